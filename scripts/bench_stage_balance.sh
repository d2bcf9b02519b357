#!/usr/bin/env bash
# How even a plan's stages are when measured. For each row: profile the preset with the settings
# `train` uses (micro-batch 4, one warm-up, three iterations), plan 4 stages of 1f1b with 8
# micro-batches (calibrated by that many rounds of measuring each stage alone: plan
# --calibrate-rounds), then run every stage alone (`run-stage`, stand-in inputs, one intra-op
# thread): each stage's forward+backward per micro-batch, predicted and measured, and the
# spread (max/min - 1) of both. Alone, so that stages do not share this machine's cores (four
# ranks on two cores time-share, and a busy time then measures the sharing as much as the plan).
# The stages are measured ROUNDS times in turn and each keeps its fastest round: one round's
# stage times move by up to 10% on this machine, which a spread would double.
#   usage: scripts/bench_stage_balance.sh [BIN] > table.md
#   rows:  ROWS="preset:chunks:rounds ..." overrides the default set (chunks: --output-chunks,
#          rounds: --calibrate-rounds);
#          ROUNDS (default 3), STAGES (default 4)
set -euo pipefail
bin=${1:-build/dawnpiper}
stages=${STAGES:-4}
rows=${ROWS:-"gpt2-mini:1:0 gpt2-mini:8:0 gpt2-mini:8:4 bert-mini:1:0 bert-mini:8:0 bert-mini:8:4"}
rounds=${ROUNDS:-3}
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

spread() { printf '%s\n' "$@" | awk 'NR == 1 || $1 > hi {hi = $1} NR == 1 || $1 < lo {lo = $1} END {printf "%.1f%%", 100 * (hi / lo - 1)}'; }

echo "| model | output chunks | calibration rounds | cuts | predicted ms per stage | measured ms per stage | predicted spread | measured spread |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for row in $rows; do
  IFS=: read -r preset chunks calibrate <<<"$row"
  model=(--model "$preset" --output-chunks "$chunks")
  "$bin" profile "${model[@]}" --micro-batch-size 4 --warmup 1 --iterations 3 --out "$work/p.h5" --quiet >/dev/null
  "$bin" plan --profile-in "$work/p.h5" --stages "$stages" --schedule 1f1b --micro-batches 8 \
    "${model[@]}" --calibrate-rounds "${calibrate:-0}" --out "$work/plan.json" --quiet >/dev/null
  predicted=() measured=() cuts=()
  for ((r = 0; r < rounds; ++r)); do
    for ((x = 0; x < stages; ++x)); do
      out=$("$bin" run-stage "${model[@]}" --plan "$work/plan.json" --stage "$x" --steps 4)
      line=$(grep 'forward+backward per micro-batch' <<<"$out")
      ms=$(sed -E 's/.*measured ([0-9.]+) ms.*/\1/' <<<"$line")
      if [ "$r" -eq 0 ]; then
        measured+=("$ms")
        predicted+=("$(sed -E 's/.*predicted ([0-9.]+) ms.*/\1/' <<<"$line")")
        [ "$x" -gt 0 ] && cuts+=("$(grep -o 'nodes \[[0-9]*' <<<"$out" | grep -o '[0-9]*$')")
      elif awk -v a="$ms" -v b="${measured[$x]}" 'BEGIN {exit !(a < b)}'; then
        measured[$x]=$ms
      fi
    done
  done
  join() { local IFS=/; echo "$*"; }
  echo "| $preset | $chunks | ${calibrate:-0} | ${cuts[*]} | $(join "${predicted[@]}") | $(join "${measured[@]}") |" \
    "$(spread "${predicted[@]}") | $(spread "${measured[@]}") |"
done
