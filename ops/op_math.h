/* op_math.h: the per-element math of every op, written once and shared by the CPU kernels and
 * the CUDA kernels (PMAP_HD makes each function callable from both host and device code). */
#ifndef PMAP_OP_MATH_H
#define PMAP_OP_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define PMAP_HD __host__ __device__
#else
#define PMAP_HD
#endif

/* NaN propagates (as in JAX): x < 0 is false for NaN, so NaN passes through. */
PMAP_HD static inline float pmap_relu(float x) { return x < 0.0f ? 0.0f : x; }

/* dx from the forward output y (y > 0 exactly where x > 0) and the incoming gradient dy; a NaN
 * output passes NaN back. */
PMAP_HD static inline float pmap_relu_grad(float y, float dy) {
  return y > 0.0f ? dy : y != y ? y : 0.0f;
}

/* MSE over n outputs: loss = 1/n sum (p - t)^2; its gradient is 2/n (p - t), scale = 2/n. */
PMAP_HD static inline float pmap_mse_term(float p, float t) { return (p - t) * (p - t); }
PMAP_HD static inline float pmap_mse_grad(float p, float t, float scale) { return scale * (p - t); }

/* Softmax cross-entropy of one row with logits z, its max zmax and sum_exp = sum exp(z - zmax):
 * loss = log(sum_exp) + zmax - z[label];  dz_k = (softmax_k - [k == label]) * scale. */
PMAP_HD static inline float pmap_xent_grad(float z, float zmax, float inv_sum_exp, int is_label,
                                           float scale) {
  return (expf(z - zmax) * inv_sum_exp - (is_label ? 1.0f : 0.0f)) * scale;
}

/* One row of softmax cross-entropy: z (k) logits, dz (k) = (softmax - onehot) * scale; returns
 * the row's loss, log(sum exp(z - zmax)) + zmax - z[label], in double for the caller's sum. */
PMAP_HD static inline double pmap_xent_row(const float *z, int label, int64_t k, float scale,
                                           float *dz) {
  float zmax = z[0];
  for (int64_t j = 1; j < k; j++) zmax = z[j] > zmax ? z[j] : zmax;
  float se = 0.0f;
  for (int64_t j = 0; j < k; j++) se += expf(z[j] - zmax);
  float inv = 1.0f / se;
  for (int64_t j = 0; j < k; j++) dz[j] = pmap_xent_grad(z[j], zmax, inv, j == label, scale);
  return (double)logf(se) + (double)zmax - (double)z[label];
}

/* SGD with optional L2 weight decay (g += wd w), momentum (momentum == 0: plain SGD, v
 * untouched) and Nesterov's form (the step uses g + momentum v instead of v). */
PMAP_HD static inline void pmap_sgd_update(float *w, float g, float *v, float lr, float momentum,
                                           int nesterov, float wd) {
  if (wd != 0.0f) g += wd * *w;
  if (momentum != 0.0f) {
    *v = momentum * *v + g;
    g = nesterov ? g + momentum * *v : *v;
  }
  *w -= lr * g;
}

/* Adam with bias correction: bc1 = 1 - beta1^t, bc2 = 1 - beta2^t for step t >= 1; wd != 0 is
 * AdamW's decoupled weight decay, w -= lr wd w, from the weight before the step. */
PMAP_HD static inline void pmap_adam_update(float *w, float g, float *m, float *v, float lr,
                                            float beta1, float beta2, float eps, float bc1,
                                            float bc2, float wd) {
  float decay = wd != 0.0f ? lr * wd * *w : 0.0f;
  *m = beta1 * *m + (1.0f - beta1) * g;
  *v = beta2 * *v + (1.0f - beta2) * g * g;
  float mhat = *m / bc1;
  float vhat = *v / bc2;
  *w -= lr * mhat / (sqrtf(vhat) + eps);
  if (wd != 0.0f) *w -= decay;
}

#endif
