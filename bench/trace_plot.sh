#!/usr/bin/env bash
# trace_plot.sh: draws one step of a pmap trace (pmap-train --trace, pmap-bench --trace,
# PMAP_TRACE) as a PNG timeline with gnuplot: a row per track (the devices, then the caller),
# each span a bar coloured by what it is (forward, backward, loss, collective, wait, optimizer,
# staging, checkpoint), nested spans drawn thinner inside their parents.
#
#   bench/trace_plot.sh TRACE.json OUT.png [STEP] [TITLE]
#
# STEP defaults to the last step the trace holds. Needs python3 and gnuplot
# (apt-get install gnuplot-nox).
set -euo pipefail
trace=${1:?usage: trace_plot.sh TRACE.json OUT.png [STEP] [TITLE]}
out=${2:?usage: trace_plot.sh TRACE.json OUT.png [STEP] [TITLE]}
step=${3:-}
title=${4:-}
command -v gnuplot >/dev/null 2>&1 || {
  echo "trace_plot.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2
  exit 1
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The step's spans as rows "x0 x1 y_lo y_hi colour" (ms from the step's start), the tracks'
# names for the y axis and the default title, from the JSON.
python3 - "$trace" "$step" "$tmp" <<'PY'
import json, sys
path, want, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
doc = json.load(open(path))
ev = doc["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
proc = next((e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"), "")
spans = [e for e in ev if e["ph"] == "X"]
if not spans:
    sys.exit("trace_plot.sh: %s holds no spans" % path)
step = int(want) if want else max(e["args"]["step"] for e in spans)
spans = [e for e in spans if e["args"]["step"] == step]
if not spans:
    sys.exit("trace_plot.sh: %s holds no spans of step %d" % (path, step))
colour = {"forward": 1, "backward": 2, "loss": 3, "collective": 4, "wait": 5, "optimizer": 6,
          "staging": 7, "checkpoint": 8, "step": 9}
t0 = min(e["ts"] for e in spans)
tracks = sorted(names)
row = {tid: len(tracks) - 1 - i for i, tid in enumerate(tracks)}  # device 0 on top
def depth(e):
    return sum(1 for o in spans if o is not e and o["tid"] == e["tid"] and
               o["ts"] <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] and
               (o["dur"] > e["dur"] or (o["dur"] == e["dur"] and id(o) < id(e))))
with open(tmp + "/spans.dat", "w") as f:
    for e in sorted(spans, key=depth):
        kind = e["cat"] if e["cat"] in colour else e["name"].split(" ")[0]
        c = colour.get(kind, 9)
        d = depth(e)
        half = max(0.42 - 0.12 * d, 0.08)
        y = row[e["tid"]]
        x0 = (e["ts"] - t0) / 1e3
        f.write("%.4f %.4f %.3f %.3f %d\n" % (x0, x0 + e["dur"] / 1e3, y - half, y + half, c))
with open(tmp + "/ytics.gp", "w") as f:
    f.write("set ytics (%s)\n" % ", ".join('"%s" %d' % (names[t].replace('"', "'"), row[t])
                                           for t in tracks))
    f.write("set yrange [-0.6:%f]\n" % (len(tracks) - 0.4))
with open(tmp + "/title", "w") as f:
    f.write("%s: step %d" % (proc, step))
PY
[ -n "$title" ] || title=$(cat "$tmp/title")
gnuplot <<GP
set terminal pngcairo size 1400,$((160 + 70 * $(grep -o '" [0-9]*' "$tmp/ytics.gp" | wc -l))) font "sans,10"
set output "$out"
set title "$title"
set xlabel "ms from the step's start"
load "$tmp/ytics.gp"
set grid xtics
set key outside right top
set style fill solid 0.9 border lc rgb "#404040"
set palette defined (1 "#4c72b0", 2 "#dd8452", 3 "#55a868", 4 "#c44e52", 5 "#e8e8e8", 6 "#8172b3", 7 "#937860", 8 "#da8bc3", 9 "#bdbdbd")
set cbrange [1:9]
unset colorbox
plot "$tmp/spans.dat" using (((\$1)+(\$2))/2):(((\$3)+(\$4))/2):1:2:3:4:5 with boxxyerror lc palette notitle, \
  NaN with boxes lc rgb "#bdbdbd" title "step", \
  NaN with boxes lc rgb "#4c72b0" title "forward", \
  NaN with boxes lc rgb "#dd8452" title "backward", \
  NaN with boxes lc rgb "#55a868" title "loss", \
  NaN with boxes lc rgb "#c44e52" title "collective", \
  NaN with boxes lc rgb "#e8e8e8" title "wait (in it)", \
  NaN with boxes lc rgb "#8172b3" title "optimizer", \
  NaN with boxes lc rgb "#937860" title "staging", \
  NaN with boxes lc rgb "#da8bc3" title "checkpoint"
GP
echo "trace_plot.sh: wrote $out (step $(sed 's/.*step //' "$tmp/title"))"
