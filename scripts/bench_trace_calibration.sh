#!/usr/bin/env bash
# How even the stages of 4-rank runs come out when the plan is corrected by traced runs
# (`train --calibrate-trace`). For each model: a run planned from the profile, then RUNS runs
# planned from the profile corrected by every trace before them; each row the run's cuts and
# `inspect`'s busy time and busy CPU time spreads. One profile per model (--profile-cache), so
# every run plans from the same measurement.
#   usage: scripts/bench_trace_calibration.sh [BIN] > table.md
#   MODELS (default "gpt2-mini bert-mini"), CHUNKS (--output-chunks, default 8), RUNS (default 3),
#   STEPS (default 8: with 4, one plan measured 10-24% in three runs)
set -euo pipefail
bin=$(realpath "${1:-build/dawnpiper}")
models=${MODELS:-"gpt2-mini bert-mini"}
chunks=${CHUNKS:-8}
runs=${RUNS:-3}
steps=${STEPS:-8}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "| model | run | calibrated by | cuts | busy time spread | busy CPU time spread | samples/s after the first step |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for model in $models; do
  traces=()
  for ((r = 0; r <= runs; ++r)); do
    out=$(mpirun --oversubscribe -np 4 "$bin" train --model "$model" --output-chunks "$chunks" --steps "$steps" \
      --micro-batches 8 --schedule 1f1b --profile-cache "$work/cache" "${traces[@]}" --trace "$work/$model-$r.h5")
    cuts=$(grep -o 'stage [1-9]: nodes \[[0-9]*' <<<"$out" | grep -o '[0-9]*$' | paste -sd' ' -)
    rate=$(grep -o '[0-9.]* samples/s after' <<<"$out" | awk '{print $1}')
    summary=$("$bin" inspect "$work/$model-$r.h5")
    busy=$(grep -o 'busy time spread (max/min - 1) [0-9.]*%' <<<"$summary" | grep -o '[0-9.]*%')
    cpu=$(grep -o 'busy CPU time per stage.*spread [0-9.]*%' <<<"$summary" | grep -o '[0-9.]*%$')
    echo "| $model | $r | $((${#traces[@]} / 2)) traces | $cuts | $busy | $cpu | $rate |"
    traces+=(--calibrate-trace "$work/$model-$r.h5")
  done
done
