#!/usr/bin/env bash
# plot.sh: the pictures of bench/README.md. Runs pmap-bench over every example model (or takes
# its CSV), pmap-allreduce, and a pmap-train run, and draws with gnuplot into OUT:
#   throughput.png  samples/s against devices, one line per model (strong solid, weak dashed)
#   efficiency.png  scaling efficiency against devices, the same lines
#   allreduce.png   all-reduce bus bandwidth against size, one line per device count
#   loss.png        the loss curve of pmap-train (cifar-cnn, 2 devices)
# Without gnuplot it says so, and still writes the CSV files and prints the tables.
#
#   bench/plot.sh [--build DIR] [--out DIR] [--scaling-csv FILE] [--allreduce-csv FILE]
#
# DIR defaults to build/ and OUT to bench/results/. With --scaling-csv / --allreduce-csv the
# given CSV (pmap-bench --csv, pmap-allreduce --csv) is drawn instead of a new run.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$SRC/build
OUT=$SRC/bench/results
SCALING="" ALLRED=""
while [ $# -gt 0 ]; do
  case $1 in
  --build) BUILD=$2; shift 2 ;;
  --out) OUT=$2; shift 2 ;;
  --scaling-csv) SCALING=$2; shift 2 ;;
  --allreduce-csv) ALLRED=$2; shift 2 ;;
  -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "plot.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
mkdir -p "$OUT"

if [ -z "$SCALING" ]; then
  SCALING=$OUT/scaling.csv
  "$BUILD/bench/pmap-bench" --model all --devices 1,2,4 --scaling both --csv "$SCALING" \
    | tee "$OUT/scaling.txt"
fi
if [ -z "$ALLRED" ]; then
  ALLRED=$OUT/allreduce.csv
  "$BUILD/bench/pmap-allreduce" -d 2,4 -b 8 -e 128M -f 2 --csv "$ALLRED" | tee "$OUT/allreduce.txt"
fi

if ! command -v gnuplot >/dev/null 2>&1; then
  echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox): no PNGs drawn; the results" \
    "are in $SCALING and $ALLRED"
  column -s, -t <"$SCALING" 2>/dev/null || cat "$SCALING"
  exit 0
fi

"$BUILD/tools/pmap-train" --model cifar-cnn --devices 2 --steps 150 --samples 2048 \
  --log-every 50 --backend cpu --plot "$OUT/loss.png"

# The models in the order of the CSV; gnuplot filters rows by the model and scaling columns.
MODELS=$(awk -F, 'NR > 1 && !seen[$1]++ { printf "%s ", $1 }' "$SCALING")
COUNTS=$(awk -F, 'NR > 1 && !seen[$1]++ { printf "%s ", $1 }' "$ALLRED")
HOST="$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
gnuplot <<EOF
set datafile separator ','
set terminal pngcairo size 900,540 noenhanced font ',11'
set key outside right top
set grid
set xlabel 'devices'
set logscale x 2
set xtics (1, 2, 4, 8, 16, 32, 64)
models = "$MODELS"
sel(m, s, col) = (strcol(1) eq m && strcol(2) eq s) ? column(col) : 1/0

set output '$OUT/throughput.png'
set title "pmap-bench throughput ($HOST); strong scaling solid, weak dashed"
set ylabel 'samples/s'
set logscale y 10
set format y '%.0e'
plot for [i=1:words(models)] '$SCALING' using 5:(sel(word(models, i), 'strong', 13)) \
       with linespoints lw 2 pt 7 lc i title word(models, i).' strong', \
     for [i=1:words(models)] '$SCALING' using 5:(sel(word(models, i), 'weak', 13)) \
       with linespoints lw 2 dt 2 pt 6 lc i title word(models, i).' weak'

set output '$OUT/efficiency.png'
set title "pmap-bench scaling efficiency ($HOST); strong solid, weak dashed"
set ylabel 'efficiency (1 = ideal)'
unset logscale y
set format y '%.1f'
set yrange [0:1.2]
plot 1 with lines lc rgb 'gray' dt 3 title 'ideal', \
     for [i=1:words(models)] '$SCALING' using 5:(sel(word(models, i), 'strong', 16)) \
       with linespoints lw 2 pt 7 lc i title word(models, i).' strong', \
     for [i=1:words(models)] '$SCALING' using 5:(sel(word(models, i), 'weak', 16)) \
       with linespoints lw 2 dt 2 pt 6 lc i title word(models, i).' weak'

set output '$OUT/allreduce.png'
set title "pmap-allreduce (sum, in place) bus bandwidth ($HOST)"
counts = "$COUNTS"
set xlabel 'bytes'
set logscale x 4
set xtics auto
set format x '%.0b%B'
set ylabel 'busbw (GB/s)'
set yrange [*:*]
set format y '%g'
unset logscale y
ar(d, col) = (strcol(1) eq d && strcol(6) eq 'sum') ? column(col) : 1/0
plot for [i=1:words(counts)] '$ALLRED' using 3:(ar(word(counts, i), 13)) \
       with linespoints lw 2 pt 7 title word(counts, i).' devices'
EOF
echo "plot.sh: wrote $OUT/throughput.png, $OUT/efficiency.png, $OUT/allreduce.png, $OUT/loss.png"
