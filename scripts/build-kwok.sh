#!/usr/bin/env bash
# Build kwok (sigs.k8s.io/kwok, pinned in tools/kwok/go.mod) into .tools/bin/kwok, for the scale benchmarks
# (bench/kwok.py): it plays the kubelet of thousands of fake Nodes against the upstream control plane, keeping
# them Ready and their pods Running. The tests do not need it, so `make tools` does not build it; `make kwok` does.
#
# kwok does nothing without its Stages (what to write to a node or pod, and when). The module ships the ones
# kwokctl uses by default; they are copied from the module cache, at the pinned version, to .tools/share/kwok.
#
# Built once per version: a stamp names the go.mod/go.sum hashes it was built from, so a second run is a no-op.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_dir="${TOOLS_DIR:-${repo_root}/.tools}/bin"
stamp="${bin_dir}/.kwok"
stages_dir="$(dirname "${bin_dir}")/share/kwok"
# Nodes: made Ready, then a status heartbeat every 10 to 20 min and a Lease renewed as a kubelet's is.
# Pods: Running once bound, Succeeded when a Job's, deleted when asked. Paths inside the module.
STAGES=(
    kustomize/stage/node/fast/node-initialize.yaml
    kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
    kustomize/stage/pod/fast/pod-ready.yaml
    kustomize/stage/pod/fast/pod-complete.yaml
    kustomize/stage/pod/fast/pod-delete.yaml
)

command -v go >/dev/null 2>&1 || { echo "error: Go is needed to build kwok (https://go.dev/doc/install)" >&2; exit 1; }

wanted_stamp() {
    (cd "${repo_root}" && sha256sum tools/kwok/go.mod tools/kwok/go.sum scripts/build-kwok.sh)
    go version
}

if [[ -x "${bin_dir}/kwok" && -d "${stages_dir}" && -f "${stamp}" && "$(cat "${stamp}")" == "$(wanted_stamp)" ]]; then
    echo "kwok already built in ${bin_dir}" >&2
else
    mkdir -p "${bin_dir}"
    rm -f "${stamp}"
    started=${SECONDS}
    echo "building kwok into ${bin_dir}" >&2
    (cd "${repo_root}/tools/kwok" && go build -trimpath -buildvcs=false -mod=readonly -o "${bin_dir}/kwok" sigs.k8s.io/kwok/cmd/kwok)
    module_dir="$(cd "${repo_root}/tools/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
    rm -rf "${stages_dir}" && mkdir -p "${stages_dir}"
    for stage in "${STAGES[@]}"; do
        install -m 0644 "${module_dir}/${stage}" "${stages_dir}/$(basename "${stage}")"
    done
    wanted_stamp >"${stamp}"
    echo "built in $((SECONDS - started)) s" >&2
fi
echo "kwok $(cd "${repo_root}/tools/kwok" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)"
