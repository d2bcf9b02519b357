#!/usr/bin/env bash
# The batch scripts on a real Slurm: scripts/slurm-local.sh starts munged, slurmctld and two
# fake nodes on this machine; jobs are submitted from another directory with sbatch --wait and
# their output checked against mpirun runs of the same training.
# usage: run_slurm_tests.sh path/to/dawnpiper
set -u
bin=$(realpath "$1")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
cluster="$work/slurm"
trap '"$root/scripts/slurm-local.sh" stop "$cluster"; rm -rf "$work"' EXIT
source "$root/tests/cli/cli_lib.sh"
eval "$("$root/scripts/slurm-local.sh" start "$cluster" 2 4)" || { echo "FAIL: no local Slurm"; exit 1; }
# Two fake nodes share one host: Open MPI stays on the loopback interface and off shared memory
# (it would take ranks of different "nodes" for strangers on the same machine).
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_btl=self,tcp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 DAWNPIPER_CACHE=off
export DAWNPIPER_BIN="$bin"
mpi="mpirun --oversubscribe -np"
cd "$work"  # not the checkout: the scripts find it themselves

# job SCRIPT ARGS...: submits, waits, leaves the output in $work/job.out; returns sbatch's status.
job() {
  local script=$1
  shift
  rm -f "$work"/dawnpiper-*.out
  sbatch --wait --output="$work/dawnpiper-%j.out" "$@" >/dev/null 2>"$work/sbatch.err"
  local code=$?
  cat "$work"/dawnpiper-*.out >"$work/job.out" 2>/dev/null
  return $code
}

# One node, two stages: the mpirun losses.
ref=$($mpi 2 "$bin" train --config "$root/inputs/gpt2-tiny.ini" --steps 3 --planner even 2>/dev/null | losses)
job single "$root/slurm/single-node.sbatch" "$root/inputs/gpt2-tiny.ini" --steps 3 --planner even
if same_losses "$ref" "$(losses <"$work/job.out")" && grep -q "done: 3 steps" "$work/job.out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: single-node job"; cat "$work/job.out" "$work/sbatch.err"; fi

# Two nodes, data x pipeline: one pipeline of 2 stages per node, 2 replicas; a trace.
ref=$($mpi 4 "$bin" train --config "$root/inputs/gpt2-tiny.ini" --steps 3 --planner even --data-parallel 2 2>/dev/null | losses)
job multi "$root/slurm/multi-node.sbatch" "$root/inputs/gpt2-tiny.ini" --steps 3 --planner even --trace "$work/multi.h5"
if same_losses "$ref" "$(losses <"$work/job.out")" && grep -q "2 stages, 1f1b, 2 data-parallel replicas" "$work/job.out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: multi-node job"; cat "$work/job.out" "$work/sbatch.err"; fi
# Ranks dealt round robin over the nodes: each pipeline still lies on one node (rank 1 is
# stage 0 of replica 1, on the second node), and the losses do not change.
job cyclic -N 2 --ntasks-per-node=2 --cpus-per-task=1 --wrap "srun --mpi=pmix --distribution=cyclic '$bin' train \
  --config '$root/inputs/gpt2-tiny.ini' --steps 3 --planner even --stages 2"
if same_losses "$ref" "$(losses <"$work/job.out")" && grep -q "2 data-parallel replicas on 2 hosts" "$work/job.out" &&
   [ "$(grep -o 'stage [01] of replica [01]: measured' "$work/job.out" | head -2 | tail -1)" = "stage 0 of replica 1: measured" ] &&
   ! grep -q "pipelines span hosts" "$work/job.out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: cyclic placement"; cat "$work/job.out" "$work/sbatch.err"; fi
expect_ok "inspect the multi-node trace" "2 data-parallel replicas" inspect "$work/multi.h5"

# Bad input: the job fails at once with a usage line and the cause.
job missing "$root/slurm/single-node.sbatch" "$work/none.ini"
code=$?
if [ $code -ne 0 ] && grep -q "usage: sbatch .*slurm/single-node.sbatch CONFIG.ini" "$work/job.out" &&
   grep -q "no config file '$work/none.ini'" "$work/job.out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: missing config (exit $code)"; cat "$work/job.out"; fi
DAWNPIPER_BIN=/nonexistent/dawnpiper job nobin "$root/slurm/single-node.sbatch" "$root/inputs/gpt2-tiny.ini"
code=$?
if [ $code -ne 0 ] && grep -q "no dawnpiper binary at '/nonexistent/dawnpiper'" "$work/job.out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: missing binary (exit $code)"; cat "$work/job.out"; fi
# A replica that fails ends the whole job within seconds, naming the rank and replica.
start=$(date +%s)
job failing "$root/slurm/multi-node.sbatch" "$root/inputs/gpt2-tiny.ini" --steps 6 --planner even --lr 1e9
code=$?
echo "failing replica: the job ended $(( $(date +%s) - start )) s after sbatch (queueing and start included)"
if [ $code -ne 0 ] && [ $(( $(date +%s) - start )) -lt 30 ] && grep -q "stage 1 of replica [01], action 1[FB][0-9]*: loss is -\?nan" "$work/job.out" &&
   ! grep -qi "segmentation fault" "$work/job.out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: failing replica (exit $code)"; cat "$work/job.out"; fi

echo "slurm: $passed passed, $failed failed"
[ $failed -eq 0 ]
