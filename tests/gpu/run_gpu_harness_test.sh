#!/usr/bin/env bash
# The GPU check's harness end to end on the CPU: `scripts/gpu-check.sh pack` (the binary, the
# Debian packages, under 40 MiB) and `run --device cpu` (every check on tiny models, through the
# packed Open MPI), then the report's tables are filled and every check passed.
# usage: run_gpu_harness_test.sh path/to/dawnpiper BUILD_DIR
set -u
bin="$1"
root=$(cd "$(dirname "$0")/../.." && pwd)
dir="$2/gpu-harness"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

DP_BIN="$bin" "$root/scripts/gpu-check.sh" pack "$dir/pack" || { echo "FAIL: pack"; exit 1; }
DP_PYTHON="$root/scripts/python" DP_TORCH_DIR="$root/.deps/site/torch" DP_DEPS_PREFIX="$dir/deps" DP_CHECK_BUDGET=900 \
  "$dir/pack/gpu-check.sh" run "$out/run" --device cpu || fail "run exited $?"
report="$out/run/gpu-report.md"
[ -s "$report" ] || { echo "FAIL: no report"; exit 1; }
[ -s "$out/run/gpu-check.log" ] && [ -s "$out/run/artifacts.tar.gz" ] || fail "no log or artifacts"

# Pipelines: six rows (2 and 4 ranks, three schedules), each equal to its in-process reference.
[ "$(grep -cE '^\| [24] \| (gpipe|1f1b|async) \| .* \| [0-9.e+-]+ \| equal \| [0-9.]+ \|$' "$report")" -eq 6 ] ||
  fail "pipeline rows"
grep -q 'masks drawn on the cpu.*' "$report" && grep -A1 'masks drawn on the cpu' "$report" | grep -q '(equal)' ||
  fail "dropout row"
[ "$(grep -cE '^\| (gpt2|bert)-tiny \| [0-9.e+-]+ \| equal \| [0-9.]+ \| [0-9.]+ \|$' "$report")" -eq 2 ] ||
  fail "one-process rows"
# ZeRO levels 0-3 on the device, each training level 0's losses.
[ "$(grep -cE '^\| [0-3] \| [0-9.e+-]+ \| equal \| measured peak .* \| [0-9.]+ \|$' "$report")" -eq 4 ] || fail "ZeRO rows"
# Planned stages: 4 stages x (none, sr, sr under its cap) x 2 models with a measured and a predicted peak.
# (The allocator's reserved peak, the last column, is CUDA's alone.)
[ "$(grep -cE '^\| (gpt2|bert)-tiny \| (none|sr) \| .* \| [0-3] \| [0-9.]+ [KMG]iB \| [0-9.]+ [KMG]iB \| [+-][0-9.]+% \| +\|$' "$report")" -eq 24 ] ||
  fail "planned stage rows"
# Every stage of the sr plans alone.
[ "$(grep -cE '^\| (gpt2|bert)-tiny \| [0-3] \| [0-9.]+ [KMG]iB \| [0-9.]+ [KMG]iB \(.*\) \| +\| [0-9.]+ \| [0-9.]+ \(.*\) \| [0-9.]+ \|' "$report")" -eq 8 ] ||
  fail "run-stage rows"
# Step times: DawnPiper and eager for both precisions, the preset for both.
[ "$(grep -cE '^\| imported GPT-2 .* \| (fp32|bf16) \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| [0-9.e+-]+ TFLOP/s .*\|$' "$report")" -eq 2 ] ||
  fail "imported GPT-2 rows"
[ "$(grep -cE '^\| preset .* \| (fp32|bf16) \| [0-9.]+ \| \| \| [0-9.e+-]+ TFLOP/s .*\|$' "$report")" -eq 2 ] || fail "preset rows"
# Ranks sharing the device against one process: 2 and 4 ranks, both timed.
[ "$(grep -cE '^\| [24] \| .* \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \|$' "$report")" -eq 2 ] || fail "sharing rows"
# ... and where the 2 shared ranks' time goes, per action kind (inspect of a traced run).
[ "$(grep -cE '^  stage [01]: [A-Z_]+ [0-9.]+ ms \(' "$report")" -eq 2 ] || fail "shared ranks' action times"
# Where a step goes: PyTorch's profiler over DawnPiper's and eager steps, both precisions.
[ "$(grep -cE '^### Where a (fp32|bf16) step goes: (dawnpiper|eager)' "$report")" -eq 4 ] || fail "trace summaries"
[ "$(grep -cE '^per step: wall [0-9.]+ ms' "$report")" -eq 4 ] || fail "trace summary lines"
[ -s "$out/run/traces.tar.gz" ] || fail "no traces"
grep -q 'Whole step of .*predicted peak [0-9.]* [KMG]iB.*measured peak' "$report" || fail "whole-step line"
# Every check ran and passed.
if grep -E '^\| [a-z0-9-]+ \| (failed|timed out|skipped|export failed)' "$report"; then fail "a check did not pass"; fi
[ "$failed" -eq 0 ] || { sed 's/^/  report: /' "$report"; exit 1; }
echo "gpu harness: report complete"
