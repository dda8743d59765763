/* cpu_peak.h: the peak multiply-add rate of the CPU cores a run's devices take, for the precision
 * its GEMMs run in: MFU's denominator, so that MFU <= 1 by construction (docs/tracing.md). */
#ifndef PMAP_TOOLS_CPU_PEAK_H
#define PMAP_TOOLS_CPU_PEAK_H

#include <stddef.h>

typedef struct cpu_peak {
  double gflops;          /* cores x flops_per_cycle x ghz */
  double ghz;             /* the core clock, measured */
  double flops_per_cycle; /* one core's, for the instructions the GEMMs use */
  int cores;              /* the cores the devices run on: min(devices, online CPUs) */
  char what[160];         /* which instructions, e.g. "fp32 FMA on 512-bit registers, 2 a cycle" */
} cpu_peak;

/* The peak of `devices` CPU devices whose GEMMs run in bf16 (pmap_bf16_provider "onednn": AMX
 * or AVX512_BF16 dot products) or in fp32 (FMAs of pmap_cpu_isa's width), at the clock measured
 * now (a chain of dependent additions, the best of a few runs). 0, or -1 with why (not x86-64). */
int cpu_peak_get(int devices, int bf16, cpu_peak *out, char *why, size_t why_size);

#endif
