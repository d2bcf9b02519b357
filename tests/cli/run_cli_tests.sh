#!/usr/bin/env bash
# Command-line behaviour of the real binary: user errors give one clear line on stderr and a
# non-zero exit, no stack trace and no partial files; --help works per subcommand.
# usage: run_cli_tests.sh path/to/dawnpiper
set -u
bin="$1"
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$root/tests/cli/cli_lib.sh"

expect_ok "top-level help" "subcommands:" --help
expect_ok "train help" "--micro-batch-size" train --help
expect_ok "graph help" "--summary" graph --help
expect_ok "graph summary" "nodes        1135" graph --model bert-large --summary
expect_ok "graph list" "amoebanet-d" graph --list
expect_ok "train tiny" "step 1 loss" train --model mlp-tiny --steps 2 --micro-batches 1

expect_fail "unknown subcommand" "unknown subcommand 'fly'; \`dawnpiper --help\` lists them" fly
expect_fail "misspelled subcommand" "unknown subcommand 'trian' (did you mean train?)" trian
[ ! -s "$work/out" ] && passed=$((passed + 1)) || { echo "FAIL: an unknown subcommand printed the usage"; failed=$((failed + 1)); }
expect_fail "unknown model" "unknown model 'gpt5'" graph --model gpt5
expect_fail "unknown option" "unrecognised option '--colour'" train --colour red
expect_fail "heads do not divide hidden" "must be divisible by heads" train --model gpt2-tiny --heads 5
expect_fail "non-numeric override" "the argument ('many') for option '--layers' is invalid" graph --model gpt2-tiny --layers many
expect_fail "fused loss with chunks" "exclude each other" graph --model gpt2-tiny --loss-chunk-tokens 64 \
  --output-chunks 2
expect_fail "fused loss on a classifier" "language model" graph --model mlp-tiny --loss-chunk-tokens 64
expect_fail "fused loss of no positions" "must be a positive integer" graph --model gpt2-tiny --loss-chunk-tokens 0
expect_ok "fused loss trains" "done: 2 steps" train --model gpt2-tiny --loss-chunk-tokens 48 --steps 2
expect_fail "unknown attention" "--attention: unknown attention 'flash' (choose ops or fused)" graph --model gpt2-tiny --attention flash
expect_fail "fused attention on a CNN" "transformer" graph --model amoebanet-tiny --attention fused
expect_ok "fused attention trains" "done: 2 steps" train --model t5-tiny --attention fused --steps 2
expect_fail "unreadable config" "cannot read config file" train --config "$work/missing.ini"
printf 'model = gpt2-tiny\nbogus = 1\n' >"$work/bad.ini"
expect_fail "unknown key in config" "bogus" train --config "$work/bad.ini"
expect_fail "bad memory size" "is not a size" train --model mlp-tiny --device-memory lots
expect_fail "zero memory" "--device-memory must be positive (leave it out for the default)" train --model mlp-tiny --device-memory 0
expect_fail "capacity exceeded" "out of memory: cannot allocate" train --model gpt2-tiny --device-memory 100KiB --steps 1
expect_fail "stages without ranks" "launch with" train --model mlp-tiny --stages 2
expect_fail "zero micro-batch size" "micro-batch size must be at least 1" train --model mlp-tiny --micro-batch-size 0
expect_fail "unknown optimizer" "unknown optimizer" train --model mlp-tiny --optimizer lion --steps 1

printf 'model = mlp-tiny\nsteps = 2\nmicro-batches = 1\nquiet = true\n' >"$work/good.ini"
expect_ok "config file" "done: 2 steps" train --config "$work/good.ini"
# The command line wins over the config file.
expect_ok "command line overrides config" "done: 3 steps" train --config "$work/good.ini" --steps 3

# profile: a real profile, and bad input without partial files.
expect_ok "profile tiny" "in-step node times" profile --model mlp-tiny --out "$work/p.h5" --iterations 1 --quiet
[ -s "$work/p.h5" ] && h5dump -H "$work/p.h5" | grep -q 'GROUP "nodes"' && passed=$((passed + 1)) ||
  { echo "FAIL: profile is not readable HDF5"; failed=$((failed + 1)); }
check "profile times the optimizers' updates" grep -q "one optimizer update of every parameter (measured): sgd" "$work/out"
expect_fail "profile without --out" "--out FILE is required" profile --model mlp-tiny
expect_fail "profile unknown device" "unknown device 'tpu'" profile --model mlp-tiny --device tpu --out "$work/x.h5"
expect_fail "profile cuda without GPU" "--device cuda" profile --model mlp-tiny --device cuda --out "$work/x.h5"
expect_fail "profile unwritable" "cannot write '/no/such/dir/p.h5'" profile --model mlp-tiny --out /no/such/dir/p.h5 --iterations 1
expect_fail "profile micro-batch 0" "micro-batch size must be at least 1" profile --model mlp-tiny --micro-batch-size 0 --out "$work/x.h5"
expect_fail "profile bad batch sizes" "--batch-sizes" profile --model mlp-tiny --batch-sizes 2,x --out "$work/x.h5"
expect_fail "profile bad timing" "--timing: unknown node timing 'fast' (choose in-step or isolated)" profile --model mlp-tiny --timing fast --out "$work/x.h5"
expect_ok "analytic profile" "on a100-40gb" profile --model bert-large --micro-batch-size 1 --analytic --device-spec a100-40gb --out "$work/a.h5"
check "analytic profile's updates" grep -q "one optimizer update of every parameter (the roofline's)" "$work/out"
expect_fail "analytic without spec" "--analytic needs --device-spec" profile --model mlp-tiny --analytic --out "$work/x.h5"
expect_fail "unknown device spec" "unknown device spec 'tpu'" profile --model mlp-tiny --analytic --device-spec tpu --out "$work/x.h5"
[ ! -e "$work/x.h5" ] && passed=$((passed + 1)) || { echo "FAIL: partial profile left behind"; failed=$((failed + 1)); }

# plan: from a measured profile and analytically; infeasible capacity; bad options.
expect_ok "plan from profile" "bottleneck" plan --profile-in "$work/p.h5" --stages 2 --schedule 1f1b --memopt sr --out "$work/plan.json"
grep -q '"version": 2' "$work/plan.json" && passed=$((passed + 1)) || { echo "FAIL: plan JSON lacks its version"; failed=$((failed + 1)); }
expect_ok "plan max batch" "largest micro-batch size" plan --model bert-large --device-spec a100-40gb --stages 4 --max-batch --memopt none
expect_fail "plan infeasible" "no feasible plan" plan --model gpt2-large --device-spec a100-40gb --stages 2 --device-memory 1GiB --micro-batch-size 8 \
  --schedule async --memopt sr
# Calibrated planning runs each stage of the profiled model (mlp-tiny) alone: it needs that model.
expect_ok "plan calibrated" "calibration round 1: cuts" plan --profile-in "$work/p.h5" --model mlp-tiny --stages 2 \
  --schedule 1f1b --memopt none --calibrate-rounds 2 --calibrate-steps 2 --out "$work/calibrated.json"
grep -q '"version": 2' "$work/calibrated.json" && passed=$((passed + 1)) ||
  { echo "FAIL: calibrated plan not written"; failed=$((failed + 1)); }
expect_fail "plan calibrated analytic" "--calibrate-rounds needs --profile-in" plan --model mlp-tiny \
  --device-spec a100-40gb --stages 2 --calibrate-rounds 1
expect_fail "plan calibrated, other model" "not the graph the profile was made for" plan --profile-in "$work/p.h5" \
  --model gpt2-tiny --stages 2 --calibrate-rounds 1
expect_fail "calibrate steps alone" "--calibrate-steps applies with --calibrate-rounds" plan --profile-in "$work/p.h5" \
  --stages 2 --calibrate-steps 2
expect_fail "plan calibrated max batch" "--calibrate-rounds plans one micro-batch size" plan --profile-in "$work/p.h5" \
  --model mlp-tiny --stages 2 --calibrate-rounds 1 --max-batch
expect_fail "plan without profile" "give --profile-in" plan --stages 2
expect_fail "plan unknown planner" "planner" plan --profile-in "$work/p.h5" --planner magic --stages 2
expect_fail "plan not a profile" "not a readable HDF5 profile" plan --profile-in "$work/bad.ini" --stages 2

