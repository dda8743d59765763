#!/usr/bin/env bash
# test_mpi.sh: runs test_mpi under mpirun with 2 and 3 processes of 1 and 2 devices each, and
# checks that a stalled process is reported, that a dead one ends the job instead of hanging, and
# that where the launcher lets the others run on, the survivor reports the dead one.
# Usage: test_mpi.sh MPIRUN TEST_MPI [coll|train|fail|tools ...] (tools: $PMAP_TRAIN names
# pmap-train). Exit 77 (skip) without mpirun.
set -u
mpirun=$1
prog=$2
shift 2
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(coll train fail)
# shellcheck source-path=SCRIPTDIR source=mpi_env.sh
source "$(dirname "$0")/mpi_env.sh"
bounds=$(cd "$(dirname "$0")/../../python/tests" && pwd) # bounds.py

# run LIMIT_S NP ARGS...: mpirun, bounded; leaves the output in $out, returns mpirun's status.
run() {
  local limit=$1 np=$2
  shift 2
  timeout -k 5 "$limit" "$mpirun" --oversubscribe -np "$np" "$prog" "$@" >"$out" 2>&1
}

expect_ok() {
  local limit=$1 np=$2
  shift 2
  local t0=$SECONDS
  run "$limit" "$np" "$@"
  local rc=$?
  if [ $rc -eq 77 ] || grep -q '^SKIP' "$out"; then cat "$out"; exit 77; fi
  if [ $rc -ne 0 ]; then
    echo "FAIL: mpirun -np $np $* exited $rc after $((SECONDS - t0)) s:"
    cat "$out"
    fail=1
  else
    echo "ok: mpirun -np $np $* ($((SECONDS - t0)) s)"
    grep -v '^process [1-9]' "$out" | sed 's/^/    /'
  fi
}

for part in "${parts[@]}"; do
  case $part in
  coll)
    for np in 2 3; do for d in 1 2; do expect_ok 120 $np coll $d; done; done
    expect_ok 60 2 layout 1
    ;;
  train)
    for np in 2 3; do for d in 1 2; do expect_ok 300 $np train $d; done; done
    ;;
  fail)
    # A stalled process: process 0 reports it (timeout 3 s) and ends; the launcher then ends
    # the job. Bounded well below the stall's 120 s.
    t0=$SECONDS
    run 60 2 stall 2
    if grep -q '^OK stall' "$out" && [ $((SECONDS - t0)) -lt 60 ]; then
      echo "ok: stall reported in $((SECONDS - t0)) s: $(grep 'failed after' "$out")"
    else
      echo "FAIL: a stalled process was not reported (after $((SECONDS - t0)) s):"
      cat "$out"
      fail=1
    fi
    # A process that exits mid-run: the job must end with an error, not hang.
    t0=$SECONDS
    run 60 2 die 1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && [ $((SECONDS - t0)) -lt 60 ]; then
      echo "ok: a dead process ended the job with status $rc in $((SECONDS - t0)) s"
    else
      echo "FAIL: a dead process: mpirun status $rc after $((SECONDS - t0)) s:"
      cat "$out"
      fail=1
    fi
    # The same with a launcher that lets the others run on: the survivor names the dead one.
    t0=$SECONDS
    OMPI_MCA_orte_abort_on_non_zero_status=0 run 60 2 die 1
    if grep -q '^OK die' "$out" && [ $((SECONDS - t0)) -lt 60 ]; then
      echo "ok: dead process reported in $((SECONDS - t0)) s: $(grep 'failed after' "$out")"
    else
      echo "FAIL: a dead process was not reported by the survivor (after $((SECONDS - t0)) s):"
      cat "$out"
      fail=1
    fi
    ;;
  tools)
    # pmap-train under mpirun, unchanged flags: 2 processes x 2 devices report once, and their
    # final loss equals one process of 4 devices (same global batch, same data) to the order of
    # the all-reduce's sums: within bound_order32 of the model on its global batch over the
    # run's steps (tests/bounds.h, python/tests/bounds.py its copy).
    train=${PMAP_TRAIN:?PMAP_TRAIN names pmap-train}
    t0=$SECONDS
    timeout -k 5 120 "$mpirun" --oversubscribe -np 2 "$train" --backend cpu --model mlp --devices 2 \
      --steps 50 --json >"$out" 2>&1
    rc=$?
    one=$(PMAP_DIST=none "$train" --backend cpu --model mlp --devices 4 --steps 50 --json | tail -n 1)
    many=$(grep '^{' "$out")
    if [ $rc -eq 0 ] && [ "$(grep -c '^{' "$out")" -eq 1 ] &&
      python3 - "$one" "$many" "$bounds" <<'PY'
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:3])
sys.path.insert(0, sys.argv[3])
from bounds import bound_model_of, bound_order32
bound = bound_order32(bound_model_of(a["model"]), a["global_batch"], a["steps"])
err = abs(a["final_loss"] - b["final_loss"]) / abs(a["final_loss"])
ok = (b["processes"] == 2 and b["devices"] == 2 and b["replicas_identical"]
      and b["global_batch"] == a["global_batch"] and err <= bound)
