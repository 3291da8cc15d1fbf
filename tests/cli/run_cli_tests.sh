#!/usr/bin/env bash
# CLI tests: exit codes and output of the `pallas` tool.
set -uo pipefail
PALLAS=$1
fail=0
check() {  # check NAME EXPECTED_RC COMMAND... ; output in $out
  local name=$1 want=$2; shift 2
  out=$("$@" 2>&1); local rc=$?
  if [ "$rc" != "$want" ]; then echo "FAIL $name: exit $rc, want $want"; echo "$out"; fail=1; else echo "ok   $name"; fi
}
expect() {  # expect NAME PATTERN : $out (of the last check) matches the extended regex PATTERN
  # A here-string, not `echo | grep -q`: grep -q exits at the first match, and with pipefail the
  # echo still writing into the closed pipe (SIGPIPE) would fail the check at random.
  grep -Eq -- "$2" <<<"$out" || { echo "FAIL $1: output lacks /$2/"; echo "$out"; fail=1; }
}
examples="add matmul softmax layer_norm gather inplace"

check help 0 "$PALLAS" --help
check demo 0 "$PALLAS" demo --seed 3
expect demo_ir "kernel @row_softmax"
expect demo_result " ok$"
check unknown_command 2 "$PALLAS" frobnicate
check unknown_option 2 "$PALLAS" demo --nope

# list: one line per example, name first.
check list 0 "$PALLAS" list
for e in $examples; do expect "list_$e" "^$e "; done

# run: every example on the reference interpreter, at a small size (this script stays fast).
declare -A size=([add]=70 [matmul]=128 [softmax]=20 [layer_norm]=20 [gather]=32 [inplace]=24)
for e in $examples; do
  check "run_$e" 0 "$PALLAS" run "$e" --backend reference --size "${size[$e]}" --seed 5
  expect "run_${e}_line" "^$e .* backend=reference: max abs err [^,]+, max rel err .*  ok$"
done
check run_matmul_bf16 0 "$PALLAS" run matmul --size 128 --dtype bf16
expect run_matmul_bf16_line "^matmul bf16\[128,128\]x\[128,128\] backend=reference: .*  ok$"

# ir: the traced kernel and its grid mapping, without running.
check ir_matmul 0 "$PALLAS" ir matmul --size 256
expect ir_kernel "kernel @"
expect ir_grid_mapping "GridMapping\("

# bench: a median time and a throughput.
check bench_matmul 0 "$PALLAS" bench matmul --size 128 --iters 2
expect bench_matmul_line "median .* ms over 2 iters, .* GFLOP/s$"
check bench_add 0 "$PALLAS" bench add --size 40 --iters 1
expect bench_add_line "GB/s$"

# Usage errors: exit 2 with a clear message.
check unknown_example 2 "$PALLAS" run nope
expect unknown_example_msg "unknown example 'nope' \(known: add, matmul"
check unknown_example_ir 2 "$PALLAS" ir nope
check unknown_run_option 2 "$PALLAS" run add --frobnicate
check bad_backend 2 "$PALLAS" run add --backend cuda
check bad_dtype 2 "$PALLAS" run add --dtype f64
check negative_size 2 "$PALLAS" run add --size -3
check missing_name 2 "$PALLAS" run
check bad_iters 2 "$PALLAS" bench add --iters 0
check matmul_bad_size 2 "$PALLAS" run matmul --size 300
expect matmul_bad_size_msg "^error: matmul: size must be .*multiple of 128.*got 300"

# The TPU interpret mode runs the portable examples too.
check tpu_interpret_backend 0 "$PALLAS" run add --backend tpu-interpret --size 8
expect tpu_interpret_line "^add .* backend=tpu-interpret: .*  ok$"
check tpu_interpret_cores 0 "$PALLAS" run matmul --backend tpu-interpret --size 128 --cores 2 --dma-mode eager --detect-races
expect tpu_interpret_cores_line "  ok$"
# The GPU backend: runs where there is a GPU; elsewhere a runtime error (exit 1) naming what is missing.
if out=$("$PALLAS" run add --backend gpu --size 8 2>&1); then
  expect gpu_run "^add .* backend=gpu: .*  ok$"; echo "ok   gpu_backend (ran on a GPU)"