# A plan is run as planned: its schedule and micro-batching, not the defaults; a flag that
# contradicts it, or a plan of another graph, is refused.
"$bin" plan --profile-in "$work/p.h5" --stages 2 --schedule async --memopt sr --micro-batch-size 8 --micro-batches 3 --out "$work/async8.json" >/dev/null
expect_ok "train runs the plan's settings" "micro-batch 8 x 3, sgd lr 0.01, 2 stages, async" \
  train --model mlp-tiny --plan-in "$work/async8.json" --stages 2 --in-process --steps 1
expect_fail "a flag against the plan" "--schedule 1f1b contradicts the plan (--plan-in), made for async" \
  train --model mlp-tiny --plan-in "$work/async8.json" --in-process --schedule 1f1b
expect_fail "a plan of another graph" "the plan (--plan-in) was made for another graph" \
  train --model mlp-tiny --hidden 48 --plan-in "$work/async8.json" --in-process

# Pipeline training over MPI: synchronous losses equal the reference trainer's; the
# asynchronous run equals the single-process execution of the same action lists, bitwise.
mpi="mpirun --oversubscribe -np"
common=(--model gpt2-tiny --steps 3 --micro-batches 4 --quiet)
"$bin" train "${common[@]}" >/dev/null 2>&1  # warm the page cache
ref=$("$bin" train "${common[@]/--quiet/}" --stages 1 2>/dev/null | losses)
# A user's schedule: gpipe's forwards, the backwards in reverse order.
printf '# backwards last in, first out\n0F0 0F1 0F2 0F3 0B3 0B2 0B1 0B0 0U\n1F0 1F1 1F2 1F3 1B3 1B2 1B1 1B0 1U\n2F0 2F1 2F2 2F3 2B3 2B2 2B1 2B0 2U\n' >"$work/lifo.txt"
for sched in gpipe 1f1b zb-h1 zb-h2 "file:$work/lifo.txt"; do
  got=$($mpi 3 "$bin" train "${common[@]/--quiet/}" --schedule $sched 2>"$work/err" | losses)
  if same_losses "$ref" "$got"; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL: mpirun $sched losses differ from the reference"; echo "$ref" | paste - <(echo "$got"); cat "$work/err"; fi
