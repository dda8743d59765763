/* cpu_ops.h: CPU kernel entry points shared between the files of ops/cpu and the CPU backend. */
#ifndef PMAP_CPU_OPS_H
#define PMAP_CPU_OPS_H

#include "ops/ops.h"

/* Row-major GEMM through the provider chosen at configure time (see pmap_gemm_provider()). */
pmap_status cpu_gemm(pmap_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                     float beta, float *c, int64_t ldc);
/* The portable blocked GEMM, also the small-shape path of the others. Same contract. */
void cpu_gemm_portable(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

/* The GEMM library runs single-threaded on each device thread: the devices are the parallelism.
 * cpu_gemm_threads_set returns the previous setting so the caller's thread can be restored. */
int cpu_gemm_threads_set(int n);

pmap_status cpu_conv2d_forward(pmap_device *dev, const pmap_conv_shape *s, int64_t bd,
                               const float *x, const float *w, float *y, float *col);
pmap_status cpu_conv2d_backward(pmap_device *dev, const pmap_conv_shape *s, int64_t bd,
                                const float *x, const float *w, const float *dy, float *dx,
                                float *dw, float *col, float *dcol);

#endif
