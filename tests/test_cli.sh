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

# expect_error NEEDLE ARGS...: exit status $want (default 2: what the run was given is wrong, a
# restart would fail alike; want=1 for a failure of the run itself) and NEEDLE on stderr.
expect_error() {
  local needle=$1 status=${want:-2}
  shift
  "$train" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne "$status" ]; then bad "pmap-train $* exited $rc, want $status"; return; fi
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
# The CPU GEMM and why: forced by PMAP_GEMM here (portable is in every build but -Dgemm=onednn
# or cblas), else one of the reasons of pmap_gemm_reason.
if PMAP_GEMM=portable "$train" --backend cpu --model linear --steps 1 >/dev/null 2>&1; then
  PMAP_GEMM=portable json_check --backend cpu --model linear --steps 2 -- \
    "j['gemm'] == 'portable' and j['gemm_reason'] == 'forced by PMAP_GEMM'"
  PMAP_GEMM=portable "$train" --backend cpu --model linear --steps 1 >"$tmp/out" 2>&1
  if grep -qF '(gemm portable, forced by PMAP_GEMM)' "$tmp/out"; then ok; else
    bad "pmap-train's header lacks the GEMM and its reason: $(head -n 1 "$tmp/out")"
  fi
fi
json_check --backend cpu --model linear --steps 2 -- \
  "j['gemm'] in ('onednn', 'cblas', 'portable') and j['gemm_reason'] in ('measured', 'cached', 'only one built')"
PMAP_GEMM=bogus expect_error 'PMAP_GEMM="bogus" names no CPU GEMM' --backend cpu --model linear
# The convolutions' paths per shape: convnet's one layer (one output channel, which oneDNN's
# primitives do not serve) runs on im2col, forward and backward, whatever PMAP_CONV says.
json_check --backend cpu --model convnet --devices 2 --steps 2 --batch 8 -- \
  "j['conv_choices'] == {'forward': {'onednn': 0, 'im2col': 1}, 'backward': {'onednn': 0, 'im2col': 1}}"

# MFU on CPU devices against their cores' peak for the precision the GEMMs run in, so never past
# 1 (fp32 and bf16, on the bar, in the summary with the peak and in --json), for any run: the
# peak is the CPU's, not a probe's. Not under a sanitizer (PMAP_TEST_SANITIZER), where these runs
# take minutes.
mfu_ok="j['mfu'] is not None and math.isfinite(j['mfu']) and 0 < j['mfu'] <= 1 and \
j['mfu_peak_gflops'] > 0 and j['mfu_peak'].startswith(('fp32', 'bf16'))"
json_check --backend cpu --model mlp --devices 2 --steps 20 --progress bar -- "$mfu_ok"
if [ "${PMAP_TEST_SANITIZER:-none}" = none ]; then
  json_check --backend cpu --model mlp-1024 --devices 1 --steps 7 --log-every 0 -- "$mfu_ok"
  if grep -q '^model FLOPs utilisation [0-9.]*% (.* of a peak of .* GHz, fp32 FMA' "$tmp/out"; then
    ok
  else
    bad "no MFU and its peak in the summary: $(tail -n 5 "$tmp/out")"
  fi
  if grep -q 'note: MFU not measured' "$tmp/err"; then bad "MFU not measured: $(cat "$tmp/err")"; else ok; fi
  json_check --backend cpu --model mlp-1024 --devices 2 --steps 7 --precision bf16 --log-every 0 \
    -- "$mfu_ok and (j['mfu_peak'].startswith('bf16') == (j['bf16_gemm'] == 'onednn'))"
  json_check --backend cpu --model mlp-1024 --devices 1 --steps 7 --progress bar -- "$mfu_ok"
  if grep -q 'MFU [0-9.]*%' "$tmp/out" && grep -q '^model FLOPs utilisation [0-9.]*%' "$tmp/out"; then ok; else
    bad "--progress bar: no MFU on the bar or in the summary: $(tr '\r' '\n' <"$tmp/out" | tail -n 5)"
  fi
  json_check --backend cpu --model gpt-mini --devices 1 --steps 7 --log-every 0 -- "$mfu_ok"
fi

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

