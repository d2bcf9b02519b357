#!/usr/bin/env bash
# DawnPiper beside torch.distributed.pipelining (the same torch, gloo, CPU) on the same Hugging
# Face GPT-2: one process, gpipe and 1f1b on 2 ranks, 1f1b on 4 ranks, zero bubble on 2 and 4
# (torch's ScheduleInterleavedZeroBubble with one stage per rank, DawnPiper's zb-h1), interleaved
# 1F1B on 2 ranks of two stages each (torch's ScheduleInterleaved1F1B); the same micro-batch
# size, micro-batches, sequence length, SGD and one intra-op thread per rank. Reports samples/s
# after the first step and the largest peak RSS of any rank (/usr/bin/time for DawnPiper,
# getrusage for torch). DawnPiper trains the exported graph (scripts/export_model.py) with its
# own plan (profiled and planned by rank 0 before training; not timed); torch's stages are cut
# at layer boundaries, as evenly as they go.
#   usage: scripts/bench_peer.sh build/dawnpiper [STEPS] [RUNS]
#   (CONFIGS="2 zb zb-h1" runs one configuration: ranks, torch's schedule, DawnPiper's)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath "${1:?usage: scripts/bench_peer.sh build/dawnpiper [STEPS] [RUNS]}")
steps=${2:-8}
runs=${3:-2}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TRANSFORMERS_VERBOSITY=error
config="n_layer=4,n_embd=256,n_head=4,vocab_size=8192,n_positions=128,bos_token_id=0,eos_token_id=0,resid_pdrop=0,embd_pdrop=0,attn_pdrop=0"
mbs=4 mbc=4 seq=128
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$root/scripts/python" "$root/scripts/export_model.py" --hf gpt2 --config "$config" --seq-len $seq --batch-size $mbs \
  --out "$work/gpt2.dpm" >/dev/null
# The same model with its output projection as 8 projections over vocabulary ranges (the same
# losses; cuts can fall between them): DawnPiper's own way to balance a head-heavy model.
"$root/scripts/python" "$root/scripts/export_model.py" --hf gpt2 --config "$config" --seq-len $seq --batch-size $mbs \
  --output-chunks 8 --out "$work/gpt2-chunked.dpm" >/dev/null

# dawnpiper RANKS SCHEDULE [MODEL]: "samples/s rss_mib" of one run.
dawnpiper() {
  local ranks=$1 schedule=$2 model=${3:-gpt2} launch=()
  [ "$ranks" -gt 1 ] && launch=(mpirun --oversubscribe -np "$ranks")
  "${launch[@]}" /usr/bin/time -f "rss_kib %M" -a -o "$work/rss" "$bin" train --model-file "$work/$model.dpm" \
    --stages "$ranks" --schedule "$schedule" --micro-batch-size $mbs --micro-batches $mbc --steps "$steps" \
    --optimizer sgd --lr 1e-3 --quiet >"$work/out" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  local rate rss
  rate=$(grep -o '[0-9.]* samples/s after the first step' "$work/out" | awk '{print $1}')
  rss=$(grep -o 'rss_kib [0-9]*' "$work/rss" | awk '{if ($2 > m) m = $2} END {printf "%.0f", m / 1024}')
  rm -f "$work/rss"
  echo "$rate $rss"
}

# peer RANKS SCHEDULE: "samples/s rss_mib" of one run.
peer() {
  "$root/scripts/python" "$root/scripts/bench_peer.py" --config "$config" --ranks "$1" --schedule "$2" \
    --micro-batch-size $mbs --micro-batches $mbc --seq-len $seq --steps "$steps" 2>"$work/err" |
    awk '/^peer/ {print $5, $7}' | grep . || { cat "$work/err" >&2; exit 1; }
}

echo "| configuration | torch samples/s | DawnPiper samples/s | ratio | DawnPiper, 8 output chunks | ratio | torch peak RSS MiB | DawnPiper peak RSS MiB |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
configs=("1 eager 1f1b" "2 gpipe gpipe" "2 1f1b 1f1b" "4 1f1b 1f1b" "2 zb zb-h1" "4 zb zb-h1" "2 interleaved interleaved")
[ -n "${CONFIGS:-}" ] && configs=("$CONFIGS")
for c in "${configs[@]}"; do
  read -r ranks peer_schedule schedule <<<"$c"
  t_rates=() d_rates=() c_rates=() t_rss=0 d_rss=0
  for ((r = 0; r < runs; ++r)); do
    read -r rate rss < <(peer "$ranks" "$peer_schedule")
    t_rates+=("$rate"); t_rss=$((rss > t_rss ? rss : t_rss))
    read -r rate rss < <(dawnpiper "$ranks" "$schedule")
    d_rates+=("$rate"); d_rss=$((rss > d_rss ? rss : d_rss))
    if [ "$ranks" -gt 1 ]; then
      read -r rate rss < <(dawnpiper "$ranks" "$schedule" gpt2-chunked)
      c_rates+=("$rate"); d_rss=$((rss > d_rss ? rss : d_rss))
    fi
  done
  best() { printf '%s\n' "$@" | sort -g | tail -1; }
  ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
  tb=$(best "${t_rates[@]}") db=$(best "${d_rates[@]}")
  chunked="- | -"
  [ ${#c_rates[@]} -gt 0 ] && chunked="${c_rates[*]} | $(ratio "$(best "${c_rates[@]}")" "$tb")"
  name=$([ "$ranks" = 1 ] && echo "one process" || echo "$schedule x$ranks")
  echo "| $name | ${t_rates[*]} | ${d_rates[*]} | $(ratio "$db" "$tb") | $chunked | $t_rss | $d_rss |"
done
