#!/bin/bash
# What the batch scripts run inside their allocation: checks the config and the binary, then
# starts one dawnpiper rank per task with srun. Not submitted itself.
#   run-train.sh SCRIPT_NAME CONFIG.ini [dawnpiper train options]
# Environment: DAWNPIPER_BIN (default: build/dawnpiper next to this script's slurm/), DAWNPIPER_MPI
# (srun's --mpi plugin, default pmix), DAWNPIPER_DEVICE (cpu | cuda; default cuda when the job has
# GPUs).
set -euo pipefail
script=$1
shift
usage="usage: sbatch [sbatch options] slurm/$script CONFIG.ini [dawnpiper train options]"
config="${1:-}"
[ -n "$config" ] || { echo "$usage" >&2; echo "dawnpiper: error: no config file given" >&2; exit 2; }
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin="${DAWNPIPER_BIN:-$here/../build/dawnpiper}"
[ -f "$config" ] || { echo "$usage" >&2; echo "dawnpiper: error: no config file '$config' (relative to $PWD)" >&2; exit 2; }
[ -x "$bin" ] || { echo "dawnpiper: error: no dawnpiper binary at '$bin' (build it, or set DAWNPIPER_BIN)" >&2; exit 2; }
# Since Slurm 22.05 a step inherits --cpus-per-task only through SRUN_CPUS_PER_TASK.
export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-1}"
export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"
device="${DAWNPIPER_DEVICE:-$([ -n "${SLURM_GPUS_ON_NODE:-}" ] && echo cuda || echo cpu)}"
exec srun --mpi="${DAWNPIPER_MPI:-pmix}" --distribution=block:block "$bin" train --config "$config" --device "$device" "$@"