# bound32 K_PATH K_BATCH KAPPA ROWS STEPS: tests/bounds.h's bound_order32, how far two runs that
# differ only in the order of their float sums (another device count) can part, relative:
# lambda kappa u sqrt((k_path + k_batch rows) steps), lambda = 6 standard deviations, u = 2^-24.
# The counts of a model's path are those of tests/bounds.h (docs/tolerances.md).
bound32() {
  python3 -c "
import math, sys
k_path, k_batch, kappa, rows, steps = map(float, sys.argv[1:])
print(repr(6.0 * kappa * 2.0**-24 * math.sqrt((k_path + k_batch * rows) * steps)))
" "$@"
}
# Paths (k_path k_batch kappa) as tests/bounds.h counts them: linear 1 -> 1; mlp 10 -> 32 -> 32 -> 1.
path_linear="2 1 10"
path_mlp="139 3 10"

# Checkpoints: 40 steps equal 20 steps saved and 20 resumed, bitwise on the same device count
# (loss, w and b as printed with 9 significant digits); on another, the 20 resumed steps sum in
# another order: within bound32 of the model's path over 20 steps of 16 rows (w and b as one
# vector, the final loss relative: these MSE models' targets are a few times their noise, where
# the loss's kappa is 10).
# last_json ARGS...: runs pmap-train ARGS --json, requires exit 0, prints its last line.
last_json() {
  if ! "$train" "$@" --json >"$tmp/out" 2>"$tmp/err"; then
    bad "pmap-train $* failed: $(cat "$tmp/err")"
    return 1
  fi
  tail -n 1 "$tmp/out"
}
# same_json A B KEYS TOL: the JSON lines A and B agree on KEYS: exactly when TOL is 0, else the
# KEYS' values as one vector within TOL relative (||a - b|| / ||b||).
same_json() {
  python3 -c "
import json, math, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
tol = float(sys.argv[4])
keys = sys.argv[3].split(',')
for k in keys:
    assert a[k] is not None and b[k] is not None, k + ' is null'
    assert tol > 0 or a[k] == b[k], '%s: %r vs %r' % (k, a[k], b[k])
e = math.sqrt(sum((a[k] - b[k])**2 for k in keys) / max(sum(b[k]**2 for k in keys), 1e-300))
assert e <= tol or tol == 0, '%s: relative %.3g > %.3g' % (sys.argv[3], e, tol)
" "$1" "$2" "$3" "$4"
}
ck=$tmp/run.ckpt
for spec in "linear 2 2 w,b final_loss" "mlp 2 2 - final_loss" "convnet 2 2 - final_loss" \
            "linear 2 4 w,b final_loss" "mlp 4 1 - final_loss"; do
  set -- $spec
  m=$1 d1=$2 d2=$3 params=$4 loss=$5
  tol=0
  if [ "$d1" != "$d2" ]; then
    path=path_$m
    tol=$(bound32 ${!path} 16 20)
  fi
  common=(--model "$m" --backend cpu --log-every 0 --batch 16 --samples 64 --seed 3)
  full=$(last_json "${common[@]}" --devices "$d1" --steps 40) || continue
  rm -f "$ck"
  last_json "${common[@]}" --devices "$d1" --steps 20 --save "$ck" >/dev/null || continue
  res=$(last_json "${common[@]}" --devices "$d2" --steps 40 --resume "$ck") || continue
  if { [ "$params" = - ] || same_json "$res" "$full" "$params" "$tol"; } &&
     same_json "$res" "$full" "$loss" "$tol" &&
     python3 -c "import json, sys; assert json.loads(sys.argv[1])['start_step'] == 20" "$res"; then
    ok
  else
    bad "resume $spec (bound $tol): $res vs $full"
  fi
done
# --save-every: the periodic checkpoint and the final one; resuming at the end trains nothing.
rm -f "$ck"
if last_json --model linear --backend cpu --steps 9 --save-every 4 --save "$ck" --log-every 0 >/dev/null &&
   res=$(last_json --model linear --backend cpu --steps 9 --resume "$ck" --log-every 0) &&
   python3 -c "import json, sys; j = json.loads(sys.argv[1]); assert j['start_step'] == 9 and j['final_loss'] is not None" "$res"; then
  ok
else
  bad "--save-every / resume at the end: ${res:-}"
fi
# --precision bf16: the policy, the CPU's bf16 instructions and the bf16 GEMM in the JSON; a
# checkpoint of bf16 training resumes under bf16 (bitwise as the run never stopped) unless
# --precision says otherwise.
json_check --backend cpu --model mlp --devices 2 --steps 30 --precision bf16 -- \
  "j['precision'] == 'bf16' and j['cpu_bf16'] in ('amx_bf16', 'avx512_bf16', 'none') and j['bf16_gemm'] in ('onednn', 'portable') and j['final_loss'] < 2.5"
