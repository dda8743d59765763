#!/usr/bin/env bash
# gpu-check.sh: the one-shot check of pmap on a machine with an NVIDIA GPU and no network. Finds
# Python, Meson, Ninja, nvcc and NCCL; builds with CUDA; proves the NCCL it loads; runs the gpu
# test suite on 2 and on 4 logical devices (several on one GPU with NCCL >= 2.30), pmap-train,
# pmap-allreduce and pmap-bench on 1, 2 and 4 devices, the step's fast paths (plain, CUDA graph,
# overlapped buckets, sharded optimizer: time, host time, agreement), each run-time switch of the
# CUDA backend against its default, the JAX comparison on the GPU (FP32 and TF32), the CPU suite,
# and, where the machine allows them, compute-sanitizer and Nsight Compute.
#
#   bench/gpu-check.sh [OUTDIR] [--nccl DIR] [--dry-run]
#
# OUTDIR      default bench/results/gpu-<date>-<gpu>; receives at most 8 files: summary.md (what
#             ran, passed, was skipped and why, key figures), summary.json (every figure),
#             check.log (this script's whole output), environment.txt, logs.tar.gz (every step's
#             log, and the JAX comparison's csv and json).
# --nccl DIR  an NCCL with DIR/include/nccl.h and DIR/lib/libnccl.so.2 (a wheel's nvidia/nccl
#             layout), used to build and at run time; also GPU_CHECK_NCCL=DIR; default .nccl/ in
#             the source tree when present, else the newest NCCL beside CUDA, in the system or
#             in an nvidia-nccl-cu* wheel. NCCL >= 2.30 runs several logical devices on one GPU
#             (NCCL_MULTI_RANK_GPU_ENABLE=1); with an older one the summary names every
#             multi-device step it skipped.
# --dry-run   on any machine: finds every tool, validates and loads the NCCL, configures the
#             build exactly as the real run would, checks that every program, test and option the
#             steps use exists, and prints each command with its limit; runs nothing on a GPU.
#             Exit status 1 if anything that would fail on the GPU machine fails here.
#
# Every step runs under a time limit inside an overall budget (GPU_CHECK_BUDGET_S, default 480 s:
# the check ends within 9 minutes); a failed step is recorded and the next one runs. Optional
# steps (compute-sanitizer, Nsight Compute, JAX) are recorded as "unavailable" with the reason
# where the machine refuses them and never fail the check. Exit status: 0 every step passed or
# was skipped or unavailable, 1 a step failed, 2 no usable NVIDIA GPU. GPU_CHECK_BUILD_DIR picks
# the build folder (default: a fresh one under /tmp).
set -u

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUDGET=${GPU_CHECK_BUDGET_S:-480}
START=$(date +%s)
NPROC=$(nproc 2>/dev/null || echo 4)
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

OUT_ARG="" NCCL_ARG=${GPU_CHECK_NCCL:-} DRY=0
while [ $# -gt 0 ]; do
  case $1 in
  --nccl) NCCL_ARG=${2:?gpu-check: --nccl needs a folder}; shift 2 ;;
  --nccl=*) NCCL_ARG=${1#--nccl=}; shift ;;
  --dry-run) DRY=1; shift ;;
  -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  -*) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 1 ;;
  *)
    [ -z "$OUT_ARG" ] || { echo "gpu-check: more than one OUTDIR ($OUT_ARG, $1)" >&2; exit 1; }
    OUT_ARG=$1; shift ;;
  esac
done
if [ -z "$NCCL_ARG" ] && [ -d "$SRC/.nccl" ]; then NCCL_ARG=$SRC/.nccl; fi

# ------------------------------------------------------------------------------------------
# Recording

STEP_NAMES=() STEP_STATUS=() STEP_SECONDS=() STEP_RC=() STEP_NOTES=() SKIPPED_MULTI=()
FAILED=0

json_str() {
  local s
  s=$(printf '%s' "$1" | tr -d '\000-\010\013-\037')
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/ }
  s=${s//$'\n'/\\n}
  printf '"%s"' "$s"
}

record() { # name status seconds rc note
  STEP_NAMES+=("$1") STEP_STATUS+=("$2") STEP_SECONDS+=("$3") STEP_RC+=("$4") STEP_NOTES+=("$5")
  [ "$2" = fail ] && FAILED=1
  printf '   -> %s%s\n' "$2" "${5:+ ($5)}"
}

