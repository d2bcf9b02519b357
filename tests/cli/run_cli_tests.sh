#!/usr/bin/env bash
# Command-line behaviour of the real binary: user errors give one clear line on stderr and a
# non-zero exit, no stack trace and no partial files; --help works per subcommand.
# usage: run_cli_tests.sh path/to/dawnpiper
set -u
bin="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0

# expect_fail NAME PATTERN ARGS...: exit != 0, stderr has PATTERN, one line, no backtrace.
expect_fail() {
  local name="$1" pattern="$2"
  shift 2
  "$bin" "$@" >"$work/out" 2>"$work/err"
  local code=$?
  if [ $code -ne 0 ] && grep -q -- "$pattern" "$work/err" && [ "$(wc -l <"$work/err")" -eq 1 ] &&
     ! grep -qiE 'backtrace|frame #|terminate called' "$work/err"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $name (exit $code)"; sed 's/^/  stderr: /' "$work/err"
  fi
}

# expect_ok NAME PATTERN ARGS...: exit 0 and stdout has PATTERN.
expect_ok() {
  local name="$1" pattern="$2"
  shift 2
  if "$bin" "$@" >"$work/out" 2>"$work/err" && grep -q -- "$pattern" "$work/out"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $name"; sed 's/^/  out: /' "$work/out" | tail -5; sed 's/^/  err: /' "$work/err"
  fi
}

expect_ok "top-level help" "subcommands:" --help
expect_ok "train help" "--micro-batch-size" train --help
expect_ok "graph help" "--summary" graph --help
expect_ok "graph summary" "nodes        1135" graph --model bert-large --summary
expect_ok "graph list" "amoebanet-d" graph --list
expect_ok "train tiny" "step 1 loss" train --model mlp-tiny --steps 2 --micro-batches 1

expect_fail "unknown subcommand" "unknown subcommand 'fly'" fly
expect_fail "unknown model" "unknown model 'gpt5'" graph --model gpt5
expect_fail "unknown option" "unrecognised option '--colour'" train --colour red
expect_fail "heads do not divide hidden" "must be divisible by heads" train --model gpt2-tiny --heads 5
expect_fail "non-numeric override" "is not a number" graph --model gpt2-tiny --layers many
expect_fail "unreadable config" "cannot read config file" train --config "$work/missing.ini"
printf 'model = gpt2-tiny\nbogus = 1\n' >"$work/bad.ini"
expect_fail "unknown key in config" "bogus" train --config "$work/bad.ini"
expect_fail "bad memory size" "is not a size" train --model mlp-tiny --device-memory lots
expect_fail "capacity exceeded" "out of memory: cannot allocate" train --model gpt2-tiny --device-memory 100KiB --steps 1
expect_fail "stages without ranks" "launch with" train --model mlp-tiny --stages 2
expect_fail "zero micro-batch size" "micro-batch size must be at least 1" train --model mlp-tiny --micro-batch-size 0
expect_fail "unknown optimizer" "unknown optimizer" train --model mlp-tiny --optimizer lion --steps 1

printf 'model = mlp-tiny\nsteps = 2\nmicro-batches = 1\nquiet = true\n' >"$work/good.ini"
expect_ok "config file" "done: 2 steps" train --config "$work/good.ini"
# The command line wins over the config file.
expect_ok "command line overrides config" "done: 3 steps" train --config "$work/good.ini" --steps 3

# profile: a real profile, and bad input without partial files.
expect_ok "profile tiny" "wrote $work/p.h5" profile --model mlp-tiny --out "$work/p.h5" --iterations 1 --quiet
[ -s "$work/p.h5" ] && h5dump -H "$work/p.h5" | grep -q 'GROUP "nodes"' && passed=$((passed + 1)) ||
  { echo "FAIL: profile is not readable HDF5"; failed=$((failed + 1)); }
expect_fail "profile without --out" "--out FILE is required" profile --model mlp-tiny
expect_fail "profile unknown device" "unknown device 'tpu'" profile --model mlp-tiny --device tpu --out "$work/x.h5"
expect_fail "profile cuda without GPU" "--device cuda" profile --model mlp-tiny --device cuda --out "$work/x.h5"
expect_fail "profile unwritable" "cannot write '/no/such/dir/p.h5'" profile --model mlp-tiny --out /no/such/dir/p.h5 --iterations 1
expect_fail "profile micro-batch 0" "micro-batch size must be at least 1" profile --model mlp-tiny --micro-batch-size 0 --out "$work/x.h5"
expect_fail "profile bad batch sizes" "--batch-sizes" profile --model mlp-tiny --batch-sizes 2,x --out "$work/x.h5"
expect_ok "analytic profile" "on a100-40gb" profile --model bert-large --micro-batch-size 1 --analytic --device-spec a100-40gb --out "$work/a.h5"
expect_fail "analytic without spec" "--analytic needs --device-spec" profile --model mlp-tiny --analytic --out "$work/x.h5"
expect_fail "unknown device spec" "unknown device spec 'tpu'" profile --model mlp-tiny --analytic --device-spec tpu --out "$work/x.h5"
[ ! -e "$work/x.h5" ] && passed=$((passed + 1)) || { echo "FAIL: partial profile left behind"; failed=$((failed + 1)); }

leftovers=$(find "$work" -name '*.tmp.*' | wc -l)
[ "$leftovers" -eq 0 ] || { echo "FAIL: $leftovers temporary files left behind"; failed=$((failed + 1)); }

echo "cli: $passed passed, $failed failed"
[ $failed -eq 0 ]
