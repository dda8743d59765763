#!/usr/bin/env bash
# test_launch.sh: pmap-launch restarts a failed pmap-train job from its newest checkpoint, ends
# every process of a failed run first, and stops at once where a restart cannot help. Parts:
#  restart  process 1 of a 2 x 2 run is killed (SIGKILL) mid-run, in its first run only: the
#           launcher says why, restarts from the checkpoint of step 30, and the final checkpoint
#           is bitwise the file of an uninterrupted run of the same layout (the data position is
#           the step, a checkpoint holds the whole state, the same layout adds in the same
#           order); the same restarted on 1 process: the same final loss to the order of its
#           sums (tests/bounds.h); a job that fails at step 5 of every run: restarted until
#           --max-restarts, then given up; the program's own --resume taken over, and used
#           again when no checkpoint loads.
#  kill     mpirun itself killed (SIGKILL) while its ranks train and save; a stand-in mpirun that
#           dies leaving its program running in a session of its own, ignoring SIGTERM; a rank
#           stopped (SIGSTOP); the launcher itself interrupted (SIGTERM). In each: no process of a
#           run is alive when the next one starts or the launcher ends, and a restart resumes at
#           the step the log names.
#  check    damaged checkpoints (garbled, truncated, a FIFO, a complete FILE.tmp.* left by a save
#           cut short, also beside the file a symbolic link FILE names: one the first save
#           created, and one not there yet beside which a first save was cut short),
#           and a job whose environment holds PMAP_FAULT: the check picks the right file, and the
#           restart ends bitwise where an uninterrupted run ends.
#  args     every option's missing value (the program's --save, --resume and --save-every last
#           included), a --log into a missing folder, a missing program or mpirun: refused at
#           start; a bad pmap-train argument, a --save into a missing folder (pmap-train's
#           status 2), mpirun's own failure and a rank crashed (SIGSEGV) before the header: one
#           run, no restart; a rank killed (SIGKILL, SIGTERM) before the header: restarted; the
#           reason of a failed run names the failing process's message before the others'.
#  end      a rank stopped (SIGSTOP) inside MPI_Finalize after the last step and save: the run
#           ends within the timeout, and the launcher finds the final checkpoint and ends with
#           success, bitwise the uninterrupted run's, without a restart; a rank 4 s late to
#           start (timeout 2 s): pmap-train's timeout at its start is restarted, and the job
#           finishes.
# Every launcher runs under a timeout: a hang fails the test. Usage: test_launch.sh MPIRUN PART
# ($PMAP_TRAIN names pmap-train, $PMAP_LAUNCH pmap-launch).
set -u
mpirun=$1
part=${2:-restart}
# shellcheck source-path=SCRIPTDIR source=mpi_env.sh
source "$(dirname "$0")/mpi_env.sh"
bounds=$(cd "$(dirname "$0")/../../python/tests" && pwd) # bounds.py
train=${PMAP_TRAIN:?PMAP_TRAIN names pmap-train}
launch=${PMAP_LAUNCH:?PMAP_LAUNCH names pmap-launch}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$out"' EXIT
export LAUNCH_DIR=$tmp

