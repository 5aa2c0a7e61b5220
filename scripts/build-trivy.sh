#!/usr/bin/env bash
# Build the pinned Trivy into .tools/bin/trivy (gitignored): the outside scanner that tests/chart/test_trivy.py runs
# on the rendered chart and the two Dockerfiles. The version is tools/trivy/go.mod's (tools/README.md says how to
# change it). The misconfiguration checks it scans with are the ones embedded in the binary, so the scan downloads
# nothing.
#
# Built once per version: a stamp names the go.mod/go.sum hashes, this script's and the Go version, so a second run
# is a no-op. The first build takes several minutes on 2 cores and a few hundred MB of Go's module and build caches,
# outside the checkout.
#
# Usage: scripts/build-trivy.sh        # builds if needed, then prints the version
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${TOOLS_DIR:-${repo_root}/.tools}"
bin_dir="${tools_dir}/bin"
stamp="${bin_dir}/.trivy"
module=github.com/aquasecurity/trivy

command -v go >/dev/null 2>&1 || { echo "error: Go is needed to build Trivy (https://go.dev/doc/install)" >&2; exit 1; }

version() {
    (cd "${repo_root}/tools/trivy" && go list -m -f '{{.Version}}' "${module}")
}

wanted_stamp() {
    (cd "${repo_root}" && sha256sum tools/trivy/go.mod tools/trivy/go.sum scripts/build-trivy.sh)
    go version
}

built() {
    [[ -f "${stamp}" && -x "${bin_dir}/trivy" ]] || return 1
    [[ "$(cat "${stamp}")" == "$(wanted_stamp)" ]]
}

build() {
    mkdir -p "${bin_dir}"
    rm -f "${stamp}"
    local started=${SECONDS}
    echo "building Trivy into ${bin_dir} (the first build takes several minutes)" >&2
    # The flags of Trivy's own release (its goreleaser.yml): encoding/json/v2 is still an experiment in Go 1.26 and
    # Trivy's parsers import it; no cgo; no symbol tables; the version without its `v`, as a release stamps it: the
    # embedded checks compare it as a semantic version, and warn at every scan that they cannot parse `v0.74.0`.
    local version
    version="$(version)"
    (cd "${repo_root}/tools/trivy" && CGO_ENABLED=0 GOEXPERIMENT=jsonv2 go build -trimpath -buildvcs=false -mod=readonly \
        -ldflags="-s -w -X ${module}/pkg/version/app.ver=${version#v}" -o "${bin_dir}/trivy" "${module}/cmd/trivy")
    wanted_stamp >"${stamp}"
    echo "built in $((SECONDS - started)) s" >&2
}

if built; then
    echo "trivy already built in ${bin_dir}" >&2
else
    build
fi

echo "trivy $(version)"
