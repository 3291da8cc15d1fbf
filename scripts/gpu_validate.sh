#!/usr/bin/env bash
# GPU validation in one go (run on a machine with an NVIDIA GPU, e.g. through the `device` tool):
# builds (or takes prebuilt binaries), runs every GPU-capable example on the GPU against its
# reference on fresh random inputs, runs the whole test suite with the GPU present (the tests that
# skip without one run), compute-sanitizer memcheck and racecheck on a few examples, dumps the SASS
# of the matmul and runs the GPU benchmark. Writes a report to ${OUT:-gpu-report}/report.txt.
#
# Environment: BUILD (build dir, default build-gpu); PREBUILT=dir takes pallas, pallas_tests and
# pallas_bench from dir instead of building (for a device machine without the build's packages:
# scripts/pack_prebuilt.sh makes such a dir: a bundle.tar.gz of them and the libraries they need).
# STEP_TIMEOUT bounds each step (seconds, default 240), so one hang cannot eat the whole run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-report}
mkdir -p "$OUT"
REPORT="$OUT/report.txt"
: > "$REPORT"
log() { echo "$@" | tee -a "$REPORT"; }
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
# BUDGET: seconds this script may take in all (a device call is cut at 600 s); steps that would
# start past it are skipped, each saying so, and the report still ends with its status line.
BUDGET=${BUDGET:-540}
# STEPS: which groups run (split a run over two calls: STEPS="examples tests sass bench", then STEPS=sanitizer).
STEPS=${STEPS:-examples tests sanitizer sass bench}
has_step() { [[ " $STEPS " == *" $1 "* ]]; }
want() { has_step "$1" || return 1; log "== $1 (t=${SECONDS}s)"; }  # (and logs the step's start)
if [ -n "${PREBUILT:-}" ]; then
  PREBUILT=$(cd "$PREBUILT" && pwd) || { log "no folder $PREBUILT"; exit 1; }
  BUILD=$PREBUILT
  if [ -f "$PREBUILT/bundle.tar.gz" ]; then
    # Unpacked outside the tree: an unpacked .prebuilt (87 MB) would no longer fit the 64 MiB the device tool carries.
    BUILD=$(mktemp -d); trap 'rm -rf "$BUILD"' EXIT
    tar -C "$BUILD" -xzf "$PREBUILT/bundle.tar.gz" || { log "could not unpack $PREBUILT/bundle.tar.gz"; exit 1; }
  fi
  [ -d "$BUILD/lib" ] && export LD_LIBRARY_PATH="$BUILD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The build machine's libstdc++ / libgcc_s, only where this machine's are too old for the binaries.
  if ! "$BUILD/pallas" version >/dev/null 2>&1 && [ -d "$BUILD/lib-compat" ]; then
    export LD_LIBRARY_PATH="$BUILD/lib-compat:$LD_LIBRARY_PATH"; log "note  using the bundled libstdc++ (lib-compat)"
  fi
else
  BUILD=${BUILD:-build-gpu}
  scripts/build.sh "$BUILD" >"$OUT/build.log" 2>&1 || { log "BUILD FAILED (see build.log)"; exit 1; }
fi
# Each step: at most STEP_TIMEOUT, and never past BUDGET.
run() {
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 20 ]; then echo "SKIP (time budget of ${BUDGET}s spent)"; return 124; fi
  timeout -k 5 "$((left < STEP_TIMEOUT ? left : STEP_TIMEOUT))" "$@"
}
log "date $(date -u +%FT%TZ); host $(uname -srm); $(ldd --version 2>&1 | head -1)"
nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$REPORT" || log "no nvidia-smi"
if ! v=$("$BUILD/pallas" version 2>&1); then log "FAIL  $BUILD/pallas does not start: $v"; ldd "$BUILD/pallas" 2>&1 | tee -a "$REPORT"; exit 1; fi
log "tools c++=$(command -v c++ || echo none) compute-sanitizer=$(command -v compute-sanitizer || echo none) cuobjdump=$(command -v cuobjdump || echo none) nvrtc=$( (ldconfig -p | grep -o 'libnvrtc.so.1[0-9]* '; ls /usr/local/cuda/lib*/libnvrtc.so.1* 2>/dev/null) | head -2 | tr '\n' ' ')"
status=0
if want examples; then
examples="add matmul softmax layer_norm gather inplace ws_matmul grid_sum pipeline_matmul flash_attention attention"
for e in $examples; do
  for seed in 1 2; do
    if out=$(run "$BUILD/pallas" run "$e" --backend gpu --seed "$seed" 2>&1); then log "ok    $out"; else log "FAIL  $e seed $seed: $out"; status=1; fi
  done
