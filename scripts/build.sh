#!/usr/bin/env bash
# Installs what the build needs (Debian packages), configures and builds. Safe to re-run.
# Usage: scripts/build.sh [build-dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache (when installed) keys on paths relative to the checkout and not on the build
# directory, so a fresh clone elsewhere reuses what an earlier build compiled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
BUILD_DIR=${1:-build}
shift || true

PACKAGES=(cmake ninja-build g++ ccache libgtest-dev libbenchmark-dev libopenblas-dev
          nlohmann-json3-dev libcli11-dev libssl-dev libdlpack-dev pkg-config)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "build.sh: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# cuobjdump for the SASS test, when the CUDA toolkit lacks it (best effort; never fails the build).
scripts/get_cuda_tools.sh || true

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja "$@" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
