#!/usr/bin/env bash
# Per-stage peak memory of real multi-rank runs against the plan's prediction (its replay of the
# stage's action list). For each row: profile the preset once, plan it, train it with mpirun
# (one rank per stage, one intra-op thread each), and read the trace's measured and predicted
# peaks. Prints a Markdown table of measured / predicted - 1 per stage.
#   usage: scripts/bench_stage_memory.sh [BIN [STAGES]] > table.md
#   rows:  ROWS="preset:schedule:memopt:cap ..." overrides the default set; a preset ending in .dpm
#          is an imported model file (scripts/export_model.py)
set -euo pipefail
bin=${1:-build/dawnpiper}
stages=${2:-4}
rows=${ROWS:-"gpt2-tiny:1f1b:none:2.4MiB gpt2-tiny:async:none:2.4MiB gpt2-tiny:gpipe:sr:2.4MiB
gpt2-tiny:1f1b:sr:2.4MiB gpt2-tiny:async:sr:2.4MiB t5-tiny:gpipe:none:6MiB t5-tiny:1f1b:none:6MiB
t5-tiny:async:none:6MiB t5-tiny:gpipe:sr:6MiB t5-tiny:async:sr:6MiB"}
python=/usr/bin/python3  # Debian's, with h5py
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

header="| plan |"
rule="| --- |"
for ((x = 0; x < stages; ++x)); do header="$header stage $x |"; rule="$rule --- |"; done
echo "$header"
echo "$rule"
for row in $rows; do
  IFS=: read -r preset schedule memopt cap <<<"$row"
  model=(--model "$preset")
  [[ "$preset" == *.dpm ]] && model=(--model-file "$preset")
  profile="$work/$(tr / _ <<<"$preset").h5"  # (two files of one name: two profiles)
  [ -f "$profile" ] || "$bin" profile "${model[@]}" --micro-batch-size 4 --out "$profile" --quiet >/dev/null
  "$bin" plan --profile-in "$profile" --stages "$stages" --schedule "$schedule" --micro-batches 4 \
    --memopt "$memopt" --device-memory "$cap" --out "$work/plan.json" --quiet >/dev/null
  mpirun --oversubscribe -np "$stages" "$bin" train "${model[@]}" --steps 3 --schedule "$schedule" \
    --micro-batches 4 --plan-in "$work/plan.json" --trace "$work/trace.h5" --quiet >/dev/null
  "$python" - "$work/trace.h5" "$preset $schedule $memopt $cap" <<'EOF'
import sys
import h5py
with h5py.File(sys.argv[1], "r") as f:
    s = f["stages"]
    cells = [f"{100 * (m / p - 1):+.1f}% ({m / 2**20:.2f} / {p / 2**20:.2f} MiB)"
             for m, p in zip(s["measured_peak_bytes"][:], s["predicted_peak_bytes"][:])]
print(f"| {sys.argv[2].split('/')[-1]} | " + " | ".join(cells) + " |")
EOF
done
