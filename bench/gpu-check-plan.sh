#!/usr/bin/env bash
# gpu-check-plan.sh: bench/gpu-check.sh's plan, sourced by it (not run alone): every step in the
# order it runs, what it costs (process starts, CUDA contexts, fixed waits, work) and the limit
# that follows; the costs measured by the probe on the GPU raise the later limits. The order is
# by what a step tells: the probe, one device (the op harness, every model), NCCL with 2 ranks
# on the GPU, bf16, then 2 logical devices, performance and JAX; 4 logical devices on one GPU,
# beyond what NCCL 2.30 documents, only when asked for (FOUR=1), last.
#
# Each step's limit is MARGIN x (eager starts x COST_EAGER + lazy starts x COST_LAZY + 1-device
# contexts x COST_CTX1 + shared-GPU contexts x COST_CTXN + fixed waits + work), rounded up to the
# second.
# The counts are those of the programs as written (tests/gpu/*.c, bench/pmap-step.c,
# bench/pmap-allreduce.c: docs/cuda.md, "The plan"). None of the unit costs can be measured
# without a GPU, so each is an estimate with its basis:
# - COST_EAGER: a process's CUDA start with CUDA_MODULE_LOADING=EAGER, which loads every module
#   of the process when its context is made: cuBLAS and cuBLASLt (libcublasLt is about 0.5 GB,
#   mostly kernels for other GPUs; the sm_90 ones are loaded), NCCL's (33 MB) and pmap's. 4 s,
#   an estimate.
# - COST_LAZY: the same with CUDA's default lazy loading (the one-device steps): 1 s, an estimate.
# - COST_CTX1: a context of one device: its thread, stream, cuBLAS handle with its 32 MiB
#   workspace, 8 MiB of pinned buffers, a one-rank NCCL communicator and the first all-reduce,
#   then its destruction. NCCL's own tests run 100 one-rank create/all-reduce/destroy cycles
#   within 20 s (NVIDIA/nccl pull 2366): 0.2 s each; 0.5 s here, an estimate.
# - COST_CTXN: a context of 2 or 4 devices sharing the GPU: NCCL's init of 8 ranks on a DGX
#   B200 reports alloc 0.4 s, bootstrap 0.6-0.8 s, topology 1.1 s, connections 0.4 s
#   (NVIDIA/nccl issue 1646, kernel loading apart: done at the process's start here), 2.6 s in
#   all for 8 GPUs with their switches and NICs; one GPU has far less to detect. 2 s with the
#   first all-reduce and the destruction, an estimate.
# The probe measures COST_EAGER (its start line), COST_CTX1 and COST_CTXN (a context of 1 and of
# 2 devices, made and destroyed); a measured cost above its estimate replaces it, and every
# step not yet run gets its limit again from the new costs (the summary says so).
#
# Work: CPU times measured on a 2-core Zen 5 build machine with the portable GEMM (what the GPU
# machine has), one thread per CPU device, times 1.5 for a server core; GPU times estimated.

COST_EAGER=4 COST_LAZY=1 COST_CTX1=0.5 COST_CTXN=2 MARGIN=1.5
declare -A VISITED # steps reached (gpu-check-lib.sh)
COSTS_FROM="estimates"

