#!/usr/bin/env bash
# The paper's Tables 2 and 3 measured by real runs on CPU: the largest micro-batch size each
# planner's plan trains with, 4 stages (4 MPI ranks), under a per-rank memory cap the counting
# allocator enforces. For each planner and memory-optimization mode: the planner's largest
# feasible micro-batch size (plan --max-batch), then real training runs from there downwards
# until one finishes without running out of memory.
#   usage: scripts/bench_max_batch_cpu.sh [build/dawnpiper] [model:cap ...] > table.md
#   e.g.   scripts/bench_max_batch_cpu.sh build/dawnpiper gpt2-tiny:3MiB gpt2-mini:24MiB
#   MODEL_ARGS="--loss-chunk-tokens 64" adds model overrides to every profile and run.
set -euo pipefail
bin="${1:-build/dawnpiper}"
read -r -a model_args <<<"${MODEL_ARGS:-}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gpt2-tiny:3MiB bert-tiny:3MiB)
stages=4
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# measured MODEL CAP SCHEDULE PLANNER MEMOPT -> "predicted measured"
measured() {
  local model=$1 cap=$2 schedule=$3 planner=$4 memopt=$5 b predicted
  local plan=(--profile-in "$work/$model.h5" --stages $stages --micro-batches $stages --schedule "$schedule"
              --planner "$planner" --memopt "$memopt" --device-memory "$cap" --quiet)
  predicted=$("$bin" plan "${plan[@]}" --max-batch 2>/dev/null | awk '/largest micro-batch/ {print $4}' || true)
  if [ -z "$predicted" ]; then echo "0 0"; return; fi
  for ((b = predicted; b >= 1; --b)); do
    "$bin" plan "${plan[@]}" --micro-batch-size "$b" --out "$work/plan.json" >/dev/null 2>&1 || continue
    if mpirun --oversubscribe -np $stages "$bin" train --model "$model" "${model_args[@]}" --micro-batch-size "$b" \
         --plan-in "$work/plan.json" --device-memory "$cap" --steps 2 --quiet >/dev/null 2>"$work/err"; then
      echo "$predicted $b"; return
    fi
    grep -q "out of memory" "$work/err" || { echo "training failed:" >&2; cat "$work/err" >&2; exit 1; }
  done
  echo "$predicted 0"
}

table() {  # title schedule rows...
  local title=$1 schedule=$2
  shift 2
  local rows=("$@")
  echo "### $title (schedule $schedule, $stages stages, $stages micro-batches)"
  echo
  local header="| memopt | planner |" rule="| --- | --- |"
  for t in "${targets[@]}"; do header="$header ${t%%:*} (cap ${t#*:}) planned / trained |"; rule="$rule --- |"; done
  echo "$header"
  echo "$rule"
  for row in "${rows[@]}"; do
    read -r planner memopt <<<"$row"
    local line="| $memopt | $planner |"
    for t in "${targets[@]}"; do
      read -r p m <<<"$(measured "${t%%:*}" "${t#*:}" "$schedule" "$planner" "$memopt")"
      line="$line $p / **$m** |"
    done
    echo "$line"
  done
  echo
}

for t in "${targets[@]}"; do
  "$bin" profile --model "${t%%:*}" "${model_args[@]}" --out "$work/${t%%:*}.h5" --quiet >/dev/null
done
echo "Command: ${MODEL_ARGS:+MODEL_ARGS=\"$MODEL_ARGS\" }scripts/bench_max_batch_cpu.sh $bin ${targets[*]}"
echo
table "Synchronous" gpipe "gpipe none" "vpipe none" "dawnpiper none" "gpipe r" "vpipe sr" "dawnpiper r" "dawnpiper sr"
table "Asynchronous" async "pipedream none" "vpipe none" "dawnpiper none" "vpipe sr" "dawnpiper r" "dawnpiper sr"