json_check --backend cpu --model mlp --devices 2 --steps 3 -- "j['precision'] == 'fp32'"
common=(--model res-mlp --backend cpu --log-every 0 --batch 16 --samples 64 --seed 3 --devices 2)
rm -f "$ck"
if full=$(last_json "${common[@]}" --precision bf16 --steps 40) &&
   last_json "${common[@]}" --precision bf16 --steps 20 --save "$ck" >/dev/null &&
   res=$(last_json "${common[@]}" --steps 40 --resume "$ck") &&
   same_json "$res" "$full" final_loss 0 &&
   python3 -c "import json, sys; assert json.loads(sys.argv[1])['precision'] == 'bf16'" "$res" &&
   res=$(last_json "${common[@]}" --steps 40 --resume "$ck" --precision fp32) &&
   python3 -c "import json, sys; j = json.loads(sys.argv[1]); assert j['precision'] == 'fp32' and j['final_loss'] < 1" "$res"; then
  ok
else
  bad "bf16 resume: ${res:-} vs ${full:-}"
fi
expect_error '--precision "fp16"' --backend cpu --precision fp16

# --verify-every on healthy replicas, and on a replica the fault injection perturbs.
json_check --model mlp --devices 3 --batch 48 --steps 6 --verify-every 2 --backend cpu -- "j['steps'] == 6"
want=1 PMAP_FAULT=drift:device=1:step=2 expect_error '--verify-every: pmap_params_verify' \
  --model mlp --devices 2 --batch 32 --steps 6 --verify-every 1 --backend cpu
if grep -q 'device 1 (' "$tmp/err"; then ok; else bad "--verify-every with drift: $(cat "$tmp/err")"; fi
json_check --model mlp --steps 5 --clip-norm 0.5 --backend cpu -- "j['steps'] == 5"
json_check --model linear --steps 5 --no-numeric-guard --backend cpu -- "j['steps'] == 5"

# The numeric guard: a diverging run stops with exit 1, and its JSON says why, numbers as null.
"$train" --model linear --lr 1e30 --backend cpu --log-every 0 --json >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 1 ] && tail -n 1 "$tmp/out" | python3 -c "
import json, sys
j = json.loads(sys.stdin.read())
assert 'error' in j and 'step' in j['error'], j
assert j['final_loss'] is None, j
"; then ok; else bad "--lr 1e30 --json: exit $rc, $(tail -n 1 "$tmp/out") $(cat "$tmp/err")"; fi
# Failures before training print valid JSON with the error too (exit 2: what was given).
"$train" --model resnet --json >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 2 ] && tail -n 1 "$tmp/out" | python3 -c "
import json, sys
j = json.loads(sys.stdin.read())
assert 'resnet' in j['error'] and j['final_loss'] is None, j
"; then ok; else bad "--model resnet --json: $(tail -n 1 "$tmp/out")"; fi

# Argument errors with --json: exit 2, the message on stderr, and still a last line of JSON
# carrying it (the values not known yet are null).
for args in "--steps 0" "--data $tmp/x.npy" "--frobnicate" "--clip-norm -1" "--devices 65"; do
  # shellcheck disable=SC2086
  "$train" --backend cpu $args --json >"$tmp/out" 2>"$tmp/err"
  rc=$?
  if [ "$rc" -eq 2 ] && [ -s "$tmp/err" ] && tail -n 1 "$tmp/out" | python3 -c "
import json, sys
j = json.loads(sys.stdin.read())
assert j['error'] and j['error'] in open(sys.argv[1]).read(), j
assert j['final_loss'] is None and j['replicas_identical'] is None, j
" "$tmp/err"; then ok; else bad "$args --json: exit $rc, '$(tail -n 1 "$tmp/out")'"; fi
done

# A FIFO without a writer where a file is read: refused at once, not waited on.
mkfifo "$tmp/fifo"
timeout 20 "$train" --backend cpu --model linear --resume "$tmp/fifo" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 2 ] && grep -qF 'is not a regular file' "$tmp/err"; then ok; else bad "--resume FIFO: exit $rc, $(cat "$tmp/err")"; fi
timeout 20 "$train" --backend cpu --data "$tmp/fifo" --labels "$tmp/fifo" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 2 ] && grep -qF 'not a regular file' "$tmp/err"; then ok; else bad "--data FIFO: exit $rc, $(cat "$tmp/err")"; fi

