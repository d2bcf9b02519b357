#!/usr/bin/env bash
# Installs, builds and runs the main job: training a tiny GPT-2 on the CPU from
# inputs/gpt2-tiny.ini (or the config given as the first argument).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
config="${1:-$root/inputs/gpt2-tiny.ini}"
"$root/scripts/build.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun -np 1 "$root/build/dawnpiper" train --config "$config"
