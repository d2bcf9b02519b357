#!/usr/bin/env bash
# The paper's Table 2 (synchronous, largest batch) with its ZeRO rows: on 4 and 8 GPUs of the
# analytic A100-40GB, the largest *global* batch of ZeRO-2 and ZeRO-3 (pure data parallelism:
# D = the GPUs, each training the whole model; global = D x the per-GPU micro-batch) beside the
# pipeline planners' (schedule gpipe, as many stages and micro-batches as GPUs; global = micro-batch
# x micro-batches), each cell "ours (paper)". Then ZeRO's per-GPU breakdown at its largest batch.
#   usage: scripts/bench_zero_baseline.sh [build/dawnpiper] > table.md
#   OPTIMIZER=adam plans every row with that optimizer (default sgd, `plan`'s);
#   ROWS="zero2 none,dawnpiper none" restricts the first table's rows (default: all eight).
set -euo pipefail
bin="${1:-build/dawnpiper}"
models=(bert-large gpt2-large t5-large amoebanet-d)
common=(--device-spec a100-40gb --max-batch --optimizer "${OPTIMIZER:-sgd}")
IFS=, read -r -a rows <<<"${ROWS:-zero2 none,zero3 none,gpipe none,vpipe none,dawnpiper none,gpipe r,vpipe sr,dawnpiper sr}"
# The paper's Table 2, BERT / GPT-2 / T5 / AmoebaNet, keyed "GPUs method memopt".
declare -A paper=(
  ["4 zero2 none"]="64 8 140 412" ["4 zero3 none"]="64 8 132 404" ["4 gpipe none"]="52 8 144 280"
  ["4 vpipe none"]="60 8 144 188" ["4 dawnpiper none"]="72 8 160 360" ["4 gpipe r"]="120 28 348 644"
  ["4 vpipe sr"]="128 28 348 720" ["4 dawnpiper sr"]="160 32 424 1220"
  ["8 zero2 none"]="128 16 224 824" ["8 zero3 none"]="128 16 208 808" ["8 gpipe none"]="88 16 256 480"
  ["8 vpipe none"]="88 16 256 264" ["8 dawnpiper none"]="136 16 320 560" ["8 gpipe r"]="208 48 664 1384"
  ["8 vpipe sr"]="208 56 664 1424" ["8 dawnpiper sr"]="280 60 800 2180")
global_batch() {  # gpus planner memopt model
  local out
  if [[ "$2" == zero* ]]; then
    out=$("$bin" plan --model "$4" "${common[@]}" --planner "$2" --data-parallel "$1" --quiet 2>/dev/null) || true
    awk '/largest micro-batch/ {gsub(/\)/, "", $NF); print $NF}' <<<"$out"
  else
    out=$("$bin" plan --model "$4" "${common[@]}" --planner "$2" --memopt "$3" --schedule gpipe --stages "$1" \
      --micro-batches "$1" --quiet 2>/dev/null) || true
    awk -v m="$1" '/largest micro-batch/ {print $4 * m}' <<<"$out"
  fi
}
echo "| GPUs | memopt | method | bert-large | gpt2-large | t5-large | amoebanet-d |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for gpus in 4 8; do
  for row in "${rows[@]}"; do
    read -r planner memopt <<<"$row"
    read -r -a theirs <<<"${paper["$gpus $planner $memopt"]}"
    line="| $gpus | $memopt | $planner |"
    for i in "${!models[@]}"; do
      b=$(global_batch "$gpus" "$planner" "$memopt" "${models[$i]}")
      line="$line ${b:-none} (${theirs[$i]}) |"
    done
    echo "$line"
  done
done
echo
echo "| GPUs | ZeRO | model | per GPU | global | peak GiB | activations GiB | state + buckets GiB | step ms | samples/s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for gpus in 4 8; do
  for level in 2 3; do
    for m in "${models[@]}"; do
      "$bin" plan --model "$m" "${common[@]}" --planner "zero$level" --data-parallel "$gpus" 2>/dev/null | awk -v g="$gpus" \
        -v l="$level" -v m="$m" '
        /^ZeRO-/ {b = $(NF-5); glob = $NF}
        /^per GPU/ {for (i = 1; i <= NF; ++i) {v = $(i+1); sub(/[,;]/, "", v); f[$i] = v}
                    rest = f["parameters"] + f["gathered"] + f["gradients"] + f["master"] + f["optimizer"] + f["buckets"] + f["transient"]}
        /^predicted step/ {ms = $(NF-3); sps = $(NF-1)}
        END {printf "| %s | %s | %s | %s | %s | %s | %s | %.2f | %s | %s |\n", g, l, m, b, glob, f["peak"], f["activations"], rest, ms, sps}'
    done
  done
done
