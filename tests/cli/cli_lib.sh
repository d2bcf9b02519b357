# Shared by the command-line test scripts (source it after setting $bin and $work).
passed=0
failed=0

# The plan with every decision rewritten to keep, and so nothing for its stage programs to evict.
keep_all() {
  python3 -c 'import json, sys
plan = json.load(open(sys.argv[1]))
for s in plan["stages"]:
    for d in s["decisions"]: d["action"] = "keep"
    s["evictions"] = []
json.dump(plan, open(sys.argv[2], "w"), indent=2)' "$1" "$2"
}

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

# check NAME COMMAND...: the command succeeds.
check() {
  local name="$1"
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $name"; fi
}

losses() { grep '^step' | grep -o 'loss [0-9.e+-]*' | awk '{print $2}'; }
# same_losses A B: equal count, each within 1e-5 relative (summation order differs by stage).
same_losses() { [ -n "$1" ] && paste <(echo "$1") <(echo "$2") | awk 'NF != 2 || ($1 - $2) / $2 > 1e-5 || ($2 - $1) / $2 > 1e-5 { bad = 1 } END { exit bad }'; }