done
async_mpi=$($mpi 3 "$bin" train --model bert-tiny --steps 3 --schedule async --plan-out "$work/async-plan.json" 2>"$work/err" | grep '^step')
async_one=$("$bin" train --model bert-tiny --steps 3 --schedule async --stages 3 --in-process --plan-in "$work/async-plan.json" 2>&1 | grep '^step')
if [ -n "$async_mpi" ] && [ "$(echo "$async_mpi" | cut -d' ' -f1-4)" = "$(echo "$async_one" | cut -d' ' -f1-4)" ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: async over MPI differs from in-process"; echo "$async_mpi"; echo "$async_one"; cat "$work/err"; fi
# The user's schedule over MPI equals its plan run in one process, bitwise; the plan carries the
# file's actions, so the in-process run reads no file; --schedule auto beside --plan-in takes the
# plan's.
file_mpi=$($mpi 3 "$bin" train "${common[@]/--quiet/}" --schedule "file:$work/lifo.txt" --plan-out "$work/lifo-plan.json" 2>"$work/err" | grep '^step')
mv "$work/lifo.txt" "$work/lifo-moved.txt"
file_one=$("$bin" train "${common[@]/--quiet/}" --stages 3 --in-process --plan-in "$work/lifo-plan.json" --schedule auto 2>&1 | grep '^step')
mv "$work/lifo-moved.txt" "$work/lifo.txt"
if [ -n "$file_mpi" ] && [ "$(echo "$file_mpi" | cut -d' ' -f1-4)" = "$(echo "$file_one" | cut -d' ' -f1-4)" ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: a schedule file over MPI differs from in-process"; echo "$file_mpi"; echo "$file_one"; cat "$work/err"; fi
# Interleaved: two ranks of two stages each train the reference's losses; the same plan in one
# process gives them bitwise; a checkpointed run resumes to the uninterrupted run's losses; each
# rank's measured peak is within 5% of its stages replayed together.
got=$($mpi 2 "$bin" train "${common[@]/--quiet/}" --schedule interleaved --plan-out "$work/il-plan.json" 2>"$work/err" | losses)
if same_losses "$ref" "$got"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: mpirun interleaved losses differ from the reference"; echo "$ref" | paste - <(echo "$got"); cat "$work/err"; fi
# One rank of two stages holds GPT-2's tied embedding and output projection both: it sums their
# gradients itself.
got=$($mpi 1 "$bin" train "${common[@]/--quiet/}" --schedule interleaved --trace "$work/il1.h5" 2>"$work/err" | losses)
if same_losses "$ref" "$got"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: one rank of two interleaved stages"; echo "$ref" | paste - <(echo "$got"); cat "$work/err"; fi
# Two data-parallel replicas of 2 interleaved ranks, clipped by the global norm, train what one
# pipeline of twice the micro-batches does (every stage averaged before the rank's first update
# takes the norm).
norms() { grep '^step' | grep -o 'grad-norm [0-9.e+-]*' | awk '{print $2}'; }
dp=$($mpi 4 "$bin" train --model gpt2-tiny --steps 3 --micro-batches 4 --stages 2 --data-parallel 2 --schedule interleaved \
  --grad-clip 0.5 2>"$work/err")
one=$($mpi 2 "$bin" train --model gpt2-tiny --steps 3 --micro-batches 8 --schedule interleaved --grad-clip 0.5 2>>"$work/err")
if same_losses "$(echo "$one" | losses)" "$(echo "$dp" | losses)" && same_losses "$(echo "$one" | norms)" "$(echo "$dp" | norms)"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: data-parallel interleaved"; echo "$one"; echo "$dp"; cat "$work/err"; fi
il_mpi=$($mpi 2 "$bin" train "${common[@]/--quiet/}" --plan-in "$work/il-plan.json" 2>"$work/err" | grep '^step')
il_one=$("$bin" train "${common[@]/--quiet/}" --stages 2 --in-process --plan-in "$work/il-plan.json" 2>&1 | grep '^step')
if [ -n "$il_mpi" ] && grep -q '"virtual_stages": 2' "$work/il-plan.json" &&
   [ "$(echo "$il_mpi" | cut -d' ' -f1-4)" = "$(echo "$il_one" | cut -d' ' -f1-4)" ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: interleaved over MPI differs from in-process"; echo "$il_mpi"; echo "$il_one"; cat "$work/err"; fi
ilc=(train --model gpt2-tiny --schedule interleaved --micro-batches 4 --plan-in "$work/il-plan.json")
ilfull=$($mpi 2 "$bin" "${ilc[@]}" --steps 4 2>/dev/null | grep '^step' | cut -d' ' -f1-4)
$mpi 2 "$bin" "${ilc[@]}" --steps 2 --checkpoint-dir "$work/ilck" --checkpoint-every 2 --quiet >/dev/null 2>"$work/err"
ilresumed=$($mpi 2 "$bin" "${ilc[@]}" --steps 4 --checkpoint-dir "$work/ilck" --resume 2>>"$work/err" | grep '^step' | cut -d' ' -f1-4)
if [ -n "$ilresumed" ] && [ "$ilresumed" = "$(echo "$ilfull" | tail -2)" ] && [ -f "$work/ilck/step-4/stage-3.h5" ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: resumed interleaved losses differ"; echo "$ilfull"; echo "--"; echo "$ilresumed"; cat "$work/err"; fi
il_peaks=$($mpi 2 "$bin" train --model gpt2-mini --schedule interleaved --micro-batches 4 --steps 2 --memopt sr \
  --device-memory 120MiB 2>"$work/err" | grep -o 'rank [01]: measured peak .*)' | tr -d '()' |
  awk '{printf "%s %s %s %s\n", $5, $6, $8, $9}')
if [ "$(echo "$il_peaks" | wc -l)" -eq 2 ] && echo "$il_peaks" | awk '
  function mib(v, u) { return u == "KiB" ? v / 1024 : u == "GiB" ? v * 1024 : v }
  { m = mib($1, $2); p = mib($3, $4); if (m > 1.05 * p || m < 0.95 * p) bad = 1 } END { exit bad }'; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: interleaved ranks' peaks beside their replay"; echo "$il_peaks"; cat "$work/err"; fi
# Activations of 2 x 500 x 768 floats (2.9 MiB) travel as several 1 MiB chunks and a partial one:
# the two ranks' losses equal the same plan's in one process.
big=(--model gpt2-tiny --hidden 768 --heads 12 --seq-len 500 --layers 2 --vocab 512 --micro-batch-size 2 --micro-batches 2 --steps 2)
chunked_mpi=$($mpi 2 "$bin" train "${big[@]}" --plan-out "$work/big-plan.json" 2>"$work/err" | grep '^step')
chunked_one=$("$bin" train "${big[@]}" --stages 2 --in-process --plan-in "$work/big-plan.json" 2>&1 | grep '^step')
if [ -n "$chunked_mpi" ] && [ "$(echo "$chunked_mpi" | cut -d' ' -f1-4)" = "$(echo "$chunked_one" | cut -d' ' -f1-4)" ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: chunked messages differ from in-process"; echo "$chunked_mpi"; echo "$chunked_one"; cat "$work/err"; fi
# --device cuda where no GPU is visible: every rank count gets one line naming the ranks, exit 2.
for n in 1 3; do
  $mpi $n "$bin" train --model mlp-tiny --device cuda >/dev/null 2>"$work/err"
  code=$?
  if [ $code -eq 2 ] && [ "$(grep -c 'dawnpiper: error' "$work/err")" -eq 1 ] &&
     grep -q "no GPU is visible to rank" "$work/err" && grep -q "(of $n)" "$work/err"; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL: --device cuda without a GPU on $n ranks: exit $code"; cat "$work/err"; fi
done
# An in-process pipeline reports each step once every stage has finished it: every step has a
# time of its own (reported together at the end, all but the first took 0.000 s).
"$bin" train --model gpt2-tiny --stages 2 --in-process --steps 3 >"$work/out" 2>"$work/err"
if [ "$(grep -o 'time [0-9.]*s' "$work/out" | awk '$2 + 0 > 0' | wc -l)" -eq 3 ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: in-process step times"; cat "$work/out" "$work/err"; fi
# A rank that fails while training (out of memory under a cap the plan did not know) takes the
# whole job down promptly.
expect_fail "planner refuses a capacity" "no feasible plan" train --model gpt2-tiny --stages 2 --in-process --device-memory 300KiB
$mpi 2 "$bin" train --model gpt2-tiny --steps 1 --plan-out "$work/plan2.json" --quiet >/dev/null 2>&1
start=$(date +%s)
$mpi 2 "$bin" train --model gpt2-tiny --steps 2 --plan-in "$work/plan2.json" --device-memory 1500KiB >/dev/null 2>"$work/err"
code=$?
elapsed=$(( $(date +%s) - start ))
if [ $code -ne 0 ] && [ $elapsed -lt 30 ] && grep -q "error on rank [01]: stage [01], action [01][A-Z_]*[0-9]*: out of memory" "$work/err"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: failing rank: exit $code after ${elapsed}s"; cat "$work/err"; fi
# Traces: every rank's actions gathered into one HDF5 file; inspect and the plot script read it.
$mpi 3 "$bin" train "${common[@]}" --schedule 1f1b --trace "$work/trace.h5" >/dev/null 2>"$work/err"
expect_ok "inspect a trace" "schedule bound: these lists with each stage's mean pass times" inspect "$work/trace.h5"
expect_ok "inspect shows the stage balance" "busy time spread (max/min - 1) [0-9.]*%; mean efficiency" inspect "$work/trace.h5"
[ "$(grep -c '^ *[0-2]  ' "$work/out")" -eq 3 ] && h5dump -H "$work/trace.h5" | grep -q 'GROUP "actions"' &&
  passed=$((passed + 1)) || { echo "FAIL: trace lacks stages or is not HDF5"; cat "$work/out" "$work/err"; failed=$((failed + 1)); }
# Ranks wait for messages without spinning (runtime/mpi_wait.h): three ranks on this machine's
# cores, and what sending and receiving cost in CPU time is a small part of its wall time
# (measured 12% here; MPI's own blocking waits took 46-55%, or all of it with a core per rank).
$mpi 3 "$bin" train --model gpt2-tiny --steps 3 --micro-batches 4 --micro-batch-size 32 --schedule gpipe --quiet \
  --trace "$work/wait.h5" >/dev/null 2>"$work/err"
expect_ok "inspect shows the communication CPU time" "communication CPU time" inspect "$work/wait.h5"
share=$(grep -o 'receiving ([0-9.]*%)' "$work/out" | grep -o '[0-9.]*')
awk -v s="${share:-100}" 'BEGIN {exit !(s < 30)}' && passed=$((passed + 1)) ||
  { echo "FAIL: waiting for messages took ${share:-?}% CPU"; cat "$work/out"; failed=$((failed + 1)); }
# Planning from a traced run: train again with the stages' node times scaled to what it measured.
expect_ok "train calibrated by a trace" "node times scaled to what 2 traced run(s) measured" train --model gpt2-tiny \
  --steps 3 --micro-batches 4 --schedule 1f1b --in-process --stages 3 --calibrate-trace "$work/trace.h5" \
  --calibrate-trace "$work/trace.h5"
grep -q "^done:" "$work/out" && passed=$((passed + 1)) || { echo "FAIL: calibrated run did not finish"; failed=$((failed + 1)); }
expect_fail "calibrate one stage" "this run has one stage" train --model gpt2-tiny --steps 1 \
  --calibrate-trace "$work/trace.h5"
expect_fail "calibrate by another model's trace" "a trace of gpt2-tiny, not of mlp-tiny" plan --profile-in "$work/p.h5" \
  --stages 2 --calibrate-trace "$work/trace.h5"
# The same preset and node count with another vocabulary: the trace's graph fingerprint differs.
"$bin" profile --model gpt2-tiny --vocab 300 --out "$work/v300.h5" --iterations 1 --quiet >/dev/null 2>&1
expect_fail "calibrate by a trace of another graph" "a run of another graph than this profile's" plan \
  --profile-in "$work/v300.h5" --stages 2 --calibrate-trace "$work/trace.h5"
expect_fail "calibrate by a trace without a profile" "--calibrate-trace needs --profile-in" plan --model gpt2-tiny \
  --device-spec a100-40gb --stages 4 --calibrate-trace "$work/trace.h5"
expect_fail "calibrate a given plan" "--plan-in gives the plan" train --model gpt2-tiny --stages 2 --in-process \
  --plan-in "$work/plan2.json" --calibrate-trace "$work/trace.h5"
expect_fail "calibrate by a profile" "not a DawnPiper trace" train --model mlp-tiny --stages 2 --in-process \
  --calibrate-trace "$work/p.h5"
expect_fail "inspect a profile" "not a DawnPiper trace" inspect "$work/p.h5"
expect_fail "inspect without file" "give the trace file" inspect
if /usr/bin/python3 -c 'import h5py, matplotlib' 2>/dev/null; then
  /usr/bin/python3 "$root/scripts/plot_trace.py" "$work/trace.h5" --chrome-json "$work/trace.json" >/dev/null &&
    [ -s "$work/trace-timeline.png" ] && [ -s "$work/trace-memory.png" ] && [ -s "$work/trace.json" ] &&
    passed=$((passed + 1)) || { echo "FAIL: plot_trace.py"; failed=$((failed + 1)); }
fi
# Checkpoint and resume: steps 3.. of a resumed run equal the uninterrupted run's, bitwise.
full=$($mpi 3 "$bin" train --model gpt2-tiny --steps 5 --schedule gpipe --optimizer adam --lr 0.001 2>/dev/null | grep '^step' | cut -d' ' -f1-4)
$mpi 3 "$bin" train --model gpt2-tiny --steps 3 --schedule gpipe --optimizer adam --lr 0.001 --checkpoint-dir "$work/ck" \
  --checkpoint-every 2 --quiet >/dev/null 2>"$work/err"
written=$(cat "$work/ck/latest")  # after the last step, too
resumed=$($mpi 3 "$bin" train --model gpt2-tiny --steps 5 --schedule gpipe --optimizer adam --lr 0.001 --checkpoint-dir "$work/ck" \
  --resume 2>>"$work/err" | grep '^step' | cut -d' ' -f1-4)
if [ -n "$resumed" ] && [ "$resumed" = "$(echo "$full" | tail -2)" ] && [ "$written" = 3 ] && [ "$(cat "$work/ck/latest")" = 5 ]; then
  passed=$((passed + 1)); else
  echo "FAIL: resumed losses differ"; echo "$full"; echo "--"; echo "$resumed"; cat "$work/err"; failed=$((failed + 1)); fi
$mpi 3 "$bin" train --model gpt2-tiny --steps 7 --schedule gpipe --optimizer sgd --checkpoint-dir "$work/ck" --resume \
  >/dev/null 2>"$work/err"
code=$?
if [ $code -eq 2 ] && grep -q "the checkpoint in $work/ck holds the state of --optimizer adam, and this run has --optimizer sgd" "$work/err"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: resume with another optimizer (exit $code)"; cat "$work/err"; fi
# Another schedule or memopt is honoured with a new plan (on a copy: the checkpoint stays at 5);
# another micro-batch size changes the global batch: refused without --resume-override.
cp -r "$work/ck" "$work/ck-moved"
timeout 120 $mpi 3 "$bin" train --model gpt2-tiny --steps 6 --schedule 1f1b --memopt sr --optimizer adam --lr 0.001 \
  --checkpoint-dir "$work/ck-moved" --resume >"$work/out" 2>"$work/err"
code=$?
if [ $code -eq 0 ] && grep -q -- "does not serve this run (--schedule gpipe -> 1f1b, --memopt none -> sr): planning anew" "$work/out" &&
   grep -q '"memopt": "sr"' "$work/ck-moved/plan.json"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: resume with another schedule and memopt (exit $code)"; cat "$work/out" "$work/err"; fi
expect_fail "resume with another micro-batch size" \
  "changes the global batch (micro-batch size x micro-batches x replicas) 16 (4 x 4 x 1) -> 32 (8 x 4 x 1)" \
  train --model gpt2-tiny --steps 7 --micro-batch-size 8 --optimizer adam --lr 0.001 --checkpoint-dir "$work/ck" --resume
# --resume-override changes the run and says so; the optimizer state must still fit.
$mpi 3 "$bin" train --model gpt2-tiny --steps 6 --schedule gpipe --optimizer adam --lr 0.002 --checkpoint-dir "$work/ck" --resume \
  --resume-override --checkpoint-every 6 >"$work/out" 2>"$work/err"
code=$?
if [ $code -eq 0 ] && grep -q "note: --resume-override: --lr 0.001 -> 0.002" "$work/out" &&
   grep -q "resuming from the checkpoint at step 5 in $work/ck" "$work/out" && [ "$(cat "$work/ck/latest")" = 6 ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: --resume-override (exit $code)"; cat "$work/out" "$work/err"; fi
expect_ok "resume of a finished run" "nothing to do: the checkpoint in $work/ck is at step 6" train --model gpt2-tiny \
  --steps 6 --optimizer adam --lr 0.002 --checkpoint-dir "$work/ck" --resume
# --eval-only: the checkpoint's weights (its optimizer, whatever --optimizer says), nothing trained.
if $mpi 3 "$bin" train --model gpt2-tiny --eval-batches 2 --eval-only --checkpoint-dir "$work/ck" --resume >"$work/out" 2>"$work/err" &&
   grep -q "^validation loss [0-9.]*: the mean of 2 micro-batches of the validation split, weights of the checkpoint at step 6 in" "$work/out" &&
   ! grep -q "^step" "$work/out" && [ "$(cat "$work/ck/latest")" = 6 ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: --eval-only of a checkpoint"; cat "$work/out" "$work/err"; fi
expect_fail "bad progress style" "--progress: unknown progress style 'fancy' (choose auto, bar or lines)" train --model mlp-tiny --progress fancy
# One name for the memory per rank, as train's: plan's former --memory is refused.
expect_fail "plan names the memory as train does" "unrecognised option '--memory'" plan --model mlp-tiny \
  --device-spec a100-40gb --stages 2 --memory 1GiB --out "$work/two-sizes.json"
expect_fail "graph takes no device memory" "unrecognised option '--device-memory'" graph --model mlp-tiny --device-memory 1GiB
# A subcommand accepts only the options it uses.
expect_fail "graph takes no seed" "unrecognised option '--seed'" graph --model mlp-tiny --seed 3
expect_fail "graph takes no weights" "unrecognised option '--init-from'" graph --model mlp-tiny --init-from w.safetensors
expect_fail "profile takes no micro-batch count" "unrecognised option '--micro-batches'" profile --model mlp-tiny \
  --micro-batches 8 --out "$work/unused.h5"
expect_fail "run-stage takes no --quiet" "unrecognised option '--quiet'" run-stage --plan "$work/plan2.json" \
  --stage 0 --quiet
expect_fail "profile at two batch sizes" "--batch-sizes profiles at its first size, 2, not --micro-batch-size 8" \
  profile --model mlp-tiny --micro-batch-size 8 --batch-sizes 2,4 --out "$work/unused.h5"
expect_fail "analytic profile measures nothing" "--iterations sets how nodes are measured; --analytic measures none" \
  profile --model mlp-tiny --analytic --device-spec a100-40gb --iterations 9 --out "$work/unused.h5"
expect_fail "plan from a profile builds no model" "--layers selects the model that --calibrate-rounds runs" \
  plan --profile-in "$work/p.h5" --stages 2 --layers 3
expect_fail "plan from two profiles" "--profile-in and --device-spec both give the profile to plan from: give one" \
  plan --profile-in "$work/p.h5" --device-spec a100-40gb --stages 2
expect_fail "a given plan is not made" "--profile-in shapes the plan a run makes; --plan-in gives one made before" \
  train --model gpt2-tiny --plan-in "$work/plan2.json" --profile-in "$work/p.h5"
if "$bin" graph --model mlp-tiny --nodes >"$work/out" 2>&1 && grep -q "^    0 " "$work/out" && ! grep -q "^nodes " "$work/out" &&
   "$bin" graph --model mlp-tiny --nodes --summary >"$work/out" 2>&1 && grep -q "^nodes        " "$work/out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: graph --nodes [--summary]"; cat "$work/out"; fi
expect_ok "graph names the precision" "model        gpt2-tiny (gpt2), micro-batch 4, bf16" graph --model gpt2-tiny --precision bf16
# One rank: a plan written out comes from the runtime's path (the reference trainer makes none).
expect_ok "one rank writes its plan" "step 1 loss" train --model mlp-tiny --steps 2 --plan-out "$work/one.json"
[ -s "$work/one.json" ] && passed=$((passed + 1)) || { failed=$((failed + 1)); echo "FAIL: train --plan-out on one rank wrote no plan"; }
expect_fail "headroom without memory" "--allocator-headroom is a share of the device memory: give --device-memory too" \
  train --model mlp-tiny --allocator-headroom 5%
# On CUDA the GPU's free memory is the default budget: the headroom is accepted (this machine has no GPU).
expect_fail "headroom of a GPU's default memory" "--device cuda: no GPU is visible to rank 0 (of 1)" \
  train --model mlp-tiny --allocator-headroom 5% --device cuda
expect_ok "train names its memory" "memory: 1.00 GiB per rank (--device-memory); the plan fills up to 1.00 GiB of it" \
  train --model mlp-tiny --steps 1 --stages 2 --in-process --device-memory 1GiB
expect_fail "bad headroom" "--allocator-headroom '60%': give a share between 0 and 50%" plan --model mlp-tiny \
  --device-spec a100-40gb --stages 2 --allocator-headroom 60%
expect_ok "plan leaves headroom" "capacity 36.00 GiB (+ 4.00 GiB left to the allocator)" plan --model mlp-tiny \
  --device-spec a100-40gb --stages 2 --schedule async --memopt sr --device-memory 40GiB --allocator-headroom 10%
expect_fail "bad data order" "--data-order: unknown data order 'random' (choose shuffled or sequential)" train --model mlp-tiny --data-order random
expect_fail "bad transport" "--transport: unknown transport 'tcp' (choose auto, mpi, nccl or host)" train --model mlp-tiny --transport tcp
# Profile cache: a second run plans from the first run's profile (the same split); another
# micro-batch size is another profile; a damaged cache file is measured again.
cached() { $mpi 2 "$bin" train --model gpt2-tiny --steps 1 --profile-cache "$work/cache" "$@" 2>>"$work/err"; }
first=$(cached)
second=$(cached)
other=$(cached --micro-batch-size 8)
if echo "$first" | grep -q "profile: measured, kept in $work/cache/profile-[0-9a-f]*.h5" &&
   echo "$second" | grep -q "profile: $work/cache/profile-[0-9a-f]*.h5 (cached" &&
   [ -n "$(echo "$first" | grep 'nodes \[')" ] &&
   [ "$(echo "$first" | grep 'nodes \[')" = "$(echo "$second" | grep 'nodes \[')" ] &&
   echo "$other" | grep -q "profile: measured" && [ "$(ls "$work/cache" | wc -l)" = 2 ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: profile cache"; echo "$first"; echo "$second"; cat "$work/err"; fi
for f in "$work"/cache/*.h5; do truncate -s 100 "$f"; done
if cached | grep -q "profile: measured, kept in"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: damaged profile cache"; cat "$work/err"; fi
# A truncated stage file: the error names the file and what to do, not "internal error".
cp -r "$work/ck" "$work/ck-cut"
truncate -s 3000 "$work/ck-cut/step-$(cat "$work/ck-cut/latest")/stage-1.h5"
$mpi 3 "$bin" train --model gpt2-tiny --steps 8 --schedule gpipe --optimizer adam --lr 0.002 --checkpoint-dir "$work/ck-cut" \
  --resume >/dev/null 2>"$work/err"
code=$?
if [ $code -eq 2 ] && grep -q "checkpoint file '$work/ck-cut/step-[0-9]*/stage-1.h5' is truncated or corrupt" "$work/err" &&
   ! grep -q "internal error" "$work/err"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: truncated checkpoint (exit $code)"; cat "$work/err"; fi
expect_fail "unknown schedule on one stage" "unknown schedule 'zigzag' (choose gpipe, 1f1b, async, zb-h1, zb-h2 or interleaved, auto or file:PATH)" \
  train --model mlp-tiny --steps 1 --schedule zigzag
# Stage 0 sends every activation ahead while stage 1 returns gradients: each waits on the other's
# send, so the file is refused before anything runs.
printf '0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3 0U\n1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 1U\n' >"$work/dead.txt"
expect_fail "a schedule file that deadlocks" "waits at its next action: 0SEND_F3 1SEND_B1" \
  train --model mlp-tiny --steps 1 --schedule "file:$work/dead.txt"
printf '0F0 0B0 0U\n1B0 1F0 1U\n' >"$work/early.txt"
expect_fail "a schedule file's backward before its forward" "stage 1, action 1B0: backward before its forward" \
  plan --model mlp-tiny --device-spec a100-40gb --stages 2 --memopt sr --schedule "file:$work/early.txt"
expect_fail "a schedule file for other micro-batches, before profiling" "runs 4 micro-batches per step; the run has 2" \
  train --model mlp-tiny --steps 1 --micro-batches 2 --schedule "file:$work/lifo.txt"
expect_fail "a schedule file for other stages" "has lists for 3 stages; the run has 2" \
  plan --model mlp-tiny --device-spec a100-40gb --stages 2 --micro-batches 4 --memopt sr --schedule "file:$work/lifo.txt"
expect_fail "a plan of another schedule" "--schedule gpipe contradicts the plan (--plan-in), made for file:" \
  train "${common[@]}" --stages 3 --in-process --plan-in "$work/lifo-plan.json" --schedule gpipe
# (The measured profile decides which; the schedule kept in the table is the one that trains.)
auto_out=$("$bin" train --model gpt2-tiny --steps 1 --micro-batches 4 --stages 3 --in-process --schedule auto 2>&1)
kept=$(echo "$auto_out" | awk '/<- kept/ {print $1}')
if [ -n "$kept" ] && echo "$auto_out" | grep -q "3 stages, $kept\$"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: train --schedule auto runs the schedule it kept"; echo "$auto_out"; fi
expect_fail "virtual stages on a schedule that does not interleave" "only interleaved does (the schedule is 1f1b)" \
  plan --model gpt2-tiny --device-spec a100-40gb --stages 2 --schedule 1f1b --virtual-stages 2
expect_fail "interleaved micro-batches in groups of the ranks" "--micro-batches 3 is not a multiple of the 2 ranks" \
  plan --model gpt2-tiny --device-spec a100-40gb --stages 2 --micro-batches 3 --schedule interleaved
expect_fail "more virtual stages than the graph has nodes" "cannot split 65 nodes into 80 stages (2 ranks x --virtual-stages 40)" \
  plan --model gpt2-tiny --device-spec a100-40gb --stages 2 --micro-batches 4 --schedule interleaved --virtual-stages 40
expect_fail "an interleaved plan on other ranks" "--stages 4 contradicts the plan (--plan-in), made for 2" \
  train "${common[@]}" --stages 4 --in-process --plan-in "$work/il-plan.json"
# A split backward cannot run a stage where GPT-2's tied embedding feeds its output projection.
expect_fail "zb-h1 on a stage whose tied weight's readers feed each other" \
  "stage 0 cannot split its backward (zb-h1): wte and lm_head read one weight" \
  plan --model gpt2-tiny --device-spec a100-40gb --stages 1 --schedule zb-h1 --memopt sr
# Interleaving's two stages per rank halve 1F1B's bubble: a faster step than zb-h1's W filling it.
expect_ok "--schedule auto prints what it chose from" "interleaved .*<- kept" \
  plan --model gpt2-tiny --device-spec a100-40gb --stages 4 --micro-batches 8 --schedule auto --memopt none
expect_fail "resume without checkpoint" "no complete checkpoint" train --model gpt2-tiny --steps 2 --checkpoint-dir "$work/none" --resume
# Asynchronous checkpoints: the pipeline drains every K steps and writes them there; a resumed
# run (same K, same split) reproduces the uninterrupted run's losses bitwise.
acommon=(train --model gpt2-tiny --schedule async --micro-batches 3 --optimizer adam --lr 0.001 --checkpoint-every 2)
afull=$($mpi 3 "$bin" "${acommon[@]}" --steps 6 --checkpoint-dir "$work/ack-full" 2>/dev/null | grep '^step' | cut -d' ' -f1-4)
$mpi 3 "$bin" "${acommon[@]}" --steps 4 --checkpoint-dir "$work/ack" --plan-in "$work/ack-full/plan.json" --quiet >/dev/null 2>"$work/err"
aresumed=$($mpi 3 "$bin" "${acommon[@]}" --steps 6 --checkpoint-dir "$work/ack" --resume 2>>"$work/err" | grep '^step' | cut -d' ' -f1-4)
if [ -n "$aresumed" ] && [ "$aresumed" = "$(echo "$afull" | tail -2)" ] && [ "$(cat "$work/ack/latest")" = 6 ] &&
   [ "$(echo "$afull" | wc -l)" -eq 6 ]; then
  passed=$((passed + 1)); else
  echo "FAIL: resumed async losses differ"; echo "$afull"; echo "--"; echo "$aresumed"; cat "$work/err"; failed=$((failed + 1)); fi
# Stage replay: one stage of a plan alone, stand-in inputs.
expect_ok "run a stage alone" "peak memory: measured" run-stage --plan "$work/plan2.json" --stage 1 --steps 2
expect_fail "run a missing stage alone" "the plan has stages 0..1" run-stage --plan "$work/plan2.json" --stage 2
# A NaN loss on the last stage ends the job with the step, stage and action named.
$mpi 2 "$bin" train --model gpt2-tiny --lr 1e9 --steps 6 --quiet >/dev/null 2>"$work/err"
code=$?
if [ $code -ne 0 ] && grep -q "error on rank 1: stage 1, action 1[FB][0-9]*: loss is nan at step [0-9]" "$work/err"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: NaN loss (exit $code)"; cat "$work/err"; fi
expect_fail "stages vs ranks" "launch with" train --model mlp-tiny --stages 3
expect_fail "unknown transport" "unknown transport 'tcp'" train --model mlp-tiny --transport tcp
expect_fail "nccl on the cpu" "use it with --device cuda" train --model mlp-tiny --transport nccl
# Host staging (what CUDA ranks sharing a GPU use) routes each link through its own MPI
# transport; on the CPU its copies are no-ops, so the losses equal plain MPI's to the last digit.
tcommon=(train --model gpt2-tiny --steps 3 --schedule 1f1b --micro-batches 4 --progress lines)
$mpi 3 "$bin" "${tcommon[@]}" >"$work/t_mpi.out" 2>&1
$mpi 3 "$bin" "${tcommon[@]}" --transport host >"$work/t_host.out" 2>&1
if grep -q "transport: 0-1 host, 1-2 host on cpu" "$work/t_host.out" && grep -q "transport: mpi on cpu" "$work/t_mpi.out" &&
   [ "$(grep -c 'step [0-9]* loss' "$work/t_host.out")" -ge 3 ] &&
   diff <(grep -o 'step [0-9]* loss [0-9.]*' "$work/t_mpi.out") <(grep -o 'step [0-9]* loss [0-9.]*' "$work/t_host.out") >/dev/null; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: host-staged transport"; cat "$work/t_host.out"; fi

# Planned memory optimization at run time. A 1f1b plan of gpt2-tiny on 2 stages that has to
# recompute (r) or swap and recompute (sr): the first of 2.7, 2.6, ... 2.2 MiB whose plan evicts
# and whose split, keeping every tensor, needs more than its cap (the split, and so the peaks,
# depend on the profile's timings). The cap is the plan's replayed peak + 3%; the same split
# keeping every tensor ("keep": the decisions rewritten) must run out of memory under it.
"$bin" profile --model gpt2-tiny --micro-batch-size 4 --out "$work/g.h5" --quiet >/dev/null 2>&1
common=(--model gpt2-tiny --schedule 1f1b --micro-batches 4 --steps 3 --progress lines)
for memopt in r sr; do
  cap=none
  for capacity in 2.7 2.6 2.5 2.4 2.3 2.2; do
    "$bin" plan --profile-in "$work/g.h5" --stages 2 --schedule 1f1b --micro-batches 4 --optimizer sgd \
      --memopt $memopt --device-memory ${capacity}MiB --out "$work/$memopt.json" >/dev/null 2>&1 || continue
    grep -q '"action": "\(swap\|recompute\)"' "$work/$memopt.json" || continue
    cap=$(python3 -c 'import json, sys
stages = json.load(open(sys.argv[1]))["stages"]
cap = max(s["memory"]["replayed_peak"] for s in stages) * 1.03
keep = max(s["replayed_peak_without_memopt"] for s in stages)
print(f"{int(cap) // 1024 + 1}KiB" if keep > 1.02 * cap else "none")' "$work/$memopt.json")
    [ "$cap" = none ] || break
  done
  if [ "$cap" = none ]; then
    failed=$((failed + 1)); echo "FAIL: no $memopt plan from 2.7 to 2.2 MiB needs its evictions"; continue; fi
  keep_all "$work/$memopt.json" "$work/$memopt-keep.json"
  $mpi 2 "$bin" train "${common[@]}" --plan-in "$work/$memopt.json" --device-memory "$cap" >"$work/opt.out" 2>&1
  code_opt=$?
  $mpi 2 "$bin" train "${common[@]}" --plan-in "$work/$memopt-keep.json" >"$work/keep.out" 2>&1
  $mpi 2 "$bin" train "${common[@]}" --plan-in "$work/$memopt-keep.json" --device-memory "$cap" >/dev/null 2>"$work/oom.err"
  code_oom=$?
  # Same losses to the last printed digit; fits with, out of memory without.
  if [ $code_opt -eq 0 ] && diff <(grep -o 'step [0-9]* loss [0-9.]*' "$work/opt.out") \
                                  <(grep -o 'step [0-9]* loss [0-9.]*' "$work/keep.out") >/dev/null &&
     [ "$(grep -c 'loss' "$work/opt.out")" -ge 3 ]; then
    passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $memopt changes the losses or does not fit"; cat "$work/opt.out"; fi
  if [ $code_oom -ne 0 ] && grep -q "out of memory: cannot allocate" "$work/oom.err"; then
    passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $memopt keep-all run fits $cap"; cat "$work/oom.err"; fi
  # Measured peak never above the (replayed) prediction, and within 5% of it on the stages that
  # evict (on the others a send MPI completes before the next one frees its buffer earlier than
  # the replay assumes: up to one message below, by timing); the measured drop from the
  # keep-all run at least 90% of the drop the planner predicts (replayed without and with).
  if python3 - "$work/$memopt.json" "$work/opt.out" "$work/keep.out" <<'PY'
import json, re, sys
plan = json.load(open(sys.argv[1]))
def measured(path):
    unit = {"KiB": 1024, "MiB": 1 << 20}
    return {int(m[0]): (float(m[1]) * unit[m[2]], float(m[3]) * unit[m[4]]) for m in re.findall(
        r"stage (\d): measured peak ([\d.]+) (KiB|MiB) \(predicted ([\d.]+) (KiB|MiB)\)", open(path).read())}
opt, keep = measured(sys.argv[2]), measured(sys.argv[3])
ok, dropped = len(opt) == 2 and len(keep) == 2, False
for s in plan["stages"]:
    x = s["index"]
    mo, po = opt[x]
    predicted_drop = s["replayed_peak_without_memopt"] - s["memory"]["replayed_peak"]
    ok &= mo <= 1.005 * po
    if predicted_drop > 0:
        dropped = True
        ok &= abs(mo / po - 1) <= 0.05
        ok &= keep[x][0] - mo >= 0.9 * predicted_drop
    print(f"stage {x}: measured {mo:.0f} predicted {po:.0f}; drop measured {keep[x][0] - mo:.0f} predicted {predicted_drop}")
sys.exit(0 if ok and dropped else 1)
PY
  then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $memopt peaks vs predictions"; fi
done

# Data x pipeline parallelism: 2 replicas x 2 stages train what one pipeline of twice the
# micro-batches trains (within 1e-5: the gradient sums are ordered differently); under async,
# what one pipeline of twice the micro-batch size trains (dropout off: its masks are drawn per
# micro-batch). Checkpoints are written once per stage, and a resumed run repeats the
# uninterrupted one bitwise; the trace shows the allreduce.
for sched in gpipe 1f1b; do
  ref=$("$bin" train --model gpt2-tiny --steps 3 --micro-batches 8 --stages 2 --in-process --planner even --schedule $sched 2>&1 | losses)
  got=$($mpi 4 "$bin" train --model gpt2-tiny --steps 3 --micro-batches 4 --data-parallel 2 --planner even --schedule $sched 2>&1 | losses)
  if same_losses "$ref" "$got"; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL: data-parallel $sched"; paste <(echo "$ref") <(echo "$got"); fi
done
ref=$("$bin" train --model gpt2-tiny --dropout 0 --steps 3 --micro-batch-size 8 --stages 2 --in-process --planner even --schedule async 2>&1 | losses)
got=$($mpi 4 "$bin" train --model gpt2-tiny --dropout 0 --steps 3 --micro-batch-size 4 --data-parallel 2 --planner even --schedule async 2>&1 | losses)
if same_losses "$ref" "$got"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: data-parallel async"; paste <(echo "$ref") <(echo "$got"); fi
dp=(train --model gpt2-tiny --micro-batches 4 --data-parallel 2 --planner even --optimizer adam --lr 0.001)
dfull=$($mpi 4 "$bin" "${dp[@]}" --steps 5 2>/dev/null | grep '^step' | cut -d' ' -f1-4)
$mpi 4 "$bin" "${dp[@]}" --steps 3 --checkpoint-dir "$work/dck" --checkpoint-every 2 --quiet >/dev/null 2>&1
dres=$($mpi 4 "$bin" "${dp[@]}" --steps 5 --checkpoint-dir "$work/dck" --resume --trace "$work/dp.h5" 2>&1 | grep '^step' | cut -d' ' -f1-4)
if [ -n "$dres" ] && [ "$dres" = "$(echo "$dfull" | tail -2)" ] && [ "$(ls "$work/dck/step-5")" = "$(printf 'manifest.json\nstage-0.h5\nstage-1.h5')" ]; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: data-parallel checkpoint"; echo "$dfull"; echo "$dres"; ls "$work/dck/step-5"; fi
expect_ok "inspect a data-parallel trace" "2 data-parallel replicas .* gradient allreduce per stage" inspect "$work/dp.h5"
$mpi 4 "$bin" train --model gpt2-tiny --stages 3 >/dev/null 2>"$work/err"
if [ $? -ne 0 ] && grep -q "launch with \`mpirun -np 3\` (or a multiple of it for data parallelism" "$work/err"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: ranks not a multiple of the stages"; cat "$work/err"; fi
$mpi 4 "$bin" train --model gpt2-tiny --stages 2 --data-parallel 3 >/dev/null 2>"$work/err"
if [ $? -ne 0 ] && grep -q "data-parallel 3 x 2 stages needs 6 MPI ranks, but 4 are launched" "$work/err"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: data-parallel x stages beyond the world"; cat "$work/err"; fi
# An error every rank hits is printed once, by rank 0, and the job ends without MPI_Abort.
$mpi 2 "$bin" train --model gpt2-tiny --schedule zigzag >/dev/null 2>"$work/err"
code=$?
if [ $code -eq 2 ] && [ "$(grep -c "unknown schedule 'zigzag'" "$work/err")" -eq 1 ] &&
   grep -q "^dawnpiper: error: configuration error: --schedule" "$work/err" && ! grep -q "MPI_ABORT\|ORTE_ERROR_LOG" "$work/err"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: an error on every rank (exit $code)"; cat "$work/err"; fi
expect_fail "data parallelism in one process" "--data-parallel needs MPI ranks" train --model mlp-tiny --in-process --data-parallel 2
# A replica that fails takes the whole job down promptly, naming the rank, stage and replica.
start=$(date +%s)
$mpi 4 "$bin" train --model gpt2-tiny --data-parallel 2 --planner even --lr 1e9 --steps 6 --quiet >/dev/null 2>"$work/err"
code=$?
if [ $code -ne 0 ] && [ $(( $(date +%s) - start )) -lt 30 ] && grep -q "stage 1 of replica [01], action 1[FB][0-9]*: loss is nan" "$work/err" &&
   ! grep -qi "segmentation fault" "$work/err"; then  # (6 of 18 runs, when the allreduces in flight lost their buffers)
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: failing replica (exit $code)"; cat "$work/err"; fi

# Signals: the run stops where a step ends, writes a checkpoint, says so and exits 128 + the signal;
# resumed, it trains what the uninterrupted run trains, bitwise (mpirun forwards SIGUSR1 as is).
stopped_run() {  # stopped_run SIGNAL LAUNCHER...: starts the run, signals it after step 2, waits
  local signal=$1
  shift
  "$@" --model gpt2-tiny --steps 300 --optimizer adam --lr 0.001 --checkpoint-dir "$work/sig" --progress lines \
    >"$work/sig.out" 2>"$work/sig.err" &
  local pid=$!
  for _ in $(seq 300); do grep -q '^step 2 ' "$work/sig.out" 2>/dev/null && break; sleep 0.1; done
  kill -"$signal" $pid
  wait $pid
}
rm -rf "$work/sig"
stopped_run USR1 $mpi 2 "$bin" train
code=$?
stopped_at=$(cat "$work/sig/latest" 2>/dev/null)  # the resumed run moves it to its last step
at=$(sed -n 's/^stopped by SIGUSR1 after step \([0-9]*\) (exit 138): checkpoint .*sig\/step-[0-9]* written; continue with the same command and --resume$/\1/p' "$work/sig.out")
end=$((${at:-0} + 4))
signal_full=$($mpi 2 "$bin" train --model gpt2-tiny --steps $end --optimizer adam --lr 0.001 2>/dev/null | grep '^step' | cut -d' ' -f1-4)
signal_resumed=$($mpi 2 "$bin" train --model gpt2-tiny --steps $end --optimizer adam --lr 0.001 --checkpoint-dir "$work/sig" \
  --resume 2>>"$work/sig.err" | grep '^step' | cut -d' ' -f1-4)
if [ $code -eq 138 ] && [ -n "$at" ] && [ "$stopped_at" = $((at + 1)) ] && [ -n "$signal_resumed" ] &&
   [ "$signal_resumed" = "$(echo "$signal_full" | tail -3)" ]; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: stop on SIGUSR1 and resume (exit $code, stopped after step '$at')"
  cat "$work/sig.out" "$work/sig.err"; echo "$signal_full"; echo "--"; echo "$signal_resumed"; fi
# One process, Ctrl-C: the same stop, exit 130, and no checkpoint without --checkpoint-dir.
"$bin" train --model gpt2-tiny --steps 300 --progress lines >"$work/sig.out" 2>&1 &
pid=$!
for _ in $(seq 300); do grep -q '^step 2 ' "$work/sig.out" 2>/dev/null && break; sleep 0.1; done
kill -INT $pid
wait $pid
code=$?
if [ $code -eq 130 ] && grep -q "^stopped by SIGINT after step [0-9]* (exit 130): no checkpoint written (give --checkpoint-dir" "$work/sig.out" &&
   grep -q "^stopped: [0-9]* steps" "$work/sig.out"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: one process stopped by SIGINT (exit $code)"; cat "$work/sig.out"; fi

# Training recipes: bad values are one line before any work; metrics are JSON lines a plot reads.
expect_fail "grad clip under async" "under --schedule async each stage updates after every backward" train --model mlp-tiny --schedule async --grad-clip 1
expect_fail "unknown lr schedule" "unknown learning-rate schedule 'cosine-annealing' (choose constant, cosine or linear)" \
  train --model mlp-tiny --lr-schedule cosine-annealing
expect_fail "min lr of a constant schedule" "a constant schedule has none" train --model mlp-tiny --min-lr 0.001
expect_fail "min lr above lr" "--min-lr 0.500000 must be in \[0, --lr 0.010000\]" train --model mlp-tiny --lr-schedule cosine --min-lr 0.5
expect_fail "negative weight decay" "--weight-decay must not be negative" train --model mlp-tiny --weight-decay -1
expect_ok "adamw, cosine, clipping" "adamw lr 0.002 (cosine after 2 warmup steps to 0.0002), weight decay 0.1, grad clip 1" \
  train --model gpt2-tiny --steps 4 --optimizer adamw --lr 0.002 --weight-decay 0.1 --lr-schedule cosine --warmup-steps 2 \
  --min-lr 0.0002 --grad-clip 1 --metrics-out "$work/metrics.jsonl" --eval-every 2
if [ "$(grep -c '"kind":"train"' "$work/metrics.jsonl")" = 4 ] && [ "$(grep -c '"kind":"validation"' "$work/metrics.jsonl")" = 2 ] &&
   grep -q '"step":1,"loss":[0-9.]*,"lr":0.001,"grad_norm":[0-9.]*,"step_s"' "$work/metrics.jsonl" &&
   grep -q '"model_flops_per_s":[0-9.e+]*[,}]' "$work/metrics.jsonl"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: --metrics-out"; cat "$work/metrics.jsonl"; fi
if /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  /usr/bin/python3 "$root/scripts/plot_metrics.py" "$work/metrics.jsonl" --out "$work/metrics.png" >/dev/null && [ -s "$work/metrics.png" ] &&
    passed=$((passed + 1)) || { echo "FAIL: plot_metrics.py"; failed=$((failed + 1)); }
fi
# Threads: OMP_NUM_THREADS (the tests' 1), else --threads, said once; checks come before any work.
# Model FLOP/s after the first step; the CPU has no peak to give an MFU against.
expect_ok "model FLOPs reported" "model FLOPs: [0-9.e+-]* TFLOP/s after the first step (no peak known for this device)" \
  train --model gpt2-tiny --steps 3
expect_ok "threads from OMP_NUM_THREADS" "threads: 1 per rank (OMP_NUM_THREADS)" train --model mlp-tiny --steps 1
expect_ok "threads from --threads" "threads: 2 per rank (--threads)" train --model mlp-tiny --steps 1 --threads 2
if env -u OMP_NUM_THREADS $mpi 2 "$bin" train --model mlp-tiny --steps 1 2>&1 |
   grep -q "threads: [1-9][0-9]* per rank ($(nproc --all) cores / 2 ranks on the node)"; then  # (mpirun may bind a rank to fewer)
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: threads shared by the ranks on a node"; fi
expect_fail "a missing token file, before profiling" "token file $work/tokens-misspelled.bin: no such file" \
  train --model gpt2-tiny --data "$work/tokens-misspelled.bin"
expect_fail "a missing --init-from" "--init-from $work/none.safetensors: no such file" \
  train --model gpt2-tiny --init-from "$work/none.safetensors"
expect_ok "--save-weights DIR is made" "wrote weights $work/out-dir/a/model.safetensors" train --model mlp-tiny --steps 1 \
  --save-weights "$work/out-dir/a"
if $mpi 2 "$bin" train --model gpt2-tiny --steps 1 --schedule async 2>&1 | grep -q "note: wte.weight is tied across stages 0 and 1; under async"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: one tied-weight note per group of stages"; fi
# What the plan evicts is one line per stage in the header. No cut fits 2.4 MiB without evicting
# (memopt none needs 2.59 MiB; sizes, not times), but the cuts follow the measured profile, so
# the plan may swap, recompute or both.
$mpi 2 "$bin" train --model gpt2-tiny --steps 1 --memopt sr --device-memory 2.4MiB >"$work/out" 2>&1
if grep -qE "^  stage [01]: nodes \[[0-9]+, [0-9]+\), predicted peak [0-9.]+ MiB, (swaps|recomputes) [0-9.]+ [KM]iB.* of each micro-batch's activations \(\+[0-9.]+ ms, [0-9]+%\)$" "$work/out"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: the header's swap/recompute summary"; cat "$work/out"; fi
# A decaying schedule ends at --steps: a resumed run may not move it.
$mpi 2 "$bin" train --model gpt2-tiny --steps 3 --lr-schedule cosine --checkpoint-dir "$work/cos" --checkpoint-every 2 --quiet >/dev/null 2>&1
$mpi 2 "$bin" train --model gpt2-tiny --steps 5 --lr-schedule cosine --checkpoint-dir "$work/cos" --resume >/dev/null 2>"$work/err"
code=$?
if [ $code -eq 2 ] && grep -q "this one changes --steps 3 -> 5" "$work/err"; then passed=$((passed + 1)); else
  failed=$((failed + 1)); echo "FAIL: resume moving a cosine schedule's end (exit $code)"; cat "$work/err"; fi

# --checkpoint-dir alone writes a checkpoint after the last step and says so, in one process (one
# stage), over MPI and under async; --resume trains on from it.
expect_ok "a final checkpoint in one process" "wrote checkpoint $work/final1/step-2" train --model mlp-tiny --steps 2 \
  --checkpoint-dir "$work/final1"
[ "$(cat "$work/final1/latest" 2>/dev/null)" = 2 ] && passed=$((passed + 1)) ||
  { echo "FAIL: no final checkpoint in one process"; ls -R "$work/final1"; failed=$((failed + 1)); }
for sched in 1f1b async; do
  $mpi 2 "$bin" train --model gpt2-tiny --steps 2 --schedule $sched --checkpoint-dir "$work/final-$sched" \
    >"$work/out" 2>"$work/err"
  if [ "$(cat "$work/final-$sched/latest" 2>/dev/null)" = 2 ] && grep -q "wrote checkpoint $work/final-$sched/step-2" "$work/out" &&
     $mpi 2 "$bin" train --model gpt2-tiny --steps 3 --schedule $sched --checkpoint-dir "$work/final-$sched" --resume \
       >"$work/out" 2>>"$work/err" && grep -q "resuming from the checkpoint at step 2" "$work/out" &&
     grep -q "^step 2 " "$work/out" && [ "$(cat "$work/final-$sched/latest")" = 3 ]; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL: --checkpoint-dir alone under $sched"; cat "$work/out" "$work/err"; fi
done
expect_fail "checkpoints in one process of several stages" "--trace and --checkpoint-dir apply to MPI runs" \
  train --model mlp-tiny --stages 2 --in-process --checkpoint-dir "$work/never"

# plan and train share their planning defaults: a plan made with none of them given is the plan
# train makes by default (1f1b, no memory optimization), and runs with no flag; plan in one
# process needs --stages, under mpirun it takes the ranks as train does.
expect_ok "plan with train's defaults" "bottleneck" plan --profile-in "$work/p.h5" --stages 2 --out "$work/defaults.json"
if python3 -c 'import json, sys
p = json.load(open(sys.argv[1]))
o = p["inputs"]
sys.exit(0 if o["schedule"] == "1f1b" and o["memopt"] == "none" and p["planner"] == "dawnpiper" and len(p["stages"]) == 2 else 1)' \
  "$work/defaults.json"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: plan's defaults"; head -30 "$work/defaults.json"; fi
expect_ok "train runs a default plan with its own defaults" "2 stages, 1f1b" train --model mlp-tiny --stages 2 --in-process \
  --steps 1 --plan-in "$work/defaults.json" --schedule 1f1b --memopt none
expect_fail "plan in one process needs --stages" "give --stages L: \`plan\` runs in one process" plan --profile-in "$work/p.h5"
$mpi 2 "$bin" plan --profile-in "$work/p.h5" --out "$work/ranks.json" >/dev/null 2>"$work/err"
if python3 -c 'import json, sys; sys.exit(0 if len(json.load(open(sys.argv[1]))["stages"]) == 2 else 1)' "$work/ranks.json"; then
  passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: plan under mpirun -np 2 plans 2 stages"; cat "$work/err"; fi

# Mistakes found before any work, each one line, exit 2 (once under MPI).
one_error() {  # one_error NAME PATTERN COMMAND...: exit 2, one error line with PATTERN, nothing planned
  local name="$1" pattern="$2"
  shift 2
  "$@" >"$work/out" 2>"$work/err"
  local code=$?
  if [ $code -eq 2 ] && [ "$(grep -c 'dawnpiper: error' "$work/err")" -eq 1 ] && grep -q -- "$pattern" "$work/err" &&
     ! grep -q "^training " "$work/out"; then passed=$((passed + 1)); else
    failed=$((failed + 1)); echo "FAIL: $name (exit $code)"; cat "$work/out" "$work/err"; fi
}
one_error "more replicas than ranks" "--data-parallel 3 needs a multiple of 3 MPI ranks .*, but 2 are launched" \
  $mpi 2 "$bin" train --model gpt2-tiny --data-parallel 3
# A token file whose ids lie beyond gpt2-tiny's vocabulary: refused by rank 0 before it profiles.
python3 -c 'import json, sys
ids = [i % 60000 for i in range(0, 400000, 7)]
open(sys.argv[1], "wb").write(b"".join(i.to_bytes(2, "little") for i in ids))
json.dump({"format": "dawnpiper-tokens", "version": 1, "dtype": "uint16", "tokens": len(ids), "vocab_size": 65536},
          open(sys.argv[1] + ".json", "w"))' "$work/wide.bin"
one_error "token ids beyond the vocabulary" "token file '$work/wide.bin' holds id [0-9]* at offset [0-9]*, outside" \
  $mpi 2 "$bin" train --model gpt2-tiny --data "$work/wide.bin"
expect_fail "no steps" "--steps must be at least 1" train --model mlp-tiny --steps 0
expect_fail "momentum under adamw" "--momentum is SGD's; --optimizer adamw keeps moving averages of its own" \
  train --model mlp-tiny --optimizer adamw --momentum 0.5
expect_fail "eval batches without evaluations" "--eval-batches sizes each validation, and this run has none" \
  train --model mlp-tiny --eval-batches 2
expect_ok "--seed says what it seeds" "seed for a preset's initial parameters" train --help
expect_ok "--help lists choices with their meanings, from the enum tables" "none | r (recompute) | sr (swap +" train --help
expect_ok "--help lists data orders with their meanings" "| sequential (sample i of the" train --help

leftovers=$(find "$work" -name '*.tmp.*' | wc -l)
[ "$leftovers" -eq 0 ] || { echo "FAIL: $leftovers temporary files left behind"; failed=$((failed + 1)); }

echo "cli: $passed passed, $failed failed"
[ $failed -eq 0 ]
