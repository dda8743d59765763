#!/usr/bin/env bash
# gpu-check-lib.sh: what bench/gpu-check.sh records and how it runs a step, sourced by it (not
# run alone): each step's verdict, the summary (summary.md, summary.json, logs.tar.gz) written
# after every step, and the step runner (its time limit, its own session, the stacks of a step
# that hangs). It reads the check's globals: OUTDIR, WORK, LOGS, PLAN_NAMES, LIMIT, STAGE,
# OPTIN, BUDGET, RESERVE, START, DRY, DRYRUN, TERMINATED, NOTES, GPU_*, PY, SRC, the versions,
# and what the summary's top says: SOURCE_DESC (the commit) and NCCL_LOADED (the NCCL the
# steps load).

ST_NAME=() ST_STATUS=() ST_SECS=() ST_NOTE=()
declare -A CMD # each step's command line, as run_step ran or planned it
CUR_STEP="" CUR_PID="" CUR_T0=0 TERMINATED=0 NOTES=()

elapsed() { echo $(($(date +%s) - START)); }

# The JSON string of $2 into the variable named $1, without a subshell (a checkpoint writes
# hundreds of them).
json_into() {
  local LC_ALL=C s=$2
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\t'/ }
  s=${s//$'\n'/\\n}
  s=${s//[$'\001'-$'\037']/}
  printf -v "$1" '"%s"' "$s"
}
json_str() {
  local v
  json_into v "$1"
  printf '%s' "$v"
}

# record NAME STATUS SECONDS NOTE: pass, fail, not-run, interrupted, not-needed, planned (dry
# run).
record() {
  ST_NAME+=("$1") ST_STATUS+=("$2") ST_SECS+=("$3") ST_NOTE+=("$4")
  say "   -> $2${4:+ ($4)}"
}

# check NAME WHAT CMD...: a check that runs in every mode; its output goes to checks.log.
check() {
  local name=$1 what=$2
  shift 2
  if "$@" >>"$LOGS/checks.log" 2>&1; then record "$name" pass 0 "$what"; else record "$name" fail 0 "$what"; fi
}

# What a failure writes, anchored on the words as a failure writes them, so that a compile line
# naming error.c, or a flag such as -Werror=vla, is not taken for one: a test's FAIL and its
# count of failed checks, a compiler's or Meson's error ("file:12:3: error: ...", "ERROR: ..."),
# a timeout, a crash, a wait that hung. COMPILE_ERROR_RE is the compiler's and Meson's alone, the
# first of which names the cause of a failed build.
FAILURE_RE='(^|[^[:alnum:]_])FAIL(ED)?([^[:alnum:]_]|$)|(^|[[:space:]:(])([Ff]atal )?([Ee]rror|ERROR)[[:space:]]*:|(^|[^0-9])[1-9][0-9]* failed|timed out|did not (finish|complete|return)|[Ss]egmentation fault|[Aa]borted|cannot |not made:|: hung'
COMPILE_ERROR_RE='^[^ ].*:[0-9]+(:[0-9]+)?: ([Ff]atal )?([Ee]rror|ERROR):|^[^ ]*\([0-9]+\): error'
# Lines that are neither: the command this script echoed, ninja's progress (which names every
# object compiled) and the command line ninja echoes after FAILED.
NOT_FAILURE_RE='^\$ |^\[[0-9]+/[0-9]+\] |^(/[^ ]*/)?(c\+\+|cc|gcc|g\+\+|clang|nvcc|ld)( |$)'

# The file ldd's line for a library resolves to: what follows "=>" up to its load address,
# spaces and all ("libnccl.so.2 => /a b/lib/libnccl.so.2 (0x...)"); nothing where it is not found.
ldd_path() { # ldd-output library-name
  printf '%s\n' "$1" | sed -n "s/^[[:space:]]*$2[^[:space:]]* => \(.*[^[:space:]]\)[[:space:]]*(0x[0-9a-fA-F]*)\$/\1/p" |
    head -n 1
}

# The probe's log: the phase it was in when it ended ("phase NAME at T s: ..."; empty: none).
probe_phase() { sed -n 's/^phase \(.*\) at \([0-9.]*\) s: .*/\1/p' "$1" | tail -n 1; }

# What a probe's log says of the waits and of its end (run_step's rc $2), into PROBE_VERDICT:
# "hung" (a blocking-sync wait did not return: every later step polls), "slow" (it ran out of
# its limit before its wait, while CUDA started: a slow start, not a hang), "ok" otherwise. Says
# it in WAIT_NOTE and NOTES.
probe_verdict() { # log rc
  local log=$1 rc=$2 phase at
  PROBE_VERDICT=ok
  [ -f "$log" ] || return 0
  phase=$(probe_phase "$log")
  at=$(sed -n "s/^phase $phase at \([0-9.]*\) s: .*/\1/p" "$log" | tail -n 1)
  if grep -q '^blocking-sync wait: hung' "$log" ||
    { ((rc == 124 || rc == 137)) && [ "$phase" = "blocking-sync wait" ]; }; then
    export PMAP_CUDA_WAIT=poll
    WAIT_NOTE="a blocking-sync wait hung in the probe: every later step ran with PMAP_CUDA_WAIT=poll"
    NOTES+=("The default waits (blocking-sync CUDA events) hung here: every step after the probe ran with PMAP_CUDA_WAIT=poll.")
    PROBE_VERDICT=hung
  elif ((rc == 124 || rc == 137)) && { [ -z "$phase" ] || [ "$phase" = nccl ] || [ "$phase" = start ]; }; then
    NOTES+=("The probe ran out of its limit while CUDA started (phase '${phase:-none}' from ${at:-0} s on): a slow start, not a hanging wait; the waits stay the default.")
    PROBE_VERDICT=slow
  elif ((rc == 124 || rc == 137)); then
    NOTES+=("The probe ran out of its limit in its phase '$phase' (from $at s on), after its wait: what it had measured stands.")
  fi
}

# The summary line of a test, or for a failed step the line naming the failure, for its note.
log_note() { # log rc
  local why
  why=$(grep -E '^[a-z_]+: [0-9]+ checks, [0-9]+ failed' "$1" | tail -n 1)
  if [ "$2" != 0 ]; then
    why=$(grep -E "$COMPILE_ERROR_RE" "$1" | grep -Ev "$NOT_FAILURE_RE" | head -n 1)
    [ -n "$why" ] || why=$(grep -E "$FAILURE_RE" "$1" | grep -Ev "$NOT_FAILURE_RE" | tail -n 1)
    [ -n "$why" ] || why=$(grep -v '^\s*$' "$1" | tail -n 1)
  fi
  printf '%s' "$why" | cut -c1-220
}

# run_step NAME CMD...: CMD under NAME's limit from the plan, output in logs/NAME.log. A dry run
# prints it. It starts only if its limit fits in what is left of the budget; otherwise it is
# not run. It runs in a session of its own (setsid: its processes form one group, ended
# together) with line-buffered output (stdbuf: a program killed keeps what it printed), in the
# background so that TERM reaches this script at once (see on_term). The first step to outlive
# its limit first has its threads' stacks written to its log (cuda-gdb), from the reserve.
run_step() {
  local name=$1 limit=${LIMIT[$1]:?gpu-check: step $1 is not in the plan}
  shift
  VISITED[$name]=1
  CMD[$name]="$*"
  if ((DRY)); then
    say "== $name (stage ${STAGE[$name]}, limit ${limit}s): $*"
    say "   limit $(plan_why "$name")"
    record "$name" planned 0 ""
    return 0
  fi
  local left=$((BUDGET - RESERVE - $(elapsed)))
  if ((TERMINATED)); then
    record "$name" not-run 0 "the check was terminated"
    return 1
  fi
  if ((limit > left)); then
    say "== $name: not run: its limit ${limit}s exceeds the ${left}s left"
    record "$name" not-run 0 "limit ${limit}s > ${left}s left of the budget"
    return 1
  fi
  local log=$LOGS/$name.log rc t1 late=0
  say "== $name (limit ${limit}s, ${left}s left): $*"
  say "   limit $(plan_why "$name")"
  { echo "\$ $*"; echo; } >"$log"
  CUR_STEP=$name CUR_T0=$(date +%s.%N)
  checkpoint
  local deadline=$(($(date +%s) + limit))
  "${LAUNCH[@]}" "$@" >>"$log" 2>&1 </dev/null &
  CUR_PID=$!
  while kill -0 "$CUR_PID" 2>/dev/null; do
    if (($(date +%s) >= deadline)); then
      late=1
      break
    fi
    sleep 0.2
  done
  if ((late)); then
    stacks "$CUR_PID" "$log"
    kill_group "$CUR_PID"
  fi
  wait "$CUR_PID"
  rc=$?
  CUR_PID="" CUR_STEP=""
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$CUR_T0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  tail -n 3 "$log" | sed 's/^/   | /' | while IFS= read -r l; do say "$l"; done
  if ((late)); then
    record "$name" fail "$secs" "timed out after its limit of ${limit}s: $(log_note "$log" 1)"
    rc=124
  elif ((rc != 0)); then
    record "$name" fail "$secs" "exit status $rc: $(log_note "$log" "$rc")"
  else
    record "$name" pass "$secs" "$(log_note "$log" 0)"
  fi
  keep_json "$name"
  checkpoint
  return $rc
}

# The launcher of every step: its own session, line-buffered output, where the tools exist.
LAUNCH=()
command -v setsid >/dev/null 2>&1 && LAUNCH+=(setsid)
command -v stdbuf >/dev/null 2>&1 && LAUNCH+=(stdbuf -oL -eL)

# Ends the step's process group (its own session when setsid ran it): TERM, then KILL.
kill_group() {
  local pid=$1 i
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  for i in $(seq 1 25); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
}

# The stacks of a step that hangs, once per run (the budget keeps STACKS_S for it).
STACKS_USED=0 STACKS_S=20
CUDA_GDB=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null | head -n 1)
stacks() { # pid log
  ((STACKS_USED)) && return
  [ -n "$CUDA_GDB" ] || { echo "(no cuda-gdb here for the stacks of the hung step)" >>"$2"; return; }
  STACKS_USED=1
  {
    echo
    echo "=== the step outlived its limit: its threads' stacks (cuda-gdb -p $1) ==="
  } >>"$2"
  timeout -k 2 $((STACKS_S - 3)) "$CUDA_GDB" -q -nx -batch -p "$1" -ex 'set pagination off' \
    -ex 'info threads' -ex 'thread apply all bt 30' >>"$2" 2>&1 </dev/null
}

# not_run NAME WHY: a planned step that cannot run here.
not_run() {
  VISITED[$1]=1
  say "== $1: not run: $2"
  record "$1" not-run 0 "$2"
}

# not_needed NAME WHY: a fallback step whose condition did not arise (counted apart).
not_needed() {
  VISITED[$1]=1
  say "== $1: not needed: $2"
  record "$1" not-needed 0 "$2"
}
declare -A VISITED

# ------------------------------------------------------------------------------------------
# The summary: written before and after every step, and by the traps.

counts() {
  PASSED=0 FAILED=0 NOTRUN=0 INTERRUPTED=0 PLANNED=0 NOTNEEDED=0
  local st
  for st in "${ST_STATUS[@]}"; do
    case $st in
    planned) PLANNED=$((PLANNED + 1)) ;;
    not-needed) NOTNEEDED=$((NOTNEEDED + 1)) ;;
    pass) PASSED=$((PASSED + 1)) ;;
    fail) FAILED=$((FAILED + 1)) ;;
    interrupted) INTERRUPTED=$((INTERRUPTED + 1)) NOTRUN=$((NOTRUN + 1)) ;;
    not-run) NOTRUN=$((NOTRUN + 1)) ;;
    esac
  done
  # Planned steps never reached (a run cut short) did not run either.
  local n
  for n in "${PLAN_NAMES[@]}"; do [ -n "${VISITED[$n]:-}" ] || NOTRUN=$((NOTRUN + 1)); done
}

