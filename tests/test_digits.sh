#!/usr/bin/env bash
# test_digits.sh: the README's real-data example: scikit-learn's 8x8 digits as .npy, an MLP on 4
# CPU devices, at least 95 % held-out accuracy. Skips (77) where no Python has numpy and sklearn.
set -u
train=${1:?usage: test_digits.sh path/to/pmap-train path/to/digits_to_npy.py}
convert=${2:?}
py=""
for cand in python3 /usr/bin/python3; do
  if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import numpy, sklearn' 2>/dev/null; then
    py=$cand
    break
  fi
done
if [ -z "$py" ]; then
  echo "digits: skipped: no python3 with numpy and scikit-learn (apt-get install python3-sklearn)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" "$convert" "$tmp" || exit 1
"$train" --data "$tmp/digits_x.npy" --labels "$tmp/digits_y.npy" --hidden 128,64 \
  --eval-fraction 0.2 --devices 4 --backend cpu --steps 1500 --batch 64 --lr 0.002 \
  --log-every 500 --json >"$tmp/out" 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
cat "$tmp/out"
tail -n 1 "$tmp/out" | python3 -c "
import json, sys
j = json.loads(sys.stdin.read())
acc = j['eval_accuracy']
print('digits: held-out accuracy', acc)
sys.exit(0 if acc is not None and acc >= 0.95 and j['replicas_identical'] else 1)"
