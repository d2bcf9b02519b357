#!/usr/bin/env bash
# The paper's Tables 2 and 3 from analytic A100-40GB profiles: the largest micro-batch size each
# planner finds feasible, per memory-optimization mode, for 4 and 8 stages.
#   usage: scripts/bench_max_batch.sh [build/dawnpiper] > table.md
#   MODEL_ARGS="--loss-chunk-tokens 4096" adds model overrides to the language models' plans
#   (every planner sees the same graph; AmoebaNet is planned as it is).
set -euo pipefail
bin="${1:-build/dawnpiper}"
read -r -a model_args <<<"${MODEL_ARGS:-}"
models=(bert-large gpt2-large t5-large amoebanet-d)
max_batch() {  # planner memopt schedule stages model
  local args=()
  [[ "$5" == amoebanet* ]] || args=("${model_args[@]}")
  "$bin" plan --model "$5" --device-spec a100-40gb --planner "$1" --memopt "$2" --schedule "$3" \
    --stages "$4" --micro-batches "$4" --max-batch --quiet "${args[@]}" 2>/dev/null | awk '/largest micro-batch/ {print $4}' || true
}
table() {  # title schedule rows...
  local title="$1" schedule="$2"
  shift 2
  local rows=("$@") planner memopt
  echo "### $title (schedule $schedule, micro-batches = stages)"
  echo
  echo "| stages | memopt | planner | bert-large | gpt2-large | t5-large | amoebanet-d |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  for stages in 4 8; do
    for row in "${rows[@]}"; do
      read -r planner memopt <<<"$row"
      line="| $stages | $memopt | $planner |"
      for m in "${models[@]}"; do
        b=$(max_batch "$planner" "$memopt" "$schedule" "$stages" "$m")
        line="$line ${b:-0} |"
      done
      echo "$line"
    done
  done
  echo
}
table "Synchronous" gpipe "gpipe none" "vpipe none" "dawnpiper none" "gpipe r" "vpipe sr" "dawnpiper sr"
table "Asynchronous" async "pipedream none" "vpipe none" "dawnpiper none" "vpipe sr" "dawnpiper sr"
