#!/usr/bin/env bash
# digits.sh: the 8x8 handwritten digits of scikit-learn (Debian python3-sklearn, no download)
# converted to .npy, then trained with pmap-train on 4 CPU devices with a held-out fifth.
# Usage: examples/digits.sh [BUILD_DIR] [extra pmap-train flags]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-$here/../build}"
[ $# -gt 0 ] && shift
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import numpy, sklearn' 2>/dev/null; then
    py="$cand"
    break
  fi
done
if [ -z "$py" ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "digits: installing python3-sklearn and python3-numpy"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-sklearn python3-numpy >/dev/null
  py=/usr/bin/python3
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
"$py" "$here/digits_to_npy.py" "$out"
"$build/tools/pmap-train" --data "$out/digits_x.npy" --labels "$out/digits_y.npy" \
  --hidden 128,64 --eval-fraction 0.2 --devices 4 --backend cpu --steps 1500 --batch 64 \
  --lr 0.002 --log-every 300 "$@"
