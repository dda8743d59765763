/* bf16.h: what the CPU's bfloat16 GEMMs share: ops/cpu/bf16.c (the kernels and the portable
 * path), bf16_onednn.c (each thread's scratch and oneDNN matmul primitives), bf16_choice.c (the
 * provider in use, and the GEMM ops that run through it). */
#ifndef PMAP_CPU_BF16_H
#define PMAP_CPU_BF16_H

#include "cpu_ops.h"

/* One call of gemm_bf16 (batch 1, strides 0) or gemm_strided_bf16 (ops.h ops_gemm16): the
 * cache's key, compared bytewise (zero it before filling it). */
typedef ops_gemm16 bf16_gemm;

/* Where a GEMM takes its scratch (oneDNN's scratchpad, the portable path's widened operands):
 * its queue's workspace (ops.h op_backend.gemm16_set_workspace), sized by the memory plan; a
 * GEMM that needs more than `bytes` (or called without a queue) takes the calling thread's own,
 * kept and grown as needed. */
typedef struct bf16_ws {
  void *p;
  size_t bytes;
} bf16_ws;

/* Below this many multiply-adds a GEMM takes the portable path (the library call costs more). */
#define CPU_BF16_SMALL_MACS 4096

/* The portable path's bound on each thread's scratch of widened operands, in floats (4 MiB): a
 * GEMM whose operands do not fit is cut into slices of k of at most BLOCK_K and tiles of c
 * (bf16.c). */
#define CPU_BF16_BLOCK_K 2048
#define CPU_BF16_SCRATCH (512 * CPU_BF16_BLOCK_K)

/* Whether the bf16 provider in use is oneDNN's matmul (made once, as cpu_gemm_active is);
 * PMAP_ERR_* when PMAP_GEMM_BF16 is invalid. */
pmap_status cpu_bf16_native(int *native);
/* Validates PMAP_GEMM_BF16 and makes the choice; errors start with `call`. */
pmap_status cpu_bf16_ready(const char *call);
/* Makes `name` ("onednn", "portable") the provider from now on, for tests and benchmarks that
 * compare both in one process. PMAP_ERR_INVALID_ARGUMENT when it is not built. */
pmap_status cpu_bf16_force(const char *name);
/* g on oneDNN's matmul through this thread's cached primitive for its shape: *done 0 when the
 * shape has no bf16 implementation there (or only oneDNN's reference one): the caller then takes
 * the portable path. */
pmap_status cpu_bf16_onednn(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b, float *c,
                            bf16_ws ws, int *done);
/* The scratchpad bytes g takes on oneDNN's matmul (its primitive made now, as its first call
 * would); *usable 0 when it would take the portable path instead. */
pmap_status cpu_bf16_onednn_scratch(const bf16_gemm *g, size_t *bytes, int *usable);
/* g on the portable path. */
pmap_status cpu_bf16_portable(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b, float *c,
                              bf16_ws ws);
/* The scratch bytes g takes on the portable path (its widened operands). */
size_t cpu_bf16_portable_scratch(const bf16_gemm *g);
/* The scratch bytes g takes on the provider in use (op_backend.gemm16_workspace). */
pmap_status cpu_bf16_workspace(const bf16_gemm *g, size_t *bytes);
/* At least `bytes` of scratch, 64-byte aligned: ws when it holds them, else the calling
 * thread's own (kept, grown as needed, freed when the thread ends; each such call is counted by
 * cpu_bf16_unplanned). NULL when out of memory. */
void *cpu_bf16_scratch_in(bf16_ws ws, size_t bytes);
/* The calls so far, by every thread, whose scratch did not fit the workspace they were given
 * (tests: a step's GEMMs all fit the plan's). */
uint64_t cpu_bf16_unplanned(void);
/* The calling thread's scratch of at least n floats (kept, grown as needed, freed when the
 * thread ends); NULL when out of memory. */
float *cpu_bf16_scratch(size_t n);
/* The floats the calling thread's scratch holds now (0 before its first use), for the test of the
 * bound. */
size_t cpu_bf16_scratch_floats(void);

#endif