# The program mpirun starts (not the checks, which run it with --inspect): notes any process of
# an earlier run that is still alive, records its own pid for its run, and in the first run does
# the harm $MODE names to the checkpoint $CKPT or to the processes.
cat >"$tmp/wrap.sh" <<'EOF'
#!/bin/sh
case " $* " in *" --inspect "*) exec "$@" ;; esac
a=${PMAP_LAUNCH_ATTEMPT:-0} r=${OMPI_COMM_WORLD_RANK:-0} d=$LAUNCH_DIR
for f in "$d"/pids.*; do
  [ -f "$f" ] && [ "${f##*.}" -lt "$a" ] || continue
  while read -r pid; do
    st=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
    if [ -n "$st" ] && [ "$st" != Z ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$d"; then
      echo "run $((a + 1)) started while process $pid of run $((${f##*.} + 1)) was alive" >>"$d/overlap"
    fi
  done <"$f"
done
echo $$ >>"$d/pids.$a"
me=$$
waitfile() { while [ ! -s "$CKPT" ]; do sleep 0.02; done; }
if [ "$a" = 0 ]; then
  case ${MODE:-}:$r in
  kill_rank:1) export PMAP_FAULT=stall:device=2:step=35; (waitfile; sleep 0.5; kill -9 $me) & ;;
  kill_mpirun:0) (waitfile; kill -9 "$PPID") & ;;
  stop:1) (waitfile; kill -STOP $me) & ;;
  hold:1) export PMAP_FAULT=stall:device=2:step=35 ;;
  early:1) ulimit -c 0; kill -"$SIG" $$ ;; # before pmap-train starts: before its header
  late:1) sleep 4 ;;                          # a slow start: the others' timeout at their start
  finstop:1) export LD_PRELOAD=$PMAP_FINALIZE_STOP PMAP_TEST_FINALIZE_STOP=$r ;;
  nan1:*) export PMAP_FAULT=nan:device=0:step=1 ;; # fails at step 1, before any save
  corrupt:1)
    export PMAP_FAULT=stall:device=2:step=35
    (waitfile; sleep 1; sh "$d/corrupt.sh"; kill -9 $me) & ;;
  esac
fi
exec "$@"
EOF
chmod +x "$tmp/wrap.sh"

