#!/usr/bin/env bash
# Builds and runs every benchmark; prints the Markdown tables that docs/PERFORMANCE.md records.
# Run it on an otherwise idle machine: OpenBLAS' threads and the timings suffer badly from
# other work on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build >/dev/null
./build/pallas_bench "$@"