# Checkpoint flags with bad values.
rm -f "$ck"
"$train" --model linear --backend cpu --steps 20 --log-every 0 --save "$ck" >/dev/null 2>&1 || bad "save for the flag checks"
expect_error '--save-every "0" is not an integer' --save-every 0 --save "$ck"
expect_error '--save-every needs --save FILE' --save-every 5
expect_error '--verify-every "0" is not an integer' --verify-every 0
expect_error '--verify-every "x"' --verify-every x
expect_error '--clip-norm "-1" must be a finite number >= 0' --clip-norm -1
expect_error '--clip-norm "nan" must be a finite number >= 0' --clip-norm nan
expect_error '--clip-norm "inf"' --clip-norm inf
expect_error 'option --resume needs a value' --resume
expect_error '--resume: pmap_params_load_user: cannot open' --resume "$tmp/none.ckpt"
expect_error 'this run differs in --batch' --model linear --batch 64 --resume "$ck"
expect_error 'this run differs in --seed' --model linear --seed 5 --resume "$ck"
expect_error 'this run differs in --samples' --model linear --samples 256 --resume "$ck"
expect_error 'holds another model' --model mlp --resume "$ck"
expect_error 'is at step 20, beyond --steps 10' --model linear --steps 10 --resume "$ck"
expect_error 'cannot create a temporary file' --steps 2 --save "$tmp/no/such/dir/x.ckpt"
# A --save the saves cannot write fails before the header and step 1 (pmap-launch knows a
# restart would fail alike), not after the steps before the first save; nothing is left.
mkdir "$tmp/savedir"
mkfifo "$tmp/savedir/fifo"
ln -s "no-folder/x.ckpt" "$tmp/savedir/into-missing"
for target in "$tmp/no/such/dir/x.ckpt" "$tmp/savedir/fifo" "$tmp/savedir" \
  "$tmp/savedir/into-missing"; do
  expect_error '--save: pmap_params_save_check: ' --backend cpu --model linear --steps 100000 \
    --save "$target"
  if grep -q 'pmap-train: model\|^step' "$tmp/out"; then bad "--save $target: trained first"; else ok; fi
done
if [ "$(find "$tmp/savedir" | wc -l)" -eq 3 ]; then ok; else bad "--save checks left: $(ls -A "$tmp/savedir")"; fi
# A symbolic link to a file not there yet: the save creates that file, the link stays.
ln -s "made.ckpt" "$tmp/savedir/link.ckpt"
if "$train" --model linear --backend cpu --steps 2 --log-every 0 --save "$tmp/savedir/link.ckpt" \
  >"$tmp/out" 2>"$tmp/err" && [ -L "$tmp/savedir/link.ckpt" ] && [ -f "$tmp/savedir/made.ckpt" ]; then
  ok
else
  bad "--save through a link to a file not there yet: $(cat "$tmp/err")"
fi
head -c 100 "$ck" >"$tmp/short.ckpt"
expect_error 'is truncated' --resume "$tmp/short.ckpt"
printf 'not a checkpoint, but long enough to hold a header' >"$tmp/junk.ckpt"
expect_error 'is not a pmap checkpoint' --resume "$tmp/junk.ckpt"

# --inspect: a checkpoint that loads in full into this run says its step (exit 0); a damaged one
# or another run's is invalid (exit 1), with the reason, and the JSON line says so.
if "$train" --model linear --inspect "$ck" --json >"$tmp/out" 2>"$tmp/err" &&
  tail -n 1 "$tmp/out" | grep -q '"valid": true, "step": 20'; then ok; else
  bad "--inspect of a good checkpoint: $(cat "$tmp/out" "$tmp/err")"
fi
"$train" --model linear --inspect "$tmp/short.ckpt" --json >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 1 ] && tail -n 1 "$tmp/out" | grep -q '"valid": false.*is truncated'; then ok; else
  bad "--inspect of a truncated checkpoint: $(cat "$tmp/out" "$tmp/err")"
fi
want=1 expect_error 'this run differs in --seed' --model linear --seed 5 --inspect "$ck"

