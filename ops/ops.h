/* ops.h: the op table a backend provides (CPU in ops/cpu, CUDA in ops/cuda). Models call ops only
 * through this table, so they never see BLAS, CUDA or threads.
 *
 * Write contract: forward ops overwrite their outputs (=); backward ops overwrite activation
 * gradients (dx =) and ACCUMULATE parameter gradients (dw +=, db +=), so a caller zeroes the
 * gradient buffer once per step and gradient accumulation over micro-batches comes free.
 * All pointers are device memory of the device `dev` (host memory on CPU); all arrays row-major. */
#ifndef PMAP_OPS_H
#define PMAP_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "pmap.h"

/* Geometry of a 2-D convolution over NCHW examples. */
typedef struct pmap_conv_shape {
  int64_t c, h, w;    /* input channels, height, width */
  int64_t oc, oh, ow; /* output channels, height, width */
  int kh, kw, stride, pad;
} pmap_conv_shape;

/* The settings of one optimizer step (models/params.c fills them from pmap_optimizer and the
 * step's place in the learning-rate schedule). */
typedef struct pmap_step_hyper {
  float lr;           /* this step's learning rate */
  float momentum;     /* SGD: 0 for none */
  int nesterov;       /* SGD with momentum: Nesterov's form */
  float weight_decay; /* SGD: L2, added to the gradient; Adam: decoupled (AdamW), applied to w */
  float beta1, beta2, eps;
  float bc1, bc2; /* Adam's bias corrections 1 - beta1^t, 1 - beta2^t for step t >= 1 */
} pmap_step_hyper;

typedef struct pmap_ops {
  /* c (m, n) = alpha * op(a) op(b) + beta * c, op(a) (m, k), op(b) (k, n); trans_* transposes the
   * stored matrix (a stored (k, m) when trans_a). beta == 0 ignores c's old contents. */
  pmap_status (*gemm)(pmap_device *dev, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                      float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                      float beta, float *c, int64_t ldc);
  /* x[i] = value for i < n. */
  pmap_status (*fill)(pmap_device *dev, float *x, float value, size_t n);
  /* y (outer, ch, inner) += b (ch) broadcast: dense uses inner 1, conv inner OH*OW. */
  pmap_status (*bias_forward)(pmap_device *dev, float *y, const float *b, int64_t outer,
                              int64_t ch, int64_t inner);
  /* db (ch) += sum over outer and inner of dy (outer, ch, inner). */
  pmap_status (*bias_backward)(pmap_device *dev, const float *dy, float *db, int64_t outer,
                               int64_t ch, int64_t inner);
  /* y (n) = max(x, 0); y may equal x. */
  pmap_status (*relu_forward)(pmap_device *dev, const float *x, float *y, size_t n);
  /* dx (n) = dy where y > 0, else 0; dx may equal dy. */
  pmap_status (*relu_backward)(pmap_device *dev, const float *y, const float *dy, float *dx,
                               size_t n);
  /* y (bd, oc, oh, ow) = conv(x (bd, c, h, w), w (oc, c, kh, kw)), no bias.
   * col: scratch of c*kh*kw*oh*ow floats. */
  pmap_status (*conv2d_forward)(pmap_device *dev, const pmap_conv_shape *s, int64_t bd,
                                const float *x, const float *w, float *y, float *col);
  /* dw (oc, c, kh, kw) += ..., dx (bd, c, h, w) = ... (dx may be NULL: not needed).
   * col: scratch as above; dcol: a second scratch of the same size. */
  pmap_status (*conv2d_backward)(pmap_device *dev, const pmap_conv_shape *s, int64_t bd,
                                 const float *x, const float *w, const float *dy, float *dx,
                                 float *dw, float *col, float *dcol);
  /* loss = 1/n sum (pred - t)^2 written to *loss (device memory), dpred (n) = 2/n (pred - t).
   */
  pmap_status (*mse)(pmap_device *dev, const float *pred, const float *t, size_t n, float *dpred,
                     float *loss);
  /* Mean over rows of softmax cross-entropy: logits (rows, k), labels (rows) in [0, k);
   * dlogits (rows, k) = (softmax - onehot) / rows; *loss (device memory) = the mean. */
  pmap_status (*softmax_xent)(pmap_device *dev, const float *logits, const int32_t *labels,
                              int64_t rows, int64_t k, float *dlogits, float *loss);
  /* w, g, v (n): SGD step (momentum, Nesterov, L2 weight decay: ops/op_math.h); v is read and
   * written only when h->momentum != 0. */
  pmap_status (*sgd_step)(pmap_device *dev, float *w, const float *g, float *v, size_t n,
                          const pmap_step_hyper *h);
  /* w, g, m, v (n): Adam step with bias corrections, and AdamW's decoupled weight decay. */
  pmap_status (*adam_step)(pmap_device *dev, float *w, const float *g, float *m, float *v,
                           size_t n, const pmap_step_hyper *h);
  /* *norm (device memory) = sqrt(sum of x[i]^2) for i < n, summed in double in a fixed order:
   * non-finite exactly when some x[i] is (or the norm exceeds FLT_MAX). The numeric guard and
   * gradient clipping read it. */
  pmap_status (*norm2)(pmap_device *dev, const float *x, size_t n, float *norm);
  /* x[i] *= s for i < n (gradient clipping). */
  pmap_status (*scale)(pmap_device *dev, float *x, float s, size_t n);
  /* y[i] += alpha * x[i] for i < n (weighted sums of micro-batch losses). */
  pmap_status (*axpy)(pmap_device *dev, float alpha, const float *x, float *y, size_t n);
} pmap_ops;

/* The CPU op table (always built); the oracle every other backend is tested against. */
extern const pmap_ops pmap_cpu_ops;

#endif
