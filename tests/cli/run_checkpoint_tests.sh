#!/usr/bin/env bash
# Checkpoints kept and checked (issue 55, items 4 and 5): --keep-checkpoints K keeps the last K
# complete checkpoints (each with its manifest of file sizes and checksums); a truncated,
# altered or missing file, or a damaged `latest`, is named in one line (exit 2, no rank left
# waiting) before anything is printed, with the newest complete earlier checkpoint and
# --resume-from STEP, which resumes to the uninterrupted run's losses bitwise; a 2-rank
# checkpoint resumed on 1, 3 and 4 ranks (a new plan, tensors read by name) trains the uninterrupted
# run's losses within 1e-6; so does a resume with another schedule, memopt, --device-memory or
# layout of the same global batch (a new plan), a sharded checkpoint too; another global batch or
# optimizer, or a sharded checkpoint written before the index on another plan, is refused before
# profiling; a resume past a damaged step keeps
# its own line's checkpoints; export-weights writes any kept checkpoint's weights as
# --save-weights writes them, byte for byte.
# usage: run_checkpoint_tests.sh path/to/dawnpiper
set -u
bin="$1"
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$root/tests/cli/cli_lib.sh"
# Two ranks, and a limit: a rank left waiting fails the test instead of hanging it.
mpi2() { timeout 120 mpirun --oversubscribe -np 2 "$bin" "$@"; }
run=(train --model gpt2-tiny --optimizer adam --lr 0.001 --checkpoint-every 1)
steps_of() { grep '^step' | cut -d' ' -f1-4; }
dirs() { (cd "$1" && ls -d step-* | sort -t- -k2 -n | tr '\n' ' '); }