last_json() { grep -E '^\{.*\}$' "$1" 2>/dev/null | tail -n 1; }

# The limits of the steps that ran, are planned or are still to come (not those not run or not
# needed): what this run takes at most, against the budget.
plan_run_s() {
  local i n sum=0
  declare -A seen
  for i in "${!ST_NAME[@]}"; do
    n=${ST_NAME[$i]}
    seen[$n]=1
    case ${ST_STATUS[$i]} in not-run | not-needed) ;; *) sum=$((sum + ${LIMIT[$n]:-0})) ;; esac
  done
  for n in "${PLAN_NAMES[@]}"; do [ -n "${seen[$n]:-}" ] || sum=$((sum + ${LIMIT[$n]:-0})); done
  echo "$sum"
}

# A finished step's JSON output for summary.json, checked once (a checkpoint is not slowed by
# a Python start per step).
declare -A OUTJSON
keep_json() { # name
  local out
  out=$(last_json "$LOGS/$1.log")
  if [ -n "$out" ]; then OUTJSON[$1]=$(json_value "$out"); fi
}

json_value() { # a program's JSON line, validated where Python is; a string otherwise
  if [ -n "$1" ] && [ -n "${PY:-}" ] && printf '%s' "$1" | "$PY" -c 'import json,sys; json.load(sys.stdin)' 2>/dev/null; then
    printf '%s' "$1"
  else
    json_str "$1"
  fi
}

