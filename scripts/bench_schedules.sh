#!/usr/bin/env bash
# Per schedule, from analytic A100-40GB profiles of the paper's four models: the largest
# micro-batch size DawnPiper's planner fits, and the predicted step at that size (the plan's stage
# times through the schedule's timed simulation), at 4 and 8 stages, memopt none and sr, with
# 2 x stages micro-batches per step.
#   usage: scripts/bench_schedules.sh [build/dawnpiper] > table.md
set -euo pipefail
bin="${1:-build/dawnpiper}"
models=(bert-large gpt2-large t5-large amoebanet-d)
schedules=(gpipe 1f1b async)
cell() {  # schedule memopt stages model: "B / step ms / idle"
  local out b step idle
  out=$("$bin" plan --model "$4" --device-spec a100-40gb --schedule "$1" --memopt "$2" --stages "$3" \
    --micro-batches $((2 * $3)) --max-batch 2>/dev/null || true)
  b=$(awk '/largest micro-batch/ {print $4}' <<<"$out")
  step=$(grep -o 'predicted step [0-9.]* ms ([0-9]*% idle)' <<<"$out" | awk '{print $3, $5}' | tr -d '(')
  if [ -z "$b" ]; then echo "-"; else echo "$b / ${step% *} ms / ${step#* }"; fi
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
