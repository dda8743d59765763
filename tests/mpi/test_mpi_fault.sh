#!/usr/bin/env bash
# test_mpi_fault.sh: the mpi suite's parts about processes that disagree, fail or are late.
#   agree     test_mpi_fault mismatch, row0 and verify at 2 x 2 and 3 x 1
#   exit      a process that fails alone ends the job within seconds (context destroyed or
#             not); a mapped function that fails on it alone fails every process at once; a
#             process late to start is a timeout at pmap_ctx_create within seconds, and
#             the job ends; a process that stops or dies after sending its part is named; a
#             process that stops at the end (before or after destroying its context, or inside
#             MPI_Finalize) is named by the other within the timeout, and the job ends
#   toolfail  pmap-train: --timeout and PMAP_TIMEOUT end a stalled job naming the process; an
#             unwritable --save on process 0 ends the job within seconds, refused before step 1
#             or failing at a save; a replica perturbed on process 1 fails the final check and
#             --verify-every, naming its global device
#   refuse    test_mpi_refuse update and calls at 2 x 1, 2 x 2, 3 x 1 and 3 x 2: a call one
#             process refuses by its own checks fails on every process, changes nothing, and
#             the processes stay in step
#   refusepy  the same through the Python package (test_refuse.py, TEST_MPI_FAULT unused), with
#             $PMAP_PYTHON, else $PMAP_TEST_PYTHON (the build's); exits 77 without numpy
# Usage: test_mpi_fault.sh MPIRUN TEST_MPI_FAULT PART... ($PMAP_TRAIN names pmap-train).
set -u
mpirun=$1
prog=$2
shift 2
# shellcheck source-path=SCRIPTDIR source=mpi_env.sh
source "$(dirname "$0")/mpi_env.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$out"' EXIT

