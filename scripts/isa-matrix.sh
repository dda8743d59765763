#!/usr/bin/env bash
# isa-matrix.sh BUILD_DIR [TEST...]: runs the tests whose results depend on the instruction set
# (the op harness, the GEMM providers and convolution paths, the SIMD builds, the bf16 policy,
# N devices against 1) once under every PMAP_CPU_ISA cap below this CPU's own level, which the
# plain run of the suite covers: so one machine runs the code paths of older CPUs (under sse41,
# the baseline, the op harness, GEMMs and SIMD builds only: see below). The caps
# this CPU supports are asked of the library (pmap-train refuses a level the CPU lacks).
# OpenBLAS takes the core of each cap (OPENBLAS_CORETYPE), so that it stays in the GEMM choice.
# Prints the caps it ran; exits 1 when a test failed under any of them.
set -uo pipefail
build=${1:?usage: isa-matrix.sh BUILD_DIR [TEST...]}
shift
tests=("$@")
if [ ${#tests[@]} -eq 0 ]; then
  tests=(ops ops-as-device gemm gemm-choice conv-paths simd-clones limits precision
         precision-portable equiv attention)
fi
train="$build/tools/pmap-train"
[ -x "$train" ] || { echo "isa-matrix: no $train (build first)"; exit 1; }

# The library's own level: what pmap-train reports with no cap.
native=$(PMAP_CPU_ISA= "$train" --backend cpu --model linear --steps 1 --devices 1 --json 2>/dev/null |
  tail -n 1 | python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["cpu_isa"])')
levels=(sse41 avx2 avx512 avx512_bf16 amx)
declare -A core=([sse41]=Nehalem [avx2]=Haswell [avx512]=SkylakeX [avx512_bf16]=Cooperlake)
caps=()
for l in "${levels[@]}"; do
  [ "$l" = "$native" ] && break
  caps+=("$l")
done
if [ -z "$native" ] || [ ${#caps[@]} -eq ${#levels[@]} ]; then
  echo "isa-matrix: cannot tell this CPU's level (pmap-train --json gave \"$native\")"
  exit 1
fi
echo "isa-matrix: this CPU runs $native; the caps below it: ${caps[*]:-none}"
status=0
ran=()
log="$build/meson-logs/testlog.json"
[ -f "$log" ] && cp "$log" "$log.plain"
for cap in "${caps[@]}"; do
  run=("${tests[@]}")
  if [ "$cap" = sse41 ] && [ $# -eq 0 ]; then
    # The baseline: the ops (every kernel, against float64), the GEMMs and the SIMD builds. The
    # training tests take 15 minutes and more there on two cores (oneDNN has no SSE4.1 code for
    # much of what they run), where the x86-64 CPUs without AVX2 are a decade old.
    run=(ops ops-as-device gemm gemm-choice simd-clones limits)
  fi
  echo "=== PMAP_CPU_ISA=$cap (OPENBLAS_CORETYPE=${core[$cap]}): ${run[*]}"
  if PMAP_CPU_ISA=$cap OPENBLAS_CORETYPE=${core[$cap]} \
      meson test -C "$build" --no-rebuild --print-errorlogs "${run[@]}"; then
    ran+=("$cap: ok")
  else
    ran+=("$cap: FAILED")
    status=1
  fi
  # Each cap's log, beside the plain run's, which stays testlog.json.
  cp "$log" "$build/meson-logs/testlog-isa-$cap.json" 2>/dev/null
done
[ -f "$log.plain" ] && mv "$log.plain" "$log"
echo "isa-matrix: $native (the plain run), ${ran[*]:-no cap below it}"
exit $status
