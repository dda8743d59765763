/* layers.c: the per-kind parts of every layer: the builders of the layers beyond dense and conv
 * (shape rule and parameter layout), and for every kind its initialiser, forward and backward,
 * each a switch without default. Forward and backward go through the op table only. */
#include <math.h>
#include <string.h>

#include "model.h"
#include "ops/op_math.h"
#include "rng.h"
#include "runtime/backend.h"
#include "base/error.h"

#define LAYERNORM_EPS 1e-6f /* flax.linen.LayerNorm's default */
#define BATCHNORM_EPS 1e-5f /* flax.linen.BatchNorm's default */
#define BATCHNORM_MOMENTUM 0.9f

int layer_is_view(const layer *l) {
  switch (l->kind) {
  case LAYER_FLATTEN:
  case LAYER_RES_BEGIN: return 1;
  case LAYER_DENSE:
  case LAYER_RELU:
  case LAYER_CONV2D:
  case LAYER_TANH:
  case LAYER_SIGMOID:
  case LAYER_GELU:
  case LAYER_LAYERNORM:
  case LAYER_MAXPOOL2D:
  case LAYER_AVGPOOL2D:
  case LAYER_DROPOUT:
  case LAYER_BATCHNORM:
  case LAYER_RES_END: return 0;
  }
  return 0;
}

int model_has_collectives(const pmap_model *m) {
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].kind == LAYER_BATCHNORM) return 1;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Builders                                                                                   */

static pmap_status check(const pmap_model *m, const char *call) {
  if (!m) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: model is NULL", call);
  return PMAP_SUCCESS;
}

/* A layer whose output has the shape of its input. */
static layer same_shape(const pmap_model *m, layer_kind kind) {
  layer l = {.kind = kind};
  model_current_shape(m, &l.out_rank, l.out_shape, &l.out_size);
  return l;
}

static pmap_status add_same(pmap_model *m, layer_kind kind, const char *call) {
  PMAP_TRY(check(m, call));
  return model_push(m, same_shape(m, kind), call);
}

pmap_status pmap_model_add_tanh(pmap_model *m) {
  return add_same(m, LAYER_TANH, "pmap_model_add_tanh");
}

pmap_status pmap_model_add_sigmoid(pmap_model *m) {
  return add_same(m, LAYER_SIGMOID, "pmap_model_add_sigmoid");
}

pmap_status pmap_model_add_gelu(pmap_model *m) {
  return add_same(m, LAYER_GELU, "pmap_model_add_gelu");
}

pmap_status pmap_model_add_layernorm(pmap_model *m) {
  const char *call = "pmap_model_add_layernorm";
  PMAP_TRY(check(m, call));
  layer l = same_shape(m, LAYER_LAYERNORM);
  l.w_size = l.b_size = (size_t)l.out_size;
  l.eps = LAYERNORM_EPS;
  l.aux_rows = 2; /* mean, rstd */
  return model_push(m, l, call);
}

/* Pooling over windows kh x kw; global: the whole plane, output rank 1 (C). */
static pmap_status add_pool(pmap_model *m, layer_kind kind, int kh, int kw, int stride, int global,
                            const char *call) {
  PMAP_TRY(check(m, call));
  int rank;
  int64_t s[3], size;
  model_current_shape(m, &rank, s, &size);
  if (rank != 3)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: input of rank %d; pooling needs (C, H, W)",
                    call, rank);
  if (global) {
    if (s[1] > (1 << 16) || s[2] > (1 << 16))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: plane %lldx%lld is too large", call,
                      (long long)s[1], (long long)s[2]);
    kh = (int)s[1], kw = (int)s[2], stride = 1;
  }
  if (kh <= 0 || kw <= 0 || stride <= 0 || kh > 64 || kw > 64 || stride > 64)
    if (!global)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: window %dx%d, stride %d: need window 1..64 and stride 1..64", call, kh,
                      kw, stride);
  if (kh > s[1] || kw > s[2])
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: window %dx%d does not fit input %lldx%lld",
                    call, kh, kw, (long long)s[1], (long long)s[2]);
  int64_t oh = (s[1] - kh) / stride + 1, ow = (s[2] - kw) / stride + 1;
  layer l = {.kind = kind, .out_rank = global ? 1 : 3};
  l.pool = (pmap_pool_shape){s[0], s[1], s[2], oh, ow, kh, kw, stride};
  l.out_size = s[0] * oh * ow;
  if (global)
    l.out_shape[0] = s[0];
  else
    l.out_shape[0] = s[0], l.out_shape[1] = oh, l.out_shape[2] = ow;
  return model_push(m, l, call);
}

