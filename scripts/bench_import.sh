#!/usr/bin/env bash
# Imported Hugging Face GPT-2 124M (the default config, sequence 256): export time, import
# (graph build) time, single-process training step time against PyTorch eager on the same model
# and batch with the same thread count, and planning time at 8 stages from a measured profile.
# Results go to docs/benchmarks.md by hand, with this command line.
# usage: scripts/bench_import.sh build/dawnpiper [THREADS] [WORKDIR]
set -euo pipefail
bin=$(realpath "${1:?usage: scripts/bench_import.sh build/dawnpiper [THREADS] [WORKDIR]}")
threads=${2:-2}
work=${3:-$(mktemp -d)}
root=$(cd "$(dirname "$0")/.." && pwd)
py="$root/scripts/python"
mkdir -p "$work" && cd "$work"
export OMP_NUM_THREADS=$threads
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

start=$(date +%s.%N)
"$py" "$root/scripts/export_model.py" --hf gpt2 --seq-len 256 --out gpt2-124m.dpm
echo "export: $(echo "$(date +%s.%N) - $start" | bc) s (torch.export, decompositions, 498 MB written)"
for i in 1 2 3; do /usr/bin/time -f "%e" "$bin" graph --model-file gpt2-124m.dpm 2>&1 >/dev/null; done | median |
  xargs -I{} echo "import: {} s for dawnpiper graph --model-file (read the header, build the graph; median of 3)"

"$py" "$root/scripts/bench_eager_step.py" --hf gpt2 --seq-len 256 --batch-size 4 --steps 8 --threads "$threads"
"$bin" train --model-file gpt2-124m.dpm --micro-batch-size 4 --micro-batches 1 --steps 8 --lr 1e-4 --progress lines |
  grep '^step' | awk 'NR > 2 {print $6}' | tr -d s | median |
  xargs -I{} echo "dawnpiper step median {} s over 6 steps (after 2 warm-up steps; batch 4 x 256, $threads threads)"

"$bin" profile --model-file gpt2-124m.dpm --micro-batch-size 4 --batch-sizes 4,8 --share-blocks --iterations 2 \
  --warmup 1 --no-step-check --out gpt2-124m.h5 --quiet
for schedule in 1f1b async; do
  for memopt in none sr; do
    "$bin" plan --profile-in gpt2-124m.h5 --stages 8 --schedule $schedule --memopt $memopt --device-memory 1500MiB |
      grep -o 'bottleneck.*' | sed "s/^/8 stages, $schedule, memopt $memopt, 1500 MiB: /"
  done
done