print(f'    1 x 4: {a["final_loss"]:.9g}, 2 x 2: {b["final_loss"]:.9g}: {err:.2e} '
      f'(bound {bound:.2e})')
sys.exit(0 if ok else 1)
PY
    then
      echo "ok: pmap-train under mpirun reports once and matches one process ($((SECONDS - t0)) s)"
    else
      echo "FAIL: pmap-train under mpirun (status $rc):"
      cat "$out"
      echo "one process: $one"
      fail=1
    fi
    # Open MPI gives its processes a pseudo-terminal: still plain lines into the file, no bar's
    # carriage returns or escape codes, and the JSON line a whole line of its own.
    if [ $rc -eq 0 ] && ! grep -q $'[\r\033]' "$out" && grep -q '^step ' "$out" &&
      grep '^{' "$out" | python3 -c 'import json, sys; json.loads(sys.stdin.read())'; then
      echo "ok: pmap-train under mpirun writes plain lines into a file"
    else
      echo "FAIL: pmap-train under mpirun wrote a progress bar into the file:"
      cat -A "$out" | cut -c1-200
      fail=1
    fi
    # What a run shows across processes: a trace file per process, its tracks named by global
    # device, process and host; the waits of all 4 devices and the slowest process in --json.
    rm -f "$out".p0.json "$out".p1.json
    timeout -k 5 120 "$mpirun" --oversubscribe -np 2 "$train" --backend cpu --model mlp --devices 2 \
      --steps 6 --trace "$out.json" --trace-steps 2 --json >"$out" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && python3 - "$out" <<'PY'
import json, sys
base = sys.argv[1]
j = json.loads([l for l in open(base) if l.startswith("{")][-1])
w = j["waits"]
assert [d["device"] for d in w["devices"]] == [0, 1, 2, 3], w
assert w["slowest_process"] in (0, 1) and all(d["collectives"] >= 6 for d in w["devices"]), w
for p in (0, 1):
    doc = json.load(open(f"{base}.p{p}.json"))
    names = sorted(e["args"]["name"] for e in doc["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "thread_name")
    want = [f"device {2 * p + i} (process {p} of 2" for i in (0, 1)]
    assert all(any(n.startswith(x) for n in names) for x in want), names
    assert any(n.startswith(f"caller (process {p}, host") for n in names), names
    steps = {e["args"]["step"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert steps == {5, 6}, steps
PY
    then
      echo "ok: pmap-train under mpirun writes a trace per process and every device's waits"
    else
      echo "FAIL: trace and waits under mpirun (status $rc):"
      cat "$out"
      fail=1
    fi
    rm -f "$out".p0.json "$out".p1.json
    ;;
  *)
    echo "unknown part $part"
    exit 2
    ;;
  esac
done
exit $fail
