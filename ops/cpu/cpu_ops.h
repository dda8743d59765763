/* cpu_ops.h: CPU kernel entry points shared between the files of ops/cpu and the CPU backend. */
#ifndef PMAP_CPU_OPS_H
#define PMAP_CPU_OPS_H

#include "ops/ops.h"

/* Row-major GEMM through the provider in use (ops/cpu/gemm.h, pmap_gemm_provider()). */
pmap_status cpu_gemm(pmap_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                     float beta, float *c, int64_t ldc);
/* The portable blocked GEMM, also the small-shape path of the others. Same contract. */
void cpu_gemm_portable(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

/* The GEMM library runs single-threaded on each device thread: the devices are the parallelism.
 * cpu_gemm_threads_set sets the thread count of the provider in use and returns the setting to
 * restore the caller's thread with: the previous one, or n for a count of the whole process
 * (OpenBLAS's pthread build), which one device thread cannot give back while others run. */
int cpu_gemm_threads_set(int n);

pmap_status cpu_conv2d_forward(pmap_device *dev, const pmap_conv_shape *s, int64_t bd,
                               const float *x, const float *w, float *y, float *col);
pmap_status cpu_conv2d_backward(pmap_device *dev, const pmap_conv_shape *s, int64_t bd,
                                const float *x, const float *w, const float *dy, float *dx,
                                float *dw, float *col, float *dcol);

/* Layers beyond dense and conv (layer_ops.c); contracts in ops/ops.h. */
pmap_status cpu_act_forward(pmap_device *dev, pmap_act act, const float *x, float *y, size_t n);
pmap_status cpu_act_backward(pmap_device *dev, pmap_act act, const float *x, const float *y,
                             const float *dy, float *dx, size_t n);
pmap_status cpu_add(pmap_device *dev, const float *a, const float *b, float *y, size_t n);
pmap_status cpu_layernorm_forward(pmap_device *dev, const float *x, const float *gamma,
                                  const float *beta, int64_t rows, int64_t f, float eps, float *y,
                                  float *stats);
pmap_status cpu_layernorm_backward(pmap_device *dev, const float *x, const float *gamma,
                                   const float *stats, const float *dy, int64_t rows, int64_t f,
                                   float *dx, float *dgamma, float *dbeta);
pmap_status cpu_pool2d_forward(pmap_device *dev, int is_max, const pmap_pool_shape *s, int64_t bd,
                               const float *x, float *y);
pmap_status cpu_pool2d_backward(pmap_device *dev, int is_max, const pmap_pool_shape *s, int64_t bd,
                                const float *x, const float *dy, float *dx);
pmap_status cpu_dropout_forward(pmap_device *dev, const float *x, float *y, size_t n, float rate,
                                uint64_t key, uint64_t first);
pmap_status cpu_dropout_backward(pmap_device *dev, const float *dy, float *dx, size_t n, float rate,
                                 uint64_t key, uint64_t first);
pmap_status cpu_bn_stats(pmap_device *dev, const float *x, int64_t outer, int64_t c, int64_t inner,
                         const float *prev, float *stats);
pmap_status cpu_bn_forward(pmap_device *dev, const float *x, const float *stats,
                           const float *run_stats, float *running, const float *gamma,
                           const float *beta, int64_t outer, int64_t c, int64_t inner, float eps,
                           float momentum, int training, float *y);
pmap_status cpu_bn_backward_sums(pmap_device *dev, const float *x, const float *dy,
                                 const float *stats, int64_t outer, int64_t c, int64_t inner,
                                 float eps, float *sums);
pmap_status cpu_bn_backward_dx(pmap_device *dev, const float *x, const float *dy,
                               const float *stats, const float *gamma, const float *sums,
                               int64_t outer, int64_t c, int64_t inner, float eps, float *dx);

#endif