# A stand-in for mpirun: runs the program once, alone. In the first run it starts it in a
# session of its own ignoring SIGTERM (stalling at step 200 until its --timeout), and dies by
# SIGKILL once the checkpoint exists, leaving it training and saving.
cat >"$tmp/fake-mpirun.sh" <<'EOF'
#!/bin/sh
while [ $# -gt 0 ]; do case $1 in -np) shift 2 ;; --oversubscribe) shift ;; *) break ;; esac; done
export PMAP_DIST=none
if [ "${PMAP_LAUNCH_ATTEMPT:-0}" = 0 ]; then
  PMAP_FAULT=stall:device=1:step=200 setsid sh -c 'trap "" TERM; exec "$@"' sh "$@" &
  while [ ! -f "$CKPT" ]; do sleep 0.02; done
  sleep 0.2
  kill -9 $$
fi
exec "$@"
EOF
chmod +x "$tmp/fake-mpirun.sh"

args=(--backend cpu --model mlp --devices 2 --steps 60 --save-every 10 --log-every 0 --timeout 30
  --json)

# reference NAME NP ARGS...: the uninterrupted run ($tmp/NAME.ckpt, output $tmp/NAME.out).
reference() {
  local name=$1 np=$2 t0=$SECONDS
  shift 2
  if [ "$np" = 0 ]; then
    PMAP_DIST=none timeout -k 5 120 "$train" "$@" --save "$tmp/$name.ckpt" >"$tmp/$name.out" 2>&1
  else
    timeout -k 5 120 "$mpirun" --oversubscribe -np "$np" "$train" "$@" --save "$tmp/$name.ckpt" \
      >"$tmp/$name.out" 2>&1
  fi
  local rc=$?
  took=$((SECONDS - t0))
  cp "$tmp/$name.out" "$out"
  verdict $rc "the uninterrupted run $name"
}

# launched NAME LIMIT LAUNCHER_ARGS... -- PROGRAM ARGS...: the launcher, killed after LIMIT s;
# its output in $out, its log in $tmp/NAME.log, its status returned (wall time in $took).
# Starts from a clean slate: no pids, no overlap, $CKPT is $tmp/NAME.ckpt.
launched() {
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  rm -f "$tmp"/pids.* "$tmp/overlap" "$tmp/$name.log"
  CKPT="$tmp/$name.ckpt" timeout -k 5 "$limit" "$launch" --mpirun-arg --oversubscribe \
    --backoff 0 --log "$tmp/$name.log" "$@" >"$out" 2>&1
  local rc=$?
  took=$((SECONDS - t0))
  return $rc
}

# clean: no process of any run is alive (now that the launcher has ended), none overlapped.
clean() {
  local f pid st
  if [ -s "$tmp/overlap" ]; then cat "$tmp/overlap"; return 1; fi
  for f in "$tmp"/pids.*; do
    [ -f "$f" ] || continue
    while read -r pid; do
      st=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
      if [ -n "$st" ] && [ "$st" != Z ]; then echo "process $pid is still alive"; return 1; fi
    done <"$f"
  done
}

# resumed_as_logged NAME: run 2 resumed at the step the launcher's log names.
resumed_as_logged() {
  local logged ran
  logged=$(sed -n 's/.*restart 1 of .*(step \([0-9]*\)).*/\1/p' "$tmp/$1.log")
  ran=$(sed -n 's/^resumed from .* after step \([0-9]*\): steps .* follow$/\1/p' "$out" | head -n 1)
  echo "    the log says step ${logged:-none}, run 2 resumed at step ${ran:-none}"
  [ -n "$logged" ] && [ "$logged" = "$ran" ]
}

show_log() { sed 's/^/    /' "$tmp/$1.log" | cut -c1-250; }

# held NP NAME: the launcher in the background ($lp, since $t0) with rank 1 held at step 35 of
# its first run, once the checkpoint of step 30 exists.
held() {
  rm -f "$tmp"/pids.* "$tmp/overlap" "$tmp/$2.ckpt"
  t0=$SECONDS
  CKPT="$tmp/$2.ckpt" MODE=hold "$launch" --np "$1" --mpirun-arg --oversubscribe --backoff 0 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/$2.ckpt" >"$out" 2>&1 &
  lp=$!
  for _ in $(seq 600); do [ -f "$tmp/$2.ckpt" ] && break; sleep 0.05; done
  sleep 0.5
}

case $part in
restart)
  reference ref 2 "${args[@]}"
  MODE=kill_rank launched same 120 --np 2 --max-restarts 2 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/same.ckpt"
  rc=$?
  [ $rc -eq 0 ] && grep -q 'run 1 failed.*signal 9' "$tmp/same.log" &&
    grep -q 'restart 1 of 2 on 2 processes, from .*same.ckpt (step 30)' "$tmp/same.log" &&
    grep -q 'run 2 finished' "$tmp/same.log" && cmp -s "$tmp/ref.ckpt" "$tmp/same.ckpt" && clean
  verdict $? "killed, restarted from step 30, final state bitwise the uninterrupted run's"
  show_log same

  MODE=kill_rank launched fewer 120 --np 2 --restart-np 1 --max-restarts 2 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/fewer.ckpt"
  rc=$?
  # The steps before the checkpoint are the uninterrupted run's, bitwise; those after it sum
  # the all-reduce in another order: within bound_order32 of the model on its global batch over
  # the steps run on 1 process (tests/bounds.h, python/tests/bounds.py its copy).
  [ $rc -eq 0 ] && grep -q 'restart 1 of 2 on 1 processes' "$tmp/fewer.log" && python3 - \
    "$(grep '^{' "$tmp/ref.out" | tail -n 1)" "$(grep '^{' "$out" | tail -n 1)" "$bounds" <<'PY'
import json, sys
a, b = (json.loads(x) for x in sys.argv[1:3])
sys.path.insert(0, sys.argv[3])
from bounds import bound_model_of, bound_order32
bound = bound_order32(bound_model_of(b["model"]), b["global_batch"], b["steps"] - b["start_step"])
err = abs(a["final_loss"] - b["final_loss"]) / abs(a["final_loss"])
print(f'    2 x 2 uninterrupted: {a["final_loss"]:.9g}, resumed on 1 x 2 from step '
      f'{b["start_step"]}: {b["final_loss"]:.9g}: {err:.2e} (bound {bound:.2e})')