done
# The bf16 matmul with each of the ring's copy paths, both slot layouts and both wgmma modes (TMA
# and 128-byte swizzled slots are the default on Hopper; cp.async is what an unaligned array or
# another GPU takes).
for v in "" PALLAS_GPU_NO_SWIZZLE=1 PALLAS_GPU_NO_TMA=1 PALLAS_GPU_SYNC_WGMMA=1; do
  if out=$(run env $v "$BUILD/pallas" run matmul --backend gpu --dtype bf16 --size 1024 2>&1); then log "ok    ${v:-default}: $out"
  else log "FAIL  ${v:-default}: $out"; status=1; fi
done
# ws_matmul's swizzled SMEM tiles (stop 30) against its row-major, staged ones; its wgmma left
# running until wgmma_wait (stop 31) against waiting when issued.
for v in "" PALLAS_GPU_NO_SWIZZLE=1 PALLAS_GPU_SYNC_WGMMA=1; do
  if out=$(run env $v "$BUILD/pallas" run ws_matmul --backend gpu --dtype bf16 --size 512 2>&1); then log "ok    ${v:-default}: $out"
  else log "FAIL  ${v:-default}: $out"; status=1; fi
done
# ws_matmul in clusters sharing x by TMA multicast and in persistent grids (stop 35), and with each
# CTA copying all of x.
for v in "--cluster 2" "--cluster 4" "--cluster 2 --cluster-rows 2" "--cluster 2 --persistent 8" "--persistent 6" \
         "--cluster 2 --cluster-rows 2 --persistent 8" "--cluster 2 NO_MULTICAST" \
         "--tile-n 256" "--tile-n 256 --stages 2" "--tile-n 256 --cluster 2 --persistent 8" \
         "--tile-n 256 --cluster-rows 2 --persistent 6" "--stages 2" "--tile-n 64 --stages 3"; do
  envs=""; args=${v% NO_MULTICAST}; [ "$args" != "$v" ] && envs=PALLAS_GPU_NO_MULTICAST=1
  if out=$(run env $envs "$BUILD/pallas" run ws_matmul --backend gpu --dtype bf16 --size 1024 $args 2>&1); then log "ok    $v: $out"
  else log "FAIL  $v: $out"; status=1; fi
done
# Device arrays outside the stream-ordered pool (cuMemAlloc / cuMemFree, as before stop 35).
if out=$(PALLAS_GPU_NO_POOL=1 OPENBLAS_NUM_THREADS=1 run "$BUILD/pallas_tests" --gtest_filter='*DeviceArrays*' 2>&1 | tail -1); then
  log "ok    PALLAS_GPU_NO_POOL=1 device arrays: $out"
