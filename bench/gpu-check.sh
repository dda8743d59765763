#!/usr/bin/env bash
# gpu-check.sh: the one-shot check of pmap on a machine with an NVIDIA GPU and no network. Prints
# the environment, builds with CUDA, runs the gpu test suite (the op test once more under
# compute-sanitizer), pmap-train and pmap-bench on 1 and (where NCCL allows) 4 logical devices,
# and writes summary.md, summary.json, environment.txt and logs.tar.gz (every step's log) into
# OUTDIR: four files, as the GPU machines of this project return at most eight from an output
# folder (GPU_CHECK_KEEP_LOG_DIR=1 keeps logs/ unpacked as well).
#
#   bench/gpu-check.sh [OUTDIR]     default OUTDIR: bench/results/<date>-<gpu name>
#
# Every step runs under a time limit inside an overall budget (GPU_CHECK_BUDGET_S, default 450 s,
# so the whole check ends within 8 minutes); a failed step is recorded and the next one runs.
# Exit status: 0 every step passed or was skipped, 1 a step failed, 2 no usable NVIDIA GPU.
# GPU_CHECK_BUILD_DIR picks the build folder (default: a fresh one under /tmp);
# GPU_CHECK_NO_GPU_BUILD=1 still builds and runs what it can where there is no GPU.
set -u

SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUDGET=${GPU_CHECK_BUDGET_S:-450}
START=$(date +%s)
NPROC=$(nproc 2>/dev/null || echo 4)
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# ------------------------------------------------------------------------------------------
# Recording

STEP_NAMES=() STEP_STATUS=() STEP_SECONDS=() STEP_RC=() STEP_NOTES=()
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

elapsed() { echo $(( $(date +%s) - START )); }

