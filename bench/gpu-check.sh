#!/usr/bin/env bash
# gpu-check.sh: the one-shot check of pmap on a machine with an NVIDIA GPU and no network, sized
# for one H200 with 16 cores and one call of about 8 minutes. It builds what it runs, then runs a
# plan of steps ordered by what they tell, each under its own time limit, computed from what the
# step costs (bench/gpu-check-plan.sh; the probe's measurements raise them): (a) the build, (b)
# the probe and one device: every CUDA op (the op harness, tests/ops: float64, finite differences
# and the CPU kernels), every example model against the CPU; (c) NCCL with 2 ranks on the GPU,
# then bf16 (the models, and the op harness's bf16 ops on 2 devices at once) and 2 logical
# devices: collectives, training against the CPU, the sharded optimizer, graphs and overlap, the
# fallbacks, all only where the 2-rank NCCL step passed (else skipped, saying why); (e)
# performance: the mlp-1024 and gpt-mini steps (plain, graph, overlap), the seed model's host
# time, the all-reduce table (1 device only, where 2 ranks do not work); (f) JAX on the same GPU;
# (d) 4 logical devices on one GPU, beyond what NCCL 2.30 documents, last and only with --four.
#
#   bash bench/gpu-check.sh [OUTDIR] [--nccl DIR] [--dry-run] [--four] [--fail-nccl]
#
# OUTDIR      where the results go: summary.md (its first line counts the steps that passed,
#             failed and did not run), summary.json (every figure), logs.tar.gz (every step's
#             log), check.log (this script's output), environment.txt: 5 files, never more.
#             Default $OUT when set, else bench/results/gpu-<date>-<gpu>. They are rewritten
#             after every step and on exit, TERM or INT, so a run cut short still reports.
# --nccl DIR  an NCCL with DIR/include/nccl.h and DIR/lib/libnccl.so.2, used to build and, first
#             on LD_LIBRARY_PATH, by every step; also GPU_CHECK_NCCL=DIR; default .nccl/ in the
#             source tree when present, else the newest beside CUDA, in the system or in an
#             nvidia-nccl-cu* wheel. NCCL >= 2.30 runs several logical devices on one GPU.
# --dry-run   on any machine: finds every tool, loads the NCCL, configures and builds exactly as
#             the real run would, checks every program, test and option the steps use, prints
#             every step with its limit and the reasoning behind it, and fails when a check
#             fails or the limits add up to more than the budget. Runs nothing on a GPU.
#             bench/gpu-rehearse.sh runs it as the device call will (docs/cuda.md).
# --four      also 4 logical devices on one GPU (gpu-coll-4), last, where its limit fits in what
#             is left; also GPU_CHECK_FOUR=1
# --fail-nccl a test of the plan: the 2-rank NCCL steps (nccl-2, nccl-2-nocumem) fail at once, as
#             where NCCL cannot put two ranks on one GPU, so that every step that needs them is
#             skipped with the reason, in a dry run too
#
# The summary's top names the source (the commit, whether it was dirty, a hash of `git status
# --porcelain`: from .gpu-check-source, which bench/gpu-rehearse.sh writes and the call carries,
# where there is no .git) and the NCCL the steps load (the probe's own ncclGetVersion).
# GPU_CHECK_BUDGET_S (default 480) bounds the whole run: a step starts only if its limit fits in
# what is left, else it is "not run" (never a pass). GPU_CHECK_BUILD_DIR picks the build folder
# (default: a fresh one under /tmp). Exit status: 0 every step passed, 1 a step failed, 2 no
# usable GPU, 3 nothing failed but some steps did not run.
set -u
trap '' PIPE # a console that went away must not end the run before its summary

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUDGET=${GPU_CHECK_BUDGET_S:-480}
START=$(date +%s)
NPROC=$(nproc 2>/dev/null || echo 4)
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

OUT_ARG="" NCCL_ARG=${GPU_CHECK_NCCL:-} DRY=0 FOUR=${GPU_CHECK_FOUR:-0} FAIL_NCCL=0
while [ $# -gt 0 ]; do
  case $1 in
  --nccl) NCCL_ARG=${2:?gpu-check: --nccl needs a folder}; shift 2 ;;
  --nccl=*) NCCL_ARG=${1#--nccl=}; shift ;;
  --dry-run) DRY=1; shift ;;
  --four) FOUR=1; shift ;;
  --fail-nccl) FAIL_NCCL=1; shift ;;
  -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  -*) echo "gpu-check: unknown option $1 (see --help)" >&2; exit 1 ;;
  *)
    [ -z "$OUT_ARG" ] || { echo "gpu-check: more than one OUTDIR ($OUT_ARG, $1)" >&2; exit 1; }
    OUT_ARG=$1; shift ;;
  esac
done
if [ -z "$NCCL_ARG" ] && [ -d "$SRC/.nccl" ]; then NCCL_ARG=$SRC/.nccl; fi
[ "$FOUR" = 1 ] || FOUR=0
DRYRUN=$DRY # DRY alone is lifted for the dry run's real configure and build

