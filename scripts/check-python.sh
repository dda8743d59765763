#!/usr/bin/env bash
# check-python.sh: builds and installs the Python package with `pip install .` (meson-python,
# the same Meson build) into a fresh virtual environment and runs its pytest suite.
# Usage: scripts/check-python.sh [VENV_DIR] [pytest arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv-python}
[ $# -gt 0 ] && shift
py=python3
if ! "$py" -m venv --help >/dev/null 2>&1 || ! "$py" -c 'import ensurepip' >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-venv >/dev/null
fi
rm -rf "$venv"
"$py" -m venv "$venv"
venv=$(cd "$venv" && pwd)
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q numpy pytest
# CUDA stays out of the wheel built for this check (it is the CPU package the tests use).
"$venv/bin/pip" install -q . -Csetup-args=-Dcuda=disabled
cd python/tests
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
