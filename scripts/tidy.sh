#!/usr/bin/env bash
# Runs clang-tidy with .clang-tidy's checks over lib/ and app/ (or the files given), two files
# at a time. Needs build/compile_commands.json (any configured build has it). Not part of CI:
# every file that includes LibTorch costs clang-tidy that parse again (see docs/benchmarks.md,
# "Build", for the measured cost).
#   usage: scripts/tidy.sh [FILE.cpp ...]
set -euo pipefail
cd "$(dirname "$0")/.."
tidy=$(command -v clang-tidy-14 || command -v clang-tidy || true)
[ -n "$tidy" ] || { echo "tidy: no clang-tidy (apt install clang-tidy)" >&2; exit 2; }
[ -f build/compile_commands.json ] || { echo "tidy: no build/compile_commands.json (run scripts/build.sh)" >&2; exit 2; }
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(git ls-files 'lib/*.cpp' 'app/*.cpp'); fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# GCC-only flags in the compile commands are not clang's business.
printf '%s\n' "${files[@]}" | xargs -P "$(nproc)" -n 1 "$tidy" -p build --quiet \
  --extra-arg=-Wno-unknown-warning-option --extra-arg=-Wno-unused-command-line-argument >"$out" 2>/dev/null || true
grep -E "(warning|error): " "$out" | sort -u || true
count=$(grep -cE "(warning|error): " "$out" || true)
echo "tidy: ${#files[@]} files, $count findings"
[ "$count" -eq 0 ]
