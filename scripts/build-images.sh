#!/usr/bin/env bash
# `make images`: build the project's images without a Docker engine, into a local image store and OCI archives
# under .images/ (gitignored):
#   1. a minimal Debian bookworm base with Python 3.11 (mmdebstrap, from Debian's packages: no registry), the
#      stand-in for python:3.11-slim-bookworm;
#   2. the operator image from ./Dockerfile on that base (its PYTHON_IMAGE build argument);
#   3. with --trainer: a CPU PyTorch base (images/torch-cpu.Containerfile, PyPI's torch 2.13.0 from a hashed
#      lock) and its devel variant (compilers), then the CPU flavour of the trainer image from
#      trainer-image/Dockerfile, chosen by build arguments only (the GPU flavour is that file's defaults).
#
# buildah builds with --isolation chroot on the overlay driver (vfs where overlay cannot mount) and --layers, so
# a second run reuses every unchanged layer. The machine's CA bundle is mounted into each build step (not
# committed), so pip reaches PyPI through a TLS-intercepting proxy; pip's cache is mounted into the torch step.
#
# Usage: scripts/build-images.sh [--trainer]
#   IMAGES_DIR (default .images) holds the store and the archives; the Debian root filesystem is cached outside
#   the checkout, in BASE_CACHE (default ~/.cache/paralleljob/images), as pip and Go cache their downloads, so a
#   fresh clone on the same machine builds on it at once.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
images_dir="$(realpath -m "${IMAGES_DIR:-${repo_root}/.images}")"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "${repo_root}/pyproject.toml" | head -1)"

readonly DEBIAN_SUITE="bookworm"
# Where Debian's packages come from: this machine's own apt sources (mmdebstrap pastes a file given as its mirror
# into the new root's sources), or DEBIAN_MIRROR (a mirror URI or a sources file) where those are not Debian 12's.
readonly DEBIAN_MIRROR="${DEBIAN_MIRROR:-$(ls /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list 2>/dev/null | head -1)}"
# What python:3.11-slim-bookworm offers the Dockerfiles: python, python -m venv and pip, and CA certificates.
readonly BASE_PACKAGES="python3,python3-venv,python3-pip,python-is-python3,ca-certificates"
readonly BASE_IMAGE="localhost/paralleljob/python:3.11-${DEBIAN_SUITE}"
readonly TORCH_IMAGE="localhost/paralleljob/torch:2.13.0-cpu"
readonly TORCH_DEVEL_IMAGE="localhost/paralleljob/torch:2.13.0-cpu-devel"
readonly OPERATOR_IMAGE="ghcr.io/paralleljob/operator:${version}"
readonly TRAINER_CPU_IMAGE="ghcr.io/paralleljob/trainer:${version}-cpu"

with_trainer=0
for argument in "$@"; do
    case "${argument}" in
        --trainer) with_trainer=1 ;;
        *) echo "usage: $0 [--trainer]" >&2; exit 2 ;;
    esac
done

readonly BUILD_TOOLS="buildah skopeo mmdebstrap"
missing() { for tool in ${BUILD_TOOLS}; do command -v "${tool}" >/dev/null || echo "${tool}"; done; }
if [[ -n "$(missing)" ]]; then
    # Debian's packages, as `make tools` fetches the control plane: installed when this runs as root (CI does).
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "installing ${BUILD_TOOLS} from Debian's packages" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ${BUILD_TOOLS} >/dev/null
    fi
    if [[ -n "$(missing)" ]]; then
        echo "missing: $(missing | xargs): apt-get install ${BUILD_TOOLS} (Debian 12), as root" >&2
        exit 1
    fi
fi

base_cache="$(realpath -m "${BASE_CACHE:-${XDG_CACHE_HOME:-${HOME}/.cache}/paralleljob/images}")"
mkdir -p "${base_cache}" "${images_dir}/base" "${images_dir}/archives"
storage_driver="overlay"
if [[ -f "${images_dir}/storage-driver" ]]; then
    storage_driver="$(cat "${images_dir}/storage-driver")"
fi
store=(--root "${images_dir}/store" --runroot "${images_dir}/run" --storage-driver "${storage_driver}")
build_mounts=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)

seconds() { date +%s; }

