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
check help 0 "$PALLAS" --help
check demo 0 "$PALLAS" demo --seed 3
echo "$out" | grep -q "kernel @row_softmax" || { echo "FAIL demo prints IR"; fail=1; }
echo "$out" | grep -q " ok$" || { echo "FAIL demo result"; fail=1; }
check unknown_command 2 "$PALLAS" frobnicate
check unknown_option 2 "$PALLAS" demo --nope
exit $fail