# Timeouts: --timeout and PMAP_TIMEOUT are checked; a stalled device ends the step after them.
expect_error '--timeout "0" is not a number of seconds > 0' --backend cpu --timeout 0
expect_error '--timeout "-1"' --backend cpu --timeout -1
expect_error '--timeout "soon"' --backend cpu --timeout soon
expect_error '--timeout "nan"' --backend cpu --timeout nan
PMAP_TIMEOUT=soon expect_error 'PMAP_TIMEOUT="soon"' --backend cpu
PMAP_TIMEOUT=0 expect_error 'PMAP_TIMEOUT="0"' --backend cpu
for how in flag env; do
  t0=$SECONDS
  if [ $how = flag ]; then
    PMAP_FAULT=stall:device=1:step=2 "$train" --backend cpu --model mlp --devices 2 --steps 5 \
      --timeout 1 >"$tmp/out" 2>"$tmp/err"
  else
    PMAP_TIMEOUT=1 PMAP_FAULT=stall:device=1:step=2 "$train" --backend cpu --model mlp \
      --devices 2 --steps 5 >"$tmp/out" 2>"$tmp/err"
  fi
  rc=$?
  if [ $rc -eq 1 ] && grep -q 'step 2: pmap_update: .*: device 1 did not arrive within 1.000 s' "$tmp/err" &&
    [ $((SECONDS - t0)) -lt 20 ]; then ok; else
    bad "a stalled device with the timeout by $how: status $rc after $((SECONDS - t0)) s: $(cat "$tmp/err")"
  fi
done
"$train" --backend cpu --steps 3 --timeout inf >"$tmp/out" 2>"$tmp/err" && ok ||
  bad "--timeout inf: $(cat "$tmp/err")"
if "$train" --help | grep -q -- '--timeout' && "$train" --help | grep -q -- '--inspect'; then ok; else
  bad "--help lacks --timeout or --inspect"
fi

