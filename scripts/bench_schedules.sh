#!/usr/bin/env bash
# Per schedule, from analytic A100-40GB profiles of the paper's four models: the largest
# micro-batch size B DawnPiper's planner fits, the samples/s its predicted step gives (the plan's
# stage times through the schedule's timed simulation) and that step's idle share, at 4 and 8
# stages, memopt none and sr, with m = 2 x stages micro-batches per step (async: a stream, m
# periods of its slowest stage, no idle share per step; interleaved: 2 stages per rank, each planned
# within half the rank's memory).
#   usage: scripts/bench_schedules.sh [build/dawnpiper] > table.md
set -euo pipefail
bin="${1:-build/dawnpiper}"
models=(bert-large gpt2-large t5-large amoebanet-d)
schedules=(gpipe 1f1b async zb-h1 zb-h2 interleaved)
cell() {  # schedule memopt stages model: "B, samples/s, idle share of the step"
  local m=$((2 * $3)) out b
  out=$("$bin" plan --model "$4" --device-spec a100-40gb --schedule "$1" --memopt "$2" --stages "$3" \
    --micro-batches "$m" --max-batch 2>/dev/null || true)
  b=$(awk '/largest micro-batch/ {print $4}' <<<"$out")
  if [ -z "$b" ]; then echo "-"; return; fi
  grep -o 'predicted step [0-9.]* ms ([0-9]*% idle)' <<<"$out" | tr -d '(' |
    awk -v b="$b" -v m="$m" -v s="$1" '{idle = s == "async" ? "-" : $5; printf "%d, %.1f/s, %s", b, b * m / ($3 / 1e3), idle}'
}
echo "| stages | memopt | schedule | bert-large | gpt2-large | t5-large | amoebanet-d |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for stages in 4 8; do
  for memopt in none sr; do
    for schedule in "${schedules[@]}"; do
      line="| $stages | $memopt | $schedule |"
      for m in "${models[@]}"; do line="$line $(cell "$schedule" "$memopt" "$stages" "$m") |"; done
      echo "$line"
    done
  done
done
