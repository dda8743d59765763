/* cpu_isa.h: the instruction sets pmap's CPU code may use: what the CPU has (CPUID, with the
 * registers the OS saves), capped by the environment variable PMAP_CPU_ISA. The cap reaches
 * oneDNN (dnnl_set_max_cpu_isa, before its first primitive), pmap's own SIMD kernels (the level
 * CPU_KERNEL dispatches on, cpu_ops.h) and the choices that follow them: the bf16 GEMM (by
 * oneDNN's effective ISA), the float GEMM's measured choice (cached per cap), OpenBLAS's place
 * in it. So one machine runs the paths of older CPUs. */
#ifndef PMAP_CPU_ISA_H
#define PMAP_CPU_ISA_H

#include <stdatomic.h>

#include "pmap.h"

/* Ordered: each level has every instruction of the ones below it. */
typedef enum cpu_isa {
  CPU_ISA_BASELINE,    /* x86-64 (SSE2), or not x86: pmap's baseline kernels; oneDNN SSE41 */
  CPU_ISA_AVX2,        /* AVX2 (with FMA where the CPU has it): Haswell, Zen 1-3 */
  CPU_ISA_AVX512,      /* x86-64-v4: AVX-512 F, BW, CD, DQ, VL (Skylake-SP, Ice Lake) */
  CPU_ISA_AVX512_BF16, /* and AVX512_BF16 (Cooper Lake, Zen 4, Zen 5) */
  CPU_ISA_AMX          /* and AMX tiles with bf16 (Sapphire Rapids and later) */
} cpu_isa;

/* PMAP_CPU_ISA's values, by level: "sse41", "avx2", "avx512", "avx512_bf16", "amx". */
const char *cpu_isa_name(cpu_isa isa);
/* Reads PMAP_CPU_ISA once per process (unset, empty or "native": no cap) and sets oneDNN's cap.
 * PMAP_ERR_INVALID_ARGUMENT for a value that is none of the names, PMAP_ERR_UNAVAILABLE for a
 * level this CPU lacks, PMAP_ERR_DEVICE when oneDNN refuses the cap (it was used before): the
 * message starts with `call` and names the value and the CPU's level. The code still runs, on
 * the CPU's own level, when it fails. */
pmap_status cpu_isa_ready(const char *call);
/* Whether PMAP_CPU_ISA's level `pick` (a cpu_isa, or past the last for "native") may cap a CPU
 * of level `cpu`: PMAP_SUCCESS, or PMAP_ERR_UNAVAILABLE for a level above it with msg (size
 * bytes) naming the value as given, the CPU's level and the caps below it (cpu_isa_ready's
 * message; tests hold it for every level, whatever CPU runs them). */
pmap_status cpu_isa_cap_check(cpu_isa cpu, int pick, char *msg, size_t size);
/* The CPU's level (CPUID and XCR0), whatever the cap. */
cpu_isa cpu_isa_machine(void);
/* The level pmap's code uses: the CPU's, capped by PMAP_CPU_ISA. */
cpu_isa cpu_isa_active(void);
/* oneDNN's effective ISA in oneDNN's words ("avx512_core_amx", "avx2", ...; "none" without
 * oneDNN in the build), and whether its bf16 matmul runs on bf16 instructions there (1) rather
 * than being emulated or missing (0). Both call cpu_isa_ready first. */
const char *cpu_isa_onednn(void);
int cpu_isa_onednn_bf16(void);

/* The SIMD kernels' level, read on every kernel call (cpu_ops.h): 2 x86-64-v4, 1 AVX2,
 * 0 baseline; -1 until the first read decides it. */
extern _Atomic int cpu_simd_level_now;
int cpu_simd_level_init(void);
static inline int cpu_simd_level(void) {
  int l = atomic_load_explicit(&cpu_simd_level_now, memory_order_relaxed);
  return l >= 0 ? l : cpu_simd_level_init();
}

#endif
