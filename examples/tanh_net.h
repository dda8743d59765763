/* tanh_net.h: a model pmap does not know, written by hand in plain C: a two-layer tanh network
 * y = tanh(x W1 + b1) W2 + b2 with a mean squared error, as a pmap_grad_fn for the CPU backend
 * (its pointers are host memory there). Used by examples/custom_model.c and tests/test_custom.c.
 * Parameters, flat: W1 (F, H), b1 (H), W2 (H, K), b2 (K). */
#ifndef PMAP_EXAMPLE_TANH_NET_H
#define PMAP_EXAMPLE_TANH_NET_H

#include <math.h>
#include <stdlib.h>

#include "pmap.h"

typedef struct tanh_net {
  int64_t f, h, k; /* inputs, hidden units, outputs */
} tanh_net;

static inline size_t tanh_net_params(const tanh_net *n) {
  return (size_t)(n->f * n->h + n->h + n->h * n->k + n->k);
}

/* Forward over rows examples of x (rows, F) into hid (rows, H) and y (rows, K). */
static inline void tanh_net_forward(const tanh_net *n, const float *w, const float *x, int64_t rows,
                                    float *hid, float *y) {
  const float *w1 = w, *b1 = w1 + n->f * n->h, *w2 = b1 + n->h, *b2 = w2 + n->h * n->k;
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t j = 0; j < n->h; j++) {
      float s = b1[j];
      for (int64_t i = 0; i < n->f; i++) s += x[r * n->f + i] * w1[i * n->h + j];
      hid[r * n->h + j] = tanhf(s);
    }
    for (int64_t o = 0; o < n->k; o++) {
      float s = b2[o];
      for (int64_t j = 0; j < n->h; j++) s += hid[r * n->h + j] * w2[j * n->k + o];
      y[r * n->k + o] = s;
    }
  }
}

/* The pmap_grad_fn: loss = mean over rows and outputs of (y - t)^2; grads += scale * dloss. */
static inline pmap_status tanh_net_grad(const pmap_grad_args *a, void *user) {
  const tanh_net *n = user;
  int64_t rows = a->xs.shape[0];
  const float *x = a->xs.data, *t = a->ys.data, *w = a->params;
  if (a->xs.rank != 2 || a->xs.shape[1] != n->f || a->ys.rank != 2 || a->ys.shape[1] != n->k ||
      a->ys.dtype != PMAP_F32)
    return PMAP_ERR_INVALID_ARGUMENT;
  float *hid = malloc(sizeof *hid * (size_t)(rows * n->h));
  float *y = malloc(sizeof *y * (size_t)(rows * n->k));
  float *dh = malloc(sizeof *dh * (size_t)n->h);
  if (!hid || !y || !dh) {
    free(hid);
    free(y);
    free(dh);
    return PMAP_ERR_OUT_OF_MEMORY;
  }
  tanh_net_forward(n, w, x, rows, hid, y);
  const float *w2 = w + n->f * n->h + n->h;
  float *g1 = a->grads, *gb1 = g1 + n->f * n->h, *g2 = gb1 + n->h, *gb2 = g2 + n->h * n->k;
  double sum = 0.0;
  float c = 2.0f * a->scale / (float)(rows * n->k);
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t j = 0; j < n->h; j++) dh[j] = 0.0f;
    for (int64_t o = 0; o < n->k; o++) {
      float e = y[r * n->k + o] - t[r * n->k + o], dy = c * e;
      sum += (double)e * e;
      gb2[o] += dy;
      for (int64_t j = 0; j < n->h; j++) {
        g2[j * n->k + o] += hid[r * n->h + j] * dy;
        dh[j] += w2[j * n->k + o] * dy;
      }
    }
    for (int64_t j = 0; j < n->h; j++) {
      float hj = hid[r * n->h + j], dz = dh[j] * (1.0f - hj * hj);
      gb1[j] += dz;
      for (int64_t i = 0; i < n->f; i++) g1[i * n->h + j] += x[r * n->f + i] * dz;
    }
  }
  *a->loss = (float)(sum / (double)(rows * n->k));
  free(hid);
  free(y);
  free(dh);
  return PMAP_SUCCESS;
}

#endif
