#!/usr/bin/env bash
# gpu-check.sh: the one-shot check of pmap on a machine with an NVIDIA GPU and no network. Prints
# the environment, builds with CUDA, runs the gpu test suite, pmap-train and pmap-bench on 1 and
# (where NCCL allows) 4 logical devices, and writes summary.md, summary.json and logs/ into OUTDIR.
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
    note="exit status $rc: $(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-200)"
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

PY=""
for p in python3 python /usr/bin/python3; do
  if command -v "$p" >/dev/null 2>&1; then PY=$(command -v "$p"); break; fi
done

# meson and ninja: on PATH, else from Python packages.
MESON=()
if command -v meson >/dev/null 2>&1; then
  MESON=(meson)
else
  for p in "$PY" /usr/bin/python3; do
    if [ -n "$p" ] && "$p" -c 'import mesonbuild' 2>/dev/null; then
      MESON=("$p" -m mesonbuild.mesonmain)
      break
    fi
  done
fi
if ! command -v ninja >/dev/null 2>&1 && [ -n "$PY" ]; then
  NINJA_DIR=$("$PY" -c 'import ninja, os; print(ninja.BIN_DIR)' 2>/dev/null)
  [ -n "$NINJA_DIR" ] && export PATH="$NINJA_DIR:$PATH"
fi
MESON_VERSION=$([ ${#MESON[@]} -gt 0 ] && "${MESON[@]}" --version 2>/dev/null)
NINJA_VERSION=$(ninja --version 2>/dev/null)

# NCCL: beside CUDA or in the system, else inside a Python wheel (nvidia-nccl-cu*).
NCCL_ROOT="" NCCL_HEADER=""
for h in "$CUDA_ROOT/include/nccl.h" /usr/include/nccl.h /usr/local/include/nccl.h; do
  if [ -f "$h" ]; then NCCL_HEADER=$h; break; fi
done
if [ -z "$NCCL_HEADER" ] && [ -n "$PY" ]; then
  WHEEL=$("$PY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -n "$WHEEL" ] && [ -f "$WHEEL/include/nccl.h" ]; then
    NCCL_ROOT=$WHEEL
    NCCL_HEADER=$WHEEL/include/nccl.h
    export LD_LIBRARY_PATH="$WHEEL/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
NCCL_VERSION=""
if [ -n "$NCCL_HEADER" ]; then
  NCCL_VERSION=$(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{v[$2]=$3} END {if (v["NCCL_MAJOR"] != "") printf "%s.%s.%s", v["NCCL_MAJOR"], v["NCCL_MINOR"], v["NCCL_PATCH"]}' "$NCCL_HEADER")
fi
NCCL_CODE=$(echo "$NCCL_VERSION" | awk -F. '{ if (NF == 3) print $1 * 10000 + $2 * 100 + $3; else print 0 }')

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
  driver        ${GPU_DRIVER:-none}
  CUDA (nvcc)   ${CUDA_VERSION:-not found} ${NVCC:+at $NVCC}
  NCCL          ${NCCL_VERSION:-not found} ${NCCL_HEADER:+($NCCL_HEADER)}
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
  [ -n "$NCCL_ROOT" ] && SETUP+=("-Dnccl_root=$NCCL_ROOT")
  [ -f "$BUILD/build.ninja" ] && SETUP+=(--reconfigure)
  if run_step configure 90 "${SETUP[@]}" && run_step build 240 ninja -C "$BUILD" -j "$NPROC"; then
    BUILT=1
  fi
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
  printf '  "cuda": %s,\n  "nccl": %s,\n  "nccl_header": %s,\n  "meson": %s,\n  "ninja": %s,\n' \
    "$(json_str "$CUDA_VERSION")" "$(json_str "$NCCL_VERSION")" "$(json_str "$NCCL_HEADER")" \
    "$(json_str "$MESON_VERSION")" "$(json_str "$NINJA_VERSION")"
  printf '  "four_devices": %s,\n  "steps": [\n' "$(json_str "${FOUR_IDS:-$FOUR_WHY}")"
  for i in "${!STEP_NAMES[@]}"; do
    name=${STEP_NAMES[$i]}
    out=$(last_json "$OUT/logs/$name.log")
    printf '    {"name": %s, "status": %s, "seconds": %s, "rc": %s, "note": %s, "log": %s, "output": %s}%s\n' \
      "$(json_str "$name")" "$(json_str "${STEP_STATUS[$i]}")" "${STEP_SECONDS[$i]}" \
      "${STEP_RC[$i]:-null}" "$(json_str "${STEP_NOTES[$i]}")" \
      "$(json_str "$([ -f "$OUT/logs/$name.log" ] && echo "logs/$name.log")")" \
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
  echo "Total ${TOTAL} s. Logs in \`logs/\`; machine-readable results in \`summary.json\`."
  for i in "${!STEP_NAMES[@]}"; do
    name=${STEP_NAMES[$i]}
    case $name in
    train-* | bench-*)
      [ -f "$OUT/logs/$name.log" ] || continue
      echo
      echo "## $name"
      echo
      echo '```'
      grep -v '^{' "$OUT/logs/$name.log" | tail -n 12
      echo '```'
      ;;
    esac
  done
} >"$OUT/summary.md"

echo
echo "gpu-check: $RESULT in ${TOTAL}s; summary in $OUT/summary.md and $OUT/summary.json"
case $RESULT in
pass) exit 0 ;;
no-gpu) exit 2 ;;
*) exit 1 ;;
esac
