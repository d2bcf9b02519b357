#!/usr/bin/env bash
# Weak scaling of data x pipeline parallelism on this machine: gpt2-mini, 2 stages, D = 1 and 2
# replicas (2 and 4 MPI ranks, one intra-op thread each), the same micro-batches per replica;
# samples/s and the gradient allreduce's share of each stage's busy time, from the trace.
#   usage: scripts/bench_data_parallel.sh build/dawnpiper [STEPS] [RUNS]
set -euo pipefail
bin=$(realpath "${1:?usage: scripts/bench_data_parallel.sh build/dawnpiper [STEPS] [RUNS]}")
steps=${2:-6}
runs=${3:-3}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(train --model gpt2-mini --stages 2 --micro-batch-size 4 --micro-batches 4 --steps "$steps" --planner even --quiet)
echo "| D | ranks | samples/s (runs) | allreduce / busy, stage 0 / 1 |"
echo "| --- | --- | --- | --- |"
for d in 1 2; do
  rates=() share=""
  for ((r = 0; r < runs; ++r)); do
    mpirun --oversubscribe -np $((2 * d)) "$bin" "${common[@]}" --data-parallel $d --trace "$work/t.h5" >/dev/null
    rates+=("$("$bin" inspect "$work/t.h5" | grep -o 'throughput [0-9.]*' | awk '{print $2}')")
    share=$("$bin" inspect "$work/t.h5" | grep -o '[0-9]: [0-9.]* s ([0-9.]*% of busy)' | grep -o '[0-9.]*%' | paste -sd/ - || true)
  done
  echo "| $d | $((2 * d)) | ${rates[*]} | ${share:--} |"
done