# Real data from .npy files (written here without numpy): a separable 3-class problem with
# f8 features and i8 labels, and float targets for MSE.
python3 - "$tmp" <<'PY'
import math, random, struct, sys
def save(path, descr, shape, values, fmt):
    head = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else ""))
    head += " " * ((64 - (10 + len(head) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))
rng = random.Random(1)
x, y, t = [], [], []
for i in range(300):
    c = i % 3
    a, b = rng.gauss(0, 0.3) + 2 * math.cos(2 * c), rng.gauss(0, 0.3) + 2 * math.sin(2 * c)
    x += [a, b]
    y.append(c)
    t += [a + b, a - b]
d = sys.argv[1]
save(d + "/x.npy", "<f8", (300, 2), x, "d")
save(d + "/y.npy", "<i8", (300,), y, "q")
save(d + "/t.npy", "<f4", (300, 2), t, "f")
save(d + "/y_short.npy", "<i8", (299,), y[:299], "q")
save(d + "/fortran.npy", "<f8", (300, 2), x, "d")
data = open(d + "/fortran.npy", "rb").read().replace(b"False", b"True ")
open(d + "/fortran.npy", "wb").write(data)
PY
json_check --backend cpu --data "$tmp/x.npy" --labels "$tmp/y.npy" --devices 4 --eval-fraction 0.2 \
  --hidden 16 --steps 300 --batch 32 -- \
  "j['model'] == 'npy' and j['eval_accuracy'] >= 0.95 and math.isfinite(j['eval_loss'])"
json_check --backend cpu --data "$tmp/x.npy" --labels "$tmp/t.npy" --devices 2 --eval-fraction 0.1 \
  --hidden 32,16 --steps 400 --batch 40 --micro-batches 3 -- \
  "j['eval_accuracy'] is None and j['eval_loss'] < 0.1"
# The same seed gives the same run on 1 and on 4 devices (the epoch order is the seed's), up to
# the order of the sums: the final losses within bound32 of the MLP's path (2 -> 128 -> 64 -> 2,
# ReLU: (2 + 128) + (128 + 64) + (64 + 2), 3 weight gradients; MSE, kappa 10) over 50 steps of
# 32 rows, relative to max(L, S / kappa): S = 2 rms(y) sqrt(L) bounds the MSE's |dL| per
# relative change of the outputs y, and rms(y) <= max|t| + sqrt(L) (test_equiv.c's loss_scale).
# The float targets: the labels' loss falls to 1e-2 there, with logits the shell cannot see.
"$train" --backend cpu --data "$tmp/x.npy" --labels "$tmp/t.npy" --devices 1 --steps 50 \
  --batch 32 --log-every 0 --json >"$tmp/d1" 2>&1 || bad "data run on 1 device"
"$train" --backend cpu --data "$tmp/x.npy" --labels "$tmp/t.npy" --devices 4 --steps 50 \
  --batch 32 --log-every 0 --json >"$tmp/d4" 2>&1 || bad "data run on 4 devices"
tol=$(bound32 388 3 10 32 50)
if python3 -c "
import json, math, struct, sys
a, b = (json.loads(open(f).read().splitlines()[-1])['final_loss'] for f in sys.argv[1:3])
raw = open(sys.argv[3], 'rb').read()
head = 10 + struct.unpack('<H', raw[8:10])[0]
most = max(abs(v) for v in struct.unpack('<600f', raw[head:head + 2400]))
scale = max(abs(a), 2 * (most + math.sqrt(abs(a))) * math.sqrt(abs(a)) / 10)
sys.exit(not abs(a - b) <= float(sys.argv[4]) * scale)" "$tmp/d1" "$tmp/d4" "$tmp/t.npy" "$tol"
then ok; else bad "data: 1 vs 4 devices (bound $tol): $(tail -n 1 "$tmp/d1") vs $(tail -n 1 "$tmp/d4")"; fi
expect_error '--data and --labels go together' --backend cpu --data "$tmp/x.npy"
expect_error 'it does not take --model' --backend cpu --data "$tmp/x.npy" --labels "$tmp/y.npy" --model mlp
expect_error '299 rows, the features have 300' --backend cpu --data "$tmp/x.npy" --labels "$tmp/y_short.npy"
expect_error 'fortran_order is True' --backend cpu --data "$tmp/fortran.npy" --labels "$tmp/y.npy"
expect_error 'No such file' --backend cpu --data "$tmp/none.npy" --labels "$tmp/y.npy"
expect_error '--eval-fraction "1" is outside [0, 1)' --backend cpu --eval-fraction 1
expect_error 'larger than the 240 training rows' --backend cpu --data "$tmp/x.npy" --labels "$tmp/y.npy" --eval-fraction 0.2 --batch 256 --devices 4
# The fraction is read as the decimal given (a double): 0.01 of 300 rows is 3 rows, where a float
# 0.01 (0.00999999977) would hold out 2.
"$train" --backend cpu --data "$tmp/x.npy" --labels "$tmp/y.npy" --eval-fraction 0.01 --steps 1 \
  --devices 1 --batch 4 >"$tmp/out" 2>&1
if grep -qF '300 rows (297 for training, 3 held out)' "$tmp/out"; then ok; else
  bad "--eval-fraction 0.01 of 300 rows: $(grep -F 'held out' "$tmp/out" | head -1)"
fi
expect_error '--micro-batches "0"' --backend cpu --micro-batches 0
# What only --data (or --text) uses is refused where it would be dropped without a word.
expect_error '--hidden sizes the MLP of --data and needs --data' --backend cpu --model mlp --hidden 8
expect_error '--hidden sizes the MLP of --data' --backend cpu --text "$tmp/x.npy" --hidden 8
expect_error '--eval-fraction holds out rows of --data or bytes of --text' --backend cpu --model mlp \
  --eval-fraction 0.2
expect_error '--eval-fraction holds out' --backend cpu --model gpt-mini --eval-fraction 0.2
# BYTES: a fraction needs a digit after the point and K, M or G (not 1 byte, not 1024).
expect_error '--max-memory "1.5" is not a size in bytes' --backend cpu --max-memory 1.5
expect_error 'a fraction needs K, M or G after it' --backend cpu --max-memory 1.5
expect_error '--max-memory "1.K" is not a size in bytes' --backend cpu --max-memory 1.K
expect_error 'a fraction needs digits after the point' --backend cpu --max-memory 1.K

# --recompute full (and selective): the memory object says so, with fewer activation bytes than
# none; the same final parameters (the checkpoints' bytes) as none; other values refused.
rc=(--backend cpu --model res-mlp --devices 2 --steps 3 --log-every 0)
"$train" "${rc[@]}" --recompute none --json --save "$tmp/rc-none.ckpt" >"$tmp/rc-none" 2>&1 ||
  bad "--recompute none failed"
json_check "${rc[@]}" --recompute full --save "$tmp/rc-full.ckpt" -- \
  "j['memory']['recompute'] == 'full' and j['memory']['activations'] < $(tail -n 1 "$tmp/rc-none" | python3 -c "import json,sys; j=json.loads(sys.stdin.read()); print(j['memory']['activations'] if j['memory']['recompute'] == 'none' else -1)")"
if cmp -s "$tmp/rc-none.ckpt" "$tmp/rc-full.ckpt"; then ok; else bad "--recompute full changed the trained parameters"; fi
# --recompute selective: between the two in activation bytes, the same final parameters.
json_check "${rc[@]}" --recompute selective --save "$tmp/rc-sel.ckpt" -- \
  "j['memory']['recompute'] == 'selective' and j['memory']['activations_recomputed'] < j['memory']['activations'] == j['memory']['activations_selective'] < j['memory']['activations_stored']"
if cmp -s "$tmp/rc-none.ckpt" "$tmp/rc-sel.ckpt"; then ok; else bad "--recompute selective changed the trained parameters"; fi
expect_error '--recompute "partial" is not none, full, auto or selective' --backend cpu \
  --recompute partial
# --recompute auto under a limit only the recomputed plan fits (its total, from the full run's
# JSON): recomputed, says why, the same parameters; without a limit it stores.
"$train" "${rc[@]}" --recompute full --json >"$tmp/rc-fulljson" 2>&1
limit=$(tail -n 1 "$tmp/rc-fulljson" | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['memory']['total'])")
json_check "${rc[@]}" --recompute auto --max-memory "$limit" --save "$tmp/rc-auto.ckpt" -- \
  "j['memory']['recompute'] == 'full' and j['memory']['total'] <= $limit and j['memory']['activations_stored'] > j['memory']['activations_recomputed'] == j['memory']['activations']"
if grep -qF -- '--recompute auto chose full' "$tmp/out" && cmp -s "$tmp/rc-none.ckpt" "$tmp/rc-auto.ckpt"; then ok; else
  bad "--recompute auto under $limit bytes: $(grep -F 'auto chose' "$tmp/out")"
fi
json_check "${rc[@]}" --recompute auto -- "j['memory']['recompute'] == 'none'"
# Under the selective plan's total (the optimizer replicated in both), auto takes selective.
"$train" "${rc[@]}" --recompute selective --shard none --json >"$tmp/rc-seljson" 2>&1
limit=$(tail -n 1 "$tmp/rc-seljson" | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['memory']['total'])")
json_check "${rc[@]}" --recompute auto --shard none --max-memory "$limit" --save "$tmp/rc-auto2.ckpt" -- \
  "j['memory']['recompute'] == 'selective' and j['memory']['total'] == $limit"
if grep -qF -- '--recompute auto chose selective' "$tmp/out" && cmp -s "$tmp/rc-none.ckpt" "$tmp/rc-auto2.ckpt"; then ok; else
  bad "--recompute auto under $limit bytes: $(grep -F 'auto chose' "$tmp/out")"
fi

# --shard: none, optimizer, grads and auto as the JSON's memory.shard says; the aliases; params
# refused by name. Sharded gradients train to the same bytes as the sharded optimizer; a model of
# mostly one layer keeps its gradient whole (the memory object says so); micro-batches refused.
json_check --backend cpu --model mlp-1024 --devices 2 --steps 1 --shard none -- \
  "j['memory']['shard'] == 'none' and not j['sharded_optimizer']"
json_check --backend cpu --model mlp-1024 --devices 2 --steps 1 --shard optimizer -- \
  "j['memory']['shard'] == 'optimizer' and j['sharded_optimizer']"
json_check --backend cpu --model mlp --devices 2 --steps 1 --shard auto -- \
  "j['memory']['shard'] == 'none'"
zg=(--backend cpu --model gpt-mini --devices 2 --batch 4 --steps 2)
json_check "${zg[@]}" --shard grads --save "$tmp/zg-grads.ckpt" -- \
  "j['memory']['shard'] == 'grads' and j['memory']['grads_sharded'] and j['sharded_optimizer']"
json_check "${zg[@]}" --shard optimizer --save "$tmp/zg-opt.ckpt" -- \
  "j['memory']['shard'] == 'optimizer' and not j['memory']['grads_sharded']"
if cmp -s "$tmp/zg-grads.ckpt" "$tmp/zg-opt.ckpt"; then ok; else
  bad "--shard grads and --shard optimizer saved different checkpoints"
fi
json_check --backend cpu --model mlp --devices 2 --steps 1 --shard grads -- \
  "j['memory']['shard'] == 'optimizer' and not j['memory']['grads_sharded']"
expect_error '2 micro-batches with sharded gradients' "${zg[@]}" --shard grads --micro-batches 2
expect_error 'sharded parameters (ZeRO stage 3) are not there yet' --backend cpu --shard params
expect_error '--shard and --no-shard-optimizer both say' --backend cpu --shard optimizer --no-shard-optimizer

# Language models: --text on a small repetitive file (the tiny transformer learns it well below
# the 5.55 nats of a uniform byte), the same run on 1 and 2 devices, --sample from the trained
# and from a saved model, and the options' refusals.
for i in $(seq 1 120); do echo "the quick brown fox jumps over the lazy dog $((i % 7))"; done >"$tmp/text.txt"
lm=(--backend cpu --text "$tmp/text.txt" --context 16 --depth 1 --width 32 --heads 2 --batch 8)
json_check "${lm[@]}" --devices 2 --steps 80 --log-every 0 -- \
  "j['model'] == 'text' and j['eval_loss'] < 2.5 and abs(math.exp(j['eval_loss']) - j['eval_perplexity']) < 1e-3 * j['eval_perplexity'] and j['tokens_per_sec'] > 0 and j['model_gflops'] > 0"
"$train" "${lm[@]}" --devices 1 --steps 20 --log-every 0 --json >"$tmp/t1" 2>&1 || bad "text run on 1 device"
"$train" "${lm[@]}" --devices 2 --steps 20 --log-every 0 --json --save "$tmp/lm.ckpt" >"$tmp/t2" 2>&1 || bad "text run on 2 devices"
# 1 and 2 devices differ in the order of their sums: the final losses within bound32 of the
# transformer's path, counted as tests/bounds.h counts gpt-mini's (T 16, D 32, 1 block, head
# size 16, MLP 128, vocabulary 256, tied head: 2 layer norms (4 D), qkv (D + 3 D), attention
# (2 (16 + T)), output (2 D), MLP (D + 4 D, 4 D + D), final layer norm (4 D), head (D + 256);
# T (7 + 2) per row in the weight gradients), kappa 4 for a cross-entropy whose logits stay
# below twice the loss, as in these 20 steps (3.5 from 5.5).
tol=$(bound32 $((256 + 128 + 64 + 64 + 160 + 160 + 128 + 288)) $((16 * 9)) 4 8 20)
if python3 -c "
import json, sys
a, b = (json.loads(open(f).read().splitlines()[-1])['final_loss'] for f in sys.argv[1:3])
sys.exit(not abs(a - b) <= float(sys.argv[3]) * abs(a))" "$tmp/t1" "$tmp/t2" "$tol"
then ok; else bad "text: 1 vs 2 devices (bound $tol): $(tail -n 1 "$tmp/t1") vs $(tail -n 1 "$tmp/t2")"; fi
if "$train" "${lm[@]}" --devices 2 --steps 20 --resume "$tmp/lm.ckpt" --sample 12 --prompt "the quick" >"$tmp/out" 2>&1 &&
  grep -qF 'sample (greedy, 12 bytes after the prompt):' "$tmp/out" &&
  [ "$(grep -A1 -F 'sample (greedy' "$tmp/out" | tail -n 1 | wc -c)" -eq $((9 + 12 + 1)) ]; then ok; else
  bad "--sample from a saved model: $(cat "$tmp/out")"
fi
json_check --backend cpu --model gpt-mini --devices 2 --steps 3 --batch 4 --context 8 --depth 1 --width 16 --heads 2 --sample 5 --temperature 0.7 -- \
  "j['model'] == 'gpt-mini' and math.isfinite(j['final_loss'])"
head -c 20 "$tmp/text.txt" >"$tmp/tiny.txt"
expect_error 'needs at least 34' --backend cpu --text "$tmp/tiny.txt" --context 16
expect_error 'cannot open' --backend cpu --text "$tmp/none.txt"
expect_error 'it does not take --data or --model' --backend cpu --text "$tmp/text.txt" --model mlp
expect_error 'need --model gpt-mini or --text' --backend cpu --model mlp --depth 2
expect_error 'need --model gpt-mini or --text' --backend cpu --model linear --sample 5
expect_error '--width 30 is not a multiple of --heads 4' --backend cpu --model gpt-mini --width 30
expect_error '--prompt and --temperature go with --sample N' --backend cpu --model gpt-mini --prompt abc
expect_error '--temperature "-1" must be a finite number >= 0' --backend cpu --model gpt-mini --sample 3 --temperature -1
expect_error '--context "1" is not an integer' --backend cpu --model gpt-mini --context 1

echo "cli: $passes passed, $fails failed"
[ "$fails" -eq 0 ]
