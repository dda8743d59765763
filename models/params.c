/* params.c: the replicated training state and the data-parallel step. pmap_update validates at
 * the boundary, then every device runs: shard view -> forward -> loss -> backward -> one
 * all-reduce (mean) of [gradients | loss] -> the same optimizer step on every replica. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "params.h"
#include "runtime/backend.h"
#include "runtime/error.h"


static pmap_status check_optimizer(const pmap_optimizer *o) {
  const char *call = "pmap_params_create";
  if (!(o->lr > 0.0f) || !isfinite(o->lr))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: learning rate %g must be > 0 and finite", call,
                    (double)o->lr);
  if (o->kind == PMAP_OPT_SGD) {
    if (!(o->momentum >= 0.0f && o->momentum < 1.0f))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: SGD momentum %g is outside [0, 1)", call,
                      (double)o->momentum);
    return PMAP_SUCCESS;
  }
  if (o->kind == PMAP_OPT_ADAM) {
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f) || !(o->beta2 >= 0.0f && o->beta2 < 1.0f) ||
        !(o->eps > 0.0f) || !isfinite(o->eps))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: Adam beta1 %g, beta2 %g, eps %g: betas must be in [0, 1), eps > 0",
                      call, (double)o->beta1, (double)o->beta2, (double)o->eps);
    return PMAP_SUCCESS;
  }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: unknown optimizer kind %d", call, (int)o->kind);
}

pmap_optimizer pmap_sgd(float lr, float momentum) {
  pmap_optimizer o = {PMAP_OPT_SGD, lr, momentum, 0.0f, 0.0f, 0.0f, 0.0f};
  return o;
}

pmap_optimizer pmap_adam(float lr) {
  pmap_optimizer o = {PMAP_OPT_ADAM, lr, 0.0f, 0.9f, 0.999f, 1e-8f, 0.0f};
  return o;
}

/* Allocates the device's buffers; device 0 uploads the host parameters and a broadcast
 * replicates them, so every replica starts bitwise equal. */
static pmap_status create_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  const pmap_backend_i *be = dev->ctx->be;
  size_t P = p->n_params;
  void *w = NULL, *g = NULL, *opt = NULL;
  PMAP_TRY(be->alloc(dev, P * sizeof(float), &w));
  r->w = w;
  PMAP_TRY(be->alloc(dev, (P + 1) * sizeof(float), &g));
  r->g = g;
  PMAP_TRY(dev->ops->fill(dev, r->g, 0.0f, P + 1));
  if (p->opt_slots) {
    PMAP_TRY(be->alloc(dev, (size_t)p->opt_slots * P * sizeof(float), &opt));
    r->opt = opt;
    PMAP_TRY(dev->ops->fill(dev, r->opt, 0.0f, (size_t)p->opt_slots * P));
  }
  if (dev->index == 0) PMAP_TRY(be->upload(dev, r->w, p->host_w, P * sizeof(float)));
  PMAP_TRY(be->coll->broadcast(dev, r->w, r->w, P, 0));
  if (be->sync) PMAP_TRY(be->sync(dev));
  return PMAP_SUCCESS;
}

static pmap_status destroy_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  const pmap_backend_i *be = dev->ctx->be;
  replica_release(dev, r);
  if (r->w) be->free(dev, r->w);
  if (r->g) be->free(dev, r->g);
  if (r->opt) be->free(dev, r->opt);
  r->w = r->g = r->opt = NULL;
  return PMAP_SUCCESS;
}

void pmap_params_destroy(pmap_params *p) {
  if (!p) return;
  if (p->rep) pmap_ctx_dispatch(p->ctx, destroy_job, p);
  free(p->rep);
  pmap_model_destroy(p->model);
  free(p);
}