else log "FAIL  PALLAS_GPU_NO_POOL=1 device arrays: $out"; status=1; fi
fi
if want tests; then
# The whole suite, sharded over the cores: with a GPU present the tests that skip without one run.
shards=$(( $(nproc) > 2 ? $(nproc) : 2 ))
pids=()
SHARDS_DIR=$(mktemp -d)  # (not under $OUT: 16 files there would pass the 8 a device call brings back)
for ((i = 0; i < shards; i++)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i OPENBLAS_NUM_THREADS=1 \
    run "$BUILD/pallas_tests" >"$SHARDS_DIR/tests-$i.log" 2>&1 &
  pids+=($!)
done
failed_shards=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"; rc=$?
  [ "$rc" -ne 0 ] && failed_shards=$((failed_shards + 1))
  [ "$rc" -eq 124 ] && log "FAIL  shard $i timed out in: $(grep '^\[ RUN ' "$SHARDS_DIR/tests-$i.log" | tail -1)"
done
cat "$SHARDS_DIR"/tests-*.log > "$OUT/tests.log"; rm -rf "$SHARDS_DIR"
passed=$(grep -h "PASSED" "$OUT/tests.log" | grep -o "[0-9]* test" | awk '{s+=$1} END {print s+0}')
skipped=$(grep -h "^\[  SKIPPED \] [0-9]* test" "$OUT/tests.log" | awk '{s+=$4} END {print s+0}')
if [ "$failed_shards" -eq 0 ]; then log "ok    tests: $passed passed, $skipped skipped (tests.log)"
else log "FAIL  tests: $failed_shards of $shards shards failed; $passed passed (tests.log):"; grep -h "^\[  FAILED  \] [A-Z]" "$OUT/tests.log" | sort -u | tee -a "$REPORT"; status=1; fi
fi
if want sanitizer; then
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ -x "$SAN" ]; then
  for tool in memcheck racecheck; do
    for e in add matmul softmax ws_matmul grid_sum; do
      if STEP_TIMEOUT=${SAN_TIMEOUT:-120} run "$SAN" --tool "$tool" --error-exitcode 9 "$BUILD/pallas" run "$e" --backend gpu --size 128 >"$OUT/san.log" 2>&1; then
        log "ok    compute-sanitizer $tool $e"
      else
        log "FAIL  compute-sanitizer $tool $e:"; tail -30 "$OUT/san.log" | tee -a "$REPORT"; status=1
      fi
    done
    # (--size 128 unless the variant says: 128 x 256 tiles need a multiple of 256.)
    for v in "--cluster 2" "--persistent 1" "--cluster 2 --persistent 2" "--tile-n 256 --size 256" \
             "--tile-n 256 --size 512 --cluster 2 --persistent 2"; do
      size=(--size 128); [[ "$v" == *--size* ]] && size=()
      if STEP_TIMEOUT=${SAN_TIMEOUT:-120} run "$SAN" --tool "$tool" --error-exitcode 9 "$BUILD/pallas" run ws_matmul --backend gpu "${size[@]}" $v >"$OUT/san.log" 2>&1; then
        log "ok    compute-sanitizer $tool ws_matmul $v"
      else
        log "FAIL  compute-sanitizer $tool ws_matmul $v:"; tail -30 "$OUT/san.log" | tee -a "$REPORT"; status=1
      fi
    done
    # Device arrays: chained, asynchronous (stop 37: launches retired at synchronize), DLPack.
    # Scoped buffers and barriers (stop 41): shared by warpgroups, made new at each entry; a
    # thread's own swizzled scoped operands and wgmma's a in registers (stop 42). A peer CTA's
    # shared memory (cluster_ref) and wgmma through a transposed tile (stop 44).
    for t in '*DeviceArrays*mosaic_gpu*' '*Scope*mosaic_gpu*' '*LeftOperandFromRegisters*mosaic_gpu*' \
             '*ClusterRef*mosaic_gpu*' '*RefTransforms*mosaic_gpu*'; do
      if OPENBLAS_NUM_THREADS=1 STEP_TIMEOUT=${SAN_TIMEOUT:-120} run "$SAN" --tool "$tool" --error-exitcode 9 "$BUILD/pallas_tests" \
           --gtest_filter="$t" >"$OUT/san.log" 2>&1; then
        log "ok    compute-sanitizer $tool $t"
      else
        log "FAIL  compute-sanitizer $tool $t:"; tail -30 "$OUT/san.log" | tee -a "$REPORT"; status=1
      fi
    done
  done
  rm -f "$OUT/san.log"
else
  log "SKIP  compute-sanitizer (not installed)"
fi
fi
if want sass; then
# The machine code NVRTC makes for the bf16 matmul on this GPU's arch: HGMMA (wgmma) on sm_90a.
# (The device machine may have no network: carry .tools/ there, fetched by scripts/get_cuda_tools.sh.)
CUOBJDUMP=""
for c in "$(command -v cuobjdump)" .tools/cuobjdump /usr/local/cuda/bin/cuobjdump; do
  if [ -n "$c" ] && [ -x "$c" ]; then CUOBJDUMP=$c; break; fi
