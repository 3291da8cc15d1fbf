#!/usr/bin/env bash
# Installs pallas into a temporary prefix and builds + runs an out-of-tree consumer against it.
set -euo pipefail
SRC=$1
BUILD=$2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cmake --install "$BUILD" --prefix "$TMP/prefix" >/dev/null
cmake -S "$SRC/tests/consumer" -B "$TMP/build" -G Ninja -DCMAKE_PREFIX_PATH="$TMP/prefix" >/dev/null
cmake --build "$TMP/build" >/dev/null
"$TMP/build/consumer"