write_json() {
  local i name out st
  printf '{\n  "passed": %d, "failed": %d, "not_run": %d, "interrupted": %d, "not_needed": %d, "planned": %d,\n' \
    "$PASSED" "$FAILED" "$NOTRUN" "$INTERRUPTED" "$NOTNEEDED" "$PLANNED"
  printf '  "result": %s,\n  "dry_run": %s,\n  "terminated": %s,\n  "seconds": %d,\n  "budget_s": %d,\n  "plan_s": %d,\n' \
    "$(json_str "$RESULT")" "$( ((DRYRUN)) && echo true || echo false)" \
    "$( ((TERMINATED)) && echo true || echo false)" "$(elapsed)" "$BUDGET" "$PLAN_SUM"
  printf '  "reserve_s": %d,\n  "plan_run_s": %d,\n' "$RESERVE" "$(plan_run_s)"
  printf '  "source": {"description": %s, "commit": %s, "dirty": %s, "status_sha256": %s},\n' \
    "$(json_str "${SOURCE_DESC:-}")" "$(json_str "${SOURCE_COMMIT:-}")" \
    "$(json_str "${SOURCE_DIRTY:-}")" "$(json_str "${SOURCE_STATUS:-}")"
  printf '  "nccl_loaded": %s,\n' "$(json_str "${NCCL_LOADED:-}")"
  printf '  "date": %s,\n  "host": %s,\n' "$(json_str "$(date -u +%FT%TZ)")" "$(json_str "$(hostname)")"
  printf '  "gpu": {"name": %s, "count": %d, "driver": %s, "memory": %s, "compute_capability": %s},\n' \
    "$(json_str "$GPU_NAME")" "$GPU_COUNT" "$(json_str "$GPU_DRIVER")" "$(json_str "$GPU_MEM")" "$(json_str "$GPU_CC")"
  printf '  "nccl": %s,\n  "nccl_library": %s,\n  "cuda": %s,\n  "cublas": %s,\n  "jax": %s,\n' \
    "$(json_str "${NCCL_VERSION:-}")" "$(json_str "${NCCL_LIB:-}")" "$(json_str "${CUDA_VERSION:-}")" \
    "$(json_str "${CUBLAS_VERSION:-}")" "$(json_str "${JAX_VERSION:-}")"
  printf '  "multi_device": %s,\n  "notes": %s,\n  "environment": %s,\n  "steps": [\n' \
    "$( ((MULTI)) && echo true || echo false)" "$(json_str "$(printf '%s\n' "${NOTES[@]}")")" \
    "$(json_str "$(cat "$OUTDIR/environment.txt" 2>/dev/null)")"
  local all=("${ST_NAME[@]}") jn js jt jl jo jw jc last=$((${#ST_NAME[@]} - 1))
  for name in "${PLAN_NAMES[@]}"; do [ -n "${VISITED[$name]:-}" ] || all+=("$name"); done
  last=$((${#all[@]} - 1))
  for i in "${!all[@]}"; do
    name=${all[$i]}
    json_into jn "$name"
    if ((i < ${#ST_NAME[@]})); then
      json_into js "${ST_STATUS[$i]}"
      json_into jt "${ST_NOTE[$i]}"
    else
      js='"not-run"' jt='"not reached"'
    fi
    jl='""'
    [ -f "$LOGS/$name.log" ] && json_into jl "logs.tar.gz:logs/$name.log"
    json_into jo "${STAGE[$name]:-}"
    jw='""'
    [ -n "${LIMIT[$name]:-}" ] && json_into jw "$(plan_why "$name")"
    json_into jc "${CMD[$name]:-}"
    printf '    {"name": %s, "stage": %s, "limit_s": %s, "limit_why": %s, "status": %s, "seconds": %s, "note": %s, "command": %s, "log": %s, "output": %s}' \
      "$jn" "$jo" "${LIMIT[$name]:-null}" "$jw" "$js" "${ST_SECS[$i]:-0}" "$jt" "$jc" "$jl" "${OUTJSON[$name]:-null}"
    ((i < last)) && printf ','
    printf '\n'
  done
  printf '  ]\n}\n'
}

write_md() {
  local i name
  local more=""
  ((INTERRUPTED)) && more=" ($INTERRUPTED interrupted)"
  ((NOTNEEDED)) && more+=", $NOTNEEDED not needed"
  ((DRYRUN)) && more+=", $PLANNED planned"
  echo "# pmap gpu-check: $PASSED passed, $FAILED failed, $NOTRUN not run$more -- $RESULT"
  echo
  echo "Source: ${SOURCE_DESC:-unknown}  "
  echo "NCCL loaded: ${NCCL_LOADED:-not known yet (the probe says)}"
  echo
  for i in "${!NOTES[@]}"; do echo "**${NOTES[$i]}**"; echo; done
  echo '```'
  cat "$OUTDIR/environment.txt" 2>/dev/null
  echo '```'
  echo
  echo "| step | stage | status | seconds | limit | note |"
  echo "|---|---|---|---|---|---|"
  for i in "${!ST_NAME[@]}"; do
    name=${ST_NAME[$i]}
    echo "| $name | ${STAGE[$name]:--} | ${ST_STATUS[$i]} | ${ST_SECS[$i]} | ${LIMIT[$name]:--} | ${ST_NOTE[$i]//|/\\|} |"
  done
  for name in "${PLAN_NAMES[@]}"; do
    [ -n "${VISITED[$name]:-}" ] || echo "| $name | ${STAGE[$name]} | not-run | 0 | ${LIMIT[$name]} | not reached |"
  done
  echo
  echo "Plan: ${PLAN_SUM}s of limits in a budget of ${BUDGET}s (${RESERVE}s kept for the end); the steps that ran or would run have $(plan_run_s)s of them; this run took $(elapsed)s."
  echo "Each limit is ${MARGIN} x the step's costs, from the ${COSTS_FROM} (bench/gpu-check-plan.sh):"
  echo
  for name in "${PLAN_NAMES[@]}"; do echo "- \`$name\`: $(plan_why "$name")"; done
  echo
  echo "Every step's log is in \`logs.tar.gz\` (logs/<step>.log), this script's output in"
  echo "\`check.log\`, every figure in \`summary.json\`."
  [ -n "${PY:-}" ] && "$PY" "$SRC/bench/gpu_check_figures.py" "$OUTDIR/summary.json.new" 2>&1
  for i in "${!ST_NAME[@]}"; do
    name=${ST_NAME[$i]}
    [ -f "$LOGS/$name.log" ] && [ "${ST_STATUS[$i]}" != pass ] && [ "${ST_STATUS[$i]}" != not-run ] || continue
    echo
    echo "## $name (${ST_STATUS[$i]})"
    echo
    echo '```'
    grep -v '^{' "$LOGS/$name.log" | tail -n 40
    echo '```'
  done
}

# Rewrites the summary and the archive; each file is replaced whole (written beside, then
# renamed), so a run killed in the middle leaves the previous ones.
checkpoint() {
  counts
  if ((TERMINATED)); then
    RESULT=terminated
  elif ((DRYRUN)); then
    RESULT=dry-run-$( ((FAILED)) && echo fail || echo pass)
  elif ((GPU_COUNT < 1)); then
    RESULT=no-gpu
  elif ((FAILED)); then
    RESULT=fail
  elif ((NOTRUN)) || [ -n "$CUR_STEP" ]; then
    RESULT=incomplete
  else
    RESULT=pass
  fi
  local running=()
  if [ -n "$CUR_STEP" ]; then
    # A step under way is recorded as such, in case the run is killed before it ends.
    running=("$CUR_STEP")
    ST_NAME+=("$CUR_STEP") ST_STATUS+=(interrupted) ST_SECS+=(0) ST_NOTE+=("under way when this summary was written")
    counts
  fi
  write_json >"$OUTDIR/summary.json.new"
  write_md >"$OUTDIR/summary.md.new"
  mv -f "$OUTDIR/summary.json.new" "$OUTDIR/summary.json"
  mv -f "$OUTDIR/summary.md.new" "$OUTDIR/summary.md"
  if ((${#running[@]})); then
    local last=$((${#ST_NAME[@]} - 1))
    unset "ST_NAME[$last]" "ST_STATUS[$last]" "ST_SECS[$last]" "ST_NOTE[$last]"
    counts
  fi
  tar -C "$WORK" -czf "$OUTDIR/logs.tar.gz.new" logs 2>/dev/null &&
    mv -f "$OUTDIR/logs.tar.gz.new" "$OUTDIR/logs.tar.gz"
  rm -f "$OUTDIR/logs.tar.gz.new"
}