else
  expect gpu_msg "^error: the GPU backend needs an NVIDIA GPU: "; echo "ok   gpu_backend (no GPU: $out)"
  # ... said at once, before the inputs are drawn (two 8192 x 8192 arrays take 15 s).
  SECONDS=0
  check gpu_bench_big 1 "$PALLAS" bench matmul --backend gpu --dtype bf16 --size 8192
  expect gpu_bench_big_msg "^error: the GPU backend needs an NVIDIA GPU: "
  [ "$SECONDS" -le 3 ] || { echo "FAIL gpu_bench_big_fast: took ${SECONDS} s"; fail=1; }
fi

# The TPU-only examples: list them, run them (a collective on 8 devices, race detection on).
tpu_examples="dma_matmul right_permute all_gather all_reduce reduce_scatter core_map_pipeline racy deadlock embedding_bag segment_sum lane_sort"
check list_tpu 0 "$PALLAS" list
for e in $tpu_examples; do expect "list_$e" "^$e "; done
check all_reduce_8 0 "$PALLAS" run all_reduce --backend tpu-interpret --devices 8 --dma-mode eager --detect-races
expect all_reduce_8_line "^all_reduce f32\[8,128\] on 8 devices backend=tpu-interpret: .*  ok$"
check reduce_scatter_2 0 "$PALLAS" run reduce_scatter --backend tpu-interpret --devices 2 --dma-mode on_wait --detect-races --size 4
expect reduce_scatter_2_line "  ok$"
check dma_matmul 0 "$PALLAS" run dma_matmul --backend tpu-interpret --size 64 --detect-races
expect dma_matmul_line "^dma_matmul .*  ok$"
check core_map_pipeline 0 "$PALLAS" run core_map_pipeline --backend tpu-interpret --cores 4 --detect-races
expect core_map_pipeline_line "on 4 cores backend=tpu-interpret: .*  ok$"
check embedding_bag 0 "$PALLAS" run embedding_bag --backend tpu-interpret
expect embedding_bag_line "^embedding_bag .* on 2x16 subcores backend=tpu-interpret: .*  ok$"
check segment_sum 0 "$PALLAS" run segment_sum --backend tpu-interpret --detect-races --cores 1
expect segment_sum_line "^segment_sum .* on 1x16 subcores backend=tpu-interpret: .*  ok$"
check lane_sort 0 "$PALLAS" run lane_sort --backend tpu-interpret --dma-mode eager
expect lane_sort_line "^lane_sort .*  ok$"
check bench_all_gather 0 "$PALLAS" bench all_gather --backend tpu-interpret --devices 4 --iters 1
expect bench_all_gather_line "GB/s$"
check ir_all_gather 0 "$PALLAS" ir all_gather --backend tpu-interpret --devices 2
expect ir_all_gather_kernel "kernel @"

# racy: runs unchecked without detection; with it, prints the race and exits 3.
check racy_unchecked 0 "$PALLAS" run racy --backend tpu-interpret
expect racy_unchecked_note "not checked .*--detect-races"
check racy 3 "$PALLAS" run racy --backend tpu-interpret --detect-races
expect racy_count "^racy .*: 1 race\(s\) detected$"
expect racy_report "^RACE DETECTED on scratch 0"
expect racy_dma "DMA write\) at racy.cpp"

# deadlock: reported (not hung) within seconds, exit 4.
check deadlock 4 timeout 20 "$PALLAS" run deadlock --backend tpu-interpret
expect deadlock_line "^deadlock .*: DEADLOCK$"
expect deadlock_report "device 1, core 0: semaphore_wait on scratch 0"

