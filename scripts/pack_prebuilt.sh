#!/usr/bin/env bash
# Packs the built binaries (stripped) and the non-system shared libraries they load into one
# gzipped tarball, <out-dir>/bundle.tar.gz (about 21 MB), for a GPU machine that has the driver and CUDA toolkit but not the build's Debian
# packages (e.g. the `device` tool's machine, which has no network): carry the folder there and run
#   PREBUILT=<folder> scripts/gpu_validate.sh
# Usage: scripts/pack_prebuilt.sh [build-dir] [out-dir]   (defaults: build, .prebuilt)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
DEST=${2:-.prebuilt}
rm -rf "$DEST"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$DEST" "$STAGE/lib" "$STAGE/lib-compat"
for b in pallas pallas_tests pallas_bench; do strip -o "$STAGE/$b" "$BUILD/$b"; done
# Libraries beyond glibc and the C++ runtime (which any machine with a CUDA toolkit has).
ldd "$BUILD/pallas" "$BUILD/pallas_tests" "$BUILD/pallas_bench" | awk '/=>/ {print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libstdc++*|libgcc_s*) cp -L "$lib" "$STAGE/lib-compat/" ;;  # used there only if the machine's are too old
    libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|ld-linux*) ;;
    *) cp -L "$lib" "$STAGE/lib/" ;;
  esac
done
tar -C "$STAGE" -czf "$DEST/bundle.tar.gz" .
du -sh "$DEST/bundle.tar.gz"
