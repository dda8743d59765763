#!/usr/bin/env bash
# jax-compare.sh: pmap against JAX's pmap on the same models, data and cores. Creates a virtual
# environment (default .venv-bench/ in the source tree, git-ignored), installs JAX for CPU from
# PyPI when it cannot import jax there, and runs bench/jax_compare.py against a built pmap-bench.
#
#   bench/jax-compare.sh [--build DIR] [jax_compare.py options, e.g. --models mlp-1024 --devices 1,2]
#
# DIR defaults to build/. PMAP_BENCH_VENV picks another virtual environment (one with a CUDA
# build of JAX compares on the GPU); PMAP_BENCH_PYTHON names a Python that already has numpy and
# JAX, used as it is (nothing is installed: for machines without network, such as the GPU
# machines bench/gpu-check.sh runs on). jax_compare.py --help lists the options.
set -euo pipefail
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$SRC/build
if [ "${1:-}" = "--build" ]; then
  BUILD=${2:?--build needs a directory}
  shift 2
fi
if [ -n "${PMAP_BENCH_PYTHON:-}" ]; then
  "$PMAP_BENCH_PYTHON" -c 'import numpy, jax' || {
    echo "jax-compare: PMAP_BENCH_PYTHON=$PMAP_BENCH_PYTHON cannot import numpy and jax" >&2
    exit 1
  }
  exec "$PMAP_BENCH_PYTHON" "$SRC/bench/jax_compare.py" --pmap-bench "$BUILD/bench/pmap-bench" "$@"
fi
VENV=${PMAP_BENCH_VENV:-$SRC/.venv-bench}
PY=$VENV/bin/python
if [ ! -x "$PY" ]; then
  echo "jax-compare: creating the virtual environment $VENV"
  python3 -m venv "$VENV" || {
    echo "jax-compare: cannot create $VENV (on Debian: apt-get install python3-venv)" >&2
    exit 1
  }
fi
if ! "$PY" -c 'import jax' 2>/dev/null; then
  echo "jax-compare: installing jax[cpu] from PyPI into $VENV"
  "$PY" -m pip install --quiet "jax[cpu]" || {
    echo "jax-compare: pip install jax[cpu] failed (no network?)" >&2
    exit 1
  }
fi
if [ ! -x "$BUILD/bench/pmap-bench" ]; then
  echo "jax-compare: $BUILD/bench/pmap-bench is not built (meson setup $BUILD && ninja -C $BUILD)" >&2
  exit 1
fi
exec "$PY" "$SRC/bench/jax_compare.py" --pmap-bench "$BUILD/bench/pmap-bench" "$@"