pmap_status pmap_model_add_maxpool2d(pmap_model *m, int kernel_h, int kernel_w, int stride) {
  return add_pool(m, LAYER_MAXPOOL2D, kernel_h, kernel_w, stride, 0, "pmap_model_add_maxpool2d");
}

pmap_status pmap_model_add_avgpool2d(pmap_model *m, int kernel_h, int kernel_w, int stride) {
  return add_pool(m, LAYER_AVGPOOL2D, kernel_h, kernel_w, stride, 0, "pmap_model_add_avgpool2d");
}

pmap_status pmap_model_add_global_avgpool(pmap_model *m) {
  return add_pool(m, LAYER_AVGPOOL2D, 0, 0, 0, 1, "pmap_model_add_global_avgpool");
}

pmap_status pmap_model_add_dropout(pmap_model *m, float rate) {
  const char *call = "pmap_model_add_dropout";
  PMAP_TRY(check(m, call));
  if (!(rate >= 0.0f && rate < 1.0f))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: rate %g is outside [0, 1)", call, (double)rate);
  layer l = same_shape(m, LAYER_DROPOUT);
  l.rate = rate;
  return model_push(m, l, call);
}

pmap_status pmap_model_add_batchnorm(pmap_model *m, int cross_replica) {
  const char *call = "pmap_model_add_batchnorm";
  PMAP_TRY(check(m, call));
  layer l = same_shape(m, LAYER_BATCHNORM);
  l.channels = l.out_rank == 3 ? l.out_shape[0] : l.out_size;
  l.inner = l.out_rank == 3 ? l.out_shape[1] * l.out_shape[2] : 1;
  l.w_size = l.b_size = (size_t)l.channels;
  l.s_size = 2 * (size_t)l.channels;
  l.eps = BATCHNORM_EPS;
  l.momentum = BATCHNORM_MOMENTUM;
  l.cross_replica = cross_replica != 0;
  /* three statistics buffers of 3C + 1 (ops.h bn_stats) | backward sums (2C) */
  l.aux_fixed = 11 * (size_t)l.channels + 3;
  return model_push(m, l, call);
}

pmap_status pmap_model_begin_residual(pmap_model *m) {
  const char *call = "pmap_model_begin_residual";
  PMAP_TRY(check(m, call));
  if (m->n_open == MODEL_MAX_NESTING)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: more than %d residual blocks open at once",
                    call, MODEL_MAX_NESTING);
  PMAP_TRY(model_push(m, same_shape(m, LAYER_RES_BEGIN), call));
  m->open[m->n_open++] = m->n_layers - 1;
  return PMAP_SUCCESS;
}