sys.exit(0 if b["start_step"] > 0 and err <= bound else 1)
PY
  verdict $? "killed, restarted on fewer processes, same final loss to the order of its sums"

  # Every run fails at step 5 (the guard stops it), after training began: restarted each time.
  PMAP_FAULT=nan:device=0:step=5 launched always 60 --np 2 --max-restarts 1 -- \
    "$train" "${args[@]}" --save "$tmp/always.ckpt"
  rc=$?
  [ $rc -eq 1 ] && [ "$(grep -c 'failed after' "$tmp/always.log")" -eq 2 ] &&
    grep -q 'from the start (no checkpoint loads)' "$tmp/always.log" &&
    grep -q 'giving up after 1 restarts' "$tmp/always.log" && grep -q 'not finite' "$out"
  verdict $? "a job that fails in every run: restarted, then given up after --max-restarts"

  # A --resume in the program's arguments is the first run's; with no checkpoint of --save to
  # load (no --save-every), the restart resumes from it again, and the log says so.
  reference r30 0 --backend cpu --model mlp --devices 2 --steps 30 --log-every 0
  PMAP_FAULT=nan:device=0:step=35 launched given 60 --np 2 --max-restarts 1 -- \
    "$train" --backend cpu --model mlp --devices 2 --steps 60 --log-every 0 --resume \
    "$tmp/r30.ckpt" --save "$tmp/given.ckpt"
  rc=$?
  [ $rc -eq 1 ] && grep -q "restart 1 of 1 on 2 processes, from $tmp/r30.ckpt (the first run's \
--resume: no checkpoint loads)" "$tmp/given.log" &&
    [ "$(grep -c "^resumed from $tmp/r30.ckpt after step 30: steps 31 to 60 follow$" "$out")" -eq 2 ] &&
    [ "$(grep -c -- "--resume $tmp/r30.ckpt" "$tmp/given.log")" -eq 2 ]
  verdict $? "the program's --resume: taken over, used again when no checkpoint loads"
  ;;
kill)
  long=(--backend cpu --model mlp --devices 2 --steps 1000 --save-every 10 --log-every 0
    --timeout 30)
  reference longref 2 "${long[@]}"
  MODE=kill_mpirun launched mpirun 120 --np 2 --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${long[@]}" --save "$tmp/mpirun.ckpt"
  rc=$?
  clean && resumed_as_logged mpirun
  verdict $? "mpirun killed: no rank of run 1 alive when run 2 starts, resumed at the logged step"
  [ $rc -eq 0 ] && cmp -s "$tmp/longref.ckpt" "$tmp/mpirun.ckpt" &&
    grep -q 'run 1 failed.*mpirun itself ended by signal 9' "$tmp/mpirun.log" &&
    grep -qE 'run 1: (every process of it has ended|[0-9]+ processes outlived mpirun)' \
      "$tmp/mpirun.log"
  verdict $? "mpirun killed: the log says so and how its ranks ended, final state bitwise"
  show_log mpirun

  solo=(--backend cpu --model mlp --devices 2 --steps 400 --save-every 10 --log-every 0
    --timeout 30)
  reference soloref 0 "${solo[@]}"
  launched escape 120 --mpirun "$tmp/fake-mpirun.sh" --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${solo[@]}" --save "$tmp/escape.ckpt"
  rc=$?
  clean && resumed_as_logged escape
  verdict $? "a process left in a session of its own, ignoring SIGTERM: gone before the restart"
  [ $rc -eq 0 ] && cmp -s "$tmp/soloref.ckpt" "$tmp/escape.ckpt" &&
    grep -q 'run 1: 1 processes outlived mpirun.*SIGKILL after the 3 s grace' "$tmp/escape.log"
  verdict $? "that process: killed after the grace, the log says so, final state bitwise"
  show_log escape

  # The others give up on the stopped rank after 3 s (--timeout 3, the last one given).
  MODE=stop launched stop 120 --np 2 --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${long[@]}" --timeout 3 --save "$tmp/stop.ckpt"
  rc=$?
  [ $rc -eq 0 ] && grep -q 'run 1 failed' "$tmp/stop.log" &&
    grep -q 'restart 1 of 1 on 2 processes, from .*stop.ckpt (step [1-9]' "$tmp/stop.log" &&
    resumed_as_logged stop && clean && cmp -s "$tmp/longref.ckpt" "$tmp/stop.ckpt"
  verdict $? "a stopped rank (SIGSTOP): the run fails on the timeout, restarted, final bitwise"
  show_log stop

  # The launcher interrupted (SIGTERM): it stops the job, restarts nothing, leaves no process.
  held 2 int
  kill -TERM $lp
  for _ in $(seq 300); do kill -0 $lp 2>/dev/null || break; sleep 0.05; done
  kill -9 $lp 2>/dev/null
  wait $lp
  rc=$?
  took=$((SECONDS - t0))
  ! grep -q 'restart 1' "$out" && clean
  verdict $? "the launcher interrupted (SIGTERM): the job stopped, no restart, nothing left"
  [ $rc -eq 143 ] && grep -q 'interrupted by signal 15: stopping the job' "$out"
  verdict $? "the launcher interrupted (SIGTERM): status 143, the log says so"

  # The launcher killed (SIGKILL): mpirun is told (the parent-death signal) and ends the job,
  # well before the held rank's --timeout of 30 s.
  held 2 dead
  kill -9 $lp
  wait $lp
  for _ in $(seq 200); do clean >/dev/null && break; sleep 0.05; done
  took=$((SECONDS - t0))
  clean
  verdict $? "the launcher killed (SIGKILL): its job ends with it"
  ;;
