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
  echo "$out" | grep -Eq -- "$2" || { echo "FAIL $1: output lacks /$2/"; echo "$out"; fail=1; }
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

# Backends that do not exist yet: a runtime error (exit 1) naming what is missing.
check tpu_interpret_backend 1 "$PALLAS" run add --backend tpu-interpret --size 8
expect tpu_interpret_msg "^error: .*not supported yet"
check gpu_backend 1 "$PALLAS" run add --backend gpu --size 8
expect gpu_msg "^error: .*not supported yet"
exit $fail
