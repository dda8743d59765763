/* cpu_ops.c: the CPU op table: element-wise kernels, losses and optimizer steps, with the math
 * from ops/op_math.h. Loss sums are taken in double, so the CPU result is the reference. */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"
#include "ops/op_math.h"

static pmap_status cpu_fill(pmap_device *dev, float *x, float value, size_t n) {
  (void)dev;
  if (value == 0.0f) {
    if (n) memset(x, 0, n * sizeof *x);
  } else {
    for (size_t i = 0; i < n; i++) x[i] = value;
  }
  return PMAP_SUCCESS;
}

static pmap_status cpu_copy(pmap_device *dev, const float *x, float *y, size_t n) {
  (void)dev;
  if (n) memcpy(y, x, n * sizeof *y);
  return PMAP_SUCCESS;
}

static pmap_status cpu_bias_forward(pmap_device *dev, float *y, const float *b, int64_t outer,
                                    int64_t ch, int64_t inner) {
  (void)dev;
  for (int64_t o = 0; o < outer; o++)
    for (int64_t c = 0; c < ch; c++) {
      float *row = y + (o * ch + c) * inner;
      for (int64_t i = 0; i < inner; i++) row[i] += b[c];
    }
  return PMAP_SUCCESS;
}

static pmap_status cpu_bias_backward(pmap_device *dev, const float *dy, float *db, int64_t outer,
                                     int64_t ch, int64_t inner) {
  (void)dev;
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

static pmap_status cpu_relu_forward(pmap_device *dev, const float *x, float *y, size_t n) {
  (void)dev;
  for (size_t i = 0; i < n; i++) y[i] = pmap_relu(x[i]);
  return PMAP_SUCCESS;
}

static pmap_status cpu_relu_backward(pmap_device *dev, const float *y, const float *dy, float *dx,
                                     size_t n) {
  (void)dev;
  for (size_t i = 0; i < n; i++) dx[i] = pmap_relu_grad(y[i], dy[i]);
  return PMAP_SUCCESS;
}

static pmap_status cpu_mse(pmap_device *dev, const float *pred, const float *t, size_t n,
                           float *dpred, float *loss) {
  (void)dev;
  double sum = 0.0;
  float scale = n ? 2.0f / (float)n : 0.0f;
  for (size_t i = 0; i < n; i++) {
    sum += pmap_mse_term(pred[i], t[i]);
    dpred[i] = pmap_mse_grad(pred[i], t[i], scale);
  }
  *loss = n ? (float)(sum / (double)n) : 0.0f;
  return PMAP_SUCCESS;
}

static pmap_status cpu_softmax_xent(pmap_device *dev, const float *logits, const int32_t *labels,
                                    int64_t rows, int64_t k, float *dlogits, float *loss) {
  (void)dev;
  double sum = 0.0;
  float scale = rows ? 1.0f / (float)rows : 0.0f;
  for (int64_t r = 0; r < rows; r++)
    sum += pmap_xent_row(logits + r * k, labels[r], k, scale, dlogits + r * k);
  *loss = rows ? (float)(sum / (double)rows) : 0.0f;
  return PMAP_SUCCESS;
}

static pmap_status cpu_sgd_step(pmap_device *dev, float *w, const float *g, float *v, size_t n,
                                const pmap_step_hyper *h) {
  (void)dev;
  const float lr = h->lr, momentum = h->momentum, wd = h->weight_decay;
  if (momentum == 0.0f && wd == 0.0f) {
    for (size_t i = 0; i < n; i++) w[i] -= lr * g[i];
  } else if (momentum == 0.0f) {
    float unused = 0.0f;
    for (size_t i = 0; i < n; i++) pmap_sgd_update(&w[i], g[i], &unused, lr, 0.0f, 0, wd);
  } else {
    for (size_t i = 0; i < n; i++)
      pmap_sgd_update(&w[i], g[i], &v[i], lr, momentum, h->nesterov, wd);
  }
  return PMAP_SUCCESS;
}

static pmap_status cpu_adam_step(pmap_device *dev, float *w, const float *g, float *m, float *v,
                                 size_t n, const pmap_step_hyper *h) {
  (void)dev;
  for (size_t i = 0; i < n; i++)
    pmap_adam_update(&w[i], g[i], &m[i], &v[i], h->lr, h->beta1, h->beta2, h->eps, h->bc1, h->bc2,
                     h->weight_decay);
  return PMAP_SUCCESS;
}

/* Eight partial sums, added in a fixed order at the end: deterministic, and eight independent
 * chains instead of one, so the pass runs at memory speed rather than at one add's latency. */
static pmap_status cpu_norm2(pmap_device *dev, const float *x, size_t n, float *norm) {
  (void)dev;
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += (double)x[i + k] * (double)x[i + k];
  for (; i < n; i++) acc[i % 8] += (double)x[i] * (double)x[i];
  double sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  *norm = (float)sqrt(sum);
  return PMAP_SUCCESS;
}

static pmap_status cpu_scale(pmap_device *dev, float *x, float s, size_t n) {
  (void)dev;
  for (size_t i = 0; i < n; i++) x[i] *= s;
  return PMAP_SUCCESS;
}

static pmap_status cpu_axpy(pmap_device *dev, float alpha, const float *x, float *y, size_t n) {
  (void)dev;
  for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
  return PMAP_SUCCESS;
}

const pmap_ops pmap_cpu_ops = {
    .gemm = cpu_gemm,
    .fill = cpu_fill,
    .copy = cpu_copy,
    .bias_forward = cpu_bias_forward,
    .bias_backward = cpu_bias_backward,
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .conv2d_forward = cpu_conv2d_forward,
    .conv2d_backward = cpu_conv2d_backward,
    .mse = cpu_mse,
    .softmax_xent = cpu_softmax_xent,
    .sgd_step = cpu_sgd_step,
    .adam_step = cpu_adam_step,
    .norm2 = cpu_norm2,
    .scale = cpu_scale,
    .axpy = cpu_axpy,
    .act_forward = cpu_act_forward,
    .act_backward = cpu_act_backward,
    .add = cpu_add,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .pool2d_forward = cpu_pool2d_forward,
    .pool2d_backward = cpu_pool2d_backward,
    .dropout_forward = cpu_dropout_forward,
    .dropout_backward = cpu_dropout_backward,
    .bn_stats = cpu_bn_stats,
    .bn_forward = cpu_bn_forward,
    .bn_backward_sums = cpu_bn_backward_sums,
    .bn_backward_dx = cpu_bn_backward_dx,
};
