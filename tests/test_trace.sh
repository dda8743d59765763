#!/usr/bin/env bash
# test_trace.sh: what pmap-train shows of a run: the timeline file (--trace, PMAP_TRACE) is valid
# trace-event JSON with a track per device and the caller, spans nested in their step, and only
# the steps of its window (check_trace.py); the memory plan is in --json and --max-memory refuses
# a plan over it before step 1; the straggler report is in --json; the progress bar does not
# change the last line of --json. Usage: test_trace.sh pmap-train check_trace.py [backend]
set -u
train=${1:?usage: test_trace.sh pmap-train check_trace.py [backend]}
check=${2:?usage: test_trace.sh pmap-train check_trace.py [backend]}
backend=${3:-cpu}
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
run() { "$train" --backend "$backend" "$@" >"$tmp/out" 2>"$tmp/err"; }
# Another backend than the CPU: skip (77) where it cannot run here (no GPU, no plugin). Its
# layers are timed on the device's queue and placed on the host's clock when the step ends, to
# within an event's completion latency: nesting is checked to 200 us.
if [ "$backend" != cpu ]; then
  if ! run --model linear --devices 1 --steps 1; then
    echo "test_trace: backend $backend unavailable here: $(cat "$tmp/err")"
    exit 77
  fi
  export CHECK_TRACE_EPS_US=200
fi

# The last 3 of 8 steps on 4 devices; replicated, then sharded (reduce-scatter and gathers).
for shard in --no-shard-optimizer --shard-optimizer; do
  rm -f "$tmp/t.json"
  if ! run --model mlp --devices 4 --steps 8 $shard --trace "$tmp/t.json" --trace-steps 3; then
    bad "trace run $shard failed: $(cat "$tmp/err")"
  else
    python3 "$check" "$tmp/t.json" 4 6,7,8 || bad "trace of the last 3 steps ($shard)"
  fi
done
# Steps 2..3 with checkpoint saves on the caller's track.
if ! run --model mlp --devices 2 --steps 6 --trace "$tmp/ab.json" --trace-steps 2..3 \
  --save "$tmp/ck.pmap" --save-every 2; then
  bad "trace run 2..3 failed: $(cat "$tmp/err")"
else
  python3 "$check" "$tmp/ab.json" 2 2,3 checkpoint || bad "trace of steps 2..3"
fi
# The environment variable, written when the context is destroyed.
if ! PMAP_TRACE="$tmp/env.json" PMAP_TRACE_STEPS=2 run --model linear --devices 4 --steps 4 \
  --log-every 0; then
  bad "PMAP_TRACE run failed: $(cat "$tmp/err")"
else
  python3 "$check" "$tmp/env.json" 4 3,4 || bad "trace from PMAP_TRACE"
fi
# A step the guard skips in a model whose layers exchange values (cifar-bn's batch norm): the
# search for the source is a "guard's search" span of that step on each device, its layers in it.
PMAP_FAULT=nan:device=1:step=2 run --model cifar-bn --devices 2 --batch 8 --steps 3 \
  --trace "$tmp/g.json"
grep -q 'pmap_update: step 2: the local loss or gradients of device 1 were non-finite' "$tmp/err" ||
  bad "the skipped step's message: $(cat "$tmp/err")"
python3 - "$tmp/g.json" <<'PY' || bad "no guard's search holding its layers in step 2"
import json, os, sys
eps = float(os.environ.get("CHECK_TRACE_EPS_US", "0")) + 1e-3  # device-timed spans (CUDA)
ev = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e["ph"] == "X"]
search = [e for e in ev if e["name"] == "guard's search"]
assert sorted((e["tid"], e["args"]["step"]) for e in search) == [(0, 2), (1, 2)], search
for s in search:
    inside = [e for e in ev if e["tid"] == s["tid"] and e["name"].startswith("forward")
              and s["ts"] - eps <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + eps]
    assert inside and all(e["args"]["step"] == 2 for e in inside), s
