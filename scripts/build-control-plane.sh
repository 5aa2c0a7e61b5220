#!/usr/bin/env bash
# Build the pinned upstream control plane into .tools/bin (gitignored): kube-apiserver, kube-scheduler,
# kube-controller-manager and kubectl from tools/kube, etcd from tools/etcd. The versions are the go.mod files'
# (tools/README.md says how to change them).
#
# Built once per version: a stamp names the versions and the go.mod/go.sum hashes they were built from, so a
# second run is a no-op. The first build takes minutes and a few GB of Go's module and build caches
# (`go env GOMODCACHE GOCACHE`, outside the checkout), which later builds and fresh clones on the same machine reuse.
#
# Usage: scripts/build-control-plane.sh        # builds if needed, then prints the versions
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin_dir="${TOOLS_DIR:-${repo_root}/.tools}/bin"
stamp="${bin_dir}/.control-plane"
readonly BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubectl etcd)

command -v go >/dev/null 2>&1 || { echo "error: Go is needed to build the control plane (https://go.dev/doc/install)" >&2; exit 1; }

module_version() {  # module_version DIR MODULE -> the version DIR's go.mod requires
    (cd "$1" && go list -m -f '{{.Version}}' "$2")
}

wanted_stamp() {
    # The hashes of both modules' files and of this script: an edit to a version, a sum or a flag rebuilds.
    (cd "${repo_root}" && sha256sum tools/kube/go.mod tools/kube/go.sum tools/etcd/go.mod tools/etcd/go.sum scripts/build-control-plane.sh)
    go version
}

built() {
    [[ -f "${stamp}" ]] || return 1
    for name in "${BINARIES[@]}"; do
        [[ -x "${bin_dir}/${name}" ]] || return 1
    done
    [[ "$(cat "${stamp}")" == "$(wanted_stamp)" ]]
}

build() {
    mkdir -p "${bin_dir}"
    rm -f "${stamp}"
    local started=${SECONDS}
    echo "building the control plane into ${bin_dir} (the first build takes several minutes)" >&2
    # Kubernetes stamps its version at link time (hack/lib/version.sh does it for a release); without it every
    # binary says v0.0.0-master, which kubectl and helm refuse to parse. The date is fixed, so that two builds of
    # one version are the same; -trimpath and no VCS stamping keep them the same wherever the checkout is.
    local version major minor flags="" package
    version="$(module_version "${repo_root}/tools/kube" k8s.io/kubernetes)"
    major="${version#v}"; major="${major%%.*}"
    minor="${version#v*.}"; minor="${minor%%.*}"
    for package in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X ${package}.gitVersion=${version} -X ${package}.gitMajor=${major} -X ${package}.gitMinor=${minor}"
        flags+=" -X ${package}.gitTreeState=clean -X ${package}.buildDate=1970-01-01T00:00:00Z"
    done
    (cd "${repo_root}/tools/kube" && go build -trimpath -buildvcs=false -mod=readonly -ldflags="${flags}" -o "${bin_dir}/" tool)
    (cd "${repo_root}/tools/etcd" && go build -trimpath -buildvcs=false -mod=readonly -o "${bin_dir}/etcd" go.etcd.io/etcd/server/v3)
    wanted_stamp >"${stamp}"
    echo "built in $((SECONDS - started)) s" >&2
}

if built; then
    echo "control plane already built in ${bin_dir}" >&2
else
    build
fi

echo "kubernetes $(module_version "${repo_root}/tools/kube" k8s.io/kubernetes) (kube-apiserver, kube-scheduler, kube-controller-manager, kubectl)"
echo "etcd $(module_version "${repo_root}/tools/etcd" go.etcd.io/etcd/server/v3)"