pmap_status pmap_params_create(pmap_ctx *ctx, const pmap_model *model, const pmap_optimizer *opt,
                               uint64_t seed, pmap_params **out) {
  const char *call = "pmap_params_create";
  if (!ctx || !model || !opt || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !ctx ? "ctx" : !model ? "model" : !opt ? "opt" : "out");
  *out = NULL;
  if (model->n_layers == 0 || model->n_params == 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the model has %d layers and %zu parameters; it needs at least one "
                    "dense or conv2d layer",
                    call, model->n_layers, model->n_params);
  const layer *last = &model->layers[model->n_layers - 1];
  if (last->out_rank != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the model's output has rank %d; the loss needs rank 1 (add flatten)",
                    call, last->out_rank);
  PMAP_TRY(check_optimizer(opt));
  pmap_params *p = calloc(1, sizeof *p);
  float *host_w = malloc(model->n_params * sizeof *host_w);
  pmap_status st = PMAP_ERR_OUT_OF_MEMORY;
  if (!p || !host_w) {
    free(p);
    free(host_w);
    return PMAP_ERR(st, "%s: out of memory for %zu parameters", call, model->n_params);
  }
  p->ctx = ctx;
  p->opt = *opt;
  p->n_params = model->n_params;
  p->opt_slots = opt->kind == PMAP_OPT_ADAM ? 2 : opt->momentum != 0.0f ? 1 : 0;
  p->rep = calloc((size_t)ctx->n, sizeof *p->rep);
  if (!p->rep) {
    pmap_error_set(st, "%s: out of memory", call);
    goto fail;
  }
  PMAP_TRY_GOTO(st, model_clone(model, &p->model), fail);
  model_init_params(model, seed, host_w);
  p->host_w = host_w;
  PMAP_TRY_GOTO(st, pmap_ctx_dispatch(ctx, create_job, p), fail);
  p->host_w = NULL;
  free(host_w);
  *out = p;
  return PMAP_SUCCESS;
fail:
  free(host_w);
  pmap_params_destroy(p);
  return st;
}

size_t pmap_params_count(const pmap_params *p) { return p ? p->n_params : 0; }
int64_t pmap_params_step(const pmap_params *p) { return p ? p->step : 0; }

/* ------------------------------------------------------------------------------------------ */

static int64_t numel_from(const pmap_array *a, int first_axis) {
  int64_t n = 1;
  for (int i = first_axis; i < a->rank; i++) n *= a->shape[i];
  return n;
}

/* Validates xs (and ys when non-NULL) against the model and the device count; sets p->bd. */
static pmap_status check_batch(pmap_params *p, const pmap_array *xs, const pmap_array *ys,
                               const char *call) {
  const pmap_model *m = p->model;
  int n = p->ctx->n;
  if (!xs || !xs->data)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: xs%s is NULL", call, xs ? "->data" : "");
  if (xs->dtype != PMAP_F32)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: xs must be f32, got dtype %d", call,
                    (int)xs->dtype);
  if (xs->rank != m->in_rank + 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: xs has rank %d; the model takes rank %d (batch axis + %d example axes)",
                    call, xs->rank, m->in_rank + 1, m->in_rank);
  for (int i = 0; i < m->in_rank; i++)
    if (xs->shape[i + 1] != m->in_shape[i])
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: xs axis %d has extent %lld; the model's input needs %lld", call, i + 1,
                      (long long)xs->shape[i + 1], (long long)m->in_shape[i]);
  int64_t b = xs->shape[0];
  if (b <= 0 || b % n != 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: global batch %lld is not divisible by %d devices (it must be a positive "
                    "multiple of the device count)",
                    call, (long long)b, n);
  p->bd = b / n;
  if (!ys) return PMAP_SUCCESS;
  if (!ys->data)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys->data is NULL", call);
  int64_t k = m->layers[m->n_layers - 1].out_size;
  if (ys->rank < 1 || ys->rank > PMAP_MAX_RANK || ys->shape[0] != b)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: ys has rank %d and leading extent %lld; it must match xs's batch %lld",
                    call, ys->rank, ys->rank >= 1 ? (long long)ys->shape[0] : -1LL, (long long)b);
  if (m->loss == PMAP_LOSS_MSE) {
    if (ys->dtype != PMAP_F32 || ys->rank != 2 || ys->shape[1] != k)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: MSE needs ys f32 of shape (%lld, %lld); got dtype %d rank %d "
                      "(second extent %lld)",
                      call, (long long)b, (long long)k, (int)ys->dtype, ys->rank,
                      ys->rank >= 2 ? (long long)ys->shape[1] : -1LL);
    return PMAP_SUCCESS;
  }
  if (ys->dtype != PMAP_I32 || numel_from(ys, 1) != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: softmax cross-entropy needs ys i32 labels of shape (%lld) or (%lld, 1); "
                    "got dtype %d rank %d",
                    call, (long long)b, (long long)b, (int)ys->dtype, ys->rank);
  const int32_t *labels = ys->data;
  for (int64_t i = 0; i < b; i++)
    if (labels[i] < 0 || labels[i] >= k)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: label %d at row %lld is outside [0, %lld)", call, (int)labels[i],
                      (long long)i, (long long)k);
  return PMAP_SUCCESS;
}