pmap_status pmap_model_end_residual(pmap_model *m) {
  const char *call = "pmap_model_end_residual";
  PMAP_TRY(check(m, call));
  if (m->n_open == 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: no residual block is open", call);
  int b = m->open[m->n_open - 1];
  layer l = same_shape(m, LAYER_RES_END);
  const layer *begin = &m->layers[b];
  if (l.out_rank != begin->out_rank ||
      memcmp(l.out_shape, begin->out_shape, sizeof l.out_shape) != 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the block maps (%lld, %lld, %lld) to (%lld, %lld, %lld); y = x + f(x) "
                    "needs f to keep the shape",
                    call, (long long)begin->out_shape[0], (long long)begin->out_shape[1],
                    (long long)begin->out_shape[2], (long long)l.out_shape[0],
                    (long long)l.out_shape[1], (long long)l.out_shape[2]);
  l.skip = b;
  PMAP_TRY(model_push(m, l, call));
  m->layers[b].skip = m->n_layers - 1;
  m->n_open--;
  return PMAP_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Initialisers                                                                               */

/* A norm's scale 1 and shift 0. */
static void init_norm(const layer *l, float *w) {
  for (size_t j = 0; j < l->w_size; j++) w[l->w_off + j] = 1.0f;
  memset(w + l->b_off, 0, l->b_size * sizeof *w);
}

void layer_init(const pmap_model *m, int i, pmap_rng *rng, float *w) {
  const layer *l = &m->layers[i];
  switch (l->kind) {
  case LAYER_DENSE:
  case LAYER_CONV2D: {
    /* He normal in front of a ReLU, LeCun normal elsewhere; zero biases. */
    int relu_next = i + 1 < m->n_layers && m->layers[i + 1].kind == LAYER_RELU;
    double std = sqrt((relu_next ? 2.0 : 1.0) / (double)l->fan_in);
    for (size_t j = 0; j < l->w_size; j++) w[l->w_off + j] = (float)(std * pmap_rng_normal(rng));
    memset(w + l->b_off, 0, l->b_size * sizeof *w);
    break;
  }
  case LAYER_BATCHNORM:
    /* running mean 0, running var 1 */
    memset(w + l->s_off, 0, (size_t)l->channels * sizeof *w);
    for (size_t j = 0; j < (size_t)l->channels; j++) w[l->s_off + (size_t)l->channels + j] = 1.0f;
    init_norm(l, w);
    break;
  case LAYER_LAYERNORM: init_norm(l, w); break;
  case LAYER_RELU:
  case LAYER_FLATTEN:
  case LAYER_TANH:
  case LAYER_SIGMOID:
  case LAYER_GELU:
  case LAYER_MAXPOOL2D:
  case LAYER_AVGPOOL2D:
  case LAYER_DROPOUT:
  case LAYER_RES_BEGIN:
  case LAYER_RES_END: break;
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Forward and backward                                                                       */

static pmap_act act_of(layer_kind k) {
  return k == LAYER_TANH ? PMAP_ACT_TANH : k == LAYER_SIGMOID ? PMAP_ACT_SIGMOID : PMAP_ACT_GELU;
}

/* Dropout's key: layer i at step r->step; the element index adds the device's global offset,
 * so the mask does not depend on how the batch is split. */
static uint64_t dropout_key(const replica *r, int i) {
  return pmap_dropout_key((uint64_t)r->step, (uint64_t)i * 0x9e3779b97f4a7c15ull);
}

static uint64_t dropout_first(pmap_device *dev, const replica *r, const layer *l, int64_t bd) {
  int64_t row0 = r->has_row0 ? r->row0 : (int64_t)dev->index * bd;
  return (uint64_t)row0 * (uint64_t)l->out_size;
}

/* Batch norm's scratch: three statistics buffers of 3C + 1 floats (ops.h bn_stats), the first
 * the normalisation's (backward reads it), then the backward sums (2C). */
static float *bn_buf(const replica *r, const layer *l, int i, int k) {
  return r->aux[i] + (size_t)k * (3 * (size_t)l->channels + 1);
}
static float *bn_sums_of(const replica *r, const layer *l, int i) { return bn_buf(r, l, i, 3); }

/* Statistics in two passes, the second around the first's mean: a + (all-reduce) -> b (+
 * all-reduce); only the sums and the count travel, the shifts agree already. */
static pmap_status bn_two_pass(pmap_device *dev, replica *r, const layer *l, const float *in,
                               int64_t bd, int reduce, float *a, float *b) {
  const pmap_ops *ops = r->ops;
  int64_t c = l->channels;
  size_t sums = 2 * (size_t)c + 1;
  PMAP_TRY(ops->bn_stats(r->q, in, bd, c, l->inner, NULL, a));
  if (reduce)
    PMAP_TRY(backend_all_reduce(dev, "batch norm's statistics", a, a, sums, PMAP_RED_SUM));
  PMAP_TRY(ops->bn_stats(r->q, in, bd, c, l->inner, a, b));
  if (reduce)
    PMAP_TRY(backend_all_reduce(dev, "batch norm's statistics", b, b, sums, PMAP_RED_SUM));
  return PMAP_SUCCESS;
}

/* Training-mode batch norm: the statistics of this device's shard, all-reduced when
 * cross_replica; the running statistics always move with the global batch's, so every replica
 * keeps the same values. */
static pmap_status batchnorm_forward(pmap_device *dev, const layer *l, replica *r, int i,
                                     const float *in, float *out, int64_t bd) {
  const pmap_ops *ops = r->ops;
  int64_t c = l->channels;
  float *stats = bn_buf(r, l, i, 0), *first = bn_buf(r, l, i, 1), *global = stats;
  const float *gamma = r->w + l->w_off, *beta = r->w + l->b_off;
  if (r->inference)
    return ops->bn_forward(r->q, in, NULL, NULL, r->w + l->s_off, gamma, beta, bd, c, l->inner,
                           l->eps, l->momentum, 0, out);
  /* Training: the new running statistics go to the step's pending state, which the step
   * commits once its verdict is in (models/model.h replica.pending). */
  float *running = r->pending ? r->pending + l->st_off : NULL;
  PMAP_TRY(bn_two_pass(dev, r, l, in, bd, l->cross_replica, first, stats));
  if (!l->cross_replica) {
    global = bn_buf(r, l, i, 2);
    PMAP_TRY(bn_two_pass(dev, r, l, in, bd, 1, first, global));
  }
  return ops->bn_forward(r->q, in, stats, global, running, gamma, beta, bd, c, l->inner, l->eps,
                         l->momentum, 1, out);
}

/* Parameter gradients from this shard's sums (the step's all-reduce averages them); dx from
 * the sums over the same batch the statistics came from. */
static pmap_status batchnorm_backward(pmap_device *dev, const layer *l, replica *r, int i,
                                      const float *dy, float *dx, int64_t bd) {
  const pmap_ops *ops = r->ops;
  int64_t c = l->channels;
  float *stats = bn_buf(r, l, i, 0), *sums = bn_sums_of(r, l, i);
  PMAP_TRY(ops->bn_backward_sums(r->q, r->in[i], dy, stats, bd, c, l->inner, l->eps, sums));
  PMAP_TRY(ops->add(r->q, r->g + l->w_off, sums + c, r->g + l->w_off, (size_t)c));
  PMAP_TRY(ops->add(r->q, r->g + l->b_off, sums, r->g + l->b_off, (size_t)c));
  if (!dx) return PMAP_SUCCESS;
  if (l->cross_replica)
    PMAP_TRY(
        backend_all_reduce(dev, "batch norm's backward", sums, sums, 2 * (size_t)c, PMAP_RED_SUM));
  return ops->bn_backward_dx(r->q, r->in[i], dy, stats, r->w + l->w_off, sums, bd, c, l->inner,
                             l->eps, dx);
}

pmap_status layer_forward(pmap_device *dev, const pmap_model *m, replica *r, int i, const float *in,
                          int64_t bd) {
  const pmap_ops *ops = r->ops;
  const layer *l = &m->layers[i];
  float *out = r->act[i];
  size_t n = (size_t)(bd * l->out_size);
  switch (l->kind) {
  case LAYER_DENSE:
    /* out (bd, units) = in (bd, F) W (F, units) + b */
    PMAP_TRY(ops->gemm(r->q, 0, 0, bd, l->out_size, l->in_size, 1.0f, in, l->in_size,
                       r->w + l->w_off, l->out_size, 0.0f, out, l->out_size));
    PMAP_TRY(ops->bias_forward(r->q, out, r->w + l->b_off, bd, l->out_size, 1));
    break;
  case LAYER_RELU: PMAP_TRY(ops->relu_forward(r->q, in, out, n)); break;
  case LAYER_CONV2D:
    PMAP_TRY(ops->conv2d_forward(r->q, &l->conv, bd, in, r->w + l->w_off, out, r->col));
    PMAP_TRY(
        ops->bias_forward(r->q, out, r->w + l->b_off, bd, l->conv.oc, l->conv.oh * l->conv.ow));
    break;
  case LAYER_FLATTEN:
  case LAYER_RES_BEGIN:
    out = (float *)in; /* a view: NCHW examples are already contiguous rows */
    break;
  case LAYER_TANH:
  case LAYER_SIGMOID:
  case LAYER_GELU: PMAP_TRY(ops->act_forward(r->q, act_of(l->kind), in, out, n)); break;
  case LAYER_LAYERNORM:
    PMAP_TRY(ops->layernorm_forward(r->q, in, r->w + l->w_off, r->w + l->b_off, bd, l->in_size,
                                    l->eps, out, r->aux[i]));
    break;
  case LAYER_MAXPOOL2D:
  case LAYER_AVGPOOL2D:
    PMAP_TRY(ops->pool2d_forward(r->q, l->kind == LAYER_MAXPOOL2D, &l->pool, bd, in, out));
    break;
  case LAYER_DROPOUT:
    if (r->inference || l->rate == 0.0f)
      out = (float *)in;
    else
      PMAP_TRY(ops->dropout_forward(r->q, in, out, n, l->rate, dropout_key(r, i),
                                    dropout_first(dev, r, l, bd)));
    break;
  case LAYER_BATCHNORM: PMAP_TRY(batchnorm_forward(dev, l, r, i, in, out, bd)); break;
  case LAYER_RES_END: PMAP_TRY(ops->add(r->q, in, r->out[l->skip], out, n)); break;
  }
  r->out[i] = out;
  return PMAP_SUCCESS;
}

pmap_status layer_backward(pmap_device *dev, const pmap_model *m, replica *r, int i,
                           const float *dy, float *dx, const float **dx_out, int64_t bd) {
  const pmap_ops *ops = r->ops;
  const layer *l = &m->layers[i];
  size_t n = (size_t)(bd * l->out_size);
  switch (l->kind) {
  case LAYER_DENSE:
    /* dW (F, units) += in^T (F, bd) dy (bd, units); db += sum_rows dy */
    PMAP_TRY(ops->gemm(r->q, 1, 0, l->in_size, l->out_size, bd, 1.0f, r->in[i], l->in_size, dy,
                       l->out_size, 1.0f, r->g + l->w_off, l->out_size));
    PMAP_TRY(ops->bias_backward(r->q, dy, r->g + l->b_off, bd, l->out_size, 1));
    /* dx (bd, F) = dy (bd, units) W^T (units, F) */
    if (dx)
      PMAP_TRY(ops->gemm(r->q, 0, 1, bd, l->in_size, l->out_size, 1.0f, dy, l->out_size,
                         r->w + l->w_off, l->out_size, 0.0f, dx, l->in_size));
    break;
  case LAYER_RELU:
    if (dx) PMAP_TRY(ops->relu_backward(r->q, r->out[i], dy, dx, n));
    break;
  case LAYER_CONV2D:
    PMAP_TRY(ops->conv2d_backward(r->q, &l->conv, bd, r->in[i], r->w + l->w_off, dy, dx,
                                  r->g + l->w_off, r->col, r->dcol));
    PMAP_TRY(
        ops->bias_backward(r->q, dy, r->g + l->b_off, bd, l->conv.oc, l->conv.oh * l->conv.ow));
    break;
  case LAYER_FLATTEN:
  case LAYER_RES_END:
    /* a view, as in forward; the residual's skip path picks dy up at its LAYER_RES_BEGIN */
    *dx_out = dx ? dy : NULL;
    return PMAP_SUCCESS;
  case LAYER_RES_BEGIN:
    /* the gradient of f's input plus that of the skip path */
    if (dx) PMAP_TRY(ops->add(r->q, dy, r->dout[l->skip], dx, n));
    break;
  case LAYER_TANH:
  case LAYER_SIGMOID:
  case LAYER_GELU:
    if (dx) PMAP_TRY(ops->act_backward(r->q, act_of(l->kind), r->in[i], r->out[i], dy, dx, n));
    break;
  case LAYER_LAYERNORM:
    PMAP_TRY(ops->layernorm_backward(r->q, r->in[i], r->w + l->w_off, r->aux[i], dy, bd, l->in_size,
                                     dx, r->g + l->w_off, r->g + l->b_off));
    break;
  case LAYER_MAXPOOL2D:
  case LAYER_AVGPOOL2D:
    if (dx)
      PMAP_TRY(
          ops->pool2d_backward(r->q, l->kind == LAYER_MAXPOOL2D, &l->pool, bd, r->in[i], dy, dx));
    break;
  case LAYER_DROPOUT:
    if (dx && l->rate == 0.0f) {
      *dx_out = dy;
      return PMAP_SUCCESS;
    }
    if (dx)
      PMAP_TRY(ops->dropout_backward(r->q, dy, dx, n, l->rate, dropout_key(r, i),
                                     dropout_first(dev, r, l, bd)));
    break;
  case LAYER_BATCHNORM: PMAP_TRY(batchnorm_backward(dev, l, r, i, dy, dx, bd)); break;
  }
  *dx_out = dx;
  return PMAP_SUCCESS;
}