done
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d . | sed 's/^90$/90a/')
if [ -n "$CUOBJDUMP" ] && "$BUILD/pallas" cuda matmul --dtype bf16 --size 1024 --compile --arch "sm_${ARCH:-90a}" \
     --image "$OUT/matmul.cubin" > "$OUT/matmul.cu" 2>>"$OUT/cuda.log"; then
  "$CUOBJDUMP" -sass "$OUT/matmul.cubin" > "$OUT/matmul.sass" 2>&1
  hgmma=$(grep -c HGMMA "$OUT/matmul.sass" 2>/dev/null); hmma=$(grep -c HMMA "$OUT/matmul.sass" 2>/dev/null)
  tma=$(grep -c UTMALDG "$OUT/matmul.sass" 2>/dev/null)
  log "sass  matmul bf16 (sm_${ARCH:-90a}): ${hgmma:-0} HGMMA, ${hmma:-0} HMMA, ${tma:-0} UTMALDG instruction lines (matmul.sass)"
  if [ "${ARCH:-90a}" = 90a ] && [ "${hgmma:-0}" -eq 0 ]; then log "FAIL  no HGMMA in the sm_90a matmul"; status=1; fi
  rm -f "$OUT/matmul.cubin"
else
  log "SKIP  sass (no cuobjdump: scripts/get_cuda_tools.sh; or the compile failed: cuda.log)"
fi
fi
want bench && [ -z "${NO_BENCH:-}" ] && { run stdbuf -oL "$BUILD/pallas_bench" gpu >"$OUT/bench.txt" 2>&1 && log "bench written to bench.txt" || log "bench: failed (bench.txt)"; }
# What swizzled slots, TMA and async wgmma bring, side by side in one run (the bf16 matmul, 4096^3).
if has_step bench && [ -z "${NO_BENCH:-}" ]; then
  for v in "" PALLAS_GPU_NO_SWIZZLE=1 PALLAS_GPU_NO_TMA=1 PALLAS_GPU_SYNC_WGMMA=1; do
    out=$(run env $v "$BUILD/pallas" bench matmul --backend gpu --dtype bf16 --size 4096 --iters 5 2>&1 | tail -1)
    log "bench ${v:-default}: $out"
  done
  for v in "" PALLAS_GPU_NO_SWIZZLE=1 PALLAS_GPU_SYNC_WGMMA=1; do
    out=$(run env $v "$BUILD/pallas" bench ws_matmul --backend gpu --dtype bf16 --size 4096 --iters 5 2>&1 | tail -1)
    log "bench ws_matmul ${v:-default}: $out"
  done
  # The launch overhead with device memory from the pool and without (stop 35), one after the other.
  for v in "" PALLAS_GPU_NO_POOL=1; do
    log "launch overhead ${v:-(pool)}:"; run env $v "$BUILD/pallas_bench" gpu_launch 2>&1 | grep "^| [a-z]" | tee -a "$REPORT"
  done
  # (132: an H100 SXM's / H200's SMs; pallas_bench gpu asks the device.)
  for v in "--cluster 2" "--cluster 4" "--cluster 2 --cluster-rows 2" "--persistent 132" "--cluster 2 --persistent 132" \
           "--stages 2" "--tile-n 256" "--tile-n 256 --cluster 2" "--tile-n 256 --cluster 2 --persistent 132"; do
    out=$(run "$BUILD/pallas" bench ws_matmul --backend gpu --dtype bf16 --size 4096 --iters 5 $v 2>&1 | tail -1)
    log "bench ws_matmul $v: $out"
  done
  # The emit_pipeline matmul (stop 43) beside them, by pipeline depth.
  for v in "" "--stages 2" "--stages 3"; do
    out=$(run "$BUILD/pallas" bench pipeline_matmul --backend gpu --dtype bf16 --size 4096 --iters 5 $v 2>&1 | tail -1)
    log "bench pipeline_matmul ${v:-default}: $out"
  done
fi
log "status $status (t=${SECONDS}s)"
exit $status