check)
  reference ref 2 "${args[@]}"
  # FILE garbled, a complete FILE.tmp.* (the save of step 30 cut short before its rename), a
  # truncated one and a FIFO: the complete one is renamed to FILE and resumed from.
  cat >"$tmp/corrupt.sh" <<'EOF'
set -e
c=$CKPT
cp "$c" "$c.tmp.AAAAAA"
head -c 1000 "$c" >"$c.tmp.BBBBBB"
mkfifo "$c.tmp.fifo"
printf 'garbage!' | dd of="$c" bs=1 seek=2000 conv=notrunc status=none
EOF
  MODE=corrupt launched corrupt 120 --np 2 --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/corrupt.ckpt"
  rc=$?
  c=$tmp/corrupt.ckpt
  [ $rc -eq 0 ] && grep -q "restart 1 of 1 on 2 processes, from $c.* (step 30)" \
    "$tmp/corrupt.log" && cmp -s "$tmp/ref.ckpt" "$c" && clean
  verdict $? "garbled FILE, truncated and complete FILE.tmp.*, a FIFO: resumed from the complete"
  grep -q "checkpoint $c does not load; skipped: .*checksum" "$tmp/corrupt.log" &&
    grep -q "checkpoint $c.tmp.BBBBBB does not load; skipped: .*truncated" "$tmp/corrupt.log" &&
    grep -q "checkpoint $c.tmp.fifo is not a regular file; skipped" "$tmp/corrupt.log" &&
    grep -q "checkpoint $c.tmp.AAAAAA (step 30) is a save cut short .*: renamed to $c" \
      "$tmp/corrupt.log" && grep -q "restart 1 of 1 on 2 processes, from $c (step 30)" \
      "$tmp/corrupt.log" && [ ! -e "$c.tmp.AAAAAA" ] && [ -f "$c.tmp.BBBBBB" ]
  verdict $? "the log says why each file was skipped; the complete one renamed to FILE first"
  show_log corrupt

  # FILE truncated, nothing else: from the start, and still the uninterrupted run's end.
  cat >"$tmp/corrupt.sh" <<'EOF'
truncate -s 100 "$CKPT"
EOF
  MODE=corrupt launched trunc 120 --np 2 --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/trunc.ckpt"
  rc=$?
  [ $rc -eq 0 ] && grep -q 'trunc.ckpt does not load; skipped' "$tmp/trunc.log" &&
    grep -q 'restart 1 of 1 on 2 processes, from the start (no checkpoint loads)' \
      "$tmp/trunc.log" && cmp -s "$tmp/ref.ckpt" "$tmp/trunc.ckpt" && clean
  verdict $? "a truncated FILE alone: restarted from the start, final bitwise"

  # --save names a symbolic link: the saves write beside the file it names, and so the complete
  # temporary file of a save cut short is found there, and renamed over that file (the link
  # stays).
  mkdir "$tmp/real"
  ln -s real/target.ckpt "$tmp/link.ckpt"
  # No file at the link's end yet: the first save creates it there.
  cat >"$tmp/corrupt.sh" <<'EOF'
