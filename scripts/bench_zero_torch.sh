#!/usr/bin/env bash
# Sharded data parallelism beside torch's (the same torch, gloo, CPU): the same Hugging Face GPT-2
# on 4 ranks, one stage, AdamW, one intra-op thread per rank; DawnPiper's `--zero-stage 0|1|2|3`
# against DDP, DDP with ZeroRedundancyOptimizer, FSDP2 keeping the parameters gathered through the
# step and FSDP2 resharding them after the forward (scripts/bench_zero_torch.py). Reports
# samples/s after the first step and the largest peak RSS of any rank (/usr/bin/time for
# DawnPiper, getrusage for torch; torch's own imports take about 580 MiB of it). Where one side
# cannot run a level, the row shows its message.
#   usage: scripts/bench_zero_torch.sh build/dawnpiper [STEPS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${1:?usage: scripts/bench_zero_torch.sh build/dawnpiper [STEPS]}")
steps=${2:-4}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TRANSFORMERS_VERBOSITY=error
config="n_layer=6,n_embd=512,n_head=8,vocab_size=16384,n_positions=128,bos_token_id=0,eos_token_id=0,resid_pdrop=0,embd_pdrop=0,attn_pdrop=0"
ranks=4 mbs=2 mbc=2 seq=128
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$root/scripts/python" "$root/scripts/export_model.py" --hf gpt2 --config "$config" --seq-len $seq --batch-size $mbs \
  --out "$work/gpt2.dpm" >/dev/null
"$bin" profile --model-file "$work/gpt2.dpm" --micro-batch-size $mbs --batch-sizes $mbs --iterations 2 \
  --out "$work/profile.h5" >/dev/null

# dawnpiper LEVEL: "samples/s rss_mib", or the error's first line. Planned beforehand (`plan`),
# so that the training ranks' RSS is training's alone (rank 0 would profile the model first).
dawnpiper() {
  rm -f "$work/rss"
  local layout=(--stages 1 --data-parallel $ranks --zero-stage "$1" --micro-batch-size $mbs --micro-batches $mbc
    --optimizer adamw)
  if ! "$bin" plan --profile-in "$work/profile.h5" "${layout[@]}" --out "$work/plan.json" >/dev/null 2>"$work/err" ||
    ! mpirun --oversubscribe -np $ranks /usr/bin/time -f "rss_kib %M" -a -o "$work/rss" "$bin" train \
      --model-file "$work/gpt2.dpm" "${layout[@]}" --plan-in "$work/plan.json" --steps "$steps" --lr 1e-3 \
      --weight-decay 0.01 --quiet >"$work/out" 2>"$work/err"; then
    echo "failed: $(grep -m1 'error' "$work/err" || tail -1 "$work/err")"
    return
  fi
  local rate rss
  rate=$(grep -o '[0-9.]* samples/s after the first step' "$work/out" | awk '{print $1}')
  rss=$(grep -o 'rss_kib [0-9]*' "$work/rss" | awk '{if ($2 > m) m = $2} END {printf "%.0f", m / 1024}')
  echo "$rate $rss"
}

# torch MODE: "samples/s rss_mib", or "failed: ..."
torch_side() {
  "$root/scripts/python" "$root/scripts/bench_zero_torch.py" --config "$config" --ranks $ranks --mode "$1" \
    --micro-batch-size $mbs --micro-batches $mbc --seq-len $seq --steps "$steps" 2>"$work/terr" |
    awk '/^torch/ && /failed/ {sub(/^torch [^ ]* x[0-9]* /, ""); print; next} /^torch/ {print $5, $7}' | grep . ||
    echo "failed: $(tail -1 "$work/terr")"
}

echo "| level | torch | torch samples/s | DawnPiper samples/s | ratio | torch peak RSS MiB | DawnPiper peak RSS MiB |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
for pair in "0 ddp" "1 ddp-zero" "2 fsdp2-keep" "3 fsdp2"; do
  read -r level mode <<<"$pair"
  t=$(torch_side "$mode")
  d=$(dawnpiper "$level")
  if [[ $t == failed* || $d == failed* ]]; then  # the message in place of the figures
    [[ $t == failed* ]] && tcell=$t || tcell=${t%% *}
    [[ $d == failed* ]] && dcell=$d || dcell=${d%% *}
    echo "| $level | $mode | $tcell | $dcell | - | - | - |"
    continue
  fi
  read -r tr trss <<<"$t"
  read -r dr drss <<<"$d"
  echo "| $level | $mode | $tr | $dr | $(awk -v a="$dr" -v b="$tr" 'BEGIN {printf "%.2f", a / b}') | $trss | $drss |"
done