# The uninterrupted run: 8 steps, the default 2 checkpoints kept.
full=$(mpi2 "${run[@]}" --steps 8 --checkpoint-dir "$work/full" --save-weights "$work/w8.safetensors" 2>"$work/err" | steps_of)
if [ "$(echo "$full" | wc -l)" = 8 ] && [ "$(dirs "$work/full")" = "step-7 step-8 " ] && [ "$(cat "$work/full/latest")" = 8 ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: default --keep-checkpoints (2)"; dirs "$work/full"; cat "$work/err"; fi
# Stopped at step 6, 3 kept: steps 4, 5 and 6, each with its manifest.
mpi2 "${run[@]}" --steps 6 --keep-checkpoints 3 --checkpoint-dir "$work/ck" --save-weights "$work/w6.safetensors" \
  --quiet >/dev/null 2>"$work/err"
if [ "$(dirs "$work/ck")" = "step-4 step-5 step-6 " ] && [ -s "$work/ck/step-4/manifest.json" ] &&
   grep -q '"stage-1.h5"' "$work/ck/step-6/manifest.json" && [ "$(cat "$work/ck/latest")" = 6 ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: --keep-checkpoints 3"; ls -R "$work/ck"; cat "$work/err"; fi

# damaged NAME PATTERN DIR ARGS...: exit 2, stderr has PATTERN (and no internal error), stdout
# is empty (nothing printed before the check: no header, no profile).
damaged() {
  local name="$1" pattern="$2" dir="$3"
  shift 3
  mpi2 "${run[@]}" --steps 8 --checkpoint-dir "$dir" "$@" >"$work/out" 2>"$work/err"
  local code=$?
  if [ $code -eq 2 ] && grep -qF -- "$pattern" "$work/err" && [ ! -s "$work/out" ] && ! grep -q "internal error" "$work/err"; then
    passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $name (exit $code)"; cat "$work/out" "$work/err"; fi
}
cp -r "$work/ck" "$work/cut" && truncate -s 3000 "$work/cut/step-6/stage-1.h5"
damaged "truncated file" "configuration error: --resume: checkpoint file '$work/cut/step-6/stage-1.h5' is truncated or corrupt (3000 bytes, \
$(stat -c %s "$work/ck/step-6/stage-1.h5") were written); the newest complete earlier checkpoint is step 5 ($work/cut/step-5): \
resume from it with --resume-from 5" "$work/cut" --resume
cp -r "$work/ck" "$work/flip" && printf 'xxxx' | dd of="$work/flip/step-6/stage-0.h5" bs=1 seek=40000 conv=notrunc 2>/dev/null
damaged "altered bytes" "checkpoint file '$work/flip/step-6/stage-0.h5' is corrupt (its bytes do not match the checksum" \
  "$work/flip" --resume
cp -r "$work/ck" "$work/gone" && rm "$work/gone/step-6/stage-0.h5" && truncate -s 10 "$work/gone/step-5/stage-1.h5"
damaged "missing file, the earlier one damaged too" "checkpoint file '$work/gone/step-6/stage-0.h5' is missing or unreadable; \
the newest complete earlier checkpoint is step 4" "$work/gone" --resume
cp -r "$work/ck" "$work/junk" && echo junk >"$work/junk/latest"
damaged "damaged latest" "'$work/junk/latest' is damaged (it names no step); the newest complete checkpoint is step 6 \
($work/junk/step-6): resume from it with --resume-from 6" "$work/junk" --resume
rm "$work/junk/latest"
damaged "missing latest" "'$work/junk/latest' is missing; the newest complete checkpoint is step 6" "$work/junk" --resume
damaged "a step not kept" "--resume-from 2: there is no checkpoint $work/ck/step-2; the newest complete checkpoint is step 6" \
  "$work/ck" --resume-from 2
cp -r "$work/ck" "$work/none" && rm -r "$work/none/step-4" "$work/none/step-5" && truncate -s 10 "$work/none/step-6/stage-0.h5"
damaged "nothing earlier" "no earlier complete checkpoint is kept in $work/none: train anew without --resume" \
  "$work/none" --resume
rm -r "$work/none"
expect_fail "no checkpoint to keep" "--keep-checkpoints must be at least 1" train --model gpt2-tiny --keep-checkpoints 0
expect_fail "a negative step" "--resume-from must be a step" train --model gpt2-tiny --checkpoint-dir "$work/ck" --resume-from -3

# --resume-from 5 past the damaged step 6: the uninterrupted run's steps 5-7 bitwise; the new
# step 6 replaces the damaged one, and 2 are kept (the resumed run's default).
resumed=$(mpi2 "${run[@]}" --steps 8 --checkpoint-dir "$work/cut" --resume-from 5 2>"$work/err" | steps_of)
if [ -n "$resumed" ] && [ "$resumed" = "$(echo "$full" | tail -3)" ] && [ "$(dirs "$work/cut")" = "step-7 step-8 " ] &&
   [ "$(cat "$work/cut/latest")" = 8 ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: --resume-from 5"; echo "$full"; echo "--"; echo "$resumed"; dirs "$work/cut"; cat "$work/err"; fi
# Another stage count: a new plan, each stage's parameters and Adam state read by name; steps
# 6-7 within 1e-6 of the uninterrupted 2-rank run's.
within_1e6() { [ -n "$1" ] && paste <(echo "$1") <(echo "$2") | awk 'NF != 2 { bad = 1 } { d = ($1 - $2) / $2; if (d < 0) d = -d;
  if (d > 1e-6) bad = 1 } END { exit bad }'; }
for n in 1 3 4; do
  cp -r "$work/ck" "$work/moved$n"
  timeout 120 mpirun --oversubscribe -np $n "$bin" "${run[@]}" --steps 8 --checkpoint-dir "$work/moved$n" --resume >"$work/out" 2>"$work/err"
  if grep -qF "note: the checkpoint's plan ($work/moved$n/plan.json) does not serve this run (--stages 2 -> $n): planning anew" "$work/out" &&
     within_1e6 "$(losses <"$work/out")" "$(echo "$full" | tail -2 | losses)"; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL: resume on $n ranks"; echo "$full"; cat "$work/out" "$work/err"; fi
done

# Honest resumes: every setting a resume changes is honoured or refused. Honoured with a new plan
# (each stage reads its tensors by name): another schedule, memopt, --device-memory (the old plan
# peaks at 3.41 MiB, above 3 MiB), and another layout with the same global batch; steps 6-7
# within 1e-6 of the uninterrupted run's.
resumed_within() {
  local name="$1" np="$2" pattern="$3"
  shift 3
  rm -rf "$work/r" && cp -r "$work/ck" "$work/r"
  timeout 120 mpirun --oversubscribe -np "$np" "$bin" "${run[@]}" --steps 8 --checkpoint-dir "$work/r" --resume "$@" \
    >"$work/out" 2>"$work/err"
  if grep -qF -- "$pattern" "$work/out" && within_1e6 "$(losses <"$work/out")" "$(echo "$full" | tail -2 | losses)"; then
    passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: resume with $name"; echo "$full"; cat "$work/out" "$work/err"; fi
}
serves="does not serve this run"
resumed_within "another schedule" 2 "$serves (--schedule 1f1b -> zb-h1): planning anew" --schedule zb-h1
resumed_within "memopt sr under 3 MiB" 2 "$serves (--memopt none -> sr, --device-memory unlimited -> 3.00 MiB)" \
  --memopt sr --device-memory 3MiB
resumed_within "less --device-memory" 2 "$serves (--device-memory unlimited -> 3.00 MiB)" --device-memory 3MiB
resumed_within "pipeline to data parallel (2 x 1 -> 1 x 2)" 2 \
  "$serves (--stages 2 -> 1, --data-parallel 1 -> 2, --micro-batches 4 -> 2)" --stages 1 --micro-batches 2
resumed_within "2 x 1 -> 2 x 2" 4 "$serves (--data-parallel 1 -> 2, --micro-batches 4 -> 2)" --stages 2 --micro-batches 2
# refused NAME NP PATTERN ARGS...: exit 2, stderr has PATTERN, nothing profiled or planned.
refused() {
  local name="$1" np="$2" pattern="$3"
  shift 3
  rm -rf "$work/r" && cp -r "$work/ck" "$work/r"
  timeout 120 mpirun --oversubscribe -np "$np" "$bin" "${run[@]}" --steps 8 --checkpoint-dir "$work/r" --resume "$@" \
    >"$work/out" 2>"$work/err"
  local code=$?
  if [ $code -eq 2 ] && grep -qF -- "$pattern" "$work/err" && ! grep -q "^profile\|^training" "$work/out"; then
    passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $name (exit $code)"; cat "$work/out" "$work/err"; fi
}
doubled="the global batch (micro-batch size x micro-batches x replicas) 16 (4 x 4 x 1) -> 32 (4 x 4 x 2); the data goes \
on by step: step 6 reads from sample 192, where the checkpoint's run had read 96 (samples 96 to 191 are skipped)"
refused "another data-parallel width" 4 "this one changes $doubled: repeat its values, or give --resume-override" --stages 2
# Another model's checkpoint, overridden or not: its first tensor named, before profiling.
for override in "" --resume-override; do
  rm -rf "$work/r" && cp -r "$work/ck" "$work/r"
  # shellcheck disable=SC2086
  timeout 120 mpirun --oversubscribe -np 2 "$bin" train --model mlp-tiny --optimizer adam --lr 0.001 --steps 8 \
    --checkpoint-dir "$work/r" --resume $override >"$work/out" 2>"$work/err"
  code=$?
  if [ $code -eq 2 ] && [ "$(grep -c "dawnpiper: error" "$work/err")" -eq 1 ] &&
     grep -qF "is of another model: checkpoint $work/r/step-6 holds no parameter layer0.fc.weight" "$work/err" &&
     ! grep -q "^profile\|^training" "$work/out"; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL: another model's checkpoint $override (exit $code)"; cat "$work/out" "$work/err"; fi
done
refused "another sequence length" 2 "changes the sample (--seq-len, --image-size) \"tokens [32], tokens_next [32]\" -> \
\"tokens [16], tokens_next [16]\": repeat its values" --seq-len 16
resumed_precision=$(rm -rf "$work/r" && cp -r "$work/ck" "$work/r" && mpi2 "${run[@]}" --steps 7 --checkpoint-dir "$work/r" \
  --resume --precision bf16 --resume-override 2>"$work/err")
if echo "$resumed_precision" | grep -qF "$serves (--precision fp32 -> bf16)" && [ "$(echo "$resumed_precision" | losses | wc -l)" = 1 ]
then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: another precision, overridden"; echo "$resumed_precision"
  cat "$work/err"; fi
rm -rf "$work/r" && cp -r "$work/ck" "$work/r"
mpi2 train --model gpt2-tiny --optimizer sgd --lr 0.001 --steps 8 --checkpoint-dir "$work/r" --resume --resume-override \
  >"$work/out" 2>"$work/err"
code=$?
if [ $code -eq 2 ] && grep -qF "the checkpoint in $work/r holds the state of --optimizer adam, and this run has --optimizer \
sgd" "$work/err" && ! grep -q "^profile\|^training" "$work/out"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: another optimizer, overridden (exit $code)"; cat "$work/out" "$work/err"; fi
rm -rf "$work/r" && cp -r "$work/ck" "$work/r"
timeout 120 mpirun --oversubscribe -np 4 "$bin" "${run[@]}" --steps 7 --checkpoint-dir "$work/r" --resume --stages 2 \
  --resume-override >"$work/out" 2>"$work/err"
if grep -qF "note: --resume-override: $doubled" "$work/out" && grep -qF "$serves (--data-parallel 1 -> 2)" "$work/out" &&
   [ "$(losses <"$work/out" | wc -l)" = 1 ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: another data-parallel width, overridden"; cat "$work/out" "$work/err"; fi
rm -rf "$work/r" && cp -r "$work/ck" "$work/r"
mpi2 "${run[@]}" --steps 7 --checkpoint-dir "$work/r" --resume --micro-batch-size 2 --resume-override >"$work/out" 2>"$work/err"
if grep -qF "(samples 48 to 95 are read again)" "$work/out" && grep -qF "$serves (--micro-batch-size 4 -> 2)" "$work/out" &&
   grep -q "micro-batch 2 x 4" "$work/out" && grep -q '"micro_batch_size": 2' "$work/r/plan.json"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: another micro-batch size, overridden"; cat "$work/out" "$work/err"; fi
# A sharded checkpoint moves to another plan (its manifest's index: ctest zero moves one across
# levels, replica and stage counts): steps 2-3 under zb-h1 within 1e-6 of the uninterrupted run's.
# Without its index (one written before it) it resumes only on its own plan: refused before
# profiling.
zfull=$(timeout 120 mpirun --oversubscribe -np 4 "$bin" "${run[@]}" --steps 4 --stages 2 --zero-stage 1 \
  --checkpoint-dir "$work/zfull" 2>&1 | losses)
timeout 120 mpirun --oversubscribe -np 4 "$bin" "${run[@]}" --steps 2 --stages 2 --zero-stage 1 --checkpoint-dir "$work/z" \
  --quiet >/dev/null 2>"$work/err"
cp -r "$work/z" "$work/r-z"
timeout 120 mpirun --oversubscribe -np 4 "$bin" "${run[@]}" --steps 4 --stages 2 --zero-stage 1 --schedule zb-h1 \
  --checkpoint-dir "$work/r-z" --resume >"$work/out" 2>"$work/err"
if grep -qF "$serves (--schedule 1f1b -> zb-h1)" "$work/out" && within_1e6 "$(losses <"$work/out")" "$(echo "$zfull" | tail -2)"
then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: a sharded checkpoint on another plan"
  echo "$zfull"; cat "$work/out" "$work/err"; fi
rm -rf "$work/r-z" && cp -r "$work/z" "$work/r-z"
python3 -c 'import json, sys; p = sys.argv[1]; m = json.load(open(p)); del m["index"]; json.dump(m, open(p, "w"))' \
  "$work/r-z/step-2/manifest.json"
timeout 120 mpirun --oversubscribe -np 4 "$bin" "${run[@]}" --steps 4 --stages 2 --zero-stage 1 --schedule zb-h1 \
  --checkpoint-dir "$work/r-z" --resume >"$work/out" 2>"$work/err"
code=$?
if [ $code -eq 2 ] && grep -qF "the checkpoint in $work/r-z is sharded (--zero-stage 1) and was written before checkpoints \
had an index: it resumes only on the plan it was written with, and this run changes --schedule 1f1b -> zb-h1" "$work/err" &&
   ! grep -q "^profile" "$work/out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: an old sharded checkpoint on another plan (exit $code)"
  cat "$work/out" "$work/err"; fi

# --resume-from 4 past a damaged step 6, its one checkpoint at step 7: steps 4 and 7 stay (the
# line it continues), the damaged step 6 goes; steps 4-6 the uninterrupted run's, bitwise.
cp -r "$work/ck" "$work/past" && truncate -s 3000 "$work/past/step-6/stage-1.h5"
past=$(mpi2 train --model gpt2-tiny --optimizer adam --lr 0.001 --steps 7 --checkpoint-dir "$work/past" --resume-from 4 \
  2>"$work/err" | steps_of)
if [ "$past" = "$(echo "$full" | sed -n 5,7p)" ] && [ "$(dirs "$work/past")" = "step-4 step-7 " ] &&
   [ "$(cat "$work/past/latest")" = 7 ] && grep -q '"after": 4' "$work/past/step-7/manifest.json"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: --keep-checkpoints after --resume-from 4"; dirs "$work/past"
  echo "$past"; cat "$work/err"; fi

# --eval-only of a kept, not latest, checkpoint.
if mpi2 train --model gpt2-tiny --eval-only --eval-batches 1 --checkpoint-dir "$work/ck" --resume-from 4 >"$work/out" 2>"$work/err" &&
   grep -q "weights of the checkpoint at step 4 in $work/ck" "$work/out"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: --eval-only --resume-from 4"; cat "$work/out" "$work/err"; fi

# export-weights: the latest (a directory: model.safetensors, no config.json for a preset) and a
# kept step (a file) equal --save-weights after those steps, byte for byte.
mpi2 "${run[@]}" --steps 4 --checkpoint-dir "$work/four" --save-weights "$work/w4.safetensors" --quiet >/dev/null 2>&1
expect_ok "export the latest" "wrote weights $work/e6/model.safetensors: 36 tensors, 0.14M parameters, of the checkpoint at \
step 6 in $work/ck" export-weights "$work/ck" "$work/e6"
check "export of step 6 = --save-weights" cmp -s "$work/e6/model.safetensors" "$work/w6.safetensors"
[ ! -e "$work/e6/config.json" ] && passed=$((passed + 1)) || { failed=$((failed + 1)); echo "FAIL: config.json for a preset"; }
expect_ok "export a kept step" "of the checkpoint at step 4" export-weights "$work/ck/step-4" "$work/e4.safetensors"
check "export of step 4 = --save-weights" cmp -s "$work/e4.safetensors" "$work/w4.safetensors"
expect_ok "export --step" "step 8" export-weights "$work/full" "$work/e8.safetensors" --step 8
check "export of step 8 = --save-weights" cmp -s "$work/e8.safetensors" "$work/w8.safetensors"
expect_fail "export a damaged checkpoint" "export-weights: checkpoint file '$work/flip/step-6/stage-0.h5' is corrupt (its bytes do \
not match the checksum they were written with); --step 5 exports the newest complete one" export-weights "$work/flip" "$work/x"
expect_fail "export nothing" "export-weights: there is no checkpoint directory '$work/nothing'" export-weights "$work/nothing" "$work/x"
expect_fail "export a step not kept" "there is no checkpoint $work/ck/step-1" export-weights "$work/ck" "$work/x" --step 1
expect_fail "export without a destination" "dawnpiper export-weights CKPT DIR" export-weights "$work/ck"
[ ! -e "$work/x" ] && passed=$((passed + 1)) || { failed=$((failed + 1)); echo "FAIL: a failed export left $work/x"; }

echo "checkpoint tests: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
