/* cpu_ops.h: the CPU op backend's kernels, one per op of ops/op_list.h (cpu_<op>), and what the
 * files of ops/cpu share. Its queue holds nothing a kernel reads: CPU kernels run on the calling
 * thread, in order. */
#ifndef PMAP_CPU_OPS_H
#define PMAP_CPU_OPS_H

#include "ops/ops.h"

#define PMAP_OP(name, args) pmap_status cpu_##name args;
#include "ops/op_list.h"
#undef PMAP_OP

/* The portable blocked GEMM, also the small-shape path of the others. cpu_gemm's contract. */
void cpu_gemm_portable(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

/* The GEMM library runs single-threaded on each device thread: the devices are the parallelism.
 * cpu_gemm_threads_set sets the thread count of the provider in use and returns the setting to
 * restore the caller's thread with: the previous one, or n for a count of the whole process
 * (OpenBLAS's pthread build), which one device thread cannot give back while others run. */
int cpu_gemm_threads_set(int n);

#endif
