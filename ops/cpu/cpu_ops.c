/* cpu_ops.c: the CPU op table: element-wise kernels, losses and optimizer steps, with the math
 * from ops/op_math.h. Loss sums are taken in double, so the CPU result is the reference. */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"
#include "ops/op_math.h"

CPU_KERNEL(extern, pmap_status, cpu_fill, (op_queue *q, float *x, float value, size_t n),
           (q, x, value, n)) {
  (void)q;
  if (value == 0.0f) {
    if (n) memset(x, 0, n * sizeof *x);
  } else {
    for (size_t i = 0; i < n; i++) x[i] = value;
  }
  return PMAP_SUCCESS;
}

pmap_status cpu_copy(op_queue *q, const float *x, float *y, size_t n) {
  (void)q;
  if (n) memcpy(y, x, n * sizeof *y);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_bias_forward,
           (op_queue *q, float *y, const float *b, int64_t outer, int64_t ch, int64_t inner),
           (q, y, b, outer, ch, inner)) {
  (void)q;
  if (inner == 1) { /* dense: a vector loop along each row rather than a loop of one */
    for (int64_t o = 0; o < outer; o++) {
      float *row = y + o * ch;
      CPU_IVDEP for (int64_t c = 0; c < ch; c++) row[c] += b[c];
    }
    return PMAP_SUCCESS;
  }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t c = 0; c < ch; c++) {
      float *row = y + (o * ch + c) * inner;
      for (int64_t i = 0; i < inner; i++) row[i] += b[c];
    }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_bias_backward,
           (op_queue *q, const float *dy, float *db, int64_t outer, int64_t ch, int64_t inner),
           (q, dy, db, outer, ch, inner)) {
  (void)q;
  if (inner == 1) {
    for (int64_t o = 0; o < outer; o++)
      for (int64_t c = 0; c < ch; c++) db[c] += dy[o * ch + c];
    return PMAP_SUCCESS;
  }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t c = 0; c < ch; c++) {
      const float *row = dy + (o * ch + c) * inner;
      float s = 0.0f;
      for (int64_t i = 0; i < inner; i++) s += row[i];
      db[c] += s;
    }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_relu_forward,
           (op_queue *q, const float *x, float *y, size_t n), (q, x, y, n)) {
  (void)q;
  for (size_t i = 0; i < n; i++) y[i] = pmap_relu(x[i]);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_relu_backward,
           (op_queue *q, const float *y, const float *dy, float *dx, size_t n),
           (q, y, dy, dx, n)) {
  (void)q;
  for (size_t i = 0; i < n; i++) dx[i] = pmap_relu_grad(y[i], dy[i]);
  return PMAP_SUCCESS;
}

pmap_status cpu_mse(op_queue *q, const float *pred, const float *t, size_t n, float *dpred,
                    float *loss) {
  (void)q;
  double sum = 0.0;
  float scale = n ? 2.0f / (float)n : 0.0f;
  for (size_t i = 0; i < n; i++) {
    sum += pmap_mse_term(pred[i], t[i]);
    dpred[i] = pmap_mse_grad(pred[i], t[i], scale);
  }
  *loss = n ? (float)(sum / (double)n) : 0.0f;
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_softmax_xent,
           (op_queue *q, const float *logits, const int32_t *labels, int64_t rows, int64_t k,
            float *dlogits, float *loss),
           (q, logits, labels, rows, k, dlogits, loss)) {
  (void)q;
  double sum = 0.0;
  float scale = rows ? 1.0f / (float)rows : 0.0f;
  for (int64_t r = 0; r < rows; r++)
    sum += pmap_xent_row(logits + r * k, labels[r], k, scale, dlogits + r * k);
  *loss = rows ? (float)(sum / (double)rows) : 0.0f;
  return PMAP_SUCCESS;
}

/* The SGD step over n elements; with `round`, w16 takes each updated w rounded (a constant at
 * each call, so each loop is built with or without it). */
CPU_INLINE void sgd_range(float *w, const float *g, float *v, pmap_bf16 *w16, size_t n,
                          const pmap_step_hyper *h, int round) {
  const float lr = h->lr, momentum = h->momentum, wd = h->weight_decay;
  if (momentum == 0.0f && wd == 0.0f) {
    for (size_t i = 0; i < n; i++) {
      w[i] -= lr * g[i];
      if (round) w16[i] = pmap_bf16_round(w[i]);
    }
  } else if (momentum == 0.0f) {
    float unused = 0.0f;
    for (size_t i = 0; i < n; i++) {
      pmap_sgd_update(&w[i], g[i], &unused, lr, 0.0f, 0, wd);
      if (round) w16[i] = pmap_bf16_round(w[i]);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      pmap_sgd_update(&w[i], g[i], &v[i], lr, momentum, h->nesterov, wd);
      if (round) w16[i] = pmap_bf16_round(w[i]);
    }
  }
}

CPU_KERNEL(extern, pmap_status, cpu_sgd_step,
           (op_queue *q, float *w, const float *g, float *v, pmap_bf16 *w16, size_t n,
            const pmap_step_hyper *h),
           (q, w, g, v, w16, n, h)) {
  (void)q;
  if (w16)
    sgd_range(w, g, v, w16, n, h, 1);
  else
    sgd_range(w, g, v, NULL, n, h, 0);
  return PMAP_SUCCESS;
}

/* The Adam step over n elements; `round` as sgd_range's. A constant weight decay of 0 folds the
 * decay's branches away: a vector loop. */
CPU_INLINE void adam_range(float *w, const float *g, float *m, float *v, pmap_bf16 *w16, size_t n,
                           const pmap_step_hyper *h, int round) {
  const float lr = h->lr, b1 = h->beta1, b2 = h->beta2, eps = h->eps, bc1 = h->bc1, bc2 = h->bc2;
  if (h->weight_decay == 0.0f) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) {
      pmap_adam_update(&w[i], g[i], &m[i], &v[i], lr, b1, b2, eps, bc1, bc2, 0.0f);
      if (round) w16[i] = pmap_bf16_round(w[i]);
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      pmap_adam_update(&w[i], g[i], &m[i], &v[i], lr, b1, b2, eps, bc1, bc2, h->weight_decay);
      if (round) w16[i] = pmap_bf16_round(w[i]);
    }
  }
}

CPU_KERNEL(extern, pmap_status, cpu_adam_step,
           (op_queue *q, float *w, const float *g, float *m, float *v, pmap_bf16 *w16, size_t n,
            const pmap_step_hyper *h),
           (q, w, g, m, v, w16, n, h)) {
  (void)q;
  if (w16)
    adam_range(w, g, m, v, w16, n, h, 1);
  else
    adam_range(w, g, m, v, NULL, n, h, 0);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_norm2, (op_queue *q, const float *x, size_t n, float *norm),
           (q, x, n, norm)) {
  (void)q;
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * (double)x[i + k];
  for (; i < n; i++) acc[i % 8] += (double)x[i] * (double)x[i];
  double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  *norm = (float)sqrt(sum);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_scale, (op_queue *q, float *x, float s, size_t n),
           (q, x, s, n)) {
  (void)q;
  for (size_t i = 0; i < n; i++) x[i] *= s;
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_axpy,
           (op_queue *q, float alpha, const float *x, float *y, size_t n), (q, alpha, x, y, n)) {
  (void)q;
  for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
  return PMAP_SUCCESS;
}