t=$(dirname "$CKPT")/real/target.ckpt
cp "$t" "$t.tmp.AAAAAA"
printf 'garbage!' | dd of="$t" bs=1 seek=2000 conv=notrunc status=none
EOF
  MODE=corrupt launched link 120 --np 2 --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/link.ckpt"
  rc=$?
  [ $rc -eq 0 ] && grep -q 'restart 1 of 1 on 2 processes, from .*link.ckpt (step 30)' \
    "$tmp/link.log" && [ -L "$tmp/link.ckpt" ] && [ ! -e "$tmp/real/target.ckpt.tmp.AAAAAA" ] &&
    cmp -s "$tmp/ref.ckpt" "$tmp/real/target.ckpt" && clean
  verdict $? "--save through a symbolic link: the save cut short found beside its target"
  show_log link

  # The link's file is not there yet, but a complete save of step 30 cut short before its first
  # rename is, beside it: the launcher finds it there, renames it to the link's file and
  # resumes from step 30.
  reference half 2 "${args[@]}" --steps 30
  mkdir "$tmp/real2"
  ln -s real2/t.ckpt "$tmp/link2.ckpt"
  cp "$tmp/half.ckpt" "$tmp/real2/t.ckpt.tmp.AAAAAA"
  MODE=nan1 launched link2 120 --np 2 --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/link2.ckpt"
  rc=$?
  [ $rc -eq 0 ] && grep -q 'real2/t.ckpt.tmp.AAAAAA (step 30) is a save cut short' "$tmp/link2.log" &&
    grep -q 'restart 1 of 1 on 2 processes, from .*link2.ckpt (step 30)' "$tmp/link2.log" &&
    [ -L "$tmp/link2.ckpt" ] && cmp -s "$tmp/ref.ckpt" "$tmp/real2/t.ckpt" && clean
  verdict $? "a link to a file not there yet: the save cut short beside it resumed from"
  show_log link2

  # The job's environment holds a fault for device 3 at step 31 (and a trace): the check loads
  # the checkpoint of step 30 alone, on one device, and the restart resumes from it.
  PMAP_FAULT=nan:device=3:step=31 PMAP_TRACE="$tmp/trace.json" launched env 120 --np 2 \
    --max-restarts 1 -- "$train" "${args[@]}" --save "$tmp/env.ckpt"
  rc=$?
  [ $rc -eq 1 ] && ! grep -q 'does not load' "$tmp/env.log" &&
    grep -q 'restart 1 of 1 on 2 processes, from .*env.ckpt (step 30)' "$tmp/env.log" &&
    grep -q 'giving up after 1 restarts' "$tmp/env.log"
  verdict $? "PMAP_FAULT and PMAP_TRACE in the job's environment: the check still loads step 30"
  show_log env
  ;;
