#!/usr/bin/env bash
# cpu-speed.sh: step times of two builds of pmap on this machine, interleaved: each turn runs
# every model at every device count on the first build, then on the second (pmap-bench, strong
# scaling, no reference probes), and the table gives per model and device count the median over
# the turns of each build's step median, the lowest and highest turn, and the ratio. It starts
# with the machine (lscpu's model name and flags) and the load average before and after.
#
#   bench/cpu-speed.sh --before DIR --after DIR [--turns N] [--models LIST] [--devices LIST]
#                      [--precision fp32|bf16|fp32,bf16]
#
# DIRs are build folders (meson setup DIR -Dcuda=disabled && ninja -C DIR); LIST defaults to
# every example model and gpt-mini, devices to 1,2, turns to 3, precision to fp32 (a row per
# model, device count and precision). bench/README.md ("CPU speed") has
# the tables it made and the JAX comparison beside them (bench/jax-compare.sh).
set -euo pipefail
BEFORE='' AFTER='' TURNS=3 DEVICES=1,2 PRECISION=fp32
MODELS=linear,mlp,convnet,mlp-1024,cifar-cnn,res-mlp,cifar-bn,gpt-mini
while [ $# -gt 0 ]; do
  case $1 in
  --before) BEFORE=$2 ;;
  --after) AFTER=$2 ;;
  --turns) TURNS=$2 ;;
  --models) MODELS=$2 ;;
  --devices) DEVICES=$2 ;;
  --precision) PRECISION=$2 ;;
  *) echo "usage: $0 --before DIR --after DIR [--turns N] [--models LIST] [--devices LIST]" \
       "[--precision LIST]" >&2
     exit 2 ;;
  esac
  shift 2
done
for b in "$BEFORE" "$AFTER"; do
  if [ -z "$b" ] || [ ! -x "$b/bench/pmap-bench" ]; then
    echo "cpu-speed: --before and --after need built folders (no $b/bench/pmap-bench)" >&2
    exit 2
  fi
done
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "flags: $(lscpu | sed -n 's/^Flags: *//p' | tr ' ' '\n' | grep -E '^(avx2|fma|avx512[a-z_0-9]*|amx[a-z_0-9]*)$' | tr '\n' ' ')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$TURNS"); do
  for m in ${MODELS//,/ }; do
    case $m in
    mlp-1024 | cifar-cnn | cifar-bn) st="--steps 20 --warmup 3" ;;
    gpt-mini) st="--steps 4 --warmup 1 --rounds 2" ;;
    *) st="--steps 300 --warmup 30" ;;
    esac
    for side in before after; do
      dir=$BEFORE
      [ $side = after ] && dir=$AFTER
      # shellcheck disable=SC2086
      "$dir/bench/pmap-bench" --model "$m" --devices "$DEVICES" --scaling strong --no-ref $st \
        --backend cpu --precision "$PRECISION" --json 2>/dev/null | tail -n 1 >> "$OUT/$side.jsonl"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT/before.jsonl" "$OUT/after.jsonl" "$TURNS" <<'EOF'
import json, statistics, sys
def read(path):
    t = {}
    for line in open(path):
        d = json.loads(line)
        for r in d["rows"]:
            key = (d["model"], r["devices"], r.get("precision", "fp32"))
            t.setdefault(key, []).append(r["median_ms"])
    return t
b, a = read(sys.argv[1]), read(sys.argv[2])
print(f"{sys.argv[3]} turns; step medians in ms, the median over the turns (lowest-highest)")
print("| model | devices | precision | before ms | after ms | before/after |")
print("|---|---|---|---|---|---|")
for k in b:
    if k not in a:
        continue
    mb, ma = statistics.median(b[k]), statistics.median(a[k])
    print(f"| {k[0]} | {k[1]} | {k[2]} | {mb:.4g} ({min(b[k]):.4g}-{max(b[k]):.4g}) | "
          f"{ma:.4g} ({min(a[k]):.4g}-{max(a[k]):.4g}) | {mb / ma:.2f}x |")
EOF
