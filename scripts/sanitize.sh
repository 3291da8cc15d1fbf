#!/usr/bin/env bash
# Builds and runs the whole test suite under a sanitizer.
# Usage: scripts/sanitize.sh address   (AddressSanitizer + UndefinedBehaviorSanitizer)
#        scripts/sanitize.sh thread    (ThreadSanitizer: the threaded parts)
set -euo pipefail
cd "$(dirname "$0")/.."
KIND=${1:-address}
case "$KIND" in
  address) DIR=build-asan ;;
  thread) DIR=build-tsan ;;
  *) echo "usage: $0 address|thread" >&2; exit 2 ;;
esac
scripts/build.sh "$DIR" -DPALLAS_SANITIZE="$KIND" -DCMAKE_BUILD_TYPE=Debug -DPALLAS_BUILD_BENCH=OFF
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
# OpenBLAS' own threads are not instrumented; keep it single-threaded under the sanitizers.
export OPENBLAS_NUM_THREADS=1
ctest --test-dir "$DIR" --output-on-failure -j2 -E install_consumer