# Usage errors of the TPU options and examples.
check devices_on_reference 2 "$PALLAS" run all_reduce --backend reference --devices 4
expect devices_on_reference_msg "^error: .*need --backend tpu-interpret"
check detect_races_on_reference 2 "$PALLAS" run add --detect-races
check devices_single_device 2 "$PALLAS" run add --backend tpu-interpret --devices 2
check tpu_only_example 2 "$PALLAS" run dma_matmul
expect tpu_only_example_msg "needs the TPU interpret mode"
check bad_dma_mode 2 "$PALLAS" run racy --backend tpu-interpret --dma-mode lazy
check bad_devices 2 "$PALLAS" run all_gather --backend tpu-interpret --devices 0
check bench_no_detect_races 2 "$PALLAS" bench all_gather --backend tpu-interpret --detect-races

# cuda: one self-contained translation unit per GPU-capable example; nvcc compiles it with no
# include path (where the CUDA toolkit is installed).
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
tmp=$(mktemp -d)
for e in $examples; do
  check "cuda_$e" 0 "$PALLAS" cuda "$e" --size "${size[$e]}"
  expect "cuda_${e}_entry" "extern \"C\" __global__ void __launch_bounds__\(256\) pallas_"
  if [ -x "$NVCC" ]; then
    "$PALLAS" cuda "$e" --size "${size[$e]}" > "$tmp/$e.cu" 2>/dev/null
    check "nvcc_$e" 0 "$NVCC" -cubin -arch=sm_90a -diag-suppress 177 -o "$tmp/$e.cubin" "$tmp/$e.cu"
  fi
done
rm -rf "$tmp"
for e in add softmax; do
  check "emulate_$e" 0 "$PALLAS" run "$e" --backend gpu-emulate --size "${size[$e]}" --seed 3
  expect "emulate_${e}_line" "^$e .* backend=gpu-emulate: .*  ok$"
done
# The persistent-grid example (a gpu::kernel with a GMEM semaphore): interpreted, emulated, and
# its CUDA compiles with nvcc.
for backend in reference gpu-emulate; do
  check "grid_sum_$backend" 0 "$PALLAS" run grid_sum --backend "$backend" --size 256 --seed 2
  expect "grid_sum_${backend}_line" "^grid_sum f32\[256,256\] backend=$backend: .*  ok$"
done
check grid_sum_cuda 0 "$PALLAS" cuda grid_sum --size 256
expect grid_sum_cuda_wait "pl_sem_wait\("
if [ -x "$NVCC" ]; then
  tmp=$(mktemp -d)
  "$PALLAS" cuda grid_sum --size 256 > "$tmp/grid_sum.cu" 2>/dev/null
  check nvcc_grid_sum 0 "$NVCC" -cubin -arch=sm_90a -diag-suppress 177 -o "$tmp/grid_sum.cubin" "$tmp/grid_sum.cu"
  rm -rf "$tmp"