# Changes the verdict of the last recorded step.
amend() { # status note
  local last=$(( ${#STEP_NAMES[@]} - 1 ))
  STEP_STATUS[last]=$1
  STEP_NOTES[last]=$2
  FAILED=0
  local st
  for st in "${STEP_STATUS[@]}"; do [ "$st" = fail ] && FAILED=1; done
  echo "   -> $1 ($2)"
}

elapsed() { echo $(( $(date +%s) - START )); }

# run_step NAME LIMIT_S CMD...: runs CMD with its output in logs/NAME.log, within LIMIT_S and
# what is left of the budget; records pass or fail; returns CMD's status. A dry run prints the
# command and records it as planned.
run_step() {
  local name=$1 limit=$2
  shift 2
  if (( DRY )); then
    echo "== $name (limit ${limit}s) would run: $*"
    record "$name" planned 0 "" ""
    return 0
  fi
  local left=$(( BUDGET - $(elapsed) ))
  if (( left < 15 )); then
    echo "== $name: skipped, the time budget is spent"
    record "$name" skip 0 "" "time budget spent"
    return 1
  fi
  (( limit > left )) && limit=$left
  local log="$OUT/logs/$name.log" t0 t1 rc note=""
  echo "== $name (limit ${limit}s): $*"
  { echo "\$ $*"; echo; } >"$log"
  t0=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  tail -n 4 "$log" | sed 's/^/   | /'
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  if (( rc == 124 || rc == 137 )); then
    note="timed out after ${limit}s"
  elif (( rc != 0 )); then
    # The last line that names a failure, else the last line (stdout and stderr interleave).
    local why
    why=$(grep -Ei 'error|fail|cannot|abort' "$log" | grep -v '^\$ ' | tail -n 1)
    [ -n "$why" ] || why=$(grep -v '^\s*$' "$log" | tail -n 1)
    note="exit status $rc: $(printf '%s' "$why" | cut -c1-200)"
  fi
  if (( rc == 0 )); then record "$name" pass "$secs" "$rc" ""; else record "$name" fail "$secs" "$rc" "$note"; fi
  return $rc
}

skip_step() { # name reason
  echo "== $1: skipped: $2"
  record "$1" skip 0 "" "$2"
}

# An optional step whose tool this machine lacks or refuses: recorded, never a failure.
unavailable() { # name reason
  echo "== $1: unavailable: $2"
  record "$1" unavailable 0 "" "$2"
}

# A multi-device step that cannot run here: skipped, and named in the summary's warning.
skip_multi() { # name
  SKIPPED_MULTI+=("$1")
  skip_step "$1" "$MULTI_WHY"
}

# check NAME CONDITION-TEXT CMD...: a check run in every mode (dry run included).
check() {
  local name=$1 what=$2
  shift 2
  if "$@" >>"$OUT/logs/checks.log" 2>&1; then
    record "$name" pass 0 0 "$what"
  else
    record "$name" fail 0 1 "$what"
  fi
}

# The last line of a log that is a JSON object (pmap-train and pmap-bench end with one).
last_json() { grep -E '^\{.*\}$' "$1" 2>/dev/null | tail -n 1; }

# ------------------------------------------------------------------------------------------
# Environment

GPU_NAME="" GPU_COUNT=0 GPU_DRIVER="" GPU_MEM="" GPU_CC=""
# Containers often mount the driver's tools here without putting them on PATH.
if ! command -v nvidia-smi >/dev/null 2>&1 && [ -x /usr/local/nvidia/bin/nvidia-smi ]; then
  export PATH="$PATH:/usr/local/nvidia/bin"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  SMI=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null)
  [ -z "$SMI" ] && SMI=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)
  GPU_COUNT=$(printf '%s\n' "$SMI" | grep -c . || true)
  FIRST=$(printf '%s\n' "$SMI" | head -n 1)
  IFS=',' read -r GPU_NAME GPU_DRIVER GPU_MEM GPU_CC <<<"$FIRST"
  GPU_NAME=$(echo "$GPU_NAME" | sed 's/^ *//; s/ *$//')
  GPU_DRIVER=$(echo "$GPU_DRIVER" | tr -d ' ')
  GPU_MEM=$(echo "$GPU_MEM" | sed 's/^ *//')
  GPU_CC=$(echo "${GPU_CC:-}" | tr -d ' ')
fi

SLUG=$(echo "${GPU_NAME:-no-gpu}" | tr '[:upper:]' '[:lower:]' | sed 's/nvidia //; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
OUT=${OUT_ARG:-$SRC/bench/results/gpu-$(date +%F)-$SLUG}
mkdir -p "$OUT/logs" || { echo "gpu-check: cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)
: >"$OUT/check.log"
exec > >(tee -a "$OUT/check.log") 2>&1
TEE_PID=$!

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
[ -n "$NVCC" ] && PATH="$(dirname "$NVCC"):$PATH" && export PATH
CUDA_VERSION=$([ -n "$NVCC" ] && "$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
CUDA_ROOT=$([ -n "$NVCC" ] && cd "$(dirname "$NVCC")/.." && pwd)

# Python: an active virtual environment, the one on PATH, then the usual places of one (the GPU
# machines of this project keep meson, ninja, numpy and JAX in /opt/*/.venv).
PYS=()
for p in ${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python3} python3 python /opt/*/.venv/bin/python3 \
  /opt/*/venv/bin/python3 "$HOME"/.venv/bin/python3 /usr/local/bin/python3 /usr/bin/python3; do
  p=$(command -v "$p" 2>/dev/null) || continue
  case " ${PYS[*]} " in *" $p "*) ;; *) PYS+=("$p") ;; esac
done
PY=${PYS[0]:-}
# The Python for the JAX comparison: the first with numpy and JAX.
JAX_PY="" JAX_VERSION=""
for p in "${PYS[@]}"; do
  if v=$("$p" -c 'import numpy, jax; print(jax.__version__)' 2>/dev/null); then
    JAX_PY=$p JAX_VERSION=$v
    break
  fi
done

# meson and ninja: on PATH, else beside a Python that has them, else run from its packages.
MESON=()
if command -v meson >/dev/null 2>&1; then
  MESON=(meson)
else
  for p in "${PYS[@]}"; do
    if [ -x "$(dirname "$p")/meson" ]; then MESON=("$(dirname "$p")/meson"); break; fi
    if "$p" -c 'import mesonbuild' 2>/dev/null; then MESON=("$p" -m mesonbuild.mesonmain); break; fi
  done
fi
if ! command -v ninja >/dev/null 2>&1; then
  for p in "${PYS[@]}"; do
    d=$(dirname "$p")
    [ -x "$d/ninja" ] || d=$("$p" -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null) || continue
    if [ -n "$d" ] && [ -x "$d/ninja" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
MESON_VERSION=$([ ${#MESON[@]} -gt 0 ] && "${MESON[@]}" --version 2>/dev/null)
NINJA_VERSION=$(ninja --version 2>/dev/null)

# NCCL: --nccl's folder, else the newest of CUDA's, the system's and any nvidia-nccl-cu* wheel's.
nccl_version_of() { # header -> major.minor.patch
  awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END {if (v["NCCL_MAJOR"] != "") printf "%s.%s.%s", v["NCCL_MAJOR"], v["NCCL_MINOR"], v["NCCL_PATCH"]}' "$1"
}
nccl_code_of() { echo "$1" | awk -F. '{ if (NF == 3) print $1 * 10000 + $2 * 100 + $3; else print 0 }'; }
NCCL_ROOT="" NCCL_HEADER="" NCCL_LIB="" NCCL_VERSION="" NCCL_CODE=0 NCCL_PROBLEM=""
nccl_candidate() { # root-for-meson header libdir...
  local root=$1 h=$2 lib="" d f v c
  shift 2
  [ -f "$h" ] || return
  for d in "$@"; do
    # The versioned file first: a copied tree may hold libnccl.so as a link turned into text.
    for f in libnccl.so.2 libnccl.so; do
      if [ -z "$lib" ] && [ -e "$d/$f" ]; then lib=$d/$f; fi
    done
  done
  [ -n "$lib" ] || return
  v=$(nccl_version_of "$h")
  c=$(nccl_code_of "$v")
  if (( c > NCCL_CODE )); then
    NCCL_ROOT=$root NCCL_HEADER=$h NCCL_LIB=$lib NCCL_VERSION=$v NCCL_CODE=$c
  fi
}
if [ -n "$NCCL_ARG" ]; then
  NCCL_ARG=$(cd "$NCCL_ARG" 2>/dev/null && pwd) || NCCL_PROBLEM="--nccl folder not found"
  if [ -z "$NCCL_PROBLEM" ]; then
    nccl_candidate "$NCCL_ARG" "$NCCL_ARG/include/nccl.h" "$NCCL_ARG/lib"
    [ -n "$NCCL_ROOT" ] || NCCL_PROBLEM="--nccl $NCCL_ARG lacks include/nccl.h or lib/libnccl.so.2"
  fi
else
  [ -n "$CUDA_ROOT" ] && nccl_candidate "" "$CUDA_ROOT/include/nccl.h" "$CUDA_ROOT/lib64" \
    "$CUDA_ROOT/lib" "$CUDA_ROOT/targets/x86_64-linux/lib"
  nccl_candidate "" /usr/include/nccl.h /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib
  nccl_candidate "" /usr/local/include/nccl.h /usr/local/lib
  WHEELS=()
  for p in "${PYS[@]}"; do
    w=$("$p" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) && WHEELS+=("$w")
  done
  for w in "${WHEELS[@]}"; do nccl_candidate "$w" "$w/include/nccl.h" "$w/lib"; done
fi
# What the library itself reports, loaded without a GPU (ctypes): it must match its header.
NCCL_LIB_VERSION=""
if [ -n "$NCCL_LIB" ] && [ -n "$PY" ]; then
  NCCL_LIB_VERSION=$("$PY" -c 'import ctypes, sys
v = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print("%d.%d.%d" % (v.value // 10000, v.value // 100 % 100, v.value % 100))' "$NCCL_LIB" 2>/dev/null)
fi

CUBLAS_VERSION=""
if [ -n "$CUDA_ROOT" ] && [ -f "$CUDA_ROOT/include/cublas_api.h" ]; then
  CUBLAS_VERSION=$(awk '/#define CUBLAS_VER_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END {if (v["CUBLAS_VER_MAJOR"] != "") printf "%s.%s.%s", v["CUBLAS_VER_MAJOR"], v["CUBLAS_VER_MINOR"], v["CUBLAS_VER_PATCH"]}' "$CUDA_ROOT/include/cublas_api.h")
fi
DRIVER_CUDA=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_ROOT:-/usr/local/cuda}/bin/compute-sanitizer")
[ -x "$SANITIZER" ] || SANITIZER=""
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu "${CUDA_ROOT:-/usr/local/cuda}/bin/ncu" 2>/dev/null | head -n 1)
[ -n "$NCU" ] && [ -x "$NCU" ] || NCU=""

# 2 and 4 logical devices: on as many GPUs, else shared where NCCL (>= 2.30) allows it.
MULTI=1 MULTI_WHY="" IDS=""
GPUS_FOR_IDS=$(( GPU_COUNT > 0 ? GPU_COUNT : 1 ))
for i in 0 1 2 3; do IDS+="${IDS:+,}$(( i % GPUS_FOR_IDS ))"; done
if (( GPU_COUNT < 4 && NCCL_CODE < 23000 )); then
  MULTI=0
  MULTI_WHY="2 and 4 logical devices on ${GPU_COUNT} GPU(s) need NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, and the NCCL found is ${NCCL_VERSION:-none} (give one with --nccl DIR)"
else
  export NCCL_MULTI_RANK_GPU_ENABLE=1
fi
export PMAP_CUDA_DEVICE_IDS=$IDS

cat <<EOF | tee "$OUT/environment.txt"
pmap gpu-check$( (( DRY )) && echo " (dry run)") $(date -u +%FT%TZ) on $(hostname)
  source        $SRC ($(cd "$SRC" && git rev-parse --short HEAD 2>/dev/null || echo "no git"))
  GPUs          $GPU_COUNT x ${GPU_NAME:-none} (${GPU_MEM:-?}, compute capability ${GPU_CC:-?})
  driver        ${GPU_DRIVER:-none} (CUDA ${DRIVER_CUDA:-?})
  CUDA (nvcc)   ${CUDA_VERSION:-not found} ${NVCC:+at $NVCC}
  cuBLAS        ${CUBLAS_VERSION:-not found}
  NCCL          ${NCCL_VERSION:-not found} ${NCCL_HEADER:+($NCCL_HEADER, $NCCL_LIB reports ${NCCL_LIB_VERSION:-?})}
  devices       1, 2, 4 on GPUs $IDS$( (( MULTI )) || echo " -- NOT POSSIBLE: $MULTI_WHY")
  Python        ${PY:-none} $([ -n "$PY" ] && "$PY" --version 2>&1 | cut -d' ' -f2)
  JAX           ${JAX_VERSION:-not found} ${JAX_PY:+($JAX_PY)}
  meson, ninja  ${MESON_VERSION:-not found}, ${NINJA_VERSION:-not found}
  sanitizer     ${SANITIZER:-not found}
  ncu           ${NCU:-not found}
  CPU cores     $NPROC
  output        $OUT
EOF
nvidia-smi >"$OUT/logs/nvidia-smi.log" 2>&1 || true

# ------------------------------------------------------------------------------------------
# Steps that every mode takes: tools, NCCL, the build's configuration

HAVE_GPU=1
if (( GPU_COUNT < 1 )); then
  HAVE_GPU=0
  (( DRY )) || record "gpu" fail 0 "" "no NVIDIA GPU found (nvidia-smi missing or lists none)"
fi

check tools "nvcc, meson and ninja found" test -n "$NVCC" -a ${#MESON[@]} -gt 0 -a -n "$NINJA_VERSION"
if [ -n "$NCCL_PROBLEM" ]; then
  record nccl fail 0 1 "$NCCL_PROBLEM"
else
  check nccl "NCCL ${NCCL_VERSION:-?} found; its library loads and reports ${NCCL_LIB_VERSION:-nothing}, as its header says" \
    test -n "$NCCL_VERSION" -a "$NCCL_LIB_VERSION" = "$NCCL_VERSION"
fi
(( MULTI )) || echo "!! $MULTI_WHY"
[ -n "$JAX_PY" ] || echo "!! no Python with numpy and JAX: the JAX comparison will be skipped"

BUILD=${GPU_CHECK_BUILD_DIR:-$(mktemp -d /tmp/pmap-gpu-check.XXXXXX)}
SETUP=("${MESON[@]}" setup "$BUILD" "$SRC" -Dcuda=enabled -Dbuildtype=release)
SETUP+=("-Dnccl_root=$NCCL_ROOT") # also when empty: a reused build folder forgets an old one
[ -f "$BUILD/build.ninja" ] && SETUP+=(--reconfigure)
CONFIGURED=0 BUILT=0
if [ ${#MESON[@]} -eq 0 ] || [ -z "$NVCC" ]; then
  record configure fail 0 "" "missing tools: nvcc '${NVCC:-}', meson '${MESON_VERSION:-}'"
elif (( DRY )); then
  # The real configuration, so that what would fail there fails here.
  DRY=0 BUDGET=$(( BUDGET + 100000 )) run_step configure 120 "${SETUP[@]}" && CONFIGURED=1
  run_step build 300 ninja -C "$BUILD" -j "$NPROC"
elif (( HAVE_GPU )); then
  run_step configure 90 "${SETUP[@]}" && CONFIGURED=1 &&
    run_step build 240 ninja -C "$BUILD" -j "$NPROC" && BUILT=1
fi

TRAIN=$BUILD/tools/pmap-train BENCH=$BUILD/bench/pmap-bench ALLRED=$BUILD/bench/pmap-allreduce
STEPB=$BUILD/bench/pmap-step
# The NCCL the built library loads by itself (its RUNPATH, no LD_LIBRARY_PATH) must be the one
# chosen: another one first on the path is what the library's version check would refuse.
nccl_loaded() {
  local lib
  lib=$(env -u LD_LIBRARY_PATH ldd "$BUILD/libpmap.so" | awk '/libnccl/ {print $3; exit}')
  echo "libpmap.so loads $lib; chosen: $NCCL_LIB"
  [ -n "$lib" ] && [ "$(readlink -f "$lib")" = "$(readlink -f "$NCCL_LIB")" ]
}
if (( BUILT )); then
  check nccl-loaded "libpmap.so loads $NCCL_LIB by its RUNPATH" nccl_loaded
elif (( DRY )); then
  echo "== nccl-loaded would check: ldd $BUILD/libpmap.so resolves libnccl.so.2 to $NCCL_LIB"
  record nccl-loaded planned 0 "" ""
fi
# In a dry run: every program and test the steps name exists in the configured build, and every
# option they pass is one the program parses (as a string in its source).
if (( DRY && CONFIGURED )); then
  check targets "pmap-train, pmap-bench, pmap-allreduce and the gpu tests are build targets" \
    bash -c 'targets=$(ninja -C "$1" -t targets all) && for t in tools/pmap-train bench/pmap-bench bench/pmap-step bench/pmap-allreduce tests/gpu/test_gpu_ops tests/gpu/test_gpu_coll tests/gpu/test_gpu_pmap tests/gpu/test_gpu_fast; do grep -q "^$t:" <<<"$targets" || { echo "no target $t"; exit 1; }; done' _ "$BUILD"
  check tests "the gpu suite lists gpu_ops, gpu_coll, gpu_pmap, gpu_fast" \
    bash -c 'l=$("$@" test -C "$0" --list --no-rebuild 2>&1 || "$@" test -C "$0" --list 2>&1); for t in gpu_ops gpu_coll gpu_pmap gpu_fast; do grep -q "$t" <<<"$l" || { echo "no test $t"; exit 1; }; done' "$BUILD" "${MESON[@]}"
fi
# opts_known SOURCE ARG...: every -x/--xx argument appears as "-x" in SOURCE (or cli.c).
opts_known() {
  local src=$1 a
  shift
  for a in "$@"; do
    case $a in
    -*) grep -qF "\"${a%%=*}\"" "$src" "$SRC/tools/cli.c" || { echo "$src does not parse $a"; return 1; } ;;
    esac
  done
}

# ------------------------------------------------------------------------------------------
# Steps on the GPU (planned only in a dry run)

TRAIN_MODELS=(mlp convnet)
COUNTS=1,2,4 SWITCH_COUNTS=1,4
(( MULTI )) || COUNTS=1 SWITCH_COUNTS=1
BENCH_ARGS=(--backend cuda --model mlp-1024,cifar-cnn --devices "$COUNTS" --steps 30 --warmup 3 --json)
SWITCH_ARGS=(--backend cuda --model mlp-1024 --devices "$SWITCH_COUNTS" --scaling strong
  --steps 30 --warmup 3 --no-ref --json)
ALLRED_ARGS=(--backend cuda -d "$COUNTS" -b 8 -e 64M -f 4 -n 20 -w 5 --json)
# The step's fast paths: each variant on 1, 2, 4 devices against the plain step (pmap-step), the
# small seed model for the host time, mlp-1024 for the overlap; the sharded optimizer through
# pmap-bench and pmap-train where they have --shard-optimizer.
STEP_ARGS=(--backend cuda --devices "$COUNTS" --warmup 5 --json)
SHARD_BENCH_ARGS=(--backend cuda --model mlp --devices "$COUNTS" --steps 100 --warmup 5 --no-ref
  --json --shard-optimizer)
JAX_ARGS=(--pmap-bench "$BENCH" --platform gpu --devices 1 --models mlp-1024,cifar-cnn --steps 30
  --warmup 3 --repeat 1 --precision both --out "$OUT/logs/jax")
if (( DRY )); then
  check options "the options the steps pass are parsed by the programs" bash -c "
    $(declare -f opts_known); SRC='$SRC'
    opts_known '$SRC/bench/pmap-bench.c' ${BENCH_ARGS[*]} ${SWITCH_ARGS[*]} &&
    opts_known '$SRC/bench/pmap-allreduce.c' ${ALLRED_ARGS[*]} &&
    opts_known '$SRC/bench/pmap-step.c' ${STEP_ARGS[*]} --model --steps &&
    opts_known '$SRC/tools/pmap-train.c' --backend --devices --model --json --steps --log-every &&
    grep -qF -- '--precision' '$SRC/bench/jax_compare.py'"
fi

# Whether a program has an option: its --help on this machine, or in a dry run (nothing built)
# the option as a string in its source.
has_option() { # program source-folder option
  if (( DRY )); then grep -rqF -- "\"$3\"" "$2"; else "$1" --help 2>&1 | grep -qF -- "$3"; fi
}

# The step's fast paths (docs/cuda.md): plain, graph, overlap and both per device count, timed
# and compared with the plain step by pmap-step; the sharded optimizer timed by pmap-bench and
# its final loss compared with the plain one's by pmap-train, or "unavailable" where those
# programs lack --shard-optimizer.
step_variants() {
  run_step step-mlp 60 "$STEPB" "${STEP_ARGS[@]}" --model mlp --steps 200
  run_step step-mlp-1024 60 "$STEPB" "${STEP_ARGS[@]}" --model mlp-1024 --steps 30
  if ! has_option "$BENCH" "$SRC/bench" --shard-optimizer; then
    unavailable step-sharded "pmap-bench has no --shard-optimizer"
  else
    run_step step-sharded 60 "$BENCH" "${SHARD_BENCH_ARGS[@]}"
  fi
  if ! has_option "$TRAIN" "$SRC/tools" --shard-optimizer; then
    unavailable agree-sharded "pmap-train has no --shard-optimizer"
    return
  fi
  local n
  for n in 2 4; do
    if (( ! MULTI )); then skip_multi "agree-plain-$n"; skip_multi "agree-sharded-$n"; continue; fi
    run_step "agree-plain-$n" 40 "$TRAIN" --backend cuda --devices "$n" --model mlp --steps 100 \
      --log-every 0 --json
    run_step "agree-sharded-$n" 40 "$TRAIN" --backend cuda --devices "$n" --model mlp --steps 100 \
      --log-every 0 --json --shard-optimizer
  done
}

GPU_STEPS=0 WAIT_NOTE=""
if (( DRY || (BUILT && HAVE_GPU) )); then GPU_STEPS=1; fi
if (( GPU_STEPS )); then
  # With a GPU present a skipped GPU test means the GPU was not usable: a failure here.
  gpu_suite() { # name devices test...
    local name=$1 n=$2
    shift 2
    run_step "$name" 200 env PMAP_GPU_TEST_DEVICES="$n" "${MESON[@]}" test -C "$BUILD" \
      --print-errorlogs "$@"
    if (( ! DRY )) && grep -Eq '^Skipped: +[1-9]' "$OUT/logs/$name.log"; then
      amend fail "GPU tests skipped although nvidia-smi lists a GPU: $(grep -m1 '^SKIP' "$BUILD/meson-logs/testlog.txt" | cut -c1-160)"
    fi
    (( DRY )) || cp "$BUILD/meson-logs/testlog.txt" "$OUT/logs/$name-testlog.txt" 2>/dev/null
  }
  # A short run first, on 1 then 2 devices: where the default waits (a blocking-sync event)
  # hang on this machine, every later step runs with PMAP_CUDA_WAIT=poll, said in the summary.
  smoke=(--backend cuda --model mlp --steps 50 --log-every 0 --json)
  run_step smoke-1 40 "$TRAIN" --devices 1 "${smoke[@]}"
  rc=$?
  if (( ! DRY && (rc == 124 || rc == 137) )); then
    if run_step smoke-1-poll 40 env PMAP_CUDA_WAIT=poll "$TRAIN" --devices 1 "${smoke[@]}"; then
      export PMAP_CUDA_WAIT=poll
      WAIT_NOTE="The default waits (blocking-sync CUDA events) hung here: every step after smoke-1 ran with PMAP_CUDA_WAIT=poll."
      echo "!! $WAIT_NOTE"
    fi
  fi
  if (( MULTI )); then
    run_step smoke-2 60 "$TRAIN" --devices 2 "${smoke[@]}"
  else
    skip_multi smoke-2
  fi
  # The op tests, then collectives with their abort and timeout tests, and training against the
  # CPU and against 1 device on every example model, on 2 and on 4 logical devices.
  if (( MULTI )); then
    gpu_suite gpu-tests-2 2 --suite gpu
    gpu_suite gpu-tests-4 4 gpu_coll gpu_pmap gpu_fast
  else
    gpu_suite gpu-tests-1 1 --suite gpu
    skip_multi gpu-tests-2
    skip_multi gpu-tests-4
  fi
  for model in "${TRAIN_MODELS[@]}"; do
    for n in 1 2 4; do
      if (( n > 1 && ! MULTI )); then skip_multi "train-$model-$n"; continue; fi
      run_step "train-$model-$n" 60 "$TRAIN" --backend cuda --devices "$n" --model "$model" --json
    done
  done
  run_step allreduce 90 "$ALLRED" "${ALLRED_ARGS[@]}"
  (( MULTI )) || SKIPPED_MULTI+=("allreduce and bench at 2 and 4 devices")
  run_step bench 120 "$BENCH" "${BENCH_ARGS[@]}"
  step_variants
  # The CPU suite (its CLI test pins --backend cpu, so the GPU here changes nothing in it).
  run_step cpu-tests 120 "${MESON[@]}" test -C "$BUILD" --no-suite gpu --print-errorlogs \
    --num-processes "$NPROC"
  # JAX's pmap on the GPU: one device per GPU, so 1 device on one GPU, at FP32 and at TF32.
  if [ -z "$JAX_PY" ]; then
    unavailable jax-compare "no Python here imports numpy and jax"
  else
    (( DRY )) && check jax-args "jax_compare.py accepts the step's arguments" \
      "$JAX_PY" "$SRC/bench/jax_compare.py" "${JAX_ARGS[@]}" --dry-run
    run_step jax-compare 120 env PYTHONUNBUFFERED=1 "$JAX_PY" "$SRC/bench/jax_compare.py" \
      "${JAX_ARGS[@]}"
  fi
  # Each run-time switch of the CUDA backend against the default run above (bench-default).
  run_step bench-default 60 "$BENCH" "${SWITCH_ARGS[@]}"
  for sw in PMAP_CUDA_WAIT=poll PMAP_CUDA_PINNED_MB=0 PMAP_CUDA_COLL_WAIT=1 PMAP_CUDA_TF32=1; do
    name=bench-$(echo "${sw%%=*}" | tr '[:upper:]_' '[:lower:]-' | sed 's/^pmap-cuda-//')-${sw#*=}
    run_step "$name" 60 env "$sw" "$BENCH" "${SWITCH_ARGS[@]}"
  done
  # Optional tools: a refusal of the device, or counters that cannot be read, is "unavailable".
  if [ -z "$SANITIZER" ]; then
    unavailable memcheck-gpu-ops "compute-sanitizer not found"
  else
    # API errors that NCCL and cuBLAS make and handle themselves are not pmap's: not reported.
    run_step memcheck-gpu-ops 110 "$SANITIZER" --tool memcheck --report-api-errors no \
      --leak-check no --error-exitcode 3 "$BUILD/tests/gpu/test_gpu_ops"
    rc=$?
    log=$OUT/logs/memcheck-gpu-ops.log
    if (( ! DRY && rc != 0 )); then
      if grep -q 'Device not supported' "$log"; then
        amend unavailable "compute-sanitizer refuses this device: $(grep -m1 'Device not supported' "$log" | cut -c1-120)"
      elif (( rc == 124 || rc == 137 )); then
        amend unavailable "did not finish under the sanitizer within its limit"
      elif (( rc != 3 )) && ! grep -q '========= ' "$log"; then
        amend unavailable "compute-sanitizer did not run: $(tail -n 1 "$log" | cut -c1-120)"
      fi
    fi
  fi
  if [ -z "$NCU" ]; then
    unavailable ncu-mlp-1024 "Nsight Compute (ncu) not found"
  else
    # The clocks are left as they are (--clock-control none): the timing steps share them.
    run_step ncu-mlp-1024 90 "$NCU" --clock-control none --launch-count 12 --section SpeedOfLight \
      "$TRAIN" --backend cuda --devices 1 --model mlp-1024 --steps 2
    rc=$?
    if (( ! DRY && rc != 0 )); then
      amend unavailable "ncu could not profile here: $(grep -Eim1 'ERR_|error|failed|not supported' "$OUT/logs/ncu-mlp-1024.log" | cut -c1-160)"
    fi
  fi
fi

# ------------------------------------------------------------------------------------------
# Summary

TOTAL=$(elapsed)
RESULT=pass
(( FAILED )) && RESULT=fail
(( ! DRY && HAVE_GPU == 0 )) && RESULT=no-gpu
(( DRY )) && RESULT=dry-run-$([ "$FAILED" = 1 ] && echo fail || echo pass)

# A program's JSON line, checked with Python where there is one; a string otherwise.
json_value() {
  if [ -n "$1" ] && [ -n "$PY" ] && printf '%s' "$1" | "$PY" -c 'import json,sys; json.load(sys.stdin)' 2>/dev/null; then
    printf '%s' "$1"
  else
    json_str "$1"
  fi
}

MULTI_NOTE=""
(( MULTI )) || MULTI_NOTE="SKIPPED (${SKIPPED_MULTI[*]}): $MULTI_WHY"
{
  printf '{\n  "date": %s,\n  "host": %s,\n  "result": %s,\n  "dry_run": %s,\n  "seconds": %d,\n' \
    "$(json_str "$(date -u +%FT%TZ)")" "$(json_str "$(hostname)")" "$(json_str "$RESULT")" \
    "$( (( DRY )) && echo true || echo false)" "$TOTAL"
  printf '  "gpu": {"name": %s, "count": %d, "driver": %s, "memory": %s, "compute_capability": %s},\n' \
    "$(json_str "$GPU_NAME")" "$GPU_COUNT" "$(json_str "$GPU_DRIVER")" "$(json_str "$GPU_MEM")" "$(json_str "$GPU_CC")"
  printf '  "cuda": %s,\n  "driver_cuda": %s,\n  "cublas": %s,\n' "$(json_str "$CUDA_VERSION")" \
    "$(json_str "$DRIVER_CUDA")" "$(json_str "$CUBLAS_VERSION")"
  printf '  "nccl": %s,\n  "nccl_root": %s,\n  "nccl_header": %s,\n  "nccl_library": %s,\n  "nccl_library_reports": %s,\n' \
    "$(json_str "$NCCL_VERSION")" "$(json_str "$NCCL_ROOT")" "$(json_str "$NCCL_HEADER")" \
    "$(json_str "$NCCL_LIB")" "$(json_str "$NCCL_LIB_VERSION")"
  printf '  "python": %s,\n  "jax_python": %s,\n  "jax": %s,\n  "meson": %s,\n  "ninja": %s,\n  "cpu_cores": %d,\n' \
    "$(json_str "$PY")" "$(json_str "$JAX_PY")" "$(json_str "$JAX_VERSION")" \
    "$(json_str "$MESON_VERSION")" "$(json_str "$NINJA_VERSION")" "$NPROC"
  printf '  "device_ids": %s,\n  "multi_device": %s,\n  "multi_device_skipped": %s,\n  "wait_fallback": %s,\n  "build_options": %s,\n  "steps": [\n' \
    "$(json_str "$IDS")" "$( (( MULTI )) && echo true || echo false)" "$(json_str "$MULTI_NOTE")" \
    "$(json_str "$WAIT_NOTE")" "$(json_str "${SETUP[*]}")"
  for i in "${!STEP_NAMES[@]}"; do
    name=${STEP_NAMES[$i]}
    out=$(last_json "$OUT/logs/$name.log")
    printf '    {"name": %s, "status": %s, "seconds": %s, "rc": %s, "note": %s, "log": %s, "output": %s}%s\n' \
      "$(json_str "$name")" "$(json_str "${STEP_STATUS[$i]}")" "${STEP_SECONDS[$i]}" \
      "${STEP_RC[$i]:-null}" "$(json_str "${STEP_NOTES[$i]}")" \
      "$(json_str "$([ -f "$OUT/logs/$name.log" ] && echo "logs.tar.gz:logs/$name.log")")" \
      "$(if [ -n "$out" ]; then json_value "$out"; else echo null; fi)" \
      "$([ "$i" -lt $(( ${#STEP_NAMES[@]} - 1 )) ] && echo ,)"
  done
  printf '  ]\n}\n'
} >"$OUT/summary.json"

{
  echo "# pmap gpu-check: $RESULT"
  echo
  if (( ! MULTI )); then
    echo "**Multi-device steps skipped: ${SKIPPED_MULTI[*]}.** $MULTI_WHY."
    echo
  fi
  if [ -n "$WAIT_NOTE" ]; then
    echo "**$WAIT_NOTE**"
    echo
  fi
  echo '```'
  cat "$OUT/environment.txt"
  echo '```'
  echo
  echo "| step | status | seconds | note |"
  echo "|---|---|---|---|"
  for i in "${!STEP_NAMES[@]}"; do
    echo "| ${STEP_NAMES[$i]} | ${STEP_STATUS[$i]} | ${STEP_SECONDS[$i]} | ${STEP_NOTES[$i]//|/\\|} |"
  done
  echo
  echo "Total ${TOTAL} s. Every log is in \`logs.tar.gz\`, this script's output in \`check.log\`;"
  echo "every figure in \`summary.json\`."
  [ -n "$PY" ] && [ -f "$SRC/bench/gpu_check_figures.py" ] &&
    "$PY" "$SRC/bench/gpu_check_figures.py" "$OUT/summary.json" 2>&1
  # The end of every failed step's log, so that this file alone says what happened.
  for i in "${!STEP_NAMES[@]}"; do
    name=${STEP_NAMES[$i]}
    [ -f "$OUT/logs/$name.log" ] && [ "${STEP_STATUS[$i]}" = fail ] || continue
    echo
    echo "## $name (fail)"
    echo
    echo '```'
    grep -v '^{' "$OUT/logs/$name.log" | tail -n 40
    echo '```'
  done
} >"$OUT/summary.md"

# One archive of the logs instead of a folder of them (the output's file count is limited).
if tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && [ "${GPU_CHECK_KEEP_LOG_DIR:-0}" != 1 ]; then
  rm -rf "$OUT/logs"
fi

# A dry run's build folder is of no further use (a named one is kept).
(( DRY )) && [ -z "${GPU_CHECK_BUILD_DIR:-}" ] && rm -rf "$BUILD"

echo
echo "gpu-check: $RESULT in ${TOTAL}s; summary in $OUT/summary.md and $OUT/summary.json"
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null
case $RESULT in
pass | dry-run-pass) exit 0 ;;
no-gpu) exit 2 ;;
*) exit 1 ;;
esac
