#!/usr/bin/env bash
# Checks that the C++ sources follow .clang-format (clang-format 14, Debian's). With --fix,
# formats them in place instead. Part of the test suite (ctest "format").
#   usage: scripts/check-format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
format=$(command -v clang-format-14 || command -v clang-format || true)
[ -n "$format" ] || { echo "check-format: no clang-format (apt install clang-format)" >&2; exit 2; }
mapfile -t files < <(git ls-files 'lib/*.cpp' 'lib/*.h' 'app/*.cpp' 'app/*.h' 'tests/*.cpp' 'tests/*.h' 'bench/*.cpp' 2>/dev/null ||
                     find lib app tests bench -name '*.cpp' -o -name '*.h')
if [ "${1:-}" = --fix ]; then
  "$format" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  "$format" --dry-run -Werror "$f" >/dev/null 2>&1 || { echo "not formatted: $f (scripts/check-format.sh --fix)"; bad=1; }
done
[ $bad -eq 0 ] && echo "check-format: ${#files[@]} files formatted"
exit $bad