PY
# Refusals: a file that cannot be written, a bad window, before any step.
expect_fail() {
  local needle=$1
  shift
  if run "$@"; then bad "$* succeeded"; return; fi
  grep -qF -- "$needle" "$tmp/err" || bad "$*: stderr lacks '$needle': $(cat "$tmp/err")"
  grep -q '^step ' "$tmp/out" && bad "$*: steps ran before the refusal"
}
expect_fail "--trace" --model linear --steps 3 --trace "$tmp/no/such/dir/t.json"
expect_fail 'steps "0"' --model linear --steps 3 --trace "$tmp/x.json" --trace-steps 0
expect_fail "--trace-steps needs --trace" --model linear --steps 3 --trace-steps 5
for w in " 5" "+5" "5 " "1.. 3" "-1..2" "99999999999999999999..99999999999999999999"; do
  expect_fail "neither K" --model linear --steps 3 --trace "$tmp/x.json" --trace-steps "$w"
done
mkfifo "$tmp/fifo"
expect_fail "not a regular file" --model linear --steps 3 --trace "$tmp/fifo"
[ -p "$tmp/fifo" ] || bad "the FIFO given to --trace was replaced"
PMAP_TRACE="$tmp/y.json" PMAP_TRACE_STEPS=1..0 expect_fail "PMAP_TRACE_STEPS" --model linear \
  --steps 3

# The memory plan: in --json, and --max-memory refuses what does not fit (nothing runs). The
# plan is read under a limit too (1G), as the runs below have one: the optimizer is then sharded
# at any size (--shard auto), and the JSON line says so.
if ! run --model mlp --devices 2 --steps 2 --json --max-memory 1G; then
  bad "plan run failed: $(cat "$tmp/err")"
else
  tail -n 1 "$tmp/out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
m = j["memory"]
parts = sum(m[k] for k in ("params", "grads", "optimizer", "state", "activations", "staging"))
assert m["total"] == parts > 0, m
assert m["params"] > 0 and m["activations"] > 0, m
assert m["shard"] == "optimizer" and m["optimizer_sharded"] and j["sharded_optimizer"], m
w = j["waits"]
assert len(w["devices"]) == 2 and w["straggler"] in (0, 1), w
assert all(d["collectives"] >= 2 and d["busy_s"] > 0 and d["wait_s"] >= 0 for d in w["devices"]), w
' || bad "memory plan or waits in --json: $(tail -n 1 "$tmp/out")"
  total=$(tail -n 1 "$tmp/out" | python3 -c 'import json,sys; print(json.load(sys.stdin)["memory"]["total"])')
  grep -q '^pmap-train: memory per device: ' "$tmp/out" || bad "no memory line in the header"
  expect_fail "--max-memory $((total - 1))" --model mlp --devices 2 --steps 2 \
    --max-memory $((total - 1))
  run --model mlp --devices 2 --steps 2 --max-memory "$total" ||
    bad "--max-memory $total (the plan exactly) refused: $(cat "$tmp/err")"
  # K is 1024 bytes (the plan in K, exactly: total / 1024 has at most ten decimals), a fraction
  # of a byte is dropped, and a refused plan is in the JSON line too.
  k_of() { python3 -c "import decimal, sys; print(decimal.Decimal(int(sys.argv[1])) / 1024)" "$1"; }
  run --model mlp --devices 2 --steps 2 --max-memory "$(k_of "$total")K" ||
    bad "--max-memory $(k_of "$total")K (the plan exactly) refused: $(cat "$tmp/err")"
  expect_fail "--max-memory $((total - 1)):" --model mlp --devices 2 --steps 2 \
    --max-memory "$(k_of $((total - 1)))k"
  run --model mlp --devices 2 --steps 2 --max-memory $((total - 1)) --json
  tail -n 1 "$tmp/out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
