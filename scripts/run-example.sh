#!/usr/bin/env bash
# Installs, builds and runs the main job: pipeline training of a tiny GPT-2 on the CPU over
# 4 MPI ranks (one stage each), from inputs/gpt2-tiny.ini (or the config given first).
# RANKS=1 runs the single-process reference trainer instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
config="${1:-$root/inputs/gpt2-tiny.ini}"
"$root/scripts/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun --oversubscribe -np "${RANKS:-4}" "$root/build/dawnpiper" train --config "$config"
