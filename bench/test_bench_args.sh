#!/usr/bin/env bash
# test_bench_args.sh: the command lines of pmap-bench, pmap-allreduce and pmap-step as a user
# meets them: --help (exit 0, every option named), and bad arguments rejected with exit status 1
# and their message. Usage: test_bench_args.sh PMAP_BENCH PMAP_ALLREDUCE PMAP_STEP
set -u
bench=${1:?usage: test_bench_args.sh PMAP_BENCH PMAP_ALLREDUCE PMAP_STEP}
allreduce=$2 step=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# expect_error PROG NEEDLE ARGS...: exit status 1 and "<prog name>: NEEDLE" on stderr.
expect_error() {
  local prog=$1 needle=$2
  shift 2
  "$prog" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 1 ]; then bad "$(basename "$prog") $* exited $rc, want 1"; return; fi
  grep -qxF -- "$(basename "$prog"): $needle" "$tmp/err" ||
    bad "$(basename "$prog") $*: stderr is not '$needle': $(cat "$tmp/err")"
}

# help PROG OPTION...: --help exits 0 on stdout, starts with "usage:" and names every option.
help() {
  local prog=$1 opt
  shift
  if ! "$prog" --help >"$tmp/out" 2>"$tmp/err"; then bad "$(basename "$prog") --help failed"; return; fi
  [ "$(head -c 6 "$tmp/out")" = "usage:" ] || bad "$(basename "$prog") --help: $(head -n 1 "$tmp/out")"
  for opt in "$@"; do
    grep -qF -- "[$opt" "$tmp/out" || bad "$(basename "$prog") --help does not name $opt"
  done
}

forms=" (decimal digits, with an optional fraction and K, M or G: powers of 1024)"
help "$bench" --model --devices --batch --weak-batch --scaling --steps --warmup --rounds \
  --backend --seed --no-ref --no-numeric-guard --shard-optimizer --no-shard-optimizer \
  --compare-shard --precision --csv --dump --timeout --json
help "$allreduce" -b -e -f -d -n -w -o -c --backend --copy-bytes --csv --json
help "$step" --backend --model --devices --batch --steps --warmup --variants --bucket-mb \
  --numeric-guard --loss --json

for p in "$bench" "$allreduce" "$step"; do
  expect_error "$p" "unknown option --frobnicate (see --help)" --frobnicate
  expect_error "$p" "option --backend needs a value" --backend
done
expect_error "$bench" 'option --csv needs a value' --csv
expect_error "$bench" '--scaling "x" is not strong, weak or both' --scaling x
expect_error "$bench" '--model: unknown model "nosuch" (expected one of: linear, mlp, convnet, mlp-1024, cifar-cnn, res-mlp, cifar-bn, gpt-mini, tanh-custom, or all)' --model mlp,nosuch
expect_error "$bench" '--devices "0,1" is not a list of at most 16 integers in [1, 64]' --devices 0,1
expect_error "$bench" '--rounds "101" is not an integer in [1, 100]' --rounds 101
expect_error "$bench" '--timeout "-1" is not a number of seconds > 0 (inf: never)' --timeout -1
expect_error "$bench" '--seed "x" is not a non-negative integer' --seed x
for v in fp16 bf16,bf16 fp32,bf16,fp32 fp32,; do
  expect_error "$bench" "--precision \"$v\": fp32, bf16 or both, each once, comma-separated" \
    --precision "$v"
done
expect_error "$bench" '--precision is empty (fp32, bf16 or fp32,bf16)' --precision ""
expect_error "$allreduce" "-b \"3\" is not a size in bytes from 4 to 4G$forms" -b 3
expect_error "$allreduce" "-e \"5G\" is not a size in bytes from 4 to 4G$forms" -e 5G
expect_error "$allreduce" "-b \"1X\" is not a size in bytes from 4 to 4G$forms" -b 1X
expect_error "$allreduce" '-e 8 is below -b 1024' -b 1K -e 8
expect_error "$allreduce" '-o "prod" is not sum, mean, max or all' -o prod
expect_error "$allreduce" '-c "2" is not an integer in [0, 1]' -c 2
expect_error "$allreduce" '--backend: unknown backend "tpu" (expected auto, cpu or cuda)' --backend tpu
expect_error "$step" '--backend tpu: cuda, cpu or auto' --backend tpu
expect_error "$step" '--variants: unknown fast (plain, graph, overlap, graph+overlap, sharded, bf16, graph-bf16)' \
  --variants plain,fast
expect_error "$step" '--bucket-mb "5000" is not an integer in [1, 4096]' --bucket-mb 5000

# Sizes in bytes: digits, an optional fraction and K, M or G; what strtod would also read is not.
for v in " 4K" "+4K" "0x1000" "4e3" "inf" "4KB"; do
  expect_error "$allreduce" "-b \"$v\" is not a size in bytes from 4 to 4G$forms" -b "$v"
done
# A fraction needs a digit after the point and K, M or G after it: not 4.5 bytes, not 1.K.
expect_error "$allreduce" "-b \"4.5\" is not a size in bytes from 4 to 4G$forms; a fraction needs K, M or G after it (1.5K is 1536 bytes)" -b 4.5
expect_error "$allreduce" "-e \"8.0\" is not a size in bytes from 4 to 4G$forms; a fraction needs K, M or G after it (1.5K is 1536 bytes)" -e 8.0
expect_error "$allreduce" "-b \"1.K\" is not a size in bytes from 4 to 4G$forms; a fraction needs digits after the point" -b 1.K
# --trace: the files are named as --help says (FILE without its .json, the model, the devices).
grep -qF 'run.mlp-1024-4d.json' <("$bench" --help) || bad "pmap-bench --help does not name its trace files"
if "$bench" --model linear --devices 1 --scaling strong --steps 2 --warmup 0 --rounds 1 --no-ref \
  --backend cpu --trace "$tmp/run.json" >"$tmp/out" 2>"$tmp/err"; then
  [ -s "$tmp/run.linear-1d.json" ] || bad "--trace run.json wrote $(ls "$tmp"), not run.linear-1d.json"
else
  bad "pmap-bench --trace failed: $(cat "$tmp/err")"
fi

if [ "$fails" -ne 0 ]; then
  echo "test_bench_args: $fails failed" >&2
  exit 1
fi
echo "test_bench_args: ok"
