#!/usr/bin/env bash
# test_launch.sh: pmap-launch restarts a failed pmap-train job from its newest checkpoint.
#  1. Process 1 of a 2 x 2 run is killed (SIGKILL) mid-run, in its first run only: the launcher
#     says why, restarts from the checkpoint of step 30, finishes, and the final checkpoint is
#     bitwise the file of an uninterrupted run of the same layout. What makes that hold: the
#     data position is the step (step s takes batch s % batches, resumed or not), a checkpoint
#     holds the whole state at the step it was taken (parameters, optimizer state, step), and
#     the same layout adds in the same order.
#  2. The same kill, restarted on 1 process of 2 devices (--restart-np 1): the run finishes
#     with the final loss of the uninterrupted run to rounding.
#  3. A job that always fails: the launcher gives up after --max-restarts, with its status.
# Usage: test_launch.sh MPIRUN ($PMAP_TRAIN names pmap-train, $PMAP_LAUNCH pmap-launch).
set -u
mpirun=$1
# shellcheck source-path=SCRIPTDIR source=mpi_env.sh
source "$(dirname "$0")/mpi_env.sh"
train=${PMAP_TRAIN:?PMAP_TRAIN names pmap-train}
launch=${PMAP_LAUNCH:?PMAP_LAUNCH names pmap-launch}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$out"' EXIT

# The wrapper mpirun starts: in the first run only, process 1 stalls at step 35 (so that the
# run cannot end first) and is killed once the first checkpoint exists.
cat >"$tmp/wrap.sh" <<'EOF'
#!/bin/sh
if [ "${PMAP_LAUNCH_ATTEMPT:-0}" = 0 ] && [ "${OMPI_COMM_WORLD_RANK:-0}" = 1 ]; then
  export PMAP_FAULT=stall:device=2:step=35
  me=$$
  (
    while [ ! -f "$KILL_AFTER" ]; do sleep 0.05; done
    sleep 0.5
    grep -q pmap-train "/proc/$me/cmdline" 2>/dev/null && kill -9 "$me"
  ) &
fi
exec "$@"
EOF
chmod +x "$tmp/wrap.sh"

args=(--backend cpu --model mlp --devices 2 --steps 60 --save-every 10 --log-every 0 --timeout 30 --json)
t0=$SECONDS
"$mpirun" --oversubscribe -np 2 "$train" "${args[@]}" --save "$tmp/ref.ckpt" >"$tmp/ref.out" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  echo "FAIL: the uninterrupted run failed ($rc):"
  cat "$tmp/ref.out"
  exit 1
fi
echo "ok: the uninterrupted 2 x 2 run ($((SECONDS - t0)) s)"

# launched RESTART_NP NAME: runs the launcher with the killing wrapper; log in $tmp/NAME.log.
launched() {
  local t0=$SECONDS
  KILL_AFTER="$tmp/$2.ckpt" timeout -k 5 120 "$launch" --np 2 --restart-np "$1" --max-restarts 2 \
    --mpirun "$mpirun" --mpirun-arg --oversubscribe --backoff 0 --log "$tmp/$2.log" -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/$2.ckpt" >"$out" 2>&1
  local rc=$?
  took=$((SECONDS - t0))
  return $rc
}

launched 2 same
rc=$?
[ $rc -eq 0 ] && grep -q 'run 1 failed.*signal 9' "$tmp/same.log" &&
  grep -q 'restart 1 of 2 on 2 processes, from .*same.ckpt (step 30)' "$tmp/same.log" &&
  grep -q 'run 2 finished' "$tmp/same.log" && cmp -s "$tmp/ref.ckpt" "$tmp/same.ckpt"
verdict $? "killed, restarted from step 30, final state bitwise the uninterrupted run's"
sed 's/^/    /' "$tmp/same.log" | cut -c1-250

launched 1 fewer
rc=$?
[ $rc -eq 0 ] && grep -q 'restart 1 of 2 on 1 processes' "$tmp/fewer.log" && python3 - \
  "$(grep '^{' "$tmp/ref.out" | tail -n 1)" "$(grep '^{' "$out" | tail -n 1)" <<'PY'
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:3])
print(f'    2 x 2 uninterrupted: {a["final_loss"]:.9g}, resumed on 1 x 2: {b["final_loss"]:.9g}')
sys.exit(0 if abs(a["final_loss"] - b["final_loss"]) <= 1e-5 * abs(a["final_loss"]) else 1)
PY
verdict $? "killed, restarted on fewer processes, same final loss to rounding"

t0=$SECONDS
timeout -k 5 60 "$launch" --np 2 --max-restarts 1 --mpirun "$mpirun" --mpirun-arg --oversubscribe \
  --backoff 0 -- "$train" --backend cpu --model mlp --devices 2 --batch 7 --save "$tmp/x.ckpt" \
  >"$out" 2>&1
rc=$?
took=$((SECONDS - t0))
[ $rc -ne 0 ] && [ "$(grep -c 'failed after' "$out")" -eq 2 ] && grep -q 'giving up after 1' "$out" &&
  grep -q 'not divisible' "$out"
verdict $? "a job that always fails: the launcher gives up after --max-restarts"
exit $fail
