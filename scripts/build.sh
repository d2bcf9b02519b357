#!/usr/bin/env bash
# Installs the dependencies (scripts/setup.sh), configures and builds into build/.
# Extra arguments go to the CMake configure step (e.g. -DCMAKE_BUILD_TYPE=Release).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S "$root" -B "$root/build" -G Ninja "$@" >"$root/build.configure.log" 2>&1 ||
  { cat "$root/build.configure.log"; exit 1; }
cmake --build "$root/build" -j "$jobs"