fi
check grid_sum_on_tpu 2 "$PALLAS" run grid_sum --backend tpu-interpret
expect grid_sum_on_tpu_msg "^error: grid_sum is a gpu::kernel"
# The on-device profiler: a trace file per run, named on stdout; only with the GPU backends.
tmp=$(mktemp -d)
check profile_ws_matmul 0 "$PALLAS" run ws_matmul --backend gpu-emulate --size 128 --profile "$tmp/prof"
expect profile_ws_matmul_path "^profile trace: $tmp/prof/ws_matmul-[0-9]+-trace.json$"
expect profile_ws_matmul_line "^ws_matmul .* backend=gpu-emulate: .*  ok$"
trace=$(ls "$tmp"/prof/*-trace.json 2>/dev/null | head -1)
out=$(cat "$trace" 2>/dev/null)
expect profile_ws_matmul_regions '"name": "produce", "pid": 1, "tid": 2'
expect profile_ws_matmul_epilogue '"name": "epilogue", "pid": 1, "tid": 1'
rm -rf "$tmp"
check profile_on_reference 2 "$PALLAS" run ws_matmul --profile /tmp/unused-pallas-profile
expect profile_on_reference_msg "^error: --profile needs --backend gpu or gpu-emulate"
check profile_space_alone 2 "$PALLAS" run ws_matmul --backend gpu-emulate --profile-space 4
# The emit_pipeline example, compiled and run on the CPU.
check pipeline_matmul 0 "$PALLAS" run pipeline_matmul --backend gpu-emulate --dtype bf16 --size 128
expect pipeline_matmul_line "^pipeline_matmul bf16.* backend=gpu-emulate: .*  ok$"
# The attention example (Ref transpose into wgmma, emit_pipeline), compiled and run on the CPU.
check flash_attention 0 "$PALLAS" run flash_attention --backend gpu-emulate --dtype bf16
expect flash_attention_line "^flash_attention bf16\[2,128,64\]x3 backend=gpu-emulate: .*  ok$"
check flash_attention_tpu 2 "$PALLAS" run flash_attention --backend tpu-interpret
# The same attention as a pallas_call: compiled and run on the CPU, and on the simulated TPU.
check attention 0 "$PALLAS" run attention --backend gpu-emulate --dtype bf16 --size 128
expect attention_line "^attention bf16\[2,128,64\]x3 backend=gpu-emulate: .*  ok$"
check attention_tpu 0 "$PALLAS" run attention --backend tpu-interpret --size 128
# Approximate math: the GPU backends only; the unit says so, and the example still checks out.
check approx_softmax 0 "$PALLAS" run softmax --backend gpu-emulate --size 16 --approx-math
expect approx_softmax_line "^softmax .* backend=gpu-emulate: .*  ok$"
check approx_cuda 0 "$PALLAS" cuda layer_norm --approx-math
expect approx_cuda_define "^#define PL_APPROX_MATH 1$"
check approx_on_reference 2 "$PALLAS" run softmax --approx-math
expect approx_on_reference_msg "^error: --approx-math needs --backend gpu or gpu-emulate"
# Clusters: ws_matmul shares x's blocks by multicast; other examples refuse --cluster.
check ws_matmul_cluster 0 "$PALLAS" run ws_matmul --backend gpu-emulate --dtype bf16 --size 256 --cluster 2
expect ws_matmul_cluster_line "^ws_matmul bf16.* backend=gpu-emulate: .*  ok$"
check ws_matmul_cluster_cuda 0 "$PALLAS" cuda ws_matmul --dtype bf16 --cluster 2
expect ws_matmul_cluster_cuda_multicast "pl_tma_load_multicast<2>\("
check ws_matmul_2x2 0 "$PALLAS" run ws_matmul --backend reference --dtype bf16 --size 256 --cluster 2 --cluster-rows 2
expect ws_matmul_2x2_line "^ws_matmul bf16.* backend=reference: .*  ok$"
check ws_matmul_persistent 0 "$PALLAS" run ws_matmul --backend gpu-emulate --dtype bf16 --size 512 --cluster 2 --persistent 4
expect ws_matmul_persistent_line "^ws_matmul bf16.* backend=gpu-emulate: .*  ok$"
# Tiling: 128 x 256 tiles (one m64n256k16 wgmma block a consumer), a ring of 3 slots.
check ws_matmul_wide 0 "$PALLAS" run ws_matmul --backend gpu-emulate --dtype bf16 --size 256 --tile-n 256 --stages 3
expect ws_matmul_wide_line "^ws_matmul bf16.* backend=gpu-emulate: .*  ok$"
check ws_matmul_wide_cuda 0 "$PALLAS" cuda ws_matmul --dtype bf16 --tile-n 256
expect ws_matmul_wide_cuda_regs "PlAccRegs<256, 1>"
check ws_matmul_one_stage 2 "$PALLAS" run ws_matmul --dtype bf16 --stages 1
expect ws_matmul_one_stage_msg "^error: ws_matmul: --stages must be at least 2"
check tile_elsewhere 2 "$PALLAS" run add --tile-n 128
check cluster_elsewhere 2 "$PALLAS" run add --cluster 2
expect cluster_elsewhere_msg "^error: add takes no grid or tiling options"
check cuda_tpu_only 2 "$PALLAS" cuda dma_matmul
expect cuda_tpu_only_msg "needs the TPU interpret mode"
exit $fail
