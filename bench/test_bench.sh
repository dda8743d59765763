#!/usr/bin/env bash
# test_bench.sh: pmap-bench's reference measurements on a few steps of the CPU backend: the
# hand-written 1-device loop (the models' own forward and backward without the runtime) runs for
# the models without collectives and ends bitwise at pmap's 1-device loss, is left out for batch
# norm across devices, the step's GEMMs are listed for every model, --dump writes its files,
# which bench/jax_compare.py maps by their blocks, and --precision fp32,bf16 puts a bf16 row beside
# each fp32 row.
set -u
bench=${1:?usage: test_bench.sh path/to/pmap-bench}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

models=linear,convnet,res-mlp,cifar-bn
if ! "$bench" --model "$models" --devices 1,2 --scaling strong --batch 16 --steps 4 --warmup 1 \
  --rounds 2 --backend cpu --dump "$tmp/dump" --json >"$tmp/out" 2>"$tmp/err"; then
  bad "pmap-bench exited non-zero: $(tail -5 "$tmp/err")"
fi
json=$(tail -n 1 "$tmp/out")
# One object per model: "model": NAME, ..., "hand_loop": {...} or none, ... "failed": false.
for m in linear convnet res-mlp; do
  obj=$(printf '%s' "$json" | grep -o "{\"model\": \"$m\", \"params\"[^]]*" | head -n 1)
  case $obj in
  *'"hand_loop": {'*'"loss_rel_diff": 0}'*) ;;
  *) bad "$m: no hand-written loop ending at pmap's 1-device loss bitwise: $obj" ;;
  esac
done
obj=$(printf '%s' "$json" | grep -o '{"model": "cifar-bn", "params"[^]]*' | head -n 1)
case $obj in
*hand_loop*) bad "cifar-bn (batch norm across devices) ran the hand-written loop: $obj" ;;
'') bad "cifar-bn: no result" ;;
esac
# The GEMM column of every row (the step's GEMMs, listed from a run of the step).
if printf '%s' "$json" | grep -q '"gemm_ms": null'; then bad "a row without its GEMMs: $json"; fi
for m in linear convnet res-mlp cifar-bn; do
  for ext in json params.f32 x.f32 y.bin; do
    [ -s "$tmp/dump/$m.$ext" ] || bad "--dump wrote no $m.$ext"
  done
done
grep -q '"kind": "batchnorm", "channels": 16, "eps": 9.99999975e-06, "momentum": 0.899999976, "cross_replica": 1' \
  "$tmp/dump/cifar-bn.json" || bad "cifar-bn.json: $(cat "$tmp/dump/cifar-bn.json")"
grep -q '{"kind": "res_end", "begin": 1}' "$tmp/dump/res-mlp.json" ||
  bad "res-mlp.json: $(cat "$tmp/dump/res-mlp.json")"
# gpt-mini: tokens/s and MFU in every row, its dump with the token ids' dtype and the tied head.
# Not under a sanitizer, where its GEMM probes alone outlast the test's limit.
if [ "${PMAP_TEST_SANITIZER:-none}" != none ]; then
  echo "bench-ref: gpt-mini runs in the builds without a sanitizer"
elif ! "$bench" --model gpt-mini --devices 1,2 --scaling strong --batch 4 --steps 2 --warmup 1 \
  --rounds 1 --backend cpu --dump "$tmp/dump" --json >"$tmp/gpt" 2>"$tmp/err"; then
  bad "pmap-bench --model gpt-mini exited non-zero: $(tail -5 "$tmp/err")"
else
  python3 -c "
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
rows = j['rows'] if 'rows' in j else [r for m in j['models'] for r in m['rows']]
assert rows and all(abs(r['tokens_per_sec'] - r['samples_per_sec'] * 64) <= 1e-6 * r['tokens_per_sec'] for r in rows), rows
assert all(0 < r['mfu'] for r in rows), rows
" "$tmp/gpt" || bad "gpt-mini: tokens_per_sec or mfu: $(tail -n 1 "$tmp/gpt")"
  grep -q '"x_dtype": "int32"' "$tmp/dump/gpt-mini.json" &&
    grep -q '{"kind": "lm_head", "vocab": 256, "tied": true}' "$tmp/dump/gpt-mini.json" ||
    bad "gpt-mini.json: $(cat "$tmp/dump/gpt-mini.json")"
fi
# bench/jax_compare.py maps every dump by its blocks (that part needs no JAX): they tile the flat
# vector, batch norm's running statistics stay out of JAX's parameters, a tied head has no block
# of its own, and a block out of place is refused.
python3 - "$tmp/dump" "$(dirname "$0")" <<'PY' || bad "bench/jax_compare.py's param_blocks on the dumps"
import copy, json, os, sys
sys.path.insert(0, sys.argv[2])
import jax_compare
seen = 0
for name in sorted(os.listdir(sys.argv[1])):
    if not name.endswith(".json"):
        continue
    spec = json.load(open(os.path.join(sys.argv[1], name)))
    trained = {b["name"] for b in jax_compare.param_blocks(spec)}
    every = {b["name"] for b in spec["blocks"]}
    assert trained <= every and sum(b["count"] for b in spec["blocks"]) == spec["params"], name
    assert len(every) == len(spec["blocks"]), name
    if name == "cifar-bn.json":
        assert "1.batchnorm.gamma" in trained and "1.batchnorm.running_var" in every - trained
    if name == "gpt-mini.json":
        assert "0.embedding.table" in trained and not any(".lm_head." in n for n in every)
    bad = copy.deepcopy(spec)
    bad["blocks"][0]["offset"] += 1
    try:
        jax_compare.param_blocks(bad)
        raise AssertionError(name + ": a block out of place was taken")
    except SystemExit:
        pass
    seen += 1
assert seen >= 4, seen
PY
# --precision fp32,bf16: a bf16 row beside each fp32 row, each against its fp32 row (vs_fp32),
# its GEMMs probed, its replicas identical; the CPU's bf16 support named.
if ! "$bench" --model res-mlp --devices 1,2 --scaling strong --batch 16 --steps 4 --warmup 1 \
  --rounds 2 --backend cpu --precision fp32,bf16 --json >"$tmp/prec" 2>"$tmp/err"; then
  bad "pmap-bench --precision fp32,bf16 exited non-zero: $(tail -5 "$tmp/err")"
else
  python3 -c "
import json, sys
j = json.loads(open(sys.argv[1]).read().splitlines()[-1])
assert j['cpu_bf16'] in ('amx_bf16', 'avx512_bf16', 'none') and j['bf16_gemm'] in ('onednn', 'portable'), j
rows = j['rows']
assert [(r['devices'], r['precision']) for r in rows] == [(1, 'fp32'), (1, 'bf16'), (2, 'fp32'), (2, 'bf16')], rows
for r in rows:
    assert r['replicas_identical'] and r['gemm_ms'] is not None, r
    assert (r['vs_fp32'] is None) == (r['precision'] == 'fp32'), r
    assert r['precision'] == 'fp32' or r['vs_fp32'] > 0, r
" "$tmp/prec" || bad "--precision fp32,bf16: $(tail -n 1 "$tmp/prec")"
  grep -q '^bf16 against fp32: 1 dev ' "$tmp/prec" || bad "no bf16 against fp32 line: $(cat "$tmp/prec")"
fi
if [ "$fails" -ne 0 ]; then
  echo "test_bench: $fails failed" >&2
  exit 1
fi
echo "test_bench: ok"
