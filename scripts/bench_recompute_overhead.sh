#!/usr/bin/env bash
# Measured vs predicted recomputation overhead. Plans the model with `--memopt r` under a
# memory cap, then runs every stage alone (run-stage: its exact action list, stand-in inputs,
# one intra-op thread) with the plan's decisions and, for comparison, with everything kept.
# Measured overhead: the time of the evictor's RECOMPUTE actions per micro-batch (traced inside
# the backward), and the difference in forward+backward time per micro-batch between the two
# runs. The plan predicts the overhead as the stage's memopt_ms. Timings on a shared CPU vary by
# tens of percent from run to run: each variant runs REPEATS times, alternately, and the fastest
# run of each counts.
#   usage: scripts/bench_recompute_overhead.sh BIN PROFILE.h5 STAGES SCHEDULE CAP [STEPS [REPEATS]] > table.md
#   e.g.   scripts/bench_recompute_overhead.sh build/dawnpiper gpt2-mini.h5 2 1f1b 100MiB
set -euo pipefail
if [ $# -lt 5 ]; then
  echo "usage: $0 BIN PROFILE.h5 STAGES SCHEDULE CAP [STEPS [REPEATS]]" >&2
  exit 2
fi
bin=$1 profile=$2 stages=$3 schedule=$4 cap=$5 steps=${6:-4} repeats=${7:-3}
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin" plan --profile-in "$profile" --stages "$stages" --micro-batches "$stages" --schedule "$schedule" \
  --memopt r --device-memory "$cap" --out "$work/r.json" --quiet >/dev/null
sed -e 's/"action": "recompute"/"action": "keep"/g' "$work/r.json" > "$work/keep.json"

# PLAN STAGE -> "forward+backward-ms recompute-ms" per micro-batch
run_stage() {
  "$bin" run-stage --plan "$1" --stage "$2" --steps "$steps" |
    awk '/forward\+backward per micro-batch/ {f = $5} /memory optimization per micro-batch/ {r = $6} END {print f, r}'
}
fastest() { printf '%s\n' "$@" | sort -g | head -1; }

echo "| stage | recomputed tensors | predicted (ms/micro-batch) | measured RECOMPUTE | measured / predicted | fwd+bwd with r | fwd+bwd kept | difference |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for ((x = 0; x < stages; ++x)); do
  with=() kept=() rec=()
  for ((i = 0; i < repeats; ++i)); do
    read -r f r <<< "$(run_stage "$work/r.json" $x)"
    with+=("$f") rec+=("$r")
    read -r f r <<< "$(run_stage "$work/keep.json" $x)"
    kept+=("$f")
  done
  python3 - "$work/r.json" $x "$(fastest "${with[@]}")" "$(fastest "${kept[@]}")" "$(fastest "${rec[@]}")" <<'PY'
import json, sys
plan, x = json.load(open(sys.argv[1])), int(sys.argv[2])
with_r, kept, recompute = (float(v) for v in sys.argv[3:6])
stage = plan["stages"][x]
recomputed = sum(1 for d in stage.get("decisions", []) if d["action"] == "recompute")
predicted = stage["memopt_ms"]
ratio = f"{recompute / predicted:.2f}" if predicted > 0 else "-"
print(f"| {x} | {recomputed} | {predicted:.1f} | {recompute:.1f} | {ratio} | {with_r:.1f} | {kept:.1f} | {with_r - kept:+.1f} |")
PY
done
