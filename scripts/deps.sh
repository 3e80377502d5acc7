#!/usr/bin/env bash
# Installs the Debian packages xpu needs, skipping those already installed.
#
#   scripts/deps.sh          what the build needs: a C toolchain, hwloc with its
#                            pkg-config metadata (topology discovery links against it),
#                            and Open MPI with libclang (communicators across processes;
#                            the `mpi` feature, on by default, binds to it with bindgen)
#   scripts/deps.sh --test   also what the full test run uses: the Vulkan loader, Mesa's
#                            lavapipe driver and the Khronos validation layer, so that the
#                            Vulkan backend runs without a GPU
#   scripts/deps.sh --bench  also the references the benchmarks compare with: OpenBLAS
#                            (`xpu bench ops`) and StarPU (`benches/starpu/compare.sh`)
#
# Uses apt-get directly as root and through sudo otherwise.
set -euo pipefail

packages=(build-essential pkg-config libhwloc-dev libudev-dev libopenmpi-dev openmpi-bin libclang-dev)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(libvulkan1 mesa-vulkan-drivers vulkan-validationlayers)
elif [[ "${1:-}" == "--bench" ]]; then
  packages+=(libvulkan1 mesa-vulkan-drivers libopenblas0 libstarpu-dev)
elif [[ -n "${1:-}" ]]; then
  echo "usage: scripts/deps.sh [--test | --bench]" >&2
  exit 2
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0

sudo=()
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || {
    echo "scripts/deps.sh: missing packages (${missing[*]}) and no sudo; install them as root" >&2
    exit 1
  }
  sudo=(sudo)
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