# run_step NAME LIMIT_S CMD...: runs CMD with its output in logs/NAME.log, within LIMIT_S and
# what is left of the budget; records pass or fail; returns CMD's status.
run_step() {
  local name=$1 limit=$2
  shift 2
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
OUT=${1:-$SRC/bench/results/$(date +%F)-$SLUG}
mkdir -p "$OUT/logs" || { echo "gpu-check: cannot create $OUT" >&2; exit 1; }
OUT=$(cd "$OUT" && pwd)

NVCC=$(command -v nvcc || true)
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
[ -n "$NVCC" ] && PATH="$(dirname "$NVCC"):$PATH" && export PATH
CUDA_VERSION=$([ -n "$NVCC" ] && "$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
CUDA_ROOT=$([ -n "$NVCC" ] && cd "$(dirname "$NVCC")/.." && pwd)

# Python: the one on PATH first (on the GPU machines of this project it is a virtual environment
# that holds meson, ninja and the nvidia-nccl-cu13 wheel), then other usual places.
PYS=()
for p in python3 python /opt/*/.venv/bin/python3 /usr/local/bin/python3 /usr/bin/python3; do
  p=$(command -v "$p" 2>/dev/null) || continue
  case " ${PYS[*]} " in *" $p "*) ;; *) PYS+=("$p") ;; esac
done
PY=${PYS[0]:-}

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

# NCCL: a header with a library beside it, from the CUDA toolkit, the system or a Python wheel
# (nvidia-nccl-cu12/-cu13: nvidia/nccl/{include,lib}, only libnccl.so.2 in it); the newest wins,
# so that a wheel with NCCL >= 2.30 enables logical devices sharing a GPU. Meson finds the first
# two by itself; a wheel is named with -Dnccl_root.
nccl_version_of() { # header -> major.minor.patch
  awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END {if (v["NCCL_MAJOR"] != "") printf "%s.%s.%s", v["NCCL_MAJOR"], v["NCCL_MINOR"], v["NCCL_PATCH"]}' "$1"
}
nccl_code_of() { echo "$1" | awk -F. '{ if (NF == 3) print $1 * 10000 + $2 * 100 + $3; else print 0 }'; }
NCCL_ROOT="" NCCL_HEADER="" NCCL_LIB="" NCCL_VERSION="" NCCL_CODE=0
nccl_candidate() { # root-for-meson header libdir...
  local root=$1 h=$2 lib="" d f v c
  shift 2
  [ -f "$h" ] || return
  for d in "$@"; do
    for f in libnccl.so libnccl.so.2; do
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
[ -n "$CUDA_ROOT" ] && nccl_candidate "" "$CUDA_ROOT/include/nccl.h" "$CUDA_ROOT/lib64" "$CUDA_ROOT/lib" \
  "$CUDA_ROOT/targets/x86_64-linux/lib"
nccl_candidate "" /usr/include/nccl.h /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib
nccl_candidate "" /usr/local/include/nccl.h /usr/local/lib
WHEELS=()
for p in "${PYS[@]}"; do
  w=$("$p" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null) && WHEELS+=("$w")
  while read -r sp; do WHEELS+=("$sp/nvidia/nccl"); done < <("$p" -c \
    'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' 2>/dev/null)
done
for w in "${WHEELS[@]}"; do nccl_candidate "$w" "$w/include/nccl.h" "$w/lib"; done
[ -n "$NCCL_ROOT" ] && export LD_LIBRARY_PATH="$NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

CUBLAS_VERSION=""
if [ -n "$CUDA_ROOT" ] && [ -f "$CUDA_ROOT/include/cublas_api.h" ]; then
  CUBLAS_VERSION=$(awk '/#define CUBLAS_VER_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END {if (v["CUBLAS_VER_MAJOR"] != "") printf "%s.%s.%s", v["CUBLAS_VER_MAJOR"], v["CUBLAS_VER_MINOR"], v["CUBLAS_VER_PATCH"]}' "$CUDA_ROOT/include/cublas_api.h")
fi
DRIVER_CUDA=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)

# Four logical devices: on four GPUs, or shared where NCCL (>= 2.30) allows it.
FOUR_IDS="" FOUR_WHY=""
if (( GPU_COUNT >= 4 )); then
  FOUR_IDS="0,1,2,3"
elif (( GPU_COUNT >= 1 && NCCL_CODE >= 23000 )); then
  FOUR_IDS=$(printf '0,%d,%d,%d' $(( 1 % GPU_COUNT )) $(( 2 % GPU_COUNT )) $(( 3 % GPU_COUNT )))
  export NCCL_MULTI_RANK_GPU_ENABLE=1
else
  FOUR_WHY="4 logical devices on $GPU_COUNT GPU(s) need NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 (found NCCL ${NCCL_VERSION:-none})"
fi

cat <<EOF | tee "$OUT/environment.txt"
pmap gpu-check $(date -u +%FT%TZ) on $(hostname)
  source        $SRC ($(cd "$SRC" && git rev-parse --short HEAD 2>/dev/null || echo "no git"))
  GPUs          $GPU_COUNT x ${GPU_NAME:-none} (${GPU_MEM:-?}, compute capability ${GPU_CC:-?})
  driver        ${GPU_DRIVER:-none} (CUDA ${DRIVER_CUDA:-?})
  CUDA (nvcc)   ${CUDA_VERSION:-not found} ${NVCC:+at $NVCC}
  cuBLAS        ${CUBLAS_VERSION:-not found}
  NCCL          ${NCCL_VERSION:-not found} ${NCCL_HEADER:+($NCCL_HEADER, $NCCL_LIB)}
  Python        ${PY:-none} $([ -n "$PY" ] && "$PY" --version 2>&1 | cut -d' ' -f2)
  meson, ninja  ${MESON_VERSION:-not found}, ${NINJA_VERSION:-not found}
  CPU cores     $NPROC
  output        $OUT
EOF
nvidia-smi >"$OUT/logs/nvidia-smi.log" 2>&1 || true

# ------------------------------------------------------------------------------------------
# Steps

HAVE_GPU=1
if (( GPU_COUNT < 1 )); then
  HAVE_GPU=0
  record "gpu" fail 0 "" "no NVIDIA GPU found (nvidia-smi missing or lists none)"
fi

BUILT=0
if (( HAVE_GPU == 0 )) && [ "${GPU_CHECK_NO_GPU_BUILD:-0}" != 1 ]; then
  skip_step build "no GPU (GPU_CHECK_NO_GPU_BUILD=1 builds anyway)"
elif [ -z "$NVCC" ] || [ ${#MESON[@]} -eq 0 ] || [ -z "$NINJA_VERSION" ]; then
  record build fail 0 "" "missing tools: nvcc '${NVCC:-}', meson '${MESON_VERSION:-}', ninja '${NINJA_VERSION:-}'"
else
  BUILD=${GPU_CHECK_BUILD_DIR:-$(mktemp -d /tmp/pmap-gpu-check.XXXXXX)}
  SETUP=("${MESON[@]}" setup "$BUILD" "$SRC" -Dcuda=enabled -Dbuildtype=release)
  SETUP+=("-Dnccl_root=$NCCL_ROOT") # also when empty: a reused build folder forgets an old one
  [ -f "$BUILD/build.ninja" ] && SETUP+=(--reconfigure)
  if run_step configure 90 "${SETUP[@]}" && run_step build 240 ninja -C "$BUILD" -j "$NPROC"; then
    BUILT=1
  fi
fi

# The NCCL the library loads at run time, and its own version (it may differ from the header's).
NCCL_LOADED="" NCCL_RUNTIME=""
if (( BUILT )); then
  NCCL_LOADED=$(ldd "$BUILD"/libpmap.so* 2>/dev/null | awk '/libnccl/ {print $3; exit}')
  if [ -n "$NCCL_LOADED" ] && [ -n "$PY" ]; then
    NCCL_RUNTIME=$("$PY" -c 'import ctypes, sys
v = ctypes.c_int()
ctypes.CDLL(sys.argv[1]).ncclGetVersion(ctypes.byref(v))
print("%d.%d.%d" % (v.value // 10000, v.value // 100 % 100, v.value % 100))' "$NCCL_LOADED" 2>/dev/null)
  fi
  echo "  NCCL loaded   ${NCCL_RUNTIME:-?} from ${NCCL_LOADED:-?}" | tee -a "$OUT/environment.txt"
fi

if (( BUILT && HAVE_GPU )); then
  run_step gpu-tests 180 "${MESON[@]}" test -C "$BUILD" --suite gpu --print-errorlogs
  # With a GPU present a skipped GPU test means the GPU was not usable: that is a failure here.
  if grep -Eq '^Skipped: +[1-9]' "$OUT/logs/gpu-tests.log"; then
    last=$(( ${#STEP_NAMES[@]} - 1 ))
    STEP_STATUS[last]=fail
    STEP_NOTES[last]="GPU tests skipped although nvidia-smi lists a GPU: $(grep -m1 '^SKIP' "$BUILD/meson-logs/testlog.txt" | cut -c1-160)"
    FAILED=1
    echo "   -> fail (${STEP_NOTES[last]})"
  fi
  cp "$BUILD/meson-logs/testlog.txt" "$OUT/logs/gpu-tests-testlog.txt" 2>/dev/null

  TRAIN=$BUILD/tools/pmap-train
  for model in mlp convnet; do
    run_step "train-$model-1" 60 "$TRAIN" --backend cuda --devices 1 --model "$model" --json
    if [ -n "$FOUR_IDS" ]; then
      run_step "train-$model-4" 90 env PMAP_CUDA_DEVICE_IDS="$FOUR_IDS" "$TRAIN" --backend cuda \
        --devices 4 --model "$model" --json
    else
      skip_step "train-$model-4" "$FOUR_WHY"
    fi
  done

  BENCH=$BUILD/bench/pmap-bench
  if [ ! -x "$BENCH" ]; then
    skip_step bench "pmap-bench was not built"
  else
    # Scaling over what this machine allows; PMAP_CUDA_DEVICE_IDS serves each count's prefix.
    if (( GPU_COUNT >= 4 )); then
      COUNTS=1,2,4
    elif [ -n "$FOUR_IDS" ]; then
      COUNTS=1,4
    elif (( GPU_COUNT >= 2 )); then
      COUNTS=1,2
    else
      COUNTS=1
    fi
    for model in mlp-1024 convnet; do
      run_step "bench-$model" 120 env PMAP_CUDA_DEVICE_IDS="${FOUR_IDS:-0,1}" "$BENCH" \
        --backend cuda --model "$model" --devices "$COUNTS" --batch 1024 --steps 50 --warmup 5 --json
    done
  fi
  # Every CUDA op once more under compute-sanitizer's memcheck: out-of-bounds and misaligned
  # accesses in the kernels that the comparisons with the CPU cannot see. Some GPU sandboxes
  # refuse the tool ("Device not supported"), and instrumenting cuBLAS can outlast the step's
  # limit: those are skips, not failures of pmap.
  SANITIZER=$(command -v compute-sanitizer || echo "$CUDA_ROOT/bin/compute-sanitizer")
  if [ ! -x "$SANITIZER" ]; then
    skip_step memcheck-gpu-ops "compute-sanitizer not found"
  elif (( BUDGET - $(elapsed) > 130 )); then
    run_step memcheck-gpu-ops 110 "$SANITIZER" --tool memcheck --error-exitcode 3 \
      --leak-check no "$BUILD/tests/gpu/test_gpu_ops"
    rc=$?
    why=""
    if grep -q 'Device not supported' "$OUT/logs/memcheck-gpu-ops.log" 2>/dev/null; then
      why="compute-sanitizer does not support this device here"
    elif (( rc == 124 || rc == 137 )); then
      why="did not finish under the sanitizer within its limit"
    fi
    if (( rc != 0 )) && [ -n "$why" ]; then
      last=$(( ${#STEP_NAMES[@]} - 1 ))
      STEP_STATUS[last]=skip
      STEP_NOTES[last]=$why
      FAILED=0
      for st in "${STEP_STATUS[@]}"; do [ "$st" = fail ] && FAILED=1; done
      echo "   -> skip ($why)"
    fi
  else
    skip_step memcheck-gpu-ops "time budget"
  fi
  # The CPU suite on this machine too, with what time is left.
  if (( BUDGET - $(elapsed) > 90 )); then
    run_step cpu-tests 80 "${MESON[@]}" test -C "$BUILD" --no-suite gpu --print-errorlogs
  else
    skip_step cpu-tests "time budget"
  fi
elif (( BUILT )); then
  run_step gpu-tests-without-gpu 60 "${MESON[@]}" test -C "$BUILD" --suite gpu
fi

# ------------------------------------------------------------------------------------------
# Summary

TOTAL=$(elapsed)
RESULT=pass
(( FAILED )) && RESULT=fail
(( HAVE_GPU == 0 )) && RESULT=no-gpu

# A program's JSON line, checked with Python where there is one; a string otherwise.
json_value() {
  if [ -n "$1" ] && [ -n "$PY" ] && printf '%s' "$1" | "$PY" -c 'import json,sys; json.load(sys.stdin)' 2>/dev/null; then
    printf '%s' "$1"
  else
    json_str "$1"
  fi
}

{
  printf '{\n  "date": %s,\n  "host": %s,\n  "result": %s,\n  "seconds": %d,\n' \
    "$(json_str "$(date -u +%FT%TZ)")" "$(json_str "$(hostname)")" "$(json_str "$RESULT")" "$TOTAL"
  printf '  "gpu": {"name": %s, "count": %d, "driver": %s, "memory": %s, "compute_capability": %s},\n' \
    "$(json_str "$GPU_NAME")" "$GPU_COUNT" "$(json_str "$GPU_DRIVER")" "$(json_str "$GPU_MEM")" "$(json_str "$GPU_CC")"
  printf '  "cuda": %s,\n  "driver_cuda": %s,\n  "cublas": %s,\n' "$(json_str "$CUDA_VERSION")" \
    "$(json_str "$DRIVER_CUDA")" "$(json_str "$CUBLAS_VERSION")"
  printf '  "nccl": %s,\n  "nccl_header": %s,\n  "nccl_loaded": %s,\n  "nccl_runtime": %s,\n' \
    "$(json_str "$NCCL_VERSION")" "$(json_str "$NCCL_HEADER")" "$(json_str "$NCCL_LOADED")" \
    "$(json_str "$NCCL_RUNTIME")"
  printf '  "python": %s,\n  "meson": %s,\n  "ninja": %s,\n  "cpu_cores": %d,\n' \
    "$(json_str "$PY")" "$(json_str "$MESON_VERSION")" "$(json_str "$NINJA_VERSION")" "$NPROC"
  printf '  "four_devices": %s,\n  "steps": [\n' "$(json_str "${FOUR_IDS:-$FOUR_WHY}")"
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
  echo "Total ${TOTAL} s. Every log is in \`logs.tar.gz\`; machine-readable results in \`summary.json\`."
  # Results of the runs, and the end of every failed step's log, so that this file alone says
  # what happened.
  for i in "${!STEP_NAMES[@]}"; do
    name=${STEP_NAMES[$i]}
    [ -f "$OUT/logs/$name.log" ] || continue
    case $name in
    train-* | bench-*) lines=12 ;;
    *) lines=0 ;;
    esac
    [ "${STEP_STATUS[$i]}" = fail ] && lines=40
    (( lines > 0 )) || continue
    echo
    echo "## $name (${STEP_STATUS[$i]})"
    echo
    echo '```'
    grep -v '^{' "$OUT/logs/$name.log" | tail -n "$lines"
    echo '```'
  done
} >"$OUT/summary.md"

# One archive of the logs instead of a folder of them (see the top of this file).
if tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && [ "${GPU_CHECK_KEEP_LOG_DIR:-0}" != 1 ]; then
  rm -rf "$OUT/logs"
fi

echo
echo "gpu-check: $RESULT in ${TOTAL}s; summary in $OUT/summary.md and $OUT/summary.json"
case $RESULT in
pass) exit 0 ;;
no-gpu) exit 2 ;;
*) exit 1 ;;
esac