/* This device's rows of a host array, staged into device memory where the backend needs it. */
static pmap_status shard(pmap_device *dev, const pmap_array *a, int64_t bd, int slot,
                         const void **out) {
  size_t esize = 4; /* f32 and i32 */
  size_t row = (size_t)numel_from(a, 1) * esize;
  const char *host = (const char *)a->data + (size_t)dev->index * (size_t)bd * row;
  if (!dev->ctx->be->stage) {
    *out = host;
    return PMAP_SUCCESS;
  }
  void *d = NULL;
  PMAP_TRY(dev->ctx->be->stage(dev, slot, host, (size_t)bd * row, &d));
  *out = d;
  return PMAP_SUCCESS;
}

static pmap_status update_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  const pmap_model *m = p->model;
  replica *r = &p->rep[dev->index];
  const pmap_ops *ops = dev->ops;
  size_t P = p->n_params;
  const void *x = NULL, *y = NULL;
  PMAP_TRY(shard(dev, p->xs, p->bd, 0, &x));
  PMAP_TRY(shard(dev, p->ys, p->bd, 1, &y));
  PMAP_TRY(replica_reserve(dev, m, r, p->bd));
  PMAP_TRY(ops->fill(dev, r->g, 0.0f, P + 1));
  PMAP_TRY(model_forward(dev, m, r, x, p->bd));
  PMAP_TRY(model_loss(dev, m, r, y, p->bd));
  PMAP_TRY(model_backward(dev, m, r, p->bd));
  /* The one all-reduce of the step: gradients and the loss slot after them. */
  PMAP_TRY(dev->ctx->be->coll->all_reduce(dev, r->g, r->g, P + 1, PMAP_RED_MEAN));
  const pmap_optimizer *o = &p->opt;
  if (o->kind == PMAP_OPT_SGD)
    PMAP_TRY(ops->sgd_step(dev, r->w, r->g, r->opt, P, o->lr, o->momentum));
  else
    PMAP_TRY(ops->adam_step(dev, r->w, r->g, r->opt, r->opt + P, P, o->lr, o->beta1, o->beta2,
                            o->eps, p->bc1, p->bc2));
  if (dev->index == 0)
    PMAP_TRY(dev->ctx->be->download(dev, &p->loss, r->g + P, sizeof p->loss));
  else if (dev->ctx->be->sync)
    PMAP_TRY(dev->ctx->be->sync(dev));
  return PMAP_SUCCESS;
}