args)
  # refused WHAT NEEDLE ARGS...: the launcher exits 2 within 10 s saying NEEDLE, runs nothing.
  refused() {
    local what=$1 needle=$2
    shift 2
    launched refused 10 "$@"
    local rc=$?
    [ $rc -eq 2 ] && grep -qF -- "$needle" "$out" && ! grep -q 'run 1 (of' "$out"
    verdict $? "refused at start: $what"
  }
  p=("$train" "${args[@]}" --save "$tmp/a.ckpt")
  for opt in --np --restart-np --max-restarts --mpirun --mpirun-arg --backoff --log; do
    refused "$opt without a value, before --" "$opt needs a value" "$opt" -- "${p[@]}"
    refused "$opt without a value, last" "$opt needs a value" "$opt"
  done
  for opt in --save --resume --save-every; do
    refused "the program's $opt last" "the program's $opt needs a value" -- "${p[@]}" "$opt"
  done
  refused "no --save" "need --save FILE" -- "$train" "${args[@]}"
  refused "--np 0" '--np "0"' --np 0 -- "${p[@]}"
  refused "--backoff -1" '--backoff "-1"' --backoff -1 -- "${p[@]}"
  refused "an unknown option" "unknown option --bogus" --bogus -- "${p[@]}"
  refused "no program" "no program after --" --np 2 --
  refused "--log into a missing folder" "--log \"$tmp/missing/l.log\": cannot open it" \
    --log "$tmp/missing/l.log" -- "${p[@]}"
  [ ! -e "$tmp/missing" ]
  verdict $? "--log into a missing folder: the folder is not created"
  refused "a missing program" "no program \"$tmp/nosuch\"" -- "$tmp/nosuch" --save "$tmp/a.ckpt"
  refused "a missing program on the PATH" 'no program "pmap-no-such-train"' -- \
    pmap-no-such-train --save "$tmp/a.ckpt"
  refused "a missing mpirun" 'no MPI launcher "pmap-no-such-mpirun"' \
    --mpirun pmap-no-such-mpirun -- "${p[@]}"

  # once WHAT ARGS...: the job fails before training began: one run, not restarted, its status.
  once() {
    local what=$1
    shift
    launched once 60 --max-restarts 3 "$@"
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c 'run [0-9] (of at most 4)' "$out")" -eq 1 ] &&
      grep -q 'run 1 ended .*not restarted, a restart would fail alike' "$out" &&
      ! grep -q 'restart 1' "$out"
    verdict $? "not restarted: $what"
  }
  once "a bad pmap-train argument" --np 2 -- "${p[@]}" --bogus
  grep -q 'run 1 ended as pmap-train cannot run as given ("pmap-train: exit status 2' \
    "$tmp/once.log"
  verdict $? "a bad pmap-train argument: known by pmap-train's word (exit status 2)"
  once "a global batch the devices do not divide" --np 2 -- "${p[@]}" --batch 7
  once "mpirun's own failure (a missing hostfile)" --np 2 --mpirun-arg --hostfile \
    --mpirun-arg "$tmp/no-hosts" -- "${p[@]}"
  once "mpirun's own failure (an unknown mpirun option)" --mpirun-arg --no-such-mpirun-option \
    -- "${p[@]}"
  # mpirun cannot start the program (here: no such working folder) and exits with a status
  # over 128 (Open MPI: 135); no process ended by a signal.
  once "mpirun cannot start the program" --mpirun-arg --wdir --mpirun-arg "$tmp/no-such-dir" \
    -- "${p[@]}"
  grep -q 'run 1 failed' "$tmp/once.log" && ! grep -q 'signal' "$tmp/once.log"
  verdict $? "mpirun unable to start the program: not reported as a signal"
  # A --save the saves cannot write is refused before the header, not after the steps before
  # the first save: one run, and nothing created.
  once "a --save into a missing folder" --np 2 -- "$train" "${args[@]}" --save \
    "$tmp/missing/a.ckpt"
  grep -q 'run 1 ended as pmap-train cannot run as given' "$tmp/once.log"
  verdict $? "a --save into a missing folder: known by pmap-train's word, though process 1 failed first"
  grep -q -- '--save: pmap_params_save_check: cannot create a temporary file beside' "$out" &&
    [ ! -e "$tmp/missing" ]
  verdict $? "a --save into a missing folder: refused at the start, nothing created"

  # A rank ended by a signal before pmap-train's header: one sent from outside (the
  # out-of-memory killer, a preemption) is restarted, a crash is not.
  for sig in KILL TERM; do
    SIG=$sig MODE=early launched "early$sig" 120 --np 2 --max-restarts 1 -- \
      "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/early$sig.ckpt"
    rc=$?
    [ $rc -eq 0 ] &&
      grep -q "run 1 ended by signal .* before pmap-train began training.*restarted" \
        "$tmp/early$sig.log" && grep -q 'run 2 finished' "$tmp/early$sig.log" && clean
    verdict $? "a rank killed by SIG$sig before the header: restarted, and the job finishes"
  done
  SIG=SEGV MODE=early launched earlySEGV 60 --np 2 --max-restarts 3 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --save "$tmp/earlySEGV.ckpt"
  rc=$?
  # (", by signal 11 (...)" in that line when mpirun printed which signal: Open MPI does not always)
  [ $rc -eq 139 ] && ! grep -q 'restart 1' "$tmp/earlySEGV.log" &&
    grep -q 'run 1 ended before pmap-train began training.*not restarted' "$tmp/earlySEGV.log"
  verdict $? "a rank crashed (SIGSEGV) before the header: not restarted, status 139"

  # Why a run failed names the failing process's own message first: the lines of the processes
  # that only report its end reach mpirun in no fixed order (a stand-in mpirun writes one first).
  cat >"$tmp/order-mpirun.sh" <<'EOF'