for part in "$@"; do
  case $part in
  agree)
    for layout in "2 2" "3 1"; do
      set -- $layout
      for mode in mismatch row0 verify; do
        bounded 60 -np "$1" "$prog" "$mode" "$2"
        rc=$?
        skip_if_no_mpi
        verdict $rc "$mode on $1 x $2"
        [ $rc -eq 0 ] && grep '^process 0:' "$out" | cut -c1-300 | sed 's/^/    /'
      done
    done
    ;;
  exit)
    # Process 1 fails alone at step 3 (timeout 30 s): process 0 hears at once, the job ends.
    for mode in "leave 2" "leaveopen 1"; do
      bounded 60 -np 2 "$prog" $mode
      skip_if_no_mpi
      grep -q '^OK leave' "$out" && [ $took -lt 10 ]
      verdict $? "$mode: process 0 names process 1 and the job ends"
      grep '^process 0:' "$out" | cut -c1-300 | sed 's/^/    /'
    done
    bounded 60 -np 2 "$prog" failjob 2
    grep -q '^OK failjob' "$out" && [ $took -lt 10 ]
    verdict $? "a mapped function failing on process 1 alone: process 0 hears at once, usable"
    grep '^process 0:' "$out" | cut -c1-300 | sed 's/^/    /'
    # Late at the start (timeout 1.5 s, 4 s late): a timeout, and the job ends.
    for mode in startinit startctx; do
      bounded 60 -np 2 "$prog" "$mode"
      grep -q '^OK start' "$out" && [ $took -lt 10 ]
      verdict $? "$mode: a late process is a timeout at pmap_ctx_create"
      grep '^process 0:' "$out" | cut -c1-300 | sed 's/^/    /'
    done
    # Process 1 stops, or dies, after sending its part of an exchange: both others name it.
    bounded 60 -np 3 "$prog" stop
    [ "$(grep -c '^OK after-send' "$out")" -eq 2 ] && [ $took -lt 20 ]
    verdict $? "a process stopped after sending its part is named"
    OMPI_MCA_orte_abort_on_non_zero_status=0 bounded 60 -np 3 "$prog" die
    [ "$(grep -c '^OK after-send' "$out")" -eq 2 ] && [ $took -lt 20 ]
    verdict $? "a process dead after sending its part is named"
    grep '^process 0:' "$out" | cut -c1-300 | sed 's/^/    /'
    # Process 1 stops (SIGSTOP) at the end, its work done (timeout 2 s): before destroying its
    # context, after, or inside MPI_Finalize (finalize_stop, preloaded): process 0 names it and
    # ends without waiting for it; mpirun then ends the job (not killed by the bound).
    stopper=${PMAP_FINALIZE_STOP:?PMAP_FINALIZE_STOP names the finalize_stop module}
    say_end='pmap: process 0 of 2 (host [^)]*): at exit: '
    for mode in closestop endstop finstop; do
      pre=()
      [ $mode = finstop ] && pre=(-x "LD_PRELOAD=$stopper" -x PMAP_TEST_FINALIZE_STOP=1)
      bounded 60 -np 2 "${pre[@]}" "$prog" $mode
      rc=$?
      case $mode in
      closestop) needle='^process 0: pmap_ctx_destroy after .*process 1 (host .*) did not destroy' ;;
      endstop) needle="${say_end}process 1 (host .*: stopped) did not finish within 2.000 s" ;;
      finstop) needle="${say_end}MPI_Finalize did not return within 2.000 s, though every process \
had finished: process 1 (host .*: stopped)" ;;
      esac
      [ $rc -ne 124 ] && [ $rc -ne 137 ] && grep -q "^OK end $mode" "$out" &&
        grep -q "$needle" "$out" && [ $took -lt 20 ]
      verdict $? "$mode: process 1 stopped at the end is named, and the job ends"
      grep -e '^process 0:' -e '^pmap: ' "$out" | cut -c1-300 | sed 's/^/    /'
    done
    ;;
  refuse)
    for layout in "2 1" "2 2" "3 1" "3 2"; do
      set -- $layout
      for mode in update calls; do
        bounded 120 -np "$1" "$prog" "$mode" "$2"
        rc=$?
        skip_if_no_mpi
        verdict $rc "a refused $mode on $1 x $2"
        [ $rc -eq 0 ] && grep '^process 0:' "$out" | head -n 3 | cut -c1-300 | sed 's/^/    /'
      done
    done
    ;;
  refusepy)
    py=${PMAP_PYTHON:-${PMAP_TEST_PYTHON:-}}
    if [ -z "$py" ] || ! "$py" -c 'import numpy' >/dev/null 2>&1; then
      echo "SKIP: no Python with numpy (set PMAP_PYTHON)"
      exit 77
    fi
    script=$(dirname "$0")/test_refuse.py
    for layout in "2 1" "3 1" "2 2"; do
      set -- $layout
      bounded 120 -np "$1" -x PYTHONPATH -x PMAP_LIBRARY "$py" "$script" "$2"
      rc=$?
      skip_if_no_mpi
      verdict $rc "a batch refused on one process, from Python, on $1 x $2"
      [ $rc -eq 0 ] && grep '^process 0:' "$out" | head -n 2 | cut -c1-300 | sed 's/^/    /'
    done
    ;;
  toolfail)
    train=${PMAP_TRAIN:?PMAP_TRAIN names pmap-train}
    args=(--backend cpu --model mlp --devices 1 --steps 400 --log-every 0)
    # Process 1 stalls at step 5: --timeout 2 (or PMAP_TIMEOUT=2) ends the job naming it.
    bounded 60 -np 1 "$train" "${args[@]}" --timeout 2 : \
      -np 1 -x PMAP_FAULT=stall:device=1:step=5 "$train" "${args[@]}" --timeout 2
    rc=$?
    [ $rc -ne 0 ] && [ $took -lt 20 ] && grep -q 'process 1 (host.*did not arrive' "$out" &&
      grep -q 'collective #' "$out"
    verdict $? "pmap-train --timeout 2 names the stalled process"
    grep 'did not arrive' "$out" | head -n 1 | cut -c1-300 | sed 's/^/    /'
    PMAP_TIMEOUT=2 bounded 60 -np 1 -x PMAP_TIMEOUT "$train" "${args[@]}" : \
      -np 1 -x PMAP_TIMEOUT -x PMAP_FAULT=stall:device=1:step=5 "$train" "${args[@]}"
    rc=$?
    [ $rc -ne 0 ] && [ $took -lt 20 ] && grep -q 'process 1 (host.*did not arrive' "$out"
    verdict $? "PMAP_TIMEOUT=2 names the stalled process"
    # Process 0 cannot write its checkpoint: the job ends within seconds, not after the
    # other's timeout (60 s). A --save into a missing folder is refused before step 1; a save
    # that fails later (here: its folder removed after the first save) ends the job alike.
    bounded 120 -np 2 "$train" "${args[@]}" --timeout 60 --save-every 5 --save "$tmp/no/such/dir/ck"
    rc=$?
    [ $rc -ne 0 ] && [ $took -lt 15 ] && grep -q -- '--save: pmap_params_save_check' "$out" &&
      ! grep -q 'pmap-train: model' "$out"
    verdict $? "a --save into a missing folder: refused on process 0 before step 1, the job ends"
    mkdir "$tmp/vanish"
    (while [ ! -s "$tmp/vanish/ck" ]; do sleep 0.02; done
      while [ -d "$tmp/vanish" ]; do rm -rf "$tmp/vanish"; done) &
    watcher=$!
    bounded 120 -np 2 "$train" "${args[@]}" --steps 100000 --timeout 60 --save-every 5 \
      --save "$tmp/vanish/ck"
    rc=$?
    kill $watcher 2>/dev/null
    wait $watcher 2>/dev/null
    [ $rc -ne 0 ] && [ $took -lt 15 ] && grep -q -- 'step [0-9]*: --save: .*No such file' "$out"
    verdict $? "a save that fails on process 0 mid-run ends the job within seconds"
    # A replica perturbed on process 1: the final check and --verify-every see it.
    bounded 60 -np 1 "$train" "${args[@]}" --steps 20 --json : \
      -np 1 -x PMAP_FAULT=drift:device=1:step=3 "$train" "${args[@]}" --steps 20 --json
    rc=$?
    [ $rc -ne 0 ] && grep -q '"replicas_identical": false' "$out" &&
      grep -q 'device 1 (process 1, host' "$out"
    verdict $? "the final replica check spans the processes"
    bounded 60 -np 1 "$train" "${args[@]}" --steps 20 --verify-every 1 : \
      -np 1 -x PMAP_FAULT=drift:device=1:step=3 "$train" "${args[@]}" --steps 20 --verify-every 1
    rc=$?
    [ $rc -ne 0 ] && grep -q 'step 3: --verify-every: .*device 1 (process 1, host' "$out"
    verdict $? "--verify-every spans the processes"
    grep -- '--verify-every:' "$out" | head -n 1 | cut -c1-300 | sed 's/^/    /'
    ;;
  *)
    echo "unknown part $part"
    exit 2
    ;;
  esac
done
exit $fail
