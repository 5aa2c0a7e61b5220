#!/usr/bin/env bash
# Build the upstream control plane into .tools (gitignored):
# - the pinned release (tools/kube: kube-apiserver, kube-scheduler, kube-controller-manager and kubectl) and etcd
#   (tools/etcd) into .tools/bin;
# - the newest release the Go module proxy serves (tools/kube-next: its three servers) into
#   .tools/kubernetes/next/bin, which the tests run with PARALLELJOB_KUBERNETES=next (testcluster/controlplane.py).
# The versions are the go.mod files' (tools/README.md says how to change them).
#
# Each is built once per version: a stamp names the go.mod/go.sum hashes it was built from, so a second run is a
# no-op. The first build takes minutes and a few GB of Go's module and build caches (`go env GOMODCACHE GOCACHE`,
# outside the checkout), which later builds and fresh clones on the same machine reuse.
#
# Usage: scripts/build-control-plane.sh           # builds what is needed of both, then prints the versions
#        scripts/build-control-plane.sh --pinned  # the pinned release and etcd only
#        scripts/build-control-plane.sh --next    # the next release's servers only (`make test` builds them, niced,
#                                                 # beside its first pass)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${TOOLS_DIR:-${repo_root}/.tools}"

command -v go >/dev/null 2>&1 || { echo "error: Go is needed to build the control plane (https://go.dev/doc/install)" >&2; exit 1; }

module_version() {  # module_version DIR MODULE -> the version DIR's go.mod requires
    (cd "$1" && go list -m -f '{{.Version}}' "$2")
}

wanted_stamp() {  # wanted_stamp FILE... -> the hashes of the files (an edit to a version, a sum or a flag rebuilds)
    (cd "${repo_root}" && sha256sum "$@" scripts/build-control-plane.sh)
    go version
}

built() {  # built BIN_DIR STAMP_TEXT NAME...
    local bin_dir=$1 wanted=$2 name
    shift 2
    [[ -f "${bin_dir}/.control-plane" ]] || return 1
    for name in "$@"; do
        [[ -x "${bin_dir}/${name}" ]] || return 1
    done
    [[ "$(cat "${bin_dir}/.control-plane")" == "${wanted}" ]]
}

build_kubernetes() {  # build_kubernetes MODULE_DIR BIN_DIR: the module's `tool` binaries
    # Kubernetes stamps its version at link time (hack/lib/version.sh does it for a release); without it every
    # binary says v0.0.0-master, which kubectl and helm refuse to parse. The date is fixed, so that two builds of
    # one version are the same; -trimpath and no VCS stamping keep them the same wherever the checkout is.
    local module=$1 bin_dir=$2 version major minor flags="" package
    version="$(module_version "${module}" k8s.io/kubernetes)"
    major="${version#v}"; major="${major%%.*}"
    minor="${version#v*.}"; minor="${minor%%.*}"
    for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X ${package}.gitVersion=${version} -X ${package}.gitMajor=${major} -X ${package}.gitMinor=${minor}"
        flags+=" -X ${package}.gitTreeState=clean -X ${package}.buildDate=1970-01-01T00:00:00Z"
    done
    (cd "${module}" && go build -trimpath -buildvcs=false -mod=readonly -ldflags="${flags}" -o "${bin_dir}/" tool)
}

pinned() {
    local bin_dir="${tools_dir}/bin" wanted
    wanted="$(wanted_stamp tools/kube/go.mod tools/kube/go.sum tools/etcd/go.mod tools/etcd/go.sum)"
    if built "${bin_dir}" "${wanted}" kube-apiserver kube-scheduler kube-controller-manager kubectl etcd; then
        echo "the pinned control plane is already built in ${bin_dir}" >&2
        return
    fi
    mkdir -p "${bin_dir}"
    rm -f "${bin_dir}/.control-plane"
    local started=${SECONDS}
    echo "building the pinned control plane into ${bin_dir} (the first build takes several minutes)" >&2
    build_kubernetes "${repo_root}/tools/kube" "${bin_dir}"
    (cd "${repo_root}/tools/etcd" && go build -trimpath -buildvcs=false -mod=readonly -o "${bin_dir}/etcd" go.etcd.io/etcd/server/v3)
    echo "${wanted}" >"${bin_dir}/.control-plane"
    echo "built in $((SECONDS - started)) s" >&2
}

next() {
    local bin_dir="${tools_dir}/kubernetes/next/bin" wanted
    wanted="$(wanted_stamp tools/kube-next/go.mod tools/kube-next/go.sum)"
    if built "${bin_dir}" "${wanted}" kube-apiserver kube-scheduler kube-controller-manager; then
        echo "the next release's servers are already built in ${bin_dir}" >&2
        return
    fi
    mkdir -p "${bin_dir}"
    rm -f "${bin_dir}/.control-plane"
    local started=${SECONDS}
    echo "building the next release's servers into ${bin_dir} (the first build takes several minutes)" >&2
    build_kubernetes "${repo_root}/tools/kube-next" "${bin_dir}"
    echo "${wanted}" >"${bin_dir}/.control-plane"
    echo "built in $((SECONDS - started)) s" >&2
}

case "${1:-both}" in
    --pinned) pinned ;;
    --next) next ;;
    both) pinned; next ;;
    *) echo "usage: $0 [--pinned|--next]" >&2; exit 2 ;;
esac

if [[ "${1:-both}" != --next ]]; then
    echo "kubernetes $(module_version "${repo_root}/tools/kube" k8s.io/kubernetes) (kube-apiserver, kube-scheduler, kube-controller-manager, kubectl)"
    echo "etcd $(module_version "${repo_root}/tools/etcd" go.etcd.io/etcd/server/v3)"
fi
if [[ "${1:-both}" != --pinned ]]; then
    echo "kubernetes $(module_version "${repo_root}/tools/kube-next" k8s.io/kubernetes) (kube-apiserver, kube-scheduler, kube-controller-manager: PARALLELJOB_KUBERNETES=next)"
fi
