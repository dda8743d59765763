#!/usr/bin/env bash
# test_cli.sh: pmap-train as a user meets it: a run with --json whose last line carries the
# required fields with checked values, and every bad argument rejected with a message and exit 1.
# Every run names --backend cpu: on a machine with a GPU, `auto` would pick CUDA, where 3 or 4
# devices on one GPU are a different test (tests/gpu, bench/gpu-check.sh); only the check of an
# unknown backend names none.
set -u
train=${1:?usage: test_cli.sh path/to/pmap-train}
fails=0
passes=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# expect_error NEEDLE ARGS...: exit status 1 and NEEDLE on stderr.
expect_error() {
  local needle=$1
  shift
  "$train" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 1 ]; then bad "pmap-train $* exited $rc, want 1"; return; fi
  if ! grep -qF -- "$needle" "$tmp/err"; then
    bad "pmap-train $*: stderr lacks '$needle': $(cat "$tmp/err")"
    return
  fi
  ok
}

# json_check ARGS... -- PYTHON_EXPR: the last stdout line is JSON and EXPR holds for it (as j).
json_check() {
  local args=()
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  shift
  if ! "$train" "${args[@]}" --json >"$tmp/out" 2>"$tmp/err"; then
    bad "pmap-train ${args[*]} failed: $(cat "$tmp/err")"
    return
  fi
  if ! tail -n 1 "$tmp/out" | python3 -c "
import json, math, sys
j = json.loads(sys.stdin.read())
for k in ['model', 'backend', 'devices', 'steps', 'global_batch', 'final_loss',
          'samples_per_sec', 'replicas_identical']:
    assert k in j, 'missing key ' + k
assert j['replicas_identical'] is True, 'replicas differ'
assert $1, 'condition failed: ' + repr(j)
"; then
    bad "pmap-train ${args[*]} --json: $(tail -n 1 "$tmp/out")"
    return
  fi
  ok
}

json_check --backend cpu --model linear --devices 4 -- \
  "j['model'] == 'linear' and j['devices'] == 4 and j['steps'] == 1000 and j['global_batch'] == 128 and j['final_loss'] < 0.3 and abs(j['w'] - 2) < 0.1 and abs(j['b'] + 1) < 0.1"
json_check --backend cpu --model mlp --devices 3 --steps 30 --batch 96 -- \
  "j['devices'] == 3 and j['steps'] == 30 and j['global_batch'] == 96 and math.isfinite(j['final_loss'])"
json_check --model convnet --devices 2 --steps 20 --batch 8 --backend cpu -- \
  "j['backend'] == 'cpu' and j['devices'] == 2 and j['final_loss'] < 0.7"
PMAP_CPU_DEVICES=3 json_check --backend cpu --model linear --steps 5 --batch 6 -- "j['devices'] == 3"
json_check --backend cpu --model linear --steps 3 --lr 0.5 --seed 9 --log-every 0 -- "j['lr'] == 0.5 and j['seed'] == 9"

expect_error 'unknown model "resnet"' --model resnet --backend cpu
expect_error 'unknown backend "tpu"' --backend tpu
expect_error '--devices "0" is not an integer in [1, 64]' --devices 0 --backend cpu
expect_error '--devices "65"' --devices 65 --backend cpu
expect_error 'global batch 30 is not divisible by 4 devices' --devices 4 --batch 30 --backend cpu
expect_error 'learning rate -1 must be > 0' --lr -1 --backend cpu
expect_error 'learning rate nan' --lr nan --backend cpu
expect_error 'learning rate 0 must be > 0' --lr 0 --backend cpu
expect_error '--steps "abc"' --steps abc --backend cpu
expect_error 'unknown option --frobnicate' --frobnicate --backend cpu
expect_error 'option --model needs a value' --backend cpu --model
PMAP_CPU_DEVICES=abc expect_error 'PMAP_CPU_DEVICES="abc"' --backend cpu
if [ "$("$train" --help | head -c 6)" = "usage:" ]; then ok; else bad "--help"; fi

# --plot: a PNG where gnuplot is installed; where it is not (or fails), a note on stderr and a
# successful run all the same. Both ways are checked: the missing case by pointing PMAP_GNUPLOT
# at nothing.
is_png() { python3 -c "import sys; sys.exit(open(sys.argv[1], 'rb').read(8) != b'\x89PNG\r\n\x1a\n')" "$1" 2>/dev/null; }
if "$train" --backend cpu --model linear --steps 20 --log-every 0 --plot "$tmp/loss.png" --json >"$tmp/out" 2>"$tmp/err"; then
  if ! tail -n 1 "$tmp/out" | python3 -c "import json, sys; json.loads(sys.stdin.read())"; then
    bad "--plot: the last line is not JSON: $(tail -n 1 "$tmp/out")"
  elif { [ -n "${PMAP_GNUPLOT:-}" ] || command -v gnuplot >/dev/null 2>&1; } && ! grep -q 'note: --plot' "$tmp/err"; then
    if is_png "$tmp/loss.png"; then ok; else bad "--plot with gnuplot present wrote no PNG"; fi
  elif grep -q 'note: --plot' "$tmp/err" && [ ! -e "$tmp/loss.png" ]; then
    ok
  else
    bad "--plot: neither a PNG nor a note: $(cat "$tmp/err")"
  fi
else
  bad "--plot: pmap-train failed: $(cat "$tmp/err")"
fi
if PMAP_GNUPLOT=/nonexistent/gnuplot "$train" --backend cpu --model linear --steps 5 --log-every 0 --plot "$tmp/none.png" >"$tmp/out" 2>"$tmp/err"; then
  if grep -q 'note: --plot: gnuplot not found' "$tmp/err" && [ ! -e "$tmp/none.png" ]; then ok; else bad "--plot without gnuplot: $(cat "$tmp/err")"; fi
else
  bad "--plot without gnuplot failed the run: $(cat "$tmp/err")"
fi

echo "cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
