#!/usr/bin/env bash
# Installs, builds and runs the whole test suite (Catch2 unit tests and command-line tests,
# through ctest). Exit status is ctest's.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/build.sh"
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DAWNPIPER_CACHE=off
cd "$root/build"
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