# ------------------------------------------------------------------------------------------
# The plan: every step, its stage and its limit from what it costs (bench/gpu-check-plan.sh).
# The limits add up to at most the budget (the dry run fails otherwise), so every step fits
# when each keeps to its limit.

# shellcheck source=bench/gpu-check-plan.sh
source "$SRC/bench/gpu-check-plan.sh"
plan_limits
# Kept out of the steps' time: the end of a run (summary, archive) and the stacks of the first
# step that hangs (STACKS_S). The plan's limits fit in the rest.
RESERVE=25

# ------------------------------------------------------------------------------------------
# Output: the five files in OUT; the steps' logs in a work folder, archived after every step.

GPU_NAME="" GPU_COUNT=0 GPU_DRIVER="" GPU_MEM="" GPU_CC=""
if ! command -v nvidia-smi >/dev/null 2>&1 && [ -x /usr/local/nvidia/bin/nvidia-smi ]; then
  export PATH="$PATH:/usr/local/nvidia/bin"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
  SMI=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null)
  [ -z "$SMI" ] && SMI=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)
  GPU_COUNT=$(printf '%s\n' "$SMI" | grep -c . || true)
  IFS=',' read -r GPU_NAME GPU_DRIVER GPU_MEM GPU_CC <<<"$(printf '%s\n' "$SMI" | head -n 1)"
  GPU_NAME=$(echo "$GPU_NAME" | sed 's/^ *//; s/ *$//')
  GPU_DRIVER=$(echo "$GPU_DRIVER" | tr -d ' ')
  GPU_MEM=$(echo "$GPU_MEM" | sed 's/^ *//')
  GPU_CC=$(echo "${GPU_CC:-}" | tr -d ' ')
fi
SLUG=$(echo "${GPU_NAME:-no-gpu}" | tr '[:upper:]' '[:lower:]' | sed 's/nvidia //; s/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
OUTDIR=${OUT_ARG:-${OUT:-$SRC/bench/results/gpu-$(date +%F)-$SLUG}}
mkdir -p "$OUTDIR" || { echo "gpu-check: cannot create $OUTDIR" >&2; exit 1; }
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d /tmp/pmap-gpu-check-work.XXXXXX)
LOGS=$WORK/logs
mkdir -p "$LOGS"
exec 3>&1 # the console: progress and, at the end, the summary
exec >"$OUTDIR/check.log" 2>&1
say() { printf '%s\n' "$*"; printf '%s\n' "$*" >&3 2>/dev/null || true; }

# ------------------------------------------------------------------------------------------
# Recording, the summary and the step runner (bench/gpu-check-lib.sh).

# shellcheck source=bench/gpu-check-lib.sh
source "$SRC/bench/gpu-check-lib.sh"

# TERM, INT or HUP: the step under way (its own process group, made by setsid) is ended and
# recorded as interrupted, and the run ends with its summary.
on_term() {
  TERMINATED=1
  NOTES+=("The check was terminated after $(elapsed)s: the steps after it did not run.")
  if [ -n "$CUR_PID" ]; then
    kill_group "$CUR_PID"
    local secs
    secs=$(awk -v a="$CUR_T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    record "$CUR_STEP" interrupted "$secs" "the check was terminated while it ran"
    CUR_PID="" CUR_STEP=""
  fi
  exit 143
}

on_exit() {
  local rc=$?
  trap - EXIT TERM INT HUP
  checkpoint
  say ""
  say "gpu-check: $RESULT in $(elapsed)s; summary in $OUTDIR/summary.md"
  sed -n '1,4p' "$OUTDIR/summary.md" >&3 2>/dev/null
  grep -E '^\| ' "$OUTDIR/summary.md" >&3 2>/dev/null
  ((DRYRUN)) && [ -z "${GPU_CHECK_BUILD_DIR:-}" ] && [ -n "${BUILD:-}" ] && rm -rf "$BUILD"
  rm -rf "$WORK"
  if ((TERMINATED)); then exit 143; fi
  case $RESULT in
  pass | dry-run-pass) exit 0 ;;
  no-gpu) exit 2 ;;
  incomplete) exit 3 ;;
  *) exit $((rc ? rc : 1)) ;;
  esac
}
RESULT=running MULTI=0 BUILD=""
trap on_term TERM INT HUP
trap on_exit EXIT

# ------------------------------------------------------------------------------------------
# Tools: nvcc, Python, Meson, Ninja, NCCL, JAX

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
[ -n "$NVCC" ] && PATH="$(dirname "$NVCC"):$PATH" && export PATH
CUDA_VERSION=$([ -n "$NVCC" ] && "$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
CUDA_ROOT=$([ -n "$NVCC" ] && cd "$(dirname "$NVCC")/.." && pwd)

# Python: an active virtual environment, the one on PATH, then the usual places of one (the GPU
# machines keep meson, ninja, numpy and JAX in /opt/*/.venv).
PYS=()
for p in ${VIRTUAL_ENV:+$VIRTUAL_ENV/bin/python3} python3 python /opt/*/.venv/bin/python3 \
  /opt/*/venv/bin/python3 "$HOME"/.venv/bin/python3 /usr/local/bin/python3 /usr/bin/python3; do
  p=$(command -v "$p" 2>/dev/null) || continue
  # The interpreter itself, not a wrapper (a version manager's shim costs a start each time).
  p=$("$p" -c 'import sys; print(sys.executable)' 2>/dev/null) && [ -x "$p" ] || continue
  case " ${PYS[*]} " in *" $p "*) ;; *) PYS+=("$p") ;; esac