# The Debian root filesystem as a tarball; made once (its package list is in its name's hash), then reused.
base_tarball() {
    local key tarball
    key="$(printf '%s %s' "${DEBIAN_SUITE}" "${BASE_PACKAGES}" | sha256sum | cut -c1-12)"
    tarball="${base_cache}/debian-${DEBIAN_SUITE}-python3.11-${key}.tar"
    if [[ ! -f "${tarball}" ]]; then
        # No docs, man pages or locales; pip installs as root into /usr/local as on python:3.11-slim, so Debian's
        # EXTERNALLY-MANAGED marker (PEP 668) goes.
        SOURCE_DATE_EPOCH=0 mmdebstrap --quiet --variant=minbase --include="${BASE_PACKAGES}" \
            --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --customize-hook='rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED' \
            --format=tar "${DEBIAN_SUITE}" "${tarball}.partial" "${DEBIAN_MIRROR}" >&2
        mv "${tarball}.partial" "${tarball}"
    fi
    echo "${tarball}"
}

build() {  # build TAG CONTEXT CONTAINERFILE [buildah bud options...]
    local tag="$1" context="$2" containerfile="$3" started
    shift 3
    started="$(seconds)"
    buildah "${store[@]}" bud --isolation chroot --layers --network host "${build_mounts[@]}" \
        --tag "${tag}" --file "${containerfile}" "$@" "${context}"
    echo "built ${tag} in $(($(seconds) - started)) s" >&2
}

archive() {  # archive TAG NAME: an OCI archive under archives/ (rewritten only when the image changed), its size
    local tag="$1" name="$2" image_id
    local archive="${images_dir}/archives/${name}.oci.tar"
    image_id="$(buildah "${store[@]}" inspect --type image --format '{{.FromImageID}}' "${tag}")"
    if [[ ! -f "${archive}" || "$(cat "${archive}.image-id" 2>/dev/null)" != "${image_id}" ]]; then
        rm -f "${archive}" "${archive}.image-id"
        skopeo copy --quiet "containers-storage:[${storage_driver}@${images_dir}/store+${images_dir}/run]${tag}" \
            "oci-archive:${archive}:${tag}"
        echo "${image_id}" >"${archive}.image-id"
    fi
    printf '%-40s %10s unpacked, %5s MB as an OCI archive (%s)\n' "${tag}" \
        "$(buildah "${store[@]}" images --noheading --format '{{.Size}}' "${tag}")" \
        "$(($(stat -c %s "${images_dir}/archives/${name}.oci.tar") / 1000000))" "archives/${name}.oci.tar"
}

started_all="$(seconds)"
tarball="$(base_tarball)"
base_context="${images_dir}/base"
ln -f "${tarball}" "${base_context}/rootfs.tar" 2>/dev/null || cp "${tarball}" "${base_context}/rootfs.tar"
printf 'FROM scratch\nADD rootfs.tar /\nCMD ["python3"]\n' >"${base_context}/Containerfile"
build "${BASE_IMAGE}" "${base_context}" "${base_context}/Containerfile"

build "${OPERATOR_IMAGE}" "${repo_root}" "${repo_root}/Dockerfile" --build-arg "PYTHON_IMAGE=${BASE_IMAGE}"
summary=("$(archive "${OPERATOR_IMAGE}" paralleljob-operator-"${version}")")

if ((with_trainer)); then
    build "${TORCH_IMAGE}" "${repo_root}" "${repo_root}/images/torch-cpu.Containerfile" \
        --build-arg "BASE_IMAGE=${BASE_IMAGE}" --volume "${HOME}/.cache/pip:/root/.cache/pip"
    build "${TORCH_DEVEL_IMAGE}" "${repo_root}" "${repo_root}/images/torch-cpu-devel.Containerfile" \
        --build-arg "TORCH_IMAGE=${TORCH_IMAGE}"
    # The CPU flavour: CPU PyTorch bases, and DeepSpeed's CUDA-only ops (FusedAdam, FusedLAMB) left out.
    build "${TRAINER_CPU_IMAGE}" "${repo_root}/trainer-image" "${repo_root}/trainer-image/Dockerfile" \
        --build-arg "PYTORCH_DEVEL=${TORCH_DEVEL_IMAGE}" --build-arg "PYTORCH_RUNTIME=${TORCH_IMAGE}" \
        --build-arg "DS_ACCELERATOR=cpu" --build-arg "TORCH_CUDA_ARCH_LIST=" \
        --build-arg "DS_BUILD_FUSED_ADAM=0" --build-arg "DS_BUILD_FUSED_LAMB=0"
    summary+=("$(archive "${TRAINER_CPU_IMAGE}" paralleljob-trainer-"${version}"-cpu)")
fi

echo "images in ${images_dir}/store, OCI archives in ${images_dir}/archives ($(($(seconds) - started_all)) s in all):"
printf '%s\n' "${summary[@]}"
