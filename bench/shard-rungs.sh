#!/usr/bin/env bash
# shard-rungs.sh: memory and step time of the sharding rungs on one model, alternated: each turn
# runs every device count, recomputation and rung once (pmap-train --json), and the table gives
# per row the plan's MB per device (parameters + gradients + optimizer, the gradients, the
# activations, the total), the step in ms (the global batch over the median samples/s of the
# turns) and its ratio to the first rung's of the same devices and recomputation. Every run of a
# row group must end at the same loss (the rungs give the same bits); a difference is printed.
#
#   bench/shard-rungs.sh [--train PATH] [--model NAME] [--depth K] [--devices LIST]
#                        [--rungs LIST] [--recompute LIST] [--turns N] [--steps S]
#
# Defaults: build/tools/pmap-train, gpt-mini of 8 blocks, devices 2,4, rungs optimizer,grads,
# recompute none,full, 5 turns of 20 steps. bench/README.md ("Memory per rung") has its tables.
set -euo pipefail
TRAIN=build/tools/pmap-train MODEL=gpt-mini DEPTH=8 DEVICES=2,4 RUNGS=optimizer,grads
RECOMPUTE=none,full TURNS=5 STEPS=20
while [ $# -gt 0 ]; do
  case $1 in
  --train) TRAIN=$2 ;;
  --model) MODEL=$2 ;;
  --depth) DEPTH=$2 ;;
  --devices) DEVICES=$2 ;;
  --rungs) RUNGS=$2 ;;
  --recompute) RECOMPUTE=$2 ;;
  --turns) TURNS=$2 ;;
  --steps) STEPS=$2 ;;
  *) echo "usage: $0 [--train PATH] [--model NAME] [--depth K] [--devices LIST] [--rungs LIST]" \
       "[--recompute LIST] [--turns N] [--steps S]" >&2
     exit 2 ;;
  esac
  shift 2
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for turn in $(seq 1 "$TURNS"); do
  for d in ${DEVICES//,/ }; do
    for rc in ${RECOMPUTE//,/ }; do
      for s in ${RUNGS//,/ }; do
        line=$("$TRAIN" --model "$MODEL" --depth "$DEPTH" --devices "$d" --steps "$STEPS" \
          --shard "$s" --recompute "$rc" --json 2>/dev/null | tail -n 1)
        echo "$d $rc $s $line" >>"$out"
      done
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" <<'EOF'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    d, rc, s, js = line.split(" ", 3)
    j = json.loads(js)
    key = (int(d), rc, s)
    if key not in order:
        order.append(key)
    runs[key].append(j)
print("| devices | rung | params+grads+opt MB | grads MB | activations MB | total MB | step ms | vs first |")
print("|---|---|---|---|---|---|---|---|")
first, losses = {}, {}
for key in order:
    d, rc, s = key
    js = runs[key]
    m = js[0]["memory"]
    ms = js[0]["global_batch"] / statistics.median(j["samples_per_sec"] for j in js) * 1000
    first.setdefault((d, rc), ms)
    for j in js:
        losses.setdefault((d, rc), set()).add(j["final_loss"])
    name = f"--shard {s}" + (f" --recompute {rc}" if rc != "none" else "")
    print(f"| {d} | `{name}` ({m['shard']}) | {(m['params'] + m['grads'] + m['optimizer']) / 1e6:.2f}"
          f" | {m['grads'] / 1e6:.2f} | {m['activations'] / 1e6:.2f} | {m['total'] / 1e6:.2f}"
          f" | {ms:.1f} | {ms / first[(d, rc)]:.2f} |")
for key, got in losses.items():
    if len(got) > 1:
        print(f"final losses differ at {key}: {sorted(got)}")
EOF
