#!/usr/bin/env bash
# GPU validation in one go (run on a machine with an NVIDIA GPU, e.g. through the `device` tool):
# builds, runs every GPU-capable example on the GPU against its reference on fresh random inputs,
# runs the GPU-dependent tests, compute-sanitizer memcheck and racecheck on a few examples, and
# dumps the SASS of the matmul. Writes a report to ${OUT:-gpu-report}/report.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-report}
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
: > "$REPORT"
log() { echo "$@" | tee -a "$REPORT"; }
BUILD=${BUILD:-build-gpu}
scripts/build.sh "$BUILD" >"$OUT/build.log" 2>&1 || { log "BUILD FAILED (see build.log)"; exit 1; }
nvidia-smi -L 2>&1 | tee -a "$REPORT"
status=0
examples="add matmul softmax layer_norm gather inplace ws_matmul"
for e in $examples; do
  for seed in 1 2; do
    if out=$("$BUILD/pallas" run "$e" --backend gpu --seed "$seed" 2>&1); then log "ok    $out"; else log "FAIL  $e seed $seed: $out"; status=1; fi
  done
done
if out=$("$BUILD/pallas" run matmul --backend gpu --dtype bf16 --size 1024 2>&1); then log "ok    $out"; else log "FAIL  $out"; status=1; fi
"$BUILD/pallas_tests" --gtest_filter='CudaLibs*:GpuCodegen*:KernelCache*:Examples.Gpu*:*GpuKernel*:*GpuProfiler*:*DeviceArrays*' >"$OUT/tests.log" 2>&1 \
  && log "ok    GPU tests" || { log "FAIL  GPU tests (tests.log)"; status=1; }
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$SAN" ]; then
  for tool in memcheck racecheck; do
    for e in add matmul softmax ws_matmul; do
      if "$SAN" --tool "$tool" --error-exitcode 9 "$BUILD/pallas" run "$e" --backend gpu --size 128 >"$OUT/$tool-$e.log" 2>&1; then
        log "ok    compute-sanitizer $tool $e"
      else
        log "FAIL  compute-sanitizer $tool $e ($tool-$e.log)"; status=1
      fi
    done
  done
else
  log "SKIP  compute-sanitizer (not installed)"
fi
# The machine code NVRTC makes for the bf16 matmul on this GPU's arch: HGMMA (wgmma) on sm_90a.
# (The device machine may have no network: carry .tools/ there, fetched by scripts/get_cuda_tools.sh.)
CUOBJDUMP=""
for c in "$(command -v cuobjdump)" .tools/cuobjdump /usr/local/cuda/bin/cuobjdump; do
  if [ -n "$c" ] && [ -x "$c" ]; then CUOBJDUMP=$c; break; fi
done
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d . | sed 's/^90$/90a/')
if [ -n "$CUOBJDUMP" ] && "$BUILD/pallas" cuda matmul --dtype bf16 --size 1024 --compile --arch "sm_${ARCH:-90a}" \
     --image "$OUT/matmul.cubin" > "$OUT/matmul.cu" 2>>"$OUT/build.log"; then
  "$CUOBJDUMP" -sass "$OUT/matmul.cubin" > "$OUT/matmul.sass" 2>&1
  hgmma=$(grep -c HGMMA "$OUT/matmul.sass" 2>/dev/null); hmma=$(grep -c HMMA "$OUT/matmul.sass" 2>/dev/null)
  log "sass  matmul bf16 (sm_${ARCH:-90a}): ${hgmma:-0} HGMMA, ${hmma:-0} HMMA instruction lines (matmul.sass)"
  if [ "${ARCH:-90a}" = 90a ] && [ "${hgmma:-0}" -eq 0 ]; then log "FAIL  no HGMMA in the sm_90a matmul"; status=1; fi
else
  log "SKIP  sass (no cuobjdump: scripts/get_cuda_tools.sh; or the compile failed: build.log)"
fi
"$BUILD/pallas_bench" gpu >"$OUT/bench.txt" 2>&1 && log "bench written to bench.txt" || log "bench: none or failed"
log "status $status"
exit $status