assert "--max-memory" in j["error"] and j["memory"]["total"] == int(sys.argv[1]), j
' "$total" || bad "a refused plan is not in the JSON line: $(tail -n 1 "$tmp/out")"
  # A limit under what the parameters alone need (their creation fails), or under their
  # bfloat16 copy (the precision's switch fails): refused as given (exit status 2), with the plan
  # made without the limit printed and in the JSON line. An allocation that fails for another
  # reason (an injected fault) stays the run's own failure (exit status 1).
  fixed=$(tail -n 1 "$tmp/out" | python3 -c '
import json, sys
m = json.load(sys.stdin)["memory"]
print(m["params"] + m["grads"] + m["optimizer"] + m["state"] + m["staging"])')
  for lim in "$((fixed / 4))" "$fixed"; do
    prec=fp32 failed="(cannot create the parameters: "
    [ "$lim" = "$fixed" ] && prec=bf16 failed="(--precision: "
    run --model mlp --devices 2 --steps 2 --precision $prec --max-memory "$lim" --json
    rc=$?
    [ $rc = 2 ] || bad "--max-memory $lim under the parameters ($prec): exit status $rc, not 2"
    grep -q '^pmap-train: memory per device: ' "$tmp/out" || bad "--max-memory $lim: no plan printed"
    grep -q '^step ' "$tmp/out" && bad "--max-memory $lim: steps ran"
    grep -qF -- "--max-memory $lim: the parameters, gradients, optimizer state and staging alone" \
      "$tmp/err" && grep -qF -- "$failed" "$tmp/err" ||
      bad "--max-memory $lim ($prec): $(cat "$tmp/err")"
    tail -n 1 "$tmp/out" | python3 -c '
import json, sys
j = json.load(sys.stdin)
m = j["memory"]
assert "--max-memory" in j["error"] and m["total"] > int(sys.argv[1]), j
assert (m["params"] > m["grads"]) == (sys.argv[2] == "bf16"), m  # the bfloat16 copy planned
# the layout the plan was made in, also where the params were never made
assert j["sharded_optimizer"] is m["optimizer_sharded"] is True, j
assert j["optimizer_state_bytes"] == m["optimizer"], j
' "$lim" "$prec" || bad "--max-memory $lim ($prec): the JSON line: $(tail -n 1 "$tmp/out")"
  done
  PMAP_FAULT=alloc:device=1 run --model mlp --devices 2 --steps 2 --max-memory "$total"
  rc=$?
  [ $rc = 1 ] && grep -q 'injected' "$tmp/err" && ! grep -q 'cannot start as given' "$tmp/err" ||
    bad "an injected allocation failure under --max-memory: exit status $rc: $(cat "$tmp/err")"
  for v in " $total" "+$total" "1e9" "0x7fffffff" "inf" "${total}B" ".5G"; do
    expect_fail "--max-memory \"$v\" is not a size in bytes" --model mlp --steps 2 --max-memory "$v"
  done
fi
# --trace and PMAP_TRACE: one recording per context, so both at once are refused before a step.
PMAP_TRACE="$tmp/env2.json" expect_fail "environment variable PMAP_TRACE=" --model linear \
  --steps 3 --trace "$tmp/flag.json"
# The largest byte count is int64_t's, read exactly; one more is refused, not wrapped.
run --model linear --steps 2 --max-memory 9223372036854775807 ||
  bad "--max-memory 9223372036854775807 refused: $(cat "$tmp/err")"
expect_fail "9223372036854775808\" is not a size in bytes" --model linear --steps 2 --max-memory 9223372036854775808

# The bar (forced: the output is a file here) leaves the --json line as the plain lines do.
run --model mlp --devices 2 --steps 20 --progress lines --json && tail -n 1 "$tmp/out" >"$tmp/lines"
run --model mlp --devices 2 --steps 20 --progress bar --json && tail -n 1 "$tmp/out" >"$tmp/bar"
grep -q $'\r\[' "$tmp/out" || bad "--progress bar drew no bar"
python3 - "$tmp/lines" "$tmp/bar" <<'PY' || bad "--progress bar changed the --json line"
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
volatile = {"samples_per_sec", "waits", "mfu", "mfu_peak_gflops"}
assert set(a) == set(b), (set(a) ^ set(b))
for k in a:
    if k not in volatile:
        assert a[k] == b[k], (k, a[k], b[k])
PY

if [ "$fails" -ne 0 ]; then
  echo "test_trace: $fails failures" >&2
  exit 1
fi
echo "test_trace: ok"
