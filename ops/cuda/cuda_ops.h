/* cuda_ops.h: the entry points of the CUDA kernels (ops/cuda, one file per op) and the CUDA op
 * table. Each runs asynchronously on the device's stream with the contract of its member in
 * ops/ops.h; pointers are device memory of that device. Usable from C and CUDA C++. */
#ifndef PMAP_CUDA_OPS_H
#define PMAP_CUDA_OPS_H

#include "runtime/cuda/cuda_device.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const pmap_ops pmap_cuda_ops;

/* cuBLAS SGEMM on row-major operands (ops.h gemm). */
pmap_status cuda_gemm(pmap_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc);
pmap_status cuda_fill(pmap_device *dev, float *x, float value, size_t n);
pmap_status cuda_copy(pmap_device *dev, const float *x, float *y, size_t n);
pmap_status cuda_bias_forward(pmap_device *dev, float *y, const float *b, int64_t outer, int64_t ch,
                              int64_t inner);
pmap_status cuda_bias_backward(pmap_device *dev, const float *dy, float *db, int64_t outer,
                               int64_t ch, int64_t inner);
pmap_status cuda_relu_forward(pmap_device *dev, const float *x, float *y, size_t n);
pmap_status cuda_relu_backward(pmap_device *dev, const float *y, const float *dy, float *dx,
                               size_t n);
/* Convolution as batched im2col + one GEMM per chunk of examples. The per-example col and dcol
 * scratch of ops.h is not used: the chunk's columns live in the device's workspace. */
pmap_status cuda_conv2d_forward(pmap_device *dev, const pmap_conv_shape *s, int64_t bd,
                                const float *x, const float *w, float *y, float *col);
pmap_status cuda_conv2d_backward(pmap_device *dev, const pmap_conv_shape *s, int64_t bd,
                                 const float *x, const float *w, const float *dy, float *dx,
                                 float *dw, float *col, float *dcol);
pmap_status cuda_mse(pmap_device *dev, const float *pred, const float *t, size_t n, float *dpred,
                     float *loss);
pmap_status cuda_softmax_xent(pmap_device *dev, const float *logits, const int32_t *labels,
                              int64_t rows, int64_t k, float *dlogits, float *loss);
pmap_status cuda_sgd_step(pmap_device *dev, float *w, const float *g, float *v, size_t n,
                          const pmap_step_hyper *h);
pmap_status cuda_adam_step(pmap_device *dev, float *w, const float *g, float *m, float *v, size_t n,
                           const pmap_step_hyper *h);
pmap_status cuda_norm2(pmap_device *dev, const float *x, size_t n, float *norm);
pmap_status cuda_scale(pmap_device *dev, float *x, float s, size_t n);
pmap_status cuda_axpy(pmap_device *dev, float alpha, const float *x, float *y, size_t n);

/* Layers beyond dense and conv: act.cu, add.cu, layernorm.cu, pool2d.cu, dropout.cu,
 * batchnorm.cu. */
pmap_status cuda_act_forward(pmap_device *dev, pmap_act act, const float *x, float *y, size_t n);
pmap_status cuda_act_backward(pmap_device *dev, pmap_act act, const float *x, const float *y,
                              const float *dy, float *dx, size_t n);
pmap_status cuda_add(pmap_device *dev, const float *a, const float *b, float *y, size_t n);
pmap_status cuda_layernorm_forward(pmap_device *dev, const float *x, const float *gamma,
                                   const float *beta, int64_t rows, int64_t f, float eps, float *y,
                                   float *stats);
pmap_status cuda_layernorm_backward(pmap_device *dev, const float *x, const float *gamma,
                                    const float *stats, const float *dy, int64_t rows, int64_t f,
                                    float *dx, float *dgamma, float *dbeta);
pmap_status cuda_pool2d_forward(pmap_device *dev, int is_max, const pmap_pool_shape *s, int64_t bd,
                                const float *x, float *y);
