#!/usr/bin/env bash
# `plan --planner zero2|zero3` (ZeRO's data-parallel baseline, lib/plan/zero_baseline.h) through
# the real binary: the largest per-GPU and global batch, the breakdown, and one-line refusals of
# what pure data parallelism has no use for.
# usage: run_zero_baseline_tests.sh path/to/dawnpiper
set -u
bin="$1"
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$root/tests/cli/cli_lib.sh"

tiny=(plan --model gpt2-tiny --device-spec a100-40gb --data-parallel 4 --device-memory 3GiB)
for level in 2 3; do
  expect_ok "zero$level max batch" "largest micro-batch size: [0-9]* per GPU (ZeRO-$level over 4 GPUs: global batch" \
    "${tiny[@]}" --planner "zero$level" --max-batch
  per_gpu=$(awk '/largest micro-batch/ {print $4}' "$work/out")
  global=$(awk '/largest micro-batch/ {gsub(/\)/, "", $NF); print $NF}' "$work/out")
  check "zero$level global batch = 4 x per GPU" [ -n "$per_gpu" ] && check "zero$level global" [ "$global" = $((4 * per_gpu)) ]
  check "zero$level breakdown" grep -q "^per GPU (GiB): parameters .* peak .* of 3.00" "$work/out"
  check "zero$level samples/s" grep -q "^predicted step: .* samples/s" "$work/out"
  # At the largest size it fits; one more does not (exit 4, one line).
  expect_ok "zero$level at its size" "global batch $global" "${tiny[@]}" --planner "zero$level" --micro-batch-size "$per_gpu"
  expect_fail "zero$level above its size" "ZeRO-$level over 4 GPUs needs" "${tiny[@]}" --planner "zero$level" \
    --micro-batch-size $((per_gpu + 1))
done
expect_ok "stages 1 is pure data parallelism" "ZeRO-2 over 4 GPUs" "${tiny[@]}" --planner zero2 --stages 1 --max-batch --quiet
expect_ok "one GPU: a note" "shards nothing" plan --model gpt2-tiny --device-spec a100-40gb --planner zero3 --device-memory 3GiB
expect_fail "zero and stages" "give --stages 1 or leave it out, not 4" "${tiny[@]}" --planner zero2 --stages 4 --max-batch
expect_fail "zero and memopt" "swaps and recomputes nothing" "${tiny[@]}" --planner zero3 --memopt sr --max-batch
expect_fail "zero and micro-batches" "leave --micro-batches out" "${tiny[@]}" --planner zero2 --micro-batches 4
expect_fail "zero and out" "no pipeline plan for --out" "${tiny[@]}" --planner zero2 --out "$work/plan.json"
check "zero wrote no plan" [ ! -e "$work/plan.json" ]
expect_fail "zero and virtual stages" "leave --virtual-stages out" "${tiny[@]}" --planner zero3 --virtual-stages 2
expect_fail "train refuses zero" "ZeRO's data-parallel baseline" train --model gpt2-tiny --planner zero2 --steps 1

echo "zero baseline cli: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
