#!/usr/bin/env bash
# Build the pinned Kueue controller into .tools/bin/kueue-controller (gitignored). The version is tools/kueue/go.mod's
# (tools/README.md says how to change it). Its CRDs are the same module's config/components/crd/bases, which the
# build leaves in Go's module cache; the tests find them with `go list -m` (testcluster/kueue.py).
#
# Built once per version: a stamp names the go.mod/go.sum hashes, this script's and the Go version, so a second run
# is a no-op. The first build takes several minutes on 2 cores and reuses the module and build caches that
# scripts/build-control-plane.sh filled (client-go, apimachinery), outside the checkout.
#
# Usage: scripts/build-kueue.sh        # builds if needed, then prints the version
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${TOOLS_DIR:-${repo_root}/.tools}"
bin_dir="${tools_dir}/bin"
stamp="${bin_dir}/.kueue"
module=sigs.k8s.io/kueue

command -v go >/dev/null 2>&1 || { echo "error: Go is needed to build Kueue (https://go.dev/doc/install)" >&2; exit 1; }

version() {
    (cd "${repo_root}/tools/kueue" && go list -m -f '{{.Version}}' "${module}")
}

wanted_stamp() {
    (cd "${repo_root}" && sha256sum tools/kueue/go.mod tools/kueue/go.sum scripts/build-kueue.sh)
    go version
}

built() {
    [[ -f "${stamp}" && -x "${bin_dir}/kueue-controller" ]] || return 1
    [[ "$(cat "${stamp}")" == "$(wanted_stamp)" ]]
}

build() {
    mkdir -p "${bin_dir}"
    rm -f "${stamp}"
    local started=${SECONDS}
    echo "building Kueue into ${bin_dir} (the first build takes several minutes)" >&2
    (cd "${repo_root}/tools/kueue" && go build -trimpath -buildvcs=false -mod=readonly \
        -ldflags="-X ${module}/pkg/version.GitVersion=$(version)" -o "${bin_dir}/kueue-controller" "${module}/cmd/kueue")
    wanted_stamp >"${stamp}"
    echo "built in $((SECONDS - started)) s" >&2
}

if built; then
    echo "kueue already built in ${bin_dir}" >&2
else
    build
fi

echo "kueue $(version) (kueue-controller; CRDs in $(cd "${repo_root}/tools/kueue" && go list -m -f '{{.Dir}}' "${module}")/config/components/crd/bases)"
