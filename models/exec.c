/* exec.c: one device's forward, loss and backward over its shard, through the op table only.
 * Forward overwrites activations; backward overwrites activation gradients and accumulates
 * parameter gradients (see ops/ops.h). */
#include <stdint.h>
#include <stdlib.h>

#include "model.h"
#include "runtime/backend.h"
#include "runtime/error.h"

void replica_release(pmap_device *dev, replica *r) {
  backend_free(dev, r->arena);
  r->arena = NULL;
  r->rows = 0;
  free(r->act);
  free(r->dact);
  free(r->in);
  free(r->out);
  r->act = r->dact = NULL;
  r->in = r->out = NULL;
}

int model_arena_floats(const pmap_model *m, int64_t bd, size_t *out) {
  size_t total = 0, per = 0, col = model_col_size(m);
  if (bd < 0 || __builtin_mul_overflow(col, (size_t)2, &total)) return -1;
  for (int i = 0; i < m->n_layers; i++) {
    size_t copies = m->layers[i].kind == LAYER_FLATTEN ? 1 : 2;
    if (__builtin_mul_overflow((size_t)m->layers[i].out_size, (size_t)bd, &per) ||
        __builtin_mul_overflow(per, copies, &per) || __builtin_add_overflow(total, per, &total))
      return -1;
  }
  *out = total;
  return 0;
}

pmap_status replica_reserve(pmap_device *dev, const pmap_model *m, replica *r, int64_t bd) {
  if (bd <= r->rows) return PMAP_SUCCESS;
  replica_release(dev, r);
  int L = m->n_layers;
  size_t total = 0;
  if (model_arena_floats(m, bd, &total) || total > PTRDIFF_MAX / sizeof(float))
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "device %d: the activations of %lld examples take more than the address space",
                    dev->index, (long long)bd);
  r->act = calloc((size_t)L, sizeof *r->act);
  r->dact = calloc((size_t)L, sizeof *r->dact);
  r->in = calloc((size_t)L, sizeof *r->in);
  r->out = calloc((size_t)L, sizeof *r->out);
  void *arena = NULL;
  pmap_status st = PMAP_ERR_OUT_OF_MEMORY;
  if (r->act && r->dact && r->in && r->out)
    st = backend_alloc(dev, total * sizeof(float), &arena);
  else
    pmap_error_set(st, "device %d: out of memory for %d layer pointers", dev->index, L);
  if (st) {
    replica_release(dev, r);
    return st;
  }
  float *p = arena;
  for (int i = 0; i < L; i++) {
    size_t per = (size_t)m->layers[i].out_size * (size_t)bd;
    if (m->layers[i].kind != LAYER_FLATTEN) {
      r->act[i] = p;
      p += per;
    }
    r->dact[i] = p;
    p += per;
  }
  r->col = p;
  r->dcol = p + model_col_size(m);
  r->arena = arena;
  r->rows = bd;
  return PMAP_SUCCESS;
}

pmap_status model_forward(pmap_device *dev, const pmap_model *m, replica *r, const float *x,
                          int64_t bd) {
  const pmap_ops *ops = dev->ops;
  const float *in = x;
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    float *out = r->act[i];
    r->in[i] = in;
    switch (l->kind) {
    case LAYER_DENSE:
      /* out (bd, units) = in (bd, F) W (F, units) + b */
      PMAP_TRY(ops->gemm(dev, 0, 0, bd, l->out_size, l->in_size, 1.0f, in, l->in_size,
                         r->w + l->w_off, l->out_size, 0.0f, out, l->out_size));
      PMAP_TRY(ops->bias_forward(dev, out, r->w + l->b_off, bd, l->out_size, 1));
      break;
    case LAYER_RELU:
      PMAP_TRY(ops->relu_forward(dev, in, out, (size_t)(bd * l->out_size)));
      break;
    case LAYER_CONV2D:
      PMAP_TRY(ops->conv2d_forward(dev, &l->conv, bd, in, r->w + l->w_off, out, r->col));
      PMAP_TRY(ops->bias_forward(dev, out, r->w + l->b_off, bd, l->conv.oc,
                                 l->conv.oh * l->conv.ow));
      break;
    case LAYER_FLATTEN:
      out = (float *)in; /* a view: NCHW examples are already contiguous rows */
      break;
    }
    r->out[i] = out;
    in = out;
  }
  return PMAP_SUCCESS;
}

pmap_status model_loss(pmap_device *dev, const pmap_model *m, replica *r, const void *y,
                       int64_t bd, float *loss) {
  const layer *last = &m->layers[m->n_layers - 1];
  if (m->loss == PMAP_LOSS_MSE)
    PMAP_TRY(dev->ops->mse(dev, r->out[m->n_layers - 1], y, (size_t)(bd * last->out_size),
                           r->dact[m->n_layers - 1], loss));
  else
    PMAP_TRY(dev->ops->softmax_xent(dev, r->out[m->n_layers - 1], y, bd, last->out_size,
                                    r->dact[m->n_layers - 1], loss));
  return PMAP_SUCCESS;
}

pmap_status model_backward(pmap_device *dev, const pmap_model *m, replica *r, int64_t bd) {
  const pmap_ops *ops = dev->ops;
  const float *dy = r->dact[m->n_layers - 1];
  for (int i = m->n_layers - 1; i >= 0; i--) {
    const layer *l = &m->layers[i];
    float *dx = i > 0 ? r->dact[i - 1] : NULL; /* the input needs no gradient */
    switch (l->kind) {
    case LAYER_DENSE:
      /* dW (F, units) += in^T (F, bd) dy (bd, units); db += sum_rows dy */
      PMAP_TRY(ops->gemm(dev, 1, 0, l->in_size, l->out_size, bd, 1.0f, r->in[i], l->in_size, dy,
                         l->out_size, 1.0f, r->g + l->w_off, l->out_size));
      PMAP_TRY(ops->bias_backward(dev, dy, r->g + l->b_off, bd, l->out_size, 1));
      /* dx (bd, F) = dy (bd, units) W^T (units, F) */
      if (dx)
        PMAP_TRY(ops->gemm(dev, 0, 1, bd, l->in_size, l->out_size, 1.0f, dy, l->out_size,
                           r->w + l->w_off, l->out_size, 0.0f, dx, l->in_size));
      break;
    case LAYER_RELU:
      if (dx) PMAP_TRY(ops->relu_backward(dev, r->out[i], dy, dx, (size_t)(bd * l->out_size)));
      break;
    case LAYER_CONV2D:
      PMAP_TRY(ops->conv2d_backward(dev, &l->conv, bd, r->in[i], r->w + l->w_off, dy, dx,
                                    r->g + l->w_off, r->col, r->dcol));
      PMAP_TRY(ops->bias_backward(dev, dy, r->g + l->b_off, bd, l->conv.oc,
                                  l->conv.oh * l->conv.ow));
      break;
    case LAYER_FLATTEN:
      dx = (float *)dy; /* a view, as in forward */
      break;
    }
    if (!dx) break;
    dy = dx;
  }
  return PMAP_SUCCESS;
}