done
PY=${PYS[0]:-}
JAX_PY="" JAX_VERSION=""
for p in "${PYS[@]}"; do
  if v=$("$p" -c 'import numpy, jax; print(jax.__version__)' 2>/dev/null); then
    JAX_PY=$p JAX_VERSION=$v
    break
  fi
done
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
  if ((c > NCCL_CODE)); then
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
  for p in "${PYS[@]}"; do
    w=$("$p" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) &&
      nccl_candidate "$w" "$w/include/nccl.h" "$w/lib"
  done
fi
# Every step loads the NCCL chosen: its folder first on the loader's path (the library's own
# run path names it too; a program loading NCCL another way must find the same one). JAX's step
# gets the loader's path as it was, so that JAX loads the NCCL it comes with.
JAX_LD=(env -u LD_LIBRARY_PATH)
if [ -n "${LD_LIBRARY_PATH+set}" ]; then JAX_LD=(env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"); fi
if [ -n "$NCCL_LIB" ]; then
  export LD_LIBRARY_PATH="$(dirname "$NCCL_LIB")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
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

# The source: the machine receives no .git, so the checkout writes what it is into
# .gpu-check-source before the call (bench/gpu-rehearse.sh does it, and the call carries the
# file): the commit, whether it was dirty, a hash of `git status --porcelain`. Where the .git is
# here, git answers itself.
SOURCE_COMMIT="" SOURCE_DIRTY="" SOURCE_STATUS="" SOURCE_DESC="" SOURCE_FROM=""
if git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
  SOURCE_TEXT=$(bash "$SRC/bench/gpu-check-source.sh" "$SRC" 2>&1) SOURCE_FROM="git"
elif [ -f "$SRC/.gpu-check-source" ]; then
  SOURCE_TEXT=$(cat "$SRC/.gpu-check-source") SOURCE_FROM=".gpu-check-source"
else
  SOURCE_TEXT=""
fi
source_field() { printf '%s\n' "$SOURCE_TEXT" | sed -n "s/^$1 //p" | head -n 1; }
SOURCE_COMMIT=$(source_field commit) SOURCE_DIRTY=$(source_field dirty)
SOURCE_STATUS=$(source_field status-sha256)
if [ -n "$SOURCE_COMMIT" ]; then
  SOURCE_DESC="commit $SOURCE_COMMIT ($(source_field describe), $(source_field branch)), $([ "$SOURCE_DIRTY" = yes ] && echo "DIRTY (tracked files differ from it)" || echo clean), git status --porcelain: $(source_field status-lines) lines, sha256 ${SOURCE_STATUS:0:16}; from $SOURCE_FROM$([ "$SOURCE_FROM" = git ] || echo ", written $(source_field written)")"
else
  SOURCE_DESC="unknown: no .git here and no .gpu-check-source (bench/gpu-rehearse.sh writes it in the checkout before the call, which carries it)"
fi
# The NCCL the steps load, as the probe (a program of this build, in the steps' environment)
# reports it from ncclGetVersion and the file it came from; until then unknown.
NCCL_LOADED=""
nccl_loaded_from() { # a log holding the probe's "nccl loaded:" line -> NCCL_LOADED
  local v
  v=$(sed -n 's/^nccl loaded: [0-9]* (\([0-9.]*\)) from \(.*\)$/\1, from \2/p' "$1" | head -n 1)
  [ -n "$v" ] || return 1
  NCCL_LOADED="$v (as the probe loaded it$( [ "${v%%,*}" = "$NCCL_VERSION" ] || echo "; NOT the $NCCL_VERSION of the header built against"))"
}

# Several logical devices on fewer GPUs need NCCL >= 2.30; each such step then loads every
# kernel eagerly (CUDA_MODULE_LOADING=EAGER, docs/cuda.md) and may share the GPU.
MULTI=1 MULTI_WHY=""
GPUS_FOR_IDS=$((GPU_COUNT > 0 ? GPU_COUNT : 1))
IDS=""
for i in 0 1 2 3; do IDS+="${IDS:+,}$((i % GPUS_FOR_IDS))"; done
if ((GPU_COUNT < 4 && NCCL_CODE < 23000)); then
  MULTI=0
  MULTI_WHY="2 and 4 logical devices on ${GPU_COUNT} GPU(s) need NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1, and the NCCL found is ${NCCL_VERSION:-none} (give one with --nccl DIR)"
  NOTES+=("Multi-device steps not run: $MULTI_WHY.")
fi
export PMAP_CUDA_DEVICE_IDS=$IDS
# Where devices share the GPU: every module loaded at CUDA's start, and 32 hardware queues
# instead of CUDA's 8 (4 ranks x 2 streams and NCCL's own exceed 8, and two streams on one queue
# serialize: a rank's collective kernel queued behind another's, which waits for it, hangs;
# docs/cuda.md). Both are read when CUDA starts, so they are in the step's environment.
SHARED_ENV=(NCCL_MULTI_RANK_GPU_ENABLE=1 CUDA_MODULE_LOADING=EAGER CUDA_DEVICE_MAX_CONNECTIONS=32)
MULTI_ENV=(env "${SHARED_ENV[@]}")
# One device: none of them, so that those steps also show the default (lazy) loading works alone.
ONE_ENV=(env -u NCCL_MULTI_RANK_GPU_ENABLE -u CUDA_MODULE_LOADING -u CUDA_DEVICE_MAX_CONNECTIONS)
# FP32 GEMMs in every step (JAX's comparison sets its own), and the CPU GEMM choice measured
# once for all of them; the tests also get the suite's short spins (tests/meson.build), the
# performance steps the library's defaults.
export PMAP_CUDA_TF32=0 XDG_CACHE_HOME=$WORK/cache
MULTI_ENV+=(PMAP_SPIN_US=50) ONE_ENV+=(PMAP_SPIN_US=50)
PERF_ENV=(env "${SHARED_ENV[@]}")

write_environment() {
  {
    echo "pmap gpu-check$( ((DRYRUN)) && echo " (dry run)") $(date -u +%FT%TZ) on $(hostname)"
    echo "  source        $SRC: $SOURCE_DESC"
    echo "  GPUs          $GPU_COUNT x ${GPU_NAME:-none} (${GPU_MEM:-?}, compute capability ${GPU_CC:-?})"
    echo "  driver        ${GPU_DRIVER:-none} (CUDA ${DRIVER_CUDA:-?})"
    echo "  CUDA (nvcc)   ${CUDA_VERSION:-not found} ${NVCC:+at $NVCC}"
    echo "  cuBLAS        ${CUBLAS_VERSION:-not found}"
    echo "  NCCL          ${NCCL_VERSION:-not found} ${NCCL_HEADER:+($NCCL_HEADER, $NCCL_LIB reports ${NCCL_LIB_VERSION:-?})}"
    echo "  NCCL loaded   ${NCCL_LOADED:-not known yet (the probe says)}"
    echo "  loader path   LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "  devices       1, 2$( ((FOUR)) && echo ", 4 (--four)") on GPUs $IDS (2 logical devices on a GPU: the most NCCL 2.30 documents)$( ((MULTI)) || echo " -- 2 and 4 NOT POSSIBLE: $MULTI_WHY")"
    echo "  2 and 4       ${MULTI_ENV[*]:1}"
    echo "  GEMMs         FP32 (PMAP_CUDA_TF32=0), in JAX's comparison too (--precision fp32)"
    echo "  Python        ${PY:-none}; JAX ${JAX_VERSION:-not found} ${JAX_PY:+($JAX_PY)}"
    echo "  meson, ninja  ${MESON_VERSION:-not found}, ${NINJA_VERSION:-not found}"
    echo "  CPU cores     $NPROC"
    echo "  output        $OUTDIR"
    local plog=${PROBE_LOG:-$LOGS/probe.log}
    if [ -f "$plog" ]; then
      echo "  $(basename "$plog" .log) (tests/gpu/gpu_probe, with the 2- and 4-device environment):"
      grep -v '^\$\|^$' "$plog" | sed 's/^/    /'
    fi
    local f
    for f in "$LOGS"/nccl-2.log "$LOGS"/nccl-2-nocumem.log "$LOGS"/gpu-coll-4.log; do
      [ -f "$f" ] || continue
      echo "  NCCL's own report ($(basename "$f" .log), NCCL_DEBUG=INFO):"
      grep -Eo 'Comm config (Min|Max) CTAs set to [0-9]+|NCCL version [0-9.]+[^ ]*|nRanks [0-9]+ nNodes [0-9]+ localRanks [0-9]+|[0-9]+ coll channels, [0-9]+ collnet channels, [0-9]+ nvls channels, [0-9]+ p2p channels' "$f" |
        sort | uniq -c | sed 's/^ */    /'
    done
    echo "  limits        from the ${COSTS_FROM}: eager start ${COST_EAGER} s, lazy ${COST_LAZY} s, context of 1 device ${COST_CTX1} s, of several sharing the GPU ${COST_CTXN} s, margin ${MARGIN}x"
    if [ -n "${COSTS_NOTE:-}" ]; then echo "  costs         $COSTS_NOTE"; fi
    if [ -n "${WAIT_NOTE:-}" ]; then echo "  waits         $WAIT_NOTE"; fi
    if [ -n "${NCCL_CUMEM_ENABLE:-}" ]; then echo "  NCCL          NCCL_CUMEM_ENABLE=$NCCL_CUMEM_ENABLE"; fi
  } >"$OUTDIR/environment.txt.new"
  mv -f "$OUTDIR/environment.txt.new" "$OUTDIR/environment.txt"
}
write_environment
cat "$OUTDIR/environment.txt"
cat "$OUTDIR/environment.txt" >&3 2>/dev/null
nvidia-smi >"$LOGS/nvidia-smi.log" 2>&1 || true
say "gpu-check: plan of ${#PLAN_NAMES[@]} steps, ${PLAN_SUM}s of limits, budget ${BUDGET}s"
if ((PLAN_SUM > BUDGET - RESERVE)); then
  NOTES+=("The plan's limits add up to ${PLAN_SUM}s, more than the budget of ${BUDGET}s less ${RESERVE}s kept for the end.")
fi

HAVE_GPU=1
if ((GPU_COUNT < 1)); then
  HAVE_GPU=0
  ((DRY)) || record gpu fail 0 "no NVIDIA GPU found (nvidia-smi missing or lists none)"
fi
check tools "nvcc, meson and ninja found" test -n "$NVCC" -a ${#MESON[@]} -gt 0 -a -n "$NINJA_VERSION"
if [ -n "$NCCL_PROBLEM" ]; then
  record nccl fail 0 "$NCCL_PROBLEM"
else
  check nccl "NCCL ${NCCL_VERSION:-?} found; its library loads and reports ${NCCL_LIB_VERSION:-nothing}, as its header says" \
    test -n "$NCCL_VERSION" -a "$NCCL_LIB_VERSION" = "$NCCL_VERSION"
fi
((DRY)) && check plan "the plan's limits (${PLAN_SUM}s$( ((FOUR)) && echo ", the opt-in gpu-coll-4 apart")) fit the budget (${BUDGET}s less ${RESERVE}s kept for the end)" \
  test "$PLAN_SUM" -le $((BUDGET - RESERVE))
checkpoint

# ------------------------------------------------------------------------------------------
# (a) The build: only what the steps run, configured on this machine (its compilers and
# libraries), single-process (no MPI), warnings not fatal.

BUILD=${GPU_CHECK_BUILD_DIR:-$(mktemp -d /tmp/pmap-gpu-check.XXXXXX)}
SETUP=("${MESON[@]}" setup "$BUILD" "$SRC" -Dcuda=enabled -Dmpi=disabled -Dbuildtype=release)
SETUP+=("-Dnccl_root=$NCCL_ROOT") # also when empty: a reused build folder forgets an old one
[ -f "$BUILD/build.ninja" ] && SETUP+=(--reconfigure)
TARGETS=(libpmap-cuda.so tests/gpu/gpu_probe tests/ops/test_ops tests/gpu/test_gpu_coll
  tests/gpu/test_gpu_pmap tests/gpu/test_gpu_bf16 tests/gpu/test_gpu_fast tests/gpu/test_gpu_fallback bench/pmap-step
  bench/pmap-allreduce bench/pmap-bench)
# The CUDA plugin of this build, for the programs linked with the static library.
export PMAP_PLUGIN_DIR=$BUILD
CONFIGURED=0 BUILT=0
if [ ${#MESON[@]} -eq 0 ] || [ -z "$NVCC" ]; then
  record configure fail 0 "missing tools: nvcc '${NVCC:-}', meson '${MESON_VERSION:-}'"
  VISITED[configure]=1
elif ((DRY)); then
  # The real configuration and build, so that what would fail there fails here; under limits
  # for this machine (CI's cores are few), not the GPU machine's of the plan.
  planned=("${LIMIT[configure]}" "${LIMIT[build]}")
  LIMIT[configure]=600 LIMIT[build]=3600
  DRY=0 BUDGET=$((BUDGET + 100000)) run_step configure "${SETUP[@]}" && CONFIGURED=1
  if ((CONFIGURED)); then
    DRY=0 BUDGET=$((BUDGET + 100000)) run_step build ninja -C "$BUILD" -j "$NPROC" "${TARGETS[@]}" && BUILT=1
  else
    not_run build "the configuration failed"
  fi
  LIMIT[configure]=${planned[0]} LIMIT[build]=${planned[1]}
elif ((HAVE_GPU)); then
  run_step configure "${SETUP[@]}" && CONFIGURED=1
  if ((CONFIGURED)); then
    run_step build ninja -C "$BUILD" -j "$NPROC" "${TARGETS[@]}" && BUILT=1
  else
    not_run build "the configuration failed"
  fi
fi
T=$BUILD/tests/gpu B=$BUILD/bench

nccl_loaded() { # the built CUDA plugin loads the chosen NCCL by its own run path
  local lib
  lib=$(ldd_path "$(env -u LD_LIBRARY_PATH ldd "$BUILD/libpmap-cuda.so")" libnccl)
  echo "libpmap-cuda.so loads $lib; chosen: $NCCL_LIB"
  [ -n "$lib" ] && [ "$(readlink -f "$lib")" = "$(readlink -f "$NCCL_LIB")" ]
}
((BUILT)) && check nccl-loaded "libpmap-cuda.so loads $NCCL_LIB by its run path" nccl_loaded
opts_known() { # SOURCE ARG...: every -x/--xx argument appears as "-x" in SOURCE (or cli.c)
  local src=$1 a
  shift
  for a in "$@"; do
    case $a in
    -*) grep -qF "\"${a%%=*}\"" "$src" "$SRC/tools/cli.c" || { echo "$src does not parse $a"; return 1; } ;;
    esac
  done
}

# ------------------------------------------------------------------------------------------
# The steps on the GPU. Tests run as programs (not through meson test: its start and rebuild
# check cost seconds per step), with the suite's environment.

OPS_ARGS=(--backend cuda)
# The bf16 path's ops: cuBLAS's bf16 GEMMs, the rounding kernels, the fused optimizer's and the
# dense layers' bf16 copies (sgd_step, adam_step: w16; bias_act_forward: z16; act_bias_backward:
# dx16), on 2 devices sharing the GPU at once, each against the CPU oracle.
BF16_OPS=gemm_bf16,gemm_strided_bf16,round_bf16,round_bf16_block,widen_bf16,sgd_step,adam_step,bias_act_forward,act_bias_backward
OPS_BF16_2=(--backend cuda --devices 2 --op "$BF16_OPS")
STEP1024=(--backend cuda --model mlp-1024 --devices 1,2 --variants plain,graph,overlap --steps 30
  --warmup 5 --json)
STEPMLP=(--backend cuda --model mlp --devices 1,2 --variants plain,graph --steps 200 --warmup 10
  --json)
# gpt-mini: the transformer's ops (embedding gathers, strided GEMM batches, causal softmax) in a
# whole step, captured as a graph and overlapped, and under bf16 (cuBLAS's bf16 GEMMs).
STEPGPT=(--backend cuda --model gpt-mini --devices 1,2 --variants plain,graph,overlap,bf16
  --steps 10 --warmup 3 --json)
ALLRED=(--backend cuda -d 2 -b 8 -e 64M -f 8 -n 20 -w 5 --json)
JAX_ARGS=(--pmap-bench "$B/pmap-bench" --platform gpu --devices 1 --models mlp-1024 --steps 20
  --warmup 3 --repeat 1 --precision fp32 --out "$LOGS/jax")
# mlp-1024's 12.6 MB of gradients in buckets of 32 KiB: one bucket per dense layer, four in all
# (the default 25 MiB would make one, and nothing to overlap).
BUCKET=0.03125
# --fail-nccl: what the 2-rank NCCL steps run instead, failing at once.
FORCED_FAIL=(bash -c 'echo "FAIL: forced by --fail-nccl (a test of the steps that need 2 ranks)"; exit 1')

if ((DRY)); then
  check options "the options the steps pass are parsed by the programs" bash -c "
    $(declare -f opts_known); SRC='$SRC'
    opts_known '$SRC/tests/ops/test_ops.c' ${OPS_ARGS[*]} ${OPS_BF16_2[*]} &&
    opts_known '$SRC/bench/pmap-step.c' ${STEP1024[*]} ${STEPMLP[*]} ${STEPGPT[*]} &&
    opts_known '$SRC/bench/pmap-allreduce.c' ${ALLRED[*]} &&
    grep -qF -- '--precision' '$SRC/bench/jax_compare.py'"
  ((BUILT)) && check targets "every program a step runs was built" \
    bash -c 'for t in "${@:2}"; do [ -x "$1/$t" ] || { echo "no $1/$t"; exit 1; }; done' _ "$BUILD" "${TARGETS[@]}"
  # The op harness takes the steps' arguments: it runs (0) or finds no GPU here (77, a skip).
  ((BUILT)) && check op-harness "the op harness accepts ${OPS_ARGS[*]} and --devices 2 --op <the bf16 path's ops> (passes, or skips without a GPU)" \
    bash -c 'ops=$1; shift; "$@" --op fill; rc=$?; echo "exit status $rc"; [ $rc = 0 ] || [ $rc = 77 ] || exit 1
      "$@" --devices 2 --op "$ops"; rc=$?; echo "exit status $rc"; [ $rc = 0 ] || [ $rc = 77 ]' _ \
    "$BF16_OPS" "$BUILD/tests/ops/test_ops" "${OPS_ARGS[@]}"
  # The NCCL the steps load, as the probe reports it before it looks for a GPU (it finds none).
  if ((BUILT)); then
    timeout -k 5 60 "${MULTI_ENV[@]}" "$T/gpu_probe" >"$LOGS/nccl-loaded.log" 2>&1
    check nccl-probe "gpu_probe loads NCCL ${NCCL_VERSION:-?} in the steps' environment" \
      bash -c 'cat "$1"; grep -q "^nccl loaded: [0-9]* ($2) from " "$1"' _ "$LOGS/nccl-loaded.log" "$NCCL_VERSION"
    nccl_loaded_from "$LOGS/nccl-loaded.log" && write_environment
  fi
fi

WAIT_NOTE=""
if ((DRY || (BUILT && HAVE_GPU))); then
  # (b) The probe first: the GPU's facts, whether a blocking-sync wait returns (where it hangs,
  # every later step polls instead), the costs that raise the later limits, the NCCL loaded.
  # Where it ran out of its limit while CUDA started, once more: CUDA's driver has started then.
  run_step probe "${MULTI_ENV[@]}" "$T/gpu_probe"
  rc=$?
  PROBE_LOG=$LOGS/probe.log
  if ((DRY)); then
    run_step probe-again "${MULTI_ENV[@]}" "$T/gpu_probe"
  else
    probe_verdict "$PROBE_LOG" "$rc"
    if [ "$PROBE_VERDICT" = slow ]; then
      run_step probe-again "${MULTI_ENV[@]}" "$T/gpu_probe"
      rc=$?
      if [ -f "$LOGS/probe-again.log" ]; then
        PROBE_LOG=$LOGS/probe-again.log
        probe_verdict "$PROBE_LOG" "$rc"
      fi
    else
      not_needed probe-again "the probe did not run out of its limit while CUDA started"
    fi
  fi
  if ((!DRY)) && [ -f "$PROBE_LOG" ]; then
    nccl_loaded_from "$PROBE_LOG"
    # The probe's measured costs raise the later limits where they exceed the estimates.
    plan_from_probe "$PROBE_LOG"
  fi
  ((DRY)) || write_environment
  # The op harness's CUDA half: every op of ops/op_list.h on the GPU (exit 77, a failure here,
  # where it finds no usable GPU after the probe did).
  run_step gpu-ops-1 "${ONE_ENV[@]}" "$BUILD/tests/ops/test_ops" "${OPS_ARGS[@]}"
  run_step gpu-pmap-1 "${ONE_ENV[@]}" PMAP_GPU_TEST_DEVICES=1 "$T/test_gpu_pmap"
  # (c) 2 logical devices (on one GPU where there is one). First the least that proves NCCL with
  # two ranks, with NCCL's report of its configuration (the channel limits as it took them);
  # where that fails, once more without NCCL's cuMem allocations (the usual refusal of a
  # sandbox), which then stay off for every later step. Where neither passes, every step that
  # needs 2 ranks is skipped with the reason, rather than run to its limit.
  INFO=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV)
  SMALL=(--backend cuda -d 2 -b 8 -e 1M -f 32 -n 5 -w 2)
  NCCL2=("${MULTI_ENV[@]}" "${INFO[@]}" "$B/pmap-allreduce" "${SMALL[@]}")
  NOCUMEM=("${MULTI_ENV[@]}" "${INFO[@]}" NCCL_CUMEM_ENABLE=0 "$B/pmap-allreduce" "${SMALL[@]}")
  if ((FAIL_NCCL)); then NCCL2=("${FORCED_FAIL[@]}") NOCUMEM=("${FORCED_FAIL[@]}"); fi
  NCCL_OK=0 NCCL_WHY=""
  if ((!MULTI)); then
    not_run nccl-2 "$MULTI_WHY"
    not_run nccl-2-nocumem "$MULTI_WHY"
    NCCL_WHY=$MULTI_WHY
  elif ((DRY && !FAIL_NCCL)); then
    run_step nccl-2 "${NCCL2[@]}"
    run_step nccl-2-nocumem "${NOCUMEM[@]}"
    NCCL_OK=1
  else
    # A dry run with --fail-nccl runs the forced failures for real (they touch no GPU), within
    # a budget that does not count this machine's build.
    saved_dry=$DRY saved_budget=$BUDGET
    ((DRY)) && BUDGET=$((BUDGET + 100000))
    DRY=0
    if run_step nccl-2 "${NCCL2[@]}"; then
      NCCL_OK=1
      not_needed nccl-2-nocumem "nccl-2 passed"
    elif [ ! -f "$LOGS/nccl-2.log" ]; then
      not_run nccl-2-nocumem "nccl-2 did not run"
      NCCL_WHY="nccl-2 did not run (the budget)"
    elif run_step nccl-2-nocumem "${NOCUMEM[@]}"; then
      NCCL_OK=1
      export NCCL_CUMEM_ENABLE=0
      NOTES+=("NCCL failed with two ranks and worked with NCCL_CUMEM_ENABLE=0: every later step ran with it.")
    else
      NCCL_WHY="NCCL with 2 ranks on the GPU failed in nccl-2 and nccl-2-nocumem (with and without cuMem): $(log_note "$LOGS/nccl-2.log" 1)"
    fi
    DRY=$saved_dry BUDGET=$saved_budget
    if ((!NCCL_OK)); then
      NOTES+=("Every step that needs 2 logical devices was skipped: $NCCL_WHY. The performance steps run on 1 device.")
    fi
  fi
  ((DRY)) || write_environment
  # bf16: cuBLAS's bf16 GEMMs in training against the CPU's bf16, graphs, the plan (1 device);
  # then the op harness's bf16 ops on 2 devices at once against the CPU oracle (on 1 device they
  # ran in gpu-ops-1, with every op of ops/op_list.h).
  run_step gpu-bf16-1 "${ONE_ENV[@]}" PMAP_GPU_TEST_DEVICES=1 "$T/test_gpu_bf16"
  two_device() { # name cmd...: run where 2 ranks work, else skipped with the reason
    local name=$1
    shift
    if ((NCCL_OK)); then run_step "$name" "$@"; else not_run "$name" "$NCCL_WHY"; fi
  }
  two_device gpu-bf16-2 "${MULTI_ENV[@]}" "$BUILD/tests/ops/test_ops" "${OPS_BF16_2[@]}"
  for t in coll pmap fast fallback; do
    two_device "gpu-$t-2" "${MULTI_ENV[@]}" PMAP_GPU_TEST_DEVICES=2 PMAP_GPU_TEST_QUICK=0 \
      "$T/test_gpu_$t"
    [ "$t" = coll ] && ((!DRY)) && write_environment
  done
  # (e) Performance: on 2 devices where they work, else on 1.
  if ((NCCL_OK)); then
    run_step step-mlp-1024 "${PERF_ENV[@]}" PMAP_CUDA_BUCKET_MB=$BUCKET "$B/pmap-step" "${STEP1024[@]}"
    run_step step-mlp "${PERF_ENV[@]}" "$B/pmap-step" "${STEPMLP[@]}"
    run_step step-gpt-mini "${PERF_ENV[@]}" "$B/pmap-step" "${STEPGPT[@]}"
    run_step allreduce "${PERF_ENV[@]}" "$B/pmap-allreduce" "${ALLRED[@]}"
  else
    run_step step-mlp-1024 env PMAP_CUDA_BUCKET_MB=$BUCKET "$B/pmap-step" "${STEP1024[@]/1,2/1}"
    run_step step-mlp "$B/pmap-step" "${STEPMLP[@]/1,2/1}"
    run_step step-gpt-mini "$B/pmap-step" "${STEPGPT[@]/1,2/1}"
    not_run allreduce "$NCCL_WHY"
  fi
  # (f) JAX's pmap on the same GPU (one device: JAX puts one device on each GPU), with the
  # loader's path as it was before this script put the carried NCCL first: JAX loads its own.
  # A dry run plans it on a machine without JAX too (the GPU machine's /opt/*/.venv has it),
  # with the arguments checked against the script's parser instead of by its own --dry-run.
  JAX_ENV=("${JAX_LD[@]}" -u NCCL_MULTI_RANK_GPU_ENABLE -u CUDA_MODULE_LOADING PYTHONUNBUFFERED=1
    XLA_PYTHON_CLIENT_PREALLOCATE=false)
  if ((DRY)) && [ -z "$JAX_PY" ]; then
    check jax-args "jax_compare.py parses the step's arguments (no JAX here to import)" bash -c "
      $(declare -f opts_known); SRC='$SRC'; opts_known '$SRC/bench/jax_compare.py' ${JAX_ARGS[*]}"
    run_step jax-compare "${JAX_ENV[@]}" "(the first Python there that imports numpy and jax)" \
      "$SRC/bench/jax_compare.py" "${JAX_ARGS[@]}"
  elif [ -z "$JAX_PY" ]; then
    not_run jax-compare "no Python here imports numpy and jax"
  else
    ((DRY)) && check jax-args "jax_compare.py accepts the step's arguments" \
      "$JAX_PY" "$SRC/bench/jax_compare.py" "${JAX_ARGS[@]}" --dry-run
    run_step jax-compare "${JAX_ENV[@]}" "$JAX_PY" "$SRC/bench/jax_compare.py" "${JAX_ARGS[@]}"
  fi
  # (d) 4 logical devices on one GPU, asked for with --four: beyond the 2 ranks a GPU that NCCL
  # 2.30 documents, so last, where its limit fits in what is left, with NCCL's report for 4.
  if ((FOUR)); then
    if ((NCCL_OK)); then
      run_step gpu-coll-4 "${MULTI_ENV[@]}" PMAP_GPU_TEST_DEVICES=4 PMAP_GPU_TEST_QUICK=1 \
        "${INFO[@]}" "$T/test_gpu_coll"
      ((DRY)) || write_environment
    else
      not_run gpu-coll-4 "$NCCL_WHY"
    fi
  fi
else
  for n in "${PLAN_NAMES[@]}"; do
    [ -n "${VISITED[$n]:-}" ] && continue
    not_run "$n" "$( ((HAVE_GPU)) && echo "nothing was built" || echo "no GPU")"
  done
fi

if ((DRY)); then
  missing=""
  for n in "${PLAN_NAMES[@]}"; do [ -n "${VISITED[$n]:-}" ] || missing+=" $n"; done
  [ -z "$missing" ] || record plan-walk fail 0 "steps in the plan that the run never reaches:$missing"
  say ""
  say "plan: ${#PLAN_NAMES[@]} steps, ${PLAN_SUM}s of limits, budget ${BUDGET}s less ${RESERVE}s kept for the end; the steps that run or would run: $(plan_run_s)s"
  for n in "${PLAN_NAMES[@]}"; do say "  $n (${STAGE[$n]}): $(plan_why "$n")"; done
fi
exit 0
