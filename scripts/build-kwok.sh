#!/usr/bin/env bash
# Build kwok (sigs.k8s.io/kwok, pinned in tools/kwok/go.mod) into .tools/bin/kwok, for the scale benchmarks
# (bench/): it registers thousands of fake Nodes against the upstream control plane and keeps them Ready. The
# tests do not need it, so `make tools` does not build it; `make kwok` does.
#
# Built once per version: a stamp names the go.mod/go.sum hashes it was built from, so a second run is a no-op.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_dir="${TOOLS_DIR:-${repo_root}/.tools}/bin"
stamp="${bin_dir}/.kwok"

command -v go >/dev/null 2>&1 || { echo "error: Go is needed to build kwok (https://go.dev/doc/install)" >&2; exit 1; }

wanted_stamp() {
    (cd "${repo_root}" && sha256sum tools/kwok/go.mod tools/kwok/go.sum scripts/build-kwok.sh)
    go version
}

if [[ -x "${bin_dir}/kwok" && -f "${stamp}" && "$(cat "${stamp}")" == "$(wanted_stamp)" ]]; then
    echo "kwok already built in ${bin_dir}" >&2
else
    mkdir -p "${bin_dir}"
    rm -f "${stamp}"
    started=${SECONDS}
    echo "building kwok into ${bin_dir}" >&2
    (cd "${repo_root}/tools/kwok" && go build -trimpath -buildvcs=false -mod=readonly -o "${bin_dir}/kwok" sigs.k8s.io/kwok/cmd/kwok)
    wanted_stamp >"${stamp}"
    echo "built in $((SECONDS - started)) s" >&2
fi
echo "kwok $(cd "${repo_root}/tools/kwok" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)"