pmap_status cuda_pool2d_backward(pmap_device *dev, int is_max, const pmap_pool_shape *s, int64_t bd,
                                 const float *x, const float *dy, float *dx);
pmap_status cuda_dropout_forward(pmap_device *dev, const float *x, float *y, size_t n, float rate,
                                 uint64_t key, uint64_t first);
pmap_status cuda_dropout_backward(pmap_device *dev, const float *dy, float *dx, size_t n,
                                  float rate, uint64_t key, uint64_t first);
pmap_status cuda_bn_stats(pmap_device *dev, const float *x, int64_t outer, int64_t c, int64_t inner,
                          const float *prev, float *stats);
pmap_status cuda_bn_forward(pmap_device *dev, const float *x, const float *stats,
                            const float *run_stats, float *running, const float *gamma,
                            const float *beta, int64_t outer, int64_t c, int64_t inner, float eps,
                            float momentum, int training, float *y);
pmap_status cuda_bn_backward_sums(pmap_device *dev, const float *x, const float *dy,
                                  const float *stats, int64_t outer, int64_t c, int64_t inner,
                                  float eps, float *sums);
pmap_status cuda_bn_backward_dx(pmap_device *dev, const float *x, const float *dy,
                                const float *stats, const float *gamma, const float *sums,
                                int64_t outer, int64_t c, int64_t inner, float eps, float *dx);

/* The fast steps' guard and clipping (step_vals.cu): from the averaged [loss | flags (n) | norm]
 * at g + P, writes cd->vals's skip and scale, and scales g (P) by it when clip > 0. */
pmap_status cuda_guard_clip(cuda_device *cd, float *g, size_t P, const float *tail, int n,
                            int guard, float clip);
/* The step's values for a kernel launched now: cd->vals while a fast step reads them, else NULL
 * (the kernel then uses its arguments). */
static inline const cuda_step_vals *cuda_vals_of(const cuda_device *cd) {
  return cd->vals_on ? cd->vals : NULL;
}

/* Loads every kernel of ops/cuda on cd's GPU (the current device) now. CUDA loads a module at
 * the first launch of one of its kernels, and that may synchronize the whole GPU: on a GPU
 * shared by several logical devices, a first launch of, say, the optimizer's kernel behind a
 * queued all-reduce could then wait for another device's all-reduce kernel, which spins until
 * this device's joins. The backend calls this when a device starts, before any collective. */
pmap_status cuda_ops_preload(cuda_device *cd);
pmap_status cuda_act_preload(cuda_device *cd);
pmap_status cuda_adam_preload(cuda_device *cd);
pmap_status cuda_add_preload(cuda_device *cd);
pmap_status cuda_batchnorm_preload(cuda_device *cd);
pmap_status cuda_bias_preload(cuda_device *cd);
pmap_status cuda_conv2d_preload(cuda_device *cd);
pmap_status cuda_copy_preload(cuda_device *cd);
pmap_status cuda_dropout_preload(cuda_device *cd);
pmap_status cuda_fill_preload(cuda_device *cd);
pmap_status cuda_layernorm_preload(cuda_device *cd);
pmap_status cuda_loss_reduce_preload(cuda_device *cd);
pmap_status cuda_mse_preload(cuda_device *cd);
pmap_status cuda_norm2_preload(cuda_device *cd);
pmap_status cuda_pool2d_preload(cuda_device *cd);
pmap_status cuda_relu_preload(cuda_device *cd);
pmap_status cuda_sgd_preload(cuda_device *cd);
pmap_status cuda_softmax_xent_preload(cuda_device *cd);
pmap_status cuda_step_vals_preload(cuda_device *cd);

/* Second pass of the loss reductions: *loss (device) = (float)(sum of partial (blocks) / denom),
 * summed in a fixed order so the loss is deterministic. blocks <= CUDA_REDUCE_BLOCKS. */
pmap_status cuda_loss_finalize(cuda_device *cd, const double *partial, unsigned blocks,
                               double denom, float *loss);

#ifdef __cplusplus
}
#endif
#endif