pmap_status pmap_update(pmap_params *p, const pmap_array *xs, const pmap_array *ys, float *loss) {
  const char *call = "pmap_update";
  if (!p) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: params is NULL", call);
  if (!ys) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys is NULL", call);
  pmap_status st = check_batch(p, xs, ys, call);
  if (st) return st;
  int64_t t = p->step + 1;
  p->bc1 = (float)(1.0 - pow((double)p->opt.beta1, (double)t));
  p->bc2 = (float)(1.0 - pow((double)p->opt.beta2, (double)t));
  p->xs = xs;
  p->ys = ys;
  st = pmap_ctx_dispatch(p->ctx, update_job, p);
  if (st) return st;
  p->step = t;
  if (loss) *loss = p->loss;
  return PMAP_SUCCESS;
}

static pmap_status predict_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  const pmap_model *m = p->model;
  replica *r = &p->rep[dev->index];
  const void *x = NULL;
  PMAP_TRY(shard(dev, p->xs, p->bd, 0, &x));
  PMAP_TRY(replica_reserve(dev, m, r, p->bd));
  PMAP_TRY(model_forward(dev, m, r, x, p->bd));
  size_t k = (size_t)m->layers[m->n_layers - 1].out_size, rows = (size_t)p->bd;
  float *dst = (float *)p->out->data + (size_t)dev->index * rows * k;
  PMAP_TRY(dev->ctx->be->download(dev, dst, r->out[m->n_layers - 1], rows * k * sizeof(float)));
  return PMAP_SUCCESS;
}

pmap_status pmap_predict(pmap_params *p, const pmap_array *xs, pmap_array *out) {
  const char *call = "pmap_predict";
  if (!p || !out || !out->data)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !p ? "params" : !out ? "out" : "out->data");
  pmap_status st = check_batch(p, xs, NULL, call);
  if (st) return st;
  const layer *last = &p->model->layers[p->model->n_layers - 1];
  if (out->dtype != PMAP_F32 || out->rank != 1 + last->out_rank || out->shape[0] != xs->shape[0] ||
      numel_from(out, 1) != last->out_size)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: out must be f32 (%lld, %lld); got dtype %d rank %d leading extent %lld",
                    call, (long long)xs->shape[0], (long long)last->out_size, (int)out->dtype,
                    out->rank, (long long)out->shape[0]);
  p->xs = xs;
  p->out = out;
  return pmap_ctx_dispatch(p->ctx, predict_job, p);
}

static pmap_status read_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  if (dev->index != p->read_device) return PMAP_SUCCESS;
  return dev->ctx->be->download(dev, p->read_dst, p->rep[dev->index].w,
                                p->n_params * sizeof(float));
}

pmap_status pmap_params_read(const pmap_params *cp, int device, float *dst, size_t count) {
  const char *call = "pmap_params_read";
  if (!cp || !dst)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, cp ? "dst" : "params");
  if (device < 0 || device >= cp->ctx->n)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: device %d is outside [0, %d)", call, device,
                    cp->ctx->n);
  if (count != cp->n_params)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu is not the parameter count %zu",
                    call, count, cp->n_params);
  pmap_params *p = (pmap_params *)cp; /* the job fields are scratch, not state */
  p->read_device = device;
  p->read_dst = dst;
  return pmap_ctx_dispatch(p->ctx, read_job, p);
}

static pmap_status write_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  PMAP_TRY(dev->ctx->be->upload(dev, r->w, p->host_w, p->n_params * sizeof(float)));
  if (dev->ctx->be->sync) PMAP_TRY(dev->ctx->be->sync(dev));
  return PMAP_SUCCESS;
}

pmap_status pmap_params_write(pmap_params *p, const float *src, size_t count) {
  const char *call = "pmap_params_write";
  if (!p || !src)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, p ? "src" : "params");
  if (count != p->n_params)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu is not the parameter count %zu",
                    call, count, p->n_params);
  p->host_w = src;
  pmap_status st = pmap_ctx_dispatch(p->ctx, write_job, p);
  p->host_w = NULL;
  return st;
}