#!/bin/sh
echo "pmap-train: backend auto chose cpu" >&2
echo "pmap-train: model mlp (stand-in)"
echo "pmap-train: step 2: pmap_update's step check on process 1 of 2 (host h): collective #9: \
process 0 (host h, device 0) destroyed its context after 8 collectives" >&2
echo "pmap-train: step 2: --save: pmap_params_save_user: cannot write: No space left on device" >&2
echo "  Exit code:    1" >&2
exit 1
EOF
  chmod +x "$tmp/order-mpirun.sh"
  launched order 30 --mpirun "$tmp/order-mpirun.sh" --max-restarts 0 -- "${p[@]}"
  grep -q 'status 1: pmap-train: step 2: --save: .*device; Exit code: 1; pmap-train: .*destroyed' \
    "$tmp/order.log" && ! grep 'status 1: ' "$tmp/order.log" | grep -q 'auto chose'
  verdict $? "why a run failed: the failing process's message first, the others' after (no note)"
  show_log order

  # A run that ends before the header with only pmap-train's note of its backend said nothing
  # of why: not restarted (the note is no report).
  cat >"$tmp/note-mpirun.sh" <<'EOF'
#!/bin/sh
echo "pmap-train: backend auto chose cpu" >&2
exit 1
EOF
  chmod +x "$tmp/note-mpirun.sh"
  launched note 30 --mpirun "$tmp/note-mpirun.sh" --max-restarts 2 -- "${p[@]}"
  ! grep -q 'restart 1' "$tmp/note.log" &&
    grep -q 'run 1 ended before pmap-train began training.*said nothing of it' "$tmp/note.log"
  verdict $? "a run that ended before the header with only the backend's note: not restarted"
  show_log note
  ;;
end)
  reference ref 2 "${args[@]}"
  # Rank 1 stops inside MPI_Finalize (finalize_stop) in the first run: rank 0 gives up on it
  # after --timeout 3 (the last one given) and exits without it, mpirun ends the job, and the
  # checkpoint holds the last step.
  MODE=finstop launched finstop 120 --np 2 --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --timeout 3 --save "$tmp/finstop.ckpt"
  rc=$?
  [ $rc -eq 0 ] && grep -q 'run 1 failed .*MPI_Finalize did not return within 3.000 s' \
    "$tmp/finstop.log" && grep -q 'holds step 60 of 60, the last: the job is complete' \
    "$tmp/finstop.log" && ! grep -q 'run 2 (of' "$tmp/finstop.log" &&
    cmp -s "$tmp/ref.ckpt" "$tmp/finstop.ckpt" && clean
  verdict $? "a rank stopped in MPI_Finalize: the job ends, complete, final state bitwise"
  show_log finstop

  # Rank 1 starts 4 s late in the first run: rank 0's pmap_ctx_create times out (2 s); that is
  # the run's own failure (pmap-train's status 1, not 2), so it is restarted.
  MODE=late launched late 120 --np 2 --max-restarts 1 -- \
    "$tmp/wrap.sh" "$train" "${args[@]}" --timeout 2 --save "$tmp/late.ckpt"
  rc=$?
  [ $rc -eq 0 ] && grep -q 'run 1 failed .*with status 1: .*pmap_ctx_create: .*within 2.000 s' \
    "$tmp/late.log" && grep -q 'restart 1 of 1 on 2 processes, from the start' "$tmp/late.log" &&
    grep -q 'run 2 finished' "$tmp/late.log" && cmp -s "$tmp/ref.ckpt" "$tmp/late.ckpt" && clean
  verdict $? "a rank late at the start: restarted, the job finishes, final state bitwise"
  show_log late
  ;;
*)
  echo "test_launch.sh: unknown part $part"
  exit 2
  ;;
esac
exit $fail
