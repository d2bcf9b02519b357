#!/usr/bin/env bash
# The GPU check in one command, for a machine with a GPU that has PyTorch but
# none of DawnPiper's other dependencies (docs/gpu.md).
#
#   scripts/gpu-check.sh pack DIR                     here: the built binary (stripped), the Debian
#                                                     runtime packages it loads (Open MPI, HDF5,
#                                                     Boost), the inputs and the Python helpers
#   DIR/gpu-check.sh run OUTDIR [--device cuda|cpu] [--size full|small] [--only REGEX]
#                                                     there: every check (or those whose names match
#                                                     REGEX), each under its own time limit, within
#                                                     $DP_CHECK_BUDGET seconds (430); writes
#                                                     OUTDIR/gpu-report.md, OUTDIR/gpu-check.log (every
#                                                     command and its output), OUTDIR/artifacts.tar.gz
#                                                     (profiles, plans) and OUTDIR/traces.tar.gz
#
# `run` finds LibTorch through $DP_TORCH_DIR or the Python that $DP_PYTHON names (python3), and
# unpacks the Debian packages into $DP_DEPS_PREFIX (/tmp/dawnpiper-deps). --size small (the
# default with --device cpu) runs every check on tiny models: the ctest `gpu-harness` does that.
set -u

usage() {
  sed -n '4,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}
die() { echo "gpu-check: $*" >&2; exit 2; }

# Runtime libraries of build/dawnpiper that a machine with PyTorch alone lacks.
DEBS="openmpi-bin openmpi-common libopenmpi3 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libpmix2
 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libnuma1
 libxnvctrl0 libltdl7 libpciaccess0 libmunge2 libhdf5-103-1 libaec0 libsz2 libcurl4 libldap-2.5-0 librtmp1 libssh2-1
 libpsl5 libnghttp2-14 libbrotli1 libboost-program-options1.74.0 libunistring2"

pack() {
  local dir=${1:-}
  [ -n "$dir" ] || usage
  local root
  root=$(cd "$(dirname "$0")/.." && pwd)
  local bin=${DP_BIN:-$root/build/dawnpiper}
  [ -x "$bin" ] || die "no binary at $bin (run scripts/build.sh first)"
  mkdir -p "$dir/debs" "$dir/inputs" "$dir/python" || die "cannot create $dir"
  dir=$(cd "$dir" && pwd)
  strip -o "$dir/dawnpiper" "$bin" 2>/dev/null || cp "$bin" "$dir/dawnpiper"
  # The unit tests of the device-side ZeRO code (the bf16 widening NCCL's gathers use), where built.
  local tests=${DP_TESTS_BIN:-$root/build/dp_torch_tests}
  if [ -x "$tests" ]; then strip -o "$dir/dp_torch_tests" "$tests" 2>/dev/null || cp "$tests" "$dir/dp_torch_tests"; fi
  cp "$root/scripts/gpu-check.sh" "$dir/"
  cp "$root"/inputs/*.ini "$dir/inputs/"
  cp "$root/scripts/export_model.py" "$root/scripts/atomic_file.py" "$root/scripts/dawnpiper_ops.py" "$root/scripts/gpt2_reference.py" \
    "$root/scripts/link_bandwidth.py" "$root/scripts/trace_summary.py" "$dir/python/"
  (cd "$root" && echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes')") \
    >"$dir/VERSION"
  # The packages, once per list (a second pack into the same DIR only checks).
  local stamp
  stamp="$dir/debs/.list-$(echo "$DEBS" | md5sum | cut -c1-8)"
  if [ ! -f "$stamp" ]; then
    rm -f "$dir"/debs/*.deb
    [ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v lock)" ] || apt-get update -qq
    (cd "$dir/debs" && apt-get download $DEBS >/dev/null 2>"$dir/debs/apt.log") ||
      die "apt-get download failed: $(tail -1 "$dir/debs/apt.log")"
    touch "$stamp"
  fi
  # safetensors (the exporter writes model files with it): the abi3 wheel, unpacked.
  if [ ! -d "$dir/python/site/safetensors" ]; then
    local version
    version=$(grep -i '^safetensors==' "$root/scripts/python-requirements.txt" | cut -d= -f3)
    local py=""
    for candidate in python3 /usr/bin/python3; do
      command -v "$candidate" >/dev/null && "$candidate" -m pip --version >/dev/null 2>&1 && { py=$candidate; break; }
    done
    [ -n "$py" ] || die "no Python with pip to download the safetensors wheel (apt-get install python3-pip)"
    rm -rf "$dir/python/wheel" && mkdir -p "$dir/python/wheel"
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir/python/wheel" \
      "safetensors==$version" || die "cannot download the safetensors wheel"
    "$py" -m zipfile -e "$dir"/python/wheel/*.whl "$dir/python/site" && rm -rf "$dir/python/wheel"
  fi
  local bytes
  bytes=$(du -sb "$dir" | cut -f1)
  echo "packed $dir: $(cat "$dir/VERSION"), $(ls "$dir"/debs/*.deb | wc -l) packages, $((bytes / 1048576)) MiB"
  [ "$bytes" -le $((40 * 1048576)) ] || die "$dir is $((bytes / 1048576)) MiB, over the 40 MiB a device call carries"
}

# --- run: helpers -------------------------------------------------------------------------------

# step NAME LIMIT CMD...: runs CMD under `timeout` (LIMIT seconds, less if the budget is nearly
# spent), its output in $work/NAME.out and the log; the result in STATUS[NAME].
declare -A STATUS SECS
ORDER=()
step() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - (SECONDS - START) - 8))
  ORDER+=("$name")
  if [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]]; then
    STATUS[$name]="not selected"; SECS[$name]=0
    : >"$work/$name.out"
    return 125
  fi
  if [ "$left" -lt 5 ]; then
    STATUS[$name]="skipped: no time left"; SECS[$name]=0
    echo "### $name: skipped (budget spent)" >>"$LOG"
    : >"$work/$name.out"
    return 124
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  {
    echo "### $name (limit ${limit}s)"
    echo "\$ $*"
  } >>"$LOG"
  timeout -k 5 "$limit" "$@" >"$work/$name.out" 2>&1
  local rc=$?
  SECS[$name]=$((SECONDS - t0))
  grep -v 'pmix_mca_pcompress\|^ *$' "$work/$name.out" | tail -n 60 >>"$LOG"
  echo "### $name: exit $rc after ${SECS[$name]}s" >>"$LOG"
  case $rc in
    0) STATUS[$name]=ok ;;
    124 | 137) STATUS[$name]="timed out (${limit}s)" ;;
    *) STATUS[$name]="failed (exit $rc): $(grep -v 'pmix_mca_pcompress\|^-\+$\|^ *$' "$work/$name.out" | grep -m1 -i 'error' | cut -c1-400)" ;;
  esac
  return $rc
}

losses() { grep -E '^step [0-9]+ loss ' "$work/$1.out" 2>/dev/null | awk '{print $4}'; }
# max_rel A B: the largest relative difference of two step-loss lists, or "-" if they do not pair.
max_rel() {
  local a b
  a=$(losses "$1")
  b=$(losses "$2")
  [ -n "$a" ] && [ "$(echo "$a" | wc -l)" -eq "$(echo "$b" | wc -l)" ] || { echo "-"; return; }
  paste <(echo "$a") <(echo "$b") | awk '{d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r} END {printf "%.1e", m}'
}
# samples/s after the first step, from train's summary line
rate() { grep -o '[0-9.]* samples/s after the first step' "$work/$1.out" 2>/dev/null | awk '{print $1}'; }
# ms per step: 1000 * samples per step / samples/s
ms_per_step() {
  local r
  r=$(rate "$1")
  [ -n "$r" ] && awk -v r="$r" -v s="$2" 'BEGIN {printf "%.1f", (r > 0 ? 1000 * s / r : 0)}' || echo "-"
}
to_bytes() { awk '{v = $1; u = $2; m = u == "KiB" ? 1024 : u == "MiB" ? 1048576 : u == "GiB" ? 1073741824 : u == "TiB" ? 1099511627776 : 1; printf "%.0f", v * m}'; }
pct() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%+.1f%%", 100 * (a / b - 1); else print "-"}'; }
verdict() { [ "$1" = "-" ] && echo "no result" || awk -v x="$1" -v t="$2" 'BEGIN {print (x + 0 <= t ? "equal" : "DIFFERENT")}'; }
status_of() { echo "${STATUS[$1]:-not run}"; }

# --- run -----------------------------------------------------------------------------------------

run() {
  local outdir=${1:-}
  [ -n "$outdir" ] || usage
  shift
  local device=cuda size=""
  ONLY=""
  while [ $# -gt 0 ]; do
    case $1 in
      --device) device=${2:-}; shift 2 ;;
      --size) size=${2:-}; shift 2 ;;
      --only) ONLY=${2:-}; shift 2 ;;
      *) usage ;;
    esac
  done
  [ "$device" = cuda ] || [ "$device" = cpu ] || die "--device cuda|cpu, not '$device'"
  [ -n "$size" ] || size=$([ "$device" = cuda ] && echo full || echo small)
  [ "$size" = full ] || [ "$size" = small ] || die "--size full|small, not '$size'"
  here=$(cd "$(dirname "$0")" && pwd)
  mkdir -p "$outdir" || die "cannot create $outdir"
  out=$(cd "$outdir" && pwd)
  work=$(mktemp -d)
  traces=$work/traces
  mkdir -p "$traces"
  LOG=$out/gpu-check.log
  REPORT=$out/gpu-report.md
  : >"$LOG"
  BUDGET=${DP_CHECK_BUDGET:-430}
  START=$SECONDS

  # Dependencies: the packed Debian packages, LibTorch from the machine's PyTorch.
  local prefix=${DP_DEPS_PREFIX:-${TMPDIR:-/tmp}/dawnpiper-deps}
  mkdir -p "$prefix"
  for f in "$here"/debs/*.deb; do dpkg -x "$f" "$prefix" || die "cannot unpack $f"; done
  local u=$prefix/usr a=$prefix/usr/lib/x86_64-linux-gnu
  for t in mpirun mpiexec orterun; do [ -e "$u/bin/$t.openmpi" ] && ln -sf "$t.openmpi" "$u/bin/$t"; done
  export OPAL_PREFIX=$u PATH=$u/bin:$PATH
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
  PY=${DP_PYTHON:-python3}
  local tdir=${DP_TORCH_DIR:-}
  [ -n "$tdir" ] || tdir=$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null | tail -1)
  [ -d "$tdir/lib" ] || die "no LibTorch: set DP_TORCH_DIR or DP_PYTHON to a Python with torch"
  local sp nv
  sp=$(dirname "$tdir")
  nv=$(ls -d "$sp"/nvidia/*/lib 2>/dev/null | tr '\n' ':')
  export LD_LIBRARY_PATH=$tdir/lib:$nv/usr/local/cuda/lib64:$a:$a/hdf5/serial${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  "$PY" -c 'import safetensors' 2>/dev/null || export PYTHONPATH=$here/python/site${PYTHONPATH:+:$PYTHONPATH}
  export DAWNPIPER_CACHE=off
  local cores
  cores=$(env -u OMP_NUM_THREADS nproc 2>/dev/null || echo 2)
  CORES=$cores
  THREADS=$((cores / 4))
  [ "$THREADS" -ge 1 ] || THREADS=1
  export OMP_NUM_THREADS=$THREADS
  DP=$here/dawnpiper
  MPI="mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS -x LD_LIBRARY_PATH -x DAWNPIPER_CACHE -np"
  local missing
  missing=$(ldd "$DP" | grep 'not found' | awk '{print $1}' | tr '\n' ' ')
  [ -z "$missing" ] || die "the binary cannot load: $missing"

  # Sizes: full on a GPU; small (tiny models, the same checks) anywhere.
  local big1 big2 big_args eager_layers eager_hidden eager_heads eager_vocab mb seq
  if [ "$size" = full ]; then
    big1="--model gpt2-small --seq-len 512"; big2="--model bert-large"; mb=8
    eager_layers=12 eager_hidden=768 eager_heads=12 eager_vocab=50257 seq=512
  else
    big1="--model gpt2-tiny"; big2="--model bert-tiny"; mb=4
    eager_layers=2 eager_hidden=64 eager_heads=4 eager_vocab=512 seq=32
  fi
  local tiny="--config $here/inputs/gpt2-tiny.ini --steps 6"
  local tiny_samples=16 # micro-batch 4 x 4 micro-batches (inputs/gpt2-tiny.ini)

  # The imported GPT-2 is exported on the CPU while the device checks run.
  local pyexport="$PY $here/python/export_model.py --module gpt2_reference:build --path $here/python"
  local gcfg="layers=$eager_layers,hidden=$eager_hidden,heads=$eager_heads,vocab=$eager_vocab,seq=$seq"
  (
    cd "$work" && for p in fp32 bf16; do
      OMP_NUM_THREADS=$((cores / 2 > 0 ? cores / 2 : 1)) timeout 200 $pyexport --config "$gcfg" --precision $p \
        --out "$work/gpt2-$p.dpm" >"$work/export-$p.out" 2>&1
      echo $? >"$work/export-$p.rc"
    done
  ) &
  local exporter=$!

  # 0. The host link a swapping stage copies over: pinned copies each way and both at once.
  [ "$device" = cuda ] && step "link" 60 "$PY" "$here/python/link_bandwidth.py"
  # 1. Pipelines on one device, all three schedules, against the CPU in-process run of the same
  #    stages and schedule (dropout 0: the two devices draw different masks).
  for n in 2 4; do
    for s in gpipe 1f1b async; do
      step "pipe-$n-$s" 45 $MPI $n "$DP" train $tiny --dropout 0 --schedule $s --device $device \
        --plan-out "$work/plan-$n-$s.json"
      # The same plan: async losses depend on where the cuts are.
      step "ref-$n-$s" 30 "$DP" train $tiny --dropout 0 --in-process --device cpu --plan-in "$work/plan-$n-$s.json"
    done
  done
  # Masks drawn on the device: a 2-rank pipeline and the same stages in one process, dropout on.
  step "dropout-pipe" 45 $MPI 2 "$DP" train $tiny --schedule 1f1b --device $device --plan-out "$work/plan-dropout.json"
  step "dropout-inproc" 45 "$DP" train $tiny --in-process --device $device --plan-in "$work/plan-dropout.json"
  step "inproc-4" 45 "$DP" train $tiny --schedule 1f1b --stages 4 --in-process --device $device
  # ZeRO levels 1-3 on the device: 2 replicas of one stage sharing it (MPI through host memory),
  #    against level 0 (dropout 0, 64KiB buckets: several per stage).
  for z in 0 1 2 3; do
    step "zero-$z" 45 $MPI 2 "$DP" train $tiny --dropout 0 --stages 1 --data-parallel 2 --zero-stage $z \
      --bucket-size 64KiB --optimizer adamw --weight-decay 0.1 --grad-clip 0.5 --device $device
  done
  # The ZeRO unit tests, on the device where it is one (the bf16 widening of NCCL's level-3 gathers).
  [ -x "$here/dp_torch_tests" ] && step "unit-zero" 60 "$here/dp_torch_tests" "[zero]"
  # 2. The profile's whole step: predicted peak (with the device runtime's bytes) against measured.
  step "profile-tiny" 60 "$DP" profile --model gpt2-tiny --device $device --iterations 2 --out "$work/gpt2-tiny.h5"
  # One process, the preset at training size (dropout on: masks on the device), fp32 and bf16.
  for p in fp32 bf16; do
    step "preset-$p" 60 "$DP" train $big1 --micro-batch-size $mb --micro-batches 1 --steps 5 --precision $p \
      --device $device
  done
  # 3. Planned stages: a measured profile, 1f1b plans on 4 stages with memopt none and sr (capped
  #    at 60% of none's largest stage), run on 4 ranks; every stage of the sr plan alone.
  local k=0
  for spec in "$big1" "$big2"; do
    k=$((k + 1))
    local name=model$k
    step "profile-$name" 90 "$DP" profile $spec --micro-batch-size $mb --batch-sizes $mb --iterations 2 --warmup 1 \
      --device $device --out "$work/$name.h5"
    [ -s "$work/$name.h5" ] || continue
    step "plan-$name-none" 30 "$DP" plan --profile-in "$work/$name.h5" --stages 4 --schedule 1f1b --micro-batches 4 \
      --memopt none --out "$work/$name-none.json"
    [ -s "$work/$name-none.json" ] || continue
    local largest cap
    largest=$("$PY" -c 'import json, sys; print(max(s["memory"]["replayed_peak"] or s["memory"]["peak"] for s in json.load(open(sys.argv[1]))["stages"]))' "$work/$name-none.json")
    for share in 60 70 80; do
      cap=$((largest * share / 100))
      step "plan-$name-sr" 60 "$DP" plan --profile-in "$work/$name.h5" --stages 4 --schedule 1f1b --micro-batches 4 \
        --memopt sr --device-memory $cap --out "$work/$name-sr.json" && break
    done
    echo "$share $cap" >"$work/$name-cap"
    step "train-$name-none" 60 $MPI 4 "$DP" train $spec --plan-in "$work/$name-none.json" --steps 3 --device $device
    [ -s "$work/$name-sr.json" ] || continue
    # Without a cap (what the plan's allocated bytes measure) and under it (the CUDA caching
    # allocator's memory fraction bounds its reserved bytes, fragmentation included).
    step "train-$name-sr" 60 $MPI 4 "$DP" train $spec --plan-in "$work/$name-sr.json" --steps 3 --device $device
    step "train-$name-srcap" 60 $MPI 4 "$DP" train $spec --plan-in "$work/$name-sr.json" --steps 3 --device $device \
      --device-memory $cap
    for x in 0 1 2 3; do
      step "stage-alone-$name-$x" 30 "$DP" run-stage $spec --plan "$work/$name-sr.json" --stage $x --steps 3 --device $device
    done
  done
  # Ranks sharing the device against the same stages in one process, at training size.
  for n in 2 4; do
    step "share-$n" 90 $MPI $n "$DP" train $big1 --micro-batch-size $mb --micro-batches 4 --steps 4 --device $device
    step "share-inproc-$n" 60 "$DP" train $big1 --micro-batch-size $mb --micro-batches 4 --steps 4 --stages $n \
      --in-process --device $device
  done
  # Where the 2 shared ranks' time goes: each stage's time per action kind (inspect).
  step "share-trace-2" 90 $MPI 2 "$DP" train $big1 --micro-batch-size $mb --micro-batches 4 --steps 3 \
    --device $device --trace "$work/share-2.h5" &&
    step "share-inspect-2" 30 "$DP" inspect "$work/share-2.h5"
  # 4. The imported GPT-2 against eager PyTorch on the same device.
  wait $exporter
  for p in fp32 bf16; do
    if [ "$(cat "$work/export-$p.rc" 2>/dev/null)" = 0 ]; then
      # 9 steps: 8 timed after the first, as eager's 8 after its one warm-up step.
      step "imported-$p" 90 "$DP" train --model-file "$work/gpt2-$p.dpm" --micro-batch-size $mb --micro-batches 1 \
        --steps 9 --device $device
    else
      STATUS[imported-$p]="export failed: $(tail -1 "$work/export-$p.out")"; ORDER+=("imported-$p")
      cat "$work/export-$p.out" >>"$LOG"
    fi
    step "eager-$p" 60 "$PY" "$here/python/gpt2_reference.py" --device $device --precision $p --layers $eager_layers \
      --hidden $eager_hidden --heads $eager_heads --vocab $eager_vocab --batch $mb --seq $seq --steps 8 \
      --torch-trace "$traces/eager-$p.json"
    # Where each step's time goes (PyTorch's profiler over two steps), DawnPiper beside eager.
    if [ -s "$work/gpt2-$p.dpm" ]; then
      step "trace-$p" 90 "$DP" train --model-file "$work/gpt2-$p.dpm" --micro-batch-size $mb --micro-batches 1 \
        --steps 4 --device $device --torch-trace "$traces/dawnpiper-$p.json"
    fi
    for who in dawnpiper eager; do
      [ -s "$traces/$who-$p.json" ] && step "summary-$who-$p" 60 "$PY" "$here/python/trace_summary.py" "$traces/$who-$p.json"
    done
  done
  # 5. The reference trainer (CPU) against one process on the device.
  for m in gpt2-tiny bert-tiny; do
    step "one-cpu-$m" 30 "$DP" train --model $m --steps 10 --dropout 0 --device cpu
    step "one-dev-$m" 45 "$DP" train --model $m --steps 10 --dropout 0 --device $device
  done
  # 6. NCCL between two ranks on one GPU.
  [ "$device" = cuda ] && step "nccl" 45 $MPI 2 "$DP" train $tiny --transport nccl --device cuda
  write_report "$device" "$size"
  tar -czf "$out/artifacts.tar.gz" -C "$work" $(cd "$work" && ls *.h5 *.json 2>/dev/null) 2>/dev/null
  [ -n "$(ls "$traces")" ] && tar -czf "$out/traces.tar.gz" -C "$traces" .
  rm -rf "$work"
  echo "gpu-check: report in $REPORT ($((SECONDS - START)) s)"
}

# --- the report ----------------------------------------------------------------------------------

write_report() {
  local device=$1 size=$2
  local what
  if [ "$device" = cuda ]; then
    what=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1)
  else
    what="CPU, $CORES cores"
  fi
  {
    echo "# GPU check: $what"
    echo
    echo "DawnPiper $(cat "$here/VERSION"), LibTorch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null | tail -1),"
    echo "\`gpu-check.sh run OUT --device $device --size $size\` on $(date -u +%Y-%m-%d), $((SECONDS - START)) s."
    echo
    echo "## Pipelines on one device against the CPU (dropout 0)"
    echo
    echo "Each row: \`mpirun -np N dawnpiper train --config inputs/gpt2-tiny.ini --steps 6 --dropout 0 --schedule S"
    echo "--device $device --plan-out P\` against \`train ... --dropout 0 --in-process --device cpu --plan-in P\`."
    echo
    echo "| ranks | schedule | transport | max rel. loss difference | losses | samples/s |"
    echo "| --- | --- | --- | --- | --- | --- |"
    for n in 2 4; do
      for s in gpipe 1f1b async; do
        local d
        d=$(max_rel "pipe-$n-$s" "ref-$n-$s")
        echo "| $n | $s | $(grep -o 'transport: .*' "$work/pipe-$n-$s.out" 2>/dev/null | cut -d' ' -f2- | cut -c1-60) | $d | $(verdict "$d" 1e-5) | $(rate "pipe-$n-$s") |"
      done
    done
    echo
    local d
    d=$(max_rel dropout-pipe dropout-inproc)
    echo "Dropout on (masks drawn on the $device): 2 ranks, 1f1b against the same 2 stages in one process:"
    echo "max rel. loss difference $d ($(verdict "$d" 1e-5))."
    echo "Four stages in one process: $(status_of inproc-4), $(rate inproc-4) samples/s, step times"
    echo "$(grep -o 'time [0-9.]*s' "$work/inproc-4.out" 2>/dev/null | awk '{print $2}' | tr '\n' ' ')."
    echo
    echo "## ZeRO levels on one device: 2 replicas of one stage"
    echo
    echo "\`mpirun -np 2 dawnpiper train --config inputs/gpt2-tiny.ini --steps 6 --dropout 0 --stages 1 --data-parallel 2"
    echo "--zero-stage L --bucket-size 64KiB --optimizer adamw --weight-decay 0.1 --grad-clip 0.5 --device $device\`: the"
    echo "replicas share the device, so the collectives go over MPI through host memory; losses against level 0."
    echo
    echo "| level | max rel. loss difference from level 0 | losses | peak (replica 0) | samples/s |"
    echo "| --- | --- | --- | --- | --- |"
    for z in 0 1 2 3; do
      d=$(max_rel "zero-$z" zero-0)
      echo "| $z | $d | $(verdict "$d" 1e-5) | $(grep -m1 -o 'measured peak .*)' "$work/zero-$z.out" 2>/dev/null) | $(rate "zero-$z") |"
    done
    echo
    echo "ZeRO's unit tests (\`dp_torch_tests \"[zero]\"\`: on a GPU, the bf16 widening in place that NCCL's"
    echo "level-3 gathers use, on the device): $(status_of unit-zero)."
    echo
    echo "## One process: CPU reference trainer against the $device (dropout 0)"
    echo
    echo "| model | max rel. loss difference | losses | cpu samples/s | $device samples/s |"
    echo "| --- | --- | --- | --- | --- |"
    for m in gpt2-tiny bert-tiny; do
      d=$(max_rel "one-dev-$m" "one-cpu-$m")
      echo "| $m | $d | $(verdict "$d" 1e-5) | $(rate "one-cpu-$m") | $(rate "one-dev-$m") |"
    done
    echo
    echo "## Planned stages on 4 ranks: measured peak against the plan's prediction"
    echo
    echo "Profiles: \`dawnpiper profile MODEL --micro-batch-size $mb --batch-sizes $mb --iterations 2 --warmup 1\`; plans:"
    echo "\`plan --stages 4 --schedule 1f1b --micro-batches 4 --memopt none|sr\` (sr capped at a share of none's largest"
    echo "stage); runs: \`mpirun -np 4 dawnpiper train MODEL --plan-in PLAN --steps 3\`, the sr plan also with"
    echo "\`--device-memory CAP\` (the cap it was planned for, less the default --allocator-headroom). \"allocator held\": the"
    echo "caching allocator's reserved peak (what a cap limits)."
    echo
    echo "| model | memopt | cap | stage | measured peak | predicted peak | measured / predicted | allocator held |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
    local k=0
    for spec in "$big1" "$big2"; do
      k=$((k + 1))
      local name=model$k label=${spec#--model }
      for mo in none sr srcap; do
        local capcol="-"
        [ "$mo" = srcap ] && [ -f "$work/$name-cap" ] && capcol="$(awk '{printf "%d%%: %.0f MiB", $1, $2 / 1048576}' "$work/$name-cap")"
        if ! grep -q 'measured peak' "$work/train-$name-$mo.out" 2>/dev/null; then
          echo "| $label | ${mo/srcap/sr} | $capcol | - | $(status_of "train-$name-$mo") | | | |"
          continue
        fi
        # "  stage 0: measured peak 4.15 GiB (predicted 4.20 GiB), the caching allocator held up to 4.36 GiB"
        grep -E '^  stage [0-9]+: measured peak' "$work/train-$name-$mo.out" | while read -r _ st _ _ mv mu _ pv pu _ _ _ _ _ _ rv ru; do
          local mb_ pb_
          pu=${pu%,}
          mb_=$(echo "$mv $mu" | to_bytes)
          pb_=$(echo "${pv#(} ${pu%)}" | to_bytes)
          echo "| $label | ${mo/srcap/sr} | $capcol | ${st%:} | $mv $mu | ${pv#(} ${pu%)} | $(pct "$mb_" "$pb_") | $rv $ru |"
        done
      done
    done
    echo
    echo "Whole step of \`profile --model gpt2-tiny\`: $(grep -o 'predicted peak.*' "$work/profile-tiny.out" 2>/dev/null | head -1)"
    echo
    echo "## Every stage of the sr plans alone (\`run-stage --plan PLAN --stage X --steps 3\`)"
    echo
    echo "| model | stage | measured peak | predicted peak | allocator held | fwd+bwd measured ms | predicted ms | predicted memopt ms | swap copies waited for |"
    echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    k=0
    for spec in "$big1" "$big2"; do
      k=$((k + 1))
      for x in 0 1 2 3; do
        local f=$work/stage-alone-model$k-$x.out
        [ -s "$f" ] || continue
        if ! grep -q '^peak memory' "$f"; then
          echo "| ${spec#--model } | $x | $(status_of "stage-alone-model$k-$x") | | | | | | |"
          continue
        fi
        local pm tm
        # "peak memory: measured 3.96 GiB, predicted 4.03 GiB (-1.7%); the caching allocator held up to 4.22 GiB"
        pm=$(grep '^peak memory' "$f" | sed 's/peak memory: measured \(.*\), predicted \([^;]*\) (\([^;]*\))\(; the caching allocator held up to \)\{0,1\}\(.*\)/\1 | \2 (\3) | \5/')
        tm=$(grep '^forward+backward' "$f" | sed 's/.*measured \([0-9.]*\) ms.*predicted \([0-9.]*\) ms (\(.*\))/\1 | \2 (\3)/')
        echo "| ${spec#--model } | $x | $pm | $tm | $(grep -o 'predicted overhead [0-9.]* ms' "$f" | awk '{print $3}') | $(grep -o 'swap-ins waited for:.*' "$f" | cut -d: -f2- | sed 's/^ //') |"
      done
    done
    echo
    echo "## Step time, one process"
    echo
    echo "| model | precision | DawnPiper ms/step | eager PyTorch ms/step | DawnPiper / eager | DawnPiper model FLOPs |"
    echo "| --- | --- | --- | --- | --- | --- |"
    # "model FLOPs: 130.5 TFLOP/s after the first step, MFU 13.2% of NVIDIA H100 ..., bf16 dense 989 TFLOP/s"
    mfu() { grep -o 'model FLOPs: .*' "$work/$1.out" 2>/dev/null | sed 's/model FLOPs: //; s/ after the first step//' | cut -c1-80; }
    for p in fp32 bf16; do
      local dms ems
      dms=$(ms_per_step "imported-$p" "$mb")
      ems=$(grep -o 'eager [a-z0-9]* [0-9.]* ms/step' "$work/eager-$p.out" 2>/dev/null | awk '{print $3}')
      echo "| imported GPT-2 ($eager_layers layers, $eager_hidden wide, seq $seq, batch $mb) | $p | $dms | ${ems:--} | $(awk -v a="$dms" -v b="${ems:-0}" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-"}') | $(mfu "imported-$p") |"
    done
    for p in fp32 bf16; do
      echo "| preset ${big1#--model } (dropout 0.1, batch $mb) | $p | $(ms_per_step "preset-$p" "$mb") | | | $(mfu "preset-$p") |"
    done
    echo
    echo "## Ranks sharing the $device against one process"
    echo
    echo "\`mpirun -np N dawnpiper train $big1 --micro-batch-size $mb --micro-batches 4 --steps 4 --device $device\` against"
    echo "\`train ... --stages N --in-process\` (the same stages in one process)."
    echo
    echo "| ranks | transport | ms/step, N ranks | ms/step, one process | N ranks / one process |"
    echo "| --- | --- | --- | --- | --- |"
    local samples=$((mb * 4))
    for n in 2 4; do
      local a b
      a=$(ms_per_step "share-$n" $samples)
      b=$(ms_per_step "share-inproc-$n" $samples)
      echo "| $n | $(grep -o 'transport: .*' "$work/share-$n.out" 2>/dev/null | cut -d' ' -f2- | cut -c1-60) | $a | $b | $(awk -v a="$a" -v b="$b" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-"}') |"
    done
    echo
    if grep -q "time per step by action" "$work/share-inspect-2.out" 2>/dev/null; then
      echo "2 ranks traced (\`train ... --steps 3 --trace T\`, then \`dawnpiper inspect T\`): each stage's time per step by action"
      echo
      echo '```'
      sed -n '/time per step by action/,$p' "$work/share-inspect-2.out"
      echo '```'
      echo
    fi
    if [ -s "$work/link.out" ]; then
      echo "## The host link (\`link_bandwidth.py\`: pinned copies on side streams, best of 5)"
      echo
      echo "| size | device to host | host to device | both at once (sum) |"
      echo "| --- | --- | --- | --- |"
      awk '$1 == "link" {v[$3 " " $2] = $5; m[$3] = 1} END {for (s in m) print s, v[s " d2h"], v[s " h2d"], v[s " both"]}' "$work/link.out" |
        sort -n | while read -r m d h b; do echo "| $m MiB | $d GB/s | $h GB/s | $b GB/s |"; done
      echo
    fi
    for p in fp32 bf16; do
      for who in dawnpiper eager; do
        [ -s "$work/summary-$who-$p.out" ] || continue
        echo "### Where a $p step goes: $who (PyTorch's profiler, two steps)"
        echo
        echo '```'
        head -n 40 "$work/summary-$who-$p.out"
        echo '```'
        echo
      done
    done
    if [ "$device" = cuda ]; then
      echo "## NCCL between two ranks on one GPU"
      echo
      echo "\`mpirun -np 2 dawnpiper train --config inputs/gpt2-tiny.ini --transport nccl --device cuda\`: $(status_of nccl)"
      echo
    fi
    echo "## Every check"
    echo
    echo "| check | result | seconds |"
    echo "| --- | --- | --- |"
    for name in "${ORDER[@]}"; do echo "| $name | $(status_of "$name" | tr '|' '/') | ${SECS[$name]:-0} |"; done
  } >"$REPORT"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run "$@" ;;
  *) usage ;;
esac