# name stage eager lazy ctx1 ctxn waits work | what the waits and the work are
PLAN=(
  "configure a 0 0 0 0 0 10 | meson setup with nvcc's, cuBLAS's and NCCL's checks: 5 s measured here, 10 s allowed (its failure loses every step)"
  "build a 0 0 0 0 0 40 | the plugin, 7 tests, 3 benchmarks: 103 s of CPU measured here, 7 s on 16 cores, behind nvcc's longest compile (10-20 s here); 40 s allowed (its failure loses every step)"
  "probe b 1 0 1 2 5.2 2 | the GPU's facts; a 100 ms kernel before the blocking-sync wait, given up on after 5 s; a context of 1 device and of 2, then 2 devices timing 400 launches of an all-reduce (the work: CUDA's first start on a machine just started)"
  "probe-again b 1 0 1 2 5.2 0 | only where the probe ran out of its limit while CUDA started: the same once more, CUDA's driver started by then"
  "gpu-ops-1 b 0 1 2 0 0 5 | every op twice against float64 and the CPU oracle: 1.7 s of CPU here (test_ops --as-device), x1.5, and 2.5 s of launches and waits"
  "gpu-pmap-1 b 0 1 2 0 0 15 | 7 models x 20 CPU steps, gpt-mini x 3 (0.94 s a step here with the portable GEMM): 8 s x1.5; the convergence runs, 2200 GPU steps: 3 s"
  "nccl-2 c 1 0 0 1 0 1 | all-reduces of 8 B to 1 MiB, NCCL_DEBUG=INFO"
  "nccl-2-nocumem c 1 0 0 1 0 1 | the same without cuMem (only where nccl-2 failed)"
  "gpu-bf16-1 b 0 1 3 0 0 3 | 4 models under bf16 on the GPU against the CPU (mlp-1024 3 CPU steps at batch 64, res-mlp 20, cifar-cnn 3 at 16, gpt-mini 2 at 8: 1.24 s of CPU here with the portable GEMMs, x1.5), the GPU's fp32 alike, gpt-mini plain and captured (a context each), 1 s of GPU steps"
  "gpu-bf16-2 c 1 0 1 1 0 4 | the bf16 path's 9 ops on 2 devices at once against the CPU oracle at the large sizes: 4.75 s of CPU here on 2 CPU devices (test_ops --as-device --devices 2), half of it the oracle's, in 2 threads: 1.2 s, x1.5, and 2 s of launches and waits"
  "gpu-coll-2 c 1 0 2 4 11 2 | waits: a device 5 s late, two 2 s timeouts and a stall until the 2 s timeout; collectives to 4 MB"
  "gpu-pmap-2 c 1 0 2 3 0 17 | CPU on 2 devices as gpu-pmap-1 (8 s x1.5), GPU: 8 models x 3 runs, 4 sharded runs, convergence on 2 devices sharing the GPU (5 s)"
  "gpu-fast-2 c 1 0 1 7 0 1 | 6 runs of 16 steps, a context each (graphs, overlap and the forced failure are read when it is made), captures included"
  "gpu-fallback-2 c 2 1 1 7 0 1 | a child with eager loading, one with lazy loading refused before NCCL; 6 runs of 6 steps, a context each (their settings are read when it is made)"
  "step-mlp-1024 e 1 0 3 3 0 2 | 3 variants x 35 steps on 1 and on 2 devices, one context each"
  "step-mlp e 1 0 2 2 0 1 | 2 variants x 210 steps on 1 and on 2 devices, one context each"
  "step-gpt-mini e 1 0 4 4 0 2 | 4 variants (plain, graph, overlap, bf16) x 13 steps on 1 and on 2 devices, one context each"
  "allreduce e 1 0 0 1 0 2 | 8 B to 64 MiB on 2 devices, 25 times each, every value checked"
  "jax-compare f 0 1 1 0 0 17 | JAX's start and XLA's compilation of mlp-1024 (15 s, an estimate), 23 steps of each"
)
# Four logical devices on one GPU: asked for alone (FOUR=1), last, and only where its limit fits
# in what is left (not counted in the plan that must fit the budget).
PLAN_OPTIN=(
  "gpu-coll-4 d 1 0 2 3 4 1 | collectives on 4 ranks, NCCL's report for them, the NCCL aborts (PMAP_GPU_TEST_QUICK=1); waits: a stall until the 2 s timeout and a failure"
)
((${FOUR:-0})) && PLAN+=("${PLAN_OPTIN[@]}")
declare -A LIMIT STAGE COUNTS WORKNOTE WHY OPTIN
PLAN_NAMES=()
for p in "${PLAN[@]}"; do
  read -r n s e l c1 cn w k _ <<<"${p%%|*}"
  PLAN_NAMES+=("$n")
  STAGE[$n]=$s COUNTS[$n]="$e $l $c1 $cn $w $k" WORKNOTE[$n]=${p#*| }
done
for p in "${PLAN_OPTIN[@]}"; do OPTIN[${p%% *}]=1; done

# The limits of the steps not yet visited (all of them at the start) from the costs in force,
# with their reasons; PLAN_SUM adds up every step's but the opt-in ones'.
plan_limits() {
  local n
  PLAN_SUM=0
  for n in "${PLAN_NAMES[@]}"; do
    if [ -z "${VISITED[$n]:-}" ]; then
      LIMIT[$n]=$(plan_limit_of "$n")
      WHY[$n]=$(plan_reason "$n")
    fi
    [ -n "${OPTIN[$n]:-}" ] || PLAN_SUM=$((PLAN_SUM + LIMIT[$n]))
  done
}

plan_limit_of() { # name -> its limit in seconds
  local e l c1 cn w k
  read -r e l c1 cn w k <<<"${COUNTS[$1]}"
  awk -v m="$MARGIN" -v E="$COST_EAGER" -v L="$COST_LAZY" -v C1="$COST_CTX1" -v CN="$COST_CTXN" \
    -v e="$e" -v l="$l" -v c1="$c1" -v cn="$cn" -v w="$w" -v k="$k" \
    'BEGIN { s = m * (e * E + l * L + c1 * C1 + cn * CN + w + k); printf "%d", (s == int(s)) ? s : int(s) + 1 }'
}

# Why name has its limit, as it was set: "45 s = 1.5 x (1 eager start(s) x 4 s + ...): ...".
plan_why() { printf '%s' "${WHY[$1]:-}"; }

plan_reason() {
  local e l c1 cn w k parts=()
  read -r e l c1 cn w k <<<"${COUNTS[$1]}"
  [ "$e" != 0 ] && parts+=("$e eager start(s) x ${COST_EAGER} s")
  [ "$l" != 0 ] && parts+=("$l lazy start(s) x ${COST_LAZY} s")
  [ "$c1" != 0 ] && parts+=("$c1 1-device context(s) x ${COST_CTX1} s")
  [ "$cn" != 0 ] && parts+=("$cn shared-GPU context(s) x ${COST_CTXN} s")
  [ "$w" != 0 ] && parts+=("${w} s of waits")
  [ "$k" != 0 ] && parts+=("${k} s of work")
  local IFS=+
  printf '%s s = %s x (%s): %s' "${LIMIT[$1]}" "$MARGIN" "$(printf '%s' "${parts[*]}" | sed 's/+/ + /g')" \
    "${WORKNOTE[$1]}"
}

# After the probe: its measured costs (its log, $1) replace the estimates they exceed, and the
# steps not yet run get their limits again. Says what it found in COSTS_NOTE.
plan_from_probe() {
  local log=$1 eager c1 cn raised=""
  eager=$(sed -n 's/^start: CUDA \([0-9.]*\) s, context on GPU 0 \([0-9.]*\) s, cuBLAS handle \([0-9.]*\) s.*/\1 \2 \3/p' "$log" |
    awk '{ printf "%.2f", $1 + $2 + $3 }')
  c1=$(sed -n 's/^pmap context, 1 device: create \([0-9.]*\) s, destroy \([0-9.]*\) s$/\1 \2/p' "$log" |
    awk '{ printf "%.2f", $1 + $2 }')
  cn=$(sed -n 's/^pmap context, 2 devices on GPU 0: create \([0-9.]*\) s, destroy \([0-9.]*\) s$/\1 \2/p' "$log" |
    awk '{ printf "%.2f", $1 + $2 }')
  COSTS_NOTE="measured by the probe: eager start ${eager:-?} s (estimate $COST_EAGER), 1-device context ${c1:-?} s (estimate $COST_CTX1), shared-GPU context ${cn:-?} s (estimate $COST_CTXN)"
  above() { [ -n "$1" ] && awk -v a="$1" -v b="$2" 'BEGIN { exit !(a > b) }'; }
  if above "$eager" "$COST_EAGER"; then COST_EAGER=$eager raised+=", eager start"; fi
  if above "$c1" "$COST_CTX1"; then COST_CTX1=$c1 raised+=", 1-device context"; fi
  if above "$cn" "$COST_CTXN"; then COST_CTXN=$cn raised+=", shared-GPU context"; fi
  if [ -n "$raised" ]; then
    COSTS_FROM="the probe's measurements where above the estimates"
    plan_limits
    NOTES+=("The probe measured costs above the plan's estimates (${raised#, }): $COSTS_NOTE; every later step's limit was raised accordingly (the plan now adds up to ${PLAN_SUM}s).")
  fi
}
