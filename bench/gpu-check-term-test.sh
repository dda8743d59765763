#!/usr/bin/env bash
# gpu-check-term-test.sh: bench/gpu-check.sh reports even when it is terminated part way. Starts
# a dry run, sends it TERM while its build runs, and checks what a GPU machine's caller would get
# back: summary.md whose first line counts the steps that passed, failed and did not run,
# summary.json marking the run terminated and the build interrupted, logs.tar.gz holding the
# configure and build logs, no more than 8 files, and no process of the build left running.
#
#   bench/gpu-check-term-test.sh [--nccl DIR]      (needs what a dry run needs: nvcc, meson)
#
# Exit status 0 when all of that holds, 1 otherwise (each miss is named).
set -uo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d /tmp/pmap-gpu-check-term.XXXXXX)
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
cleanup() {
  # Anything of the build still running was started by this test (its folder is unique).
  local pids
  pids=$(pgrep -f "$tmp/build" || true)
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

GPU_CHECK_BUILD_DIR=$tmp/build "$SRC/bench/gpu-check.sh" "$tmp/out" "$@" --dry-run \
  >"$tmp/console" 2>&1 &
pid=$!
for _ in $(seq 1 1500); do
  grep -q '^== build' "$tmp/out/check.log" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
if ! grep -q '^== build' "$tmp/out/check.log" 2>/dev/null; then
  fail "the dry run never started its build; its output:"
  cat "$tmp/console" "$tmp/out/check.log" 2>/dev/null | tail -n 30
  exit 1
fi
sleep 3 # the compilers are running now
kill -TERM "$pid"
for _ in $(seq 1 150); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
if kill -0 "$pid" 2>/dev/null; then
  fail "gpu-check.sh still runs 30 s after TERM"
  kill -KILL "$pid"
fi
wait "$pid"
rc=$?
[ "$rc" = 143 ] || fail "gpu-check.sh exited $rc after TERM, want 143"

out=$tmp/out
for f in summary.md summary.json logs.tar.gz; do [ -s "$out/$f" ] || fail "no $f after TERM"; done
files=$(find "$out" -type f | wc -l)
((files <= 8)) || fail "$files files in the output folder, more than 8: $(ls "$out")"
head -n 1 "$out/summary.md" | grep -Eq '^# pmap gpu-check: [0-9]+ passed, [0-9]+ failed, [0-9]+ not run' ||
  fail "summary.md's first line does not count the steps: $(head -n 1 "$out/summary.md")"
head -n 1 "$out/summary.md" | grep -q -- '-- terminated$' ||
  fail "summary.md's first line does not say the run was terminated: $(head -n 1 "$out/summary.md")"
python3 - "$out/summary.json" <<'PY' || fail "summary.json does not record the termination (above)"
import json, sys
s = json.load(open(sys.argv[1]))
steps = {x["name"]: x for x in s["steps"]}
problems = []
if s.get("terminated") is not True:
    problems.append("terminated is %r" % s.get("terminated"))
if steps.get("build", {}).get("status") != "interrupted":
    problems.append("the build's status is %r" % steps.get("build", {}).get("status"))
if steps.get("configure", {}).get("status") != "pass":
    problems.append("the configuration's status is %r" % steps.get("configure", {}).get("status"))
if not s.get("not_run"):
    problems.append("no step is counted as not run")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
tar -tzf "$out/logs.tar.gz" >"$tmp/list" 2>&1 || fail "logs.tar.gz does not open: $(cat "$tmp/list")"
for f in logs/configure.log logs/build.log; do
  grep -qx "$f" "$tmp/list" || fail "logs.tar.gz lacks $f"
done
sleep 1
left=$(pgrep -f "$tmp/build" || true)
[ -z "$left" ] || fail "processes of the terminated build still run: $left"

if ((failures)); then
  echo "gpu-check-term-test: $failures failed"
  tail -n 20 "$tmp/console"
  exit 1
fi
echo "gpu-check-term-test: a dry run terminated during its build wrote its summary ($(head -n 1 "$out/summary.md"))"
