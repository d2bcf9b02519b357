#!/usr/bin/env bash
# README's "Train your own model" block, run as written: from a directory outside the checkout
# (HOME is a scratch directory), without Open MPI's root variables set beforehand (ctest sets
# them; the block must itself), with fewer steps. What it writes is ignored by git in the
# checkout, and trained/config.json names only tokens the vocabulary holds.
# usage: run_readme_example.sh path/to/dawnpiper
set -u
bin="$1"
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$root/tests/cli/cli_lib.sh"

awk '/^## Train your own model/ {section = 1} section && /^```bash$/ {copy = 1; next} copy && /^```$/ {exit} copy' \
  "$root/README.md" >"$work/block.sh"
# DP: a checkout whose binary is the one under test.
mkdir -p "$work/dp/build" "$work/home"
ln -s "$root/scripts" "$work/dp/scripts"
ln -s "$root/.deps" "$work/dp/.deps"  # scripts/python's environment
ln -s "$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")" "$work/dp/build/dawnpiper"
sed -i -e "s|^DP=[^ ]*|DP=$work/dp|" -e 's/--steps 100/--steps 4/; s/--warmup-steps 10/--warmup-steps 1/' \
  -e 's/--eval-every 25/--eval-every 2/' "$work/block.sh"
grep -q "^DP=$work/dp" "$work/block.sh" && grep -q -- "--steps 4" "$work/block.sh" && passed=$((passed + 1)) ||
  { echo "FAIL: README's block has no DP= line or no --steps 100"; cat "$work/block.sh"; failed=$((failed + 1)); }
(cd / && env -u OMPI_ALLOW_RUN_AS_ROOT -u OMPI_ALLOW_RUN_AS_ROOT_CONFIRM HOME="$work/home" \
  OMPI_MCA_rmaps_base_oversubscribe=1 bash -e "$work/block.sh") >"$work/out" 2>&1
code=$?
run="$work/home/dawnpiper-run"
if [ $code -eq 0 ] && [ -s "$run/gpt2-small.dpm" ] && [ -s "$run/tokens.bin" ] && [ -s "$run/run.jsonl" ] &&
   [ -s "$run/trained/model.safetensors" ] && [ -s "$run/run.png" ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: README's block (exit $code)"; tail -20 "$work/out"; ls -la "$run"; fi
# Every output, written in the checkout, would be ignored by git.
for name in $(ls -A "$run" 2>/dev/null); do
  [ -d "$run/$name" ] && name="$name/"
  git -C "$root" check-ignore -q "$name" && passed=$((passed + 1)) ||
    { echo "FAIL: $name, written in the checkout, is not ignored by git"; failed=$((failed + 1)); }
done
# The saved config names no token beyond the exported vocabulary of 4096 (GPT-2's are 50256).
if python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
ids = {k: v for k, v in c.items() if k.endswith("_token_id")}
bad = [k for k, v in ids.items() for i in (v if isinstance(v, list) else [v]) if isinstance(i, int) and not 0 <= i < c["vocab_size"]]
sys.exit(1 if bad or c["vocab_size"] != 4096 or "eos_token_id" not in ids else 0)' "$run/trained/config.json"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: trained/config.json names tokens beyond its vocabulary"
  cat "$run/trained/config.json"; fi

echo "readme-example: $passed passed, $failed failed"
[ $failed -eq 0 ]
