/* params.c: the replicated training state and the data-parallel step. pmap_update validates at
 * the boundary, then every device runs: shard view -> forward -> loss -> backward -> one
 * all-reduce (mean) of [gradients | loss] -> the same optimizer step on every replica. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "params.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/fault.h"


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

/* Floats of a replica's gradient buffer: [gradients | loss | guard flags (N) | norm]. */
static size_t grad_len(const pmap_params *p) { return p->n_params + 2 + (size_t)p->ctx->n; }

/* Allocates the device's buffers; device 0 uploads the host parameters and a broadcast
 * replicates them, so every replica starts bitwise equal. */
static pmap_status create_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  size_t P = p->n_params;
  void *w = NULL, *g = NULL, *opt = NULL;
  PMAP_TRY(backend_alloc(dev, P * sizeof(float), &w));
  r->w = w;
  PMAP_TRY(backend_alloc(dev, grad_len(p) * sizeof(float), &g));
  r->g = g;
  PMAP_TRY(dev->ops->fill(dev, r->g, 0.0f, grad_len(p)));
  if (p->opt_slots) {
    PMAP_TRY(backend_alloc(dev, (size_t)p->opt_slots * P * sizeof(float), &opt));
    r->opt = opt;
    PMAP_TRY(dev->ops->fill(dev, r->opt, 0.0f, (size_t)p->opt_slots * P));
  }
  if (dev->index == 0) PMAP_TRY(backend_upload(dev, r->w, p->host_w, P * sizeof(float)));
  PMAP_TRY(backend_broadcast(dev, r->w, r->w, P, 0));
  return backend_sync(dev);
}

static pmap_status destroy_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  replica_release(dev, r);
  backend_free(dev, r->w);
  backend_free(dev, r->g);
  backend_free(dev, r->opt);
  r->w = r->g = r->opt = NULL;
  return PMAP_SUCCESS;
}

/* Frees everything; p->ctx's lock is held or p was never handed out. */
static void params_free(pmap_params *p) {
  if (p->rep) pmap_ctx_dispatch(p->ctx, destroy_job, p);
  free(p->rep);
  free(p->guard_host);
  pmap_model_destroy(p->model);
  free(p);
}

void pmap_params_destroy(pmap_params *p) {
  if (!p) return;
  pmap_ctx *ctx = p->ctx;
  if (pmap_ctx_lock(ctx, "pmap_params_destroy")) return;
  params_free(p);
  atomic_fetch_sub(&ctx->live_params, 1);
  pmap_ctx_unlock(ctx);
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
  p->guard = ctx->numeric_guard == PMAP_GUARD_ON;
  p->rep = calloc((size_t)ctx->n, sizeof *p->rep);
  p->guard_host = calloc((size_t)ctx->n * ((size_t)ctx->n + 2), sizeof *p->guard_host);
  if (!p->rep || !p->guard_host) {
    free(p->rep);
    free(p->guard_host);
    free(p);
    free(host_w);
    return PMAP_ERR(st, "%s: out of memory", call);
  }
  st = pmap_ctx_lock(ctx, call);
  if (st) {
    free(p->rep);
    free(p->guard_host);
    free(p);
    free(host_w);
    return st;
  }
  PMAP_TRY_GOTO(st, model_clone(model, &p->model), fail);
  model_init_params(model, seed, host_w);
  p->host_w = host_w;
  PMAP_TRY_GOTO(st, pmap_ctx_dispatch(ctx, create_job, p), fail);
  p->host_w = NULL;
  free(host_w);
  atomic_fetch_add(&ctx->live_params, 1);
  pmap_ctx_unlock(ctx);
  *out = p;
  return PMAP_SUCCESS;
fail: {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", pmap_error_message());
  free(host_w);
  params_free(p);
  pmap_ctx_unlock(ctx);
  pmap_error_set(st, "%s", msg);
  return st;
}
}

size_t pmap_params_count(const pmap_params *p) { return p ? p->n_params : 0; }
int64_t pmap_params_step(const pmap_params *p) { return p ? p->step : 0; }

/* ------------------------------------------------------------------------------------------ */

static const char *dtype_name(pmap_dtype t) {
  switch (t) {
  case PMAP_F32: return "f32";
  case PMAP_I32: return "i32";
  }
  return "unknown";
}

/* Elements of a's axes [first, rank): -1 unless every extent is >= 1 and the product fits. */
static int64_t numel_from(const pmap_array *a, int first_axis) {
  int64_t n = 1;
  for (int i = first_axis; i < a->rank; i++)
    if (a->shape[i] < 1 || __builtin_mul_overflow(n, a->shape[i], &n)) return -1;
  return n;
}

/* "(4, -1, 7)" into buf. */
static const char *shape_str(const pmap_array *a, char *buf, size_t size) {
  size_t len = (size_t)snprintf(buf, size, "(");
  for (int i = 0; i < a->rank && i < PMAP_MAX_RANK && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
  if (len < size) snprintf(buf + len, size - len, ")");
  return buf;
}

static pmap_status check_ys(pmap_params *p, const pmap_array *ys, int64_t b, const char *call) {
  const pmap_model *m = p->model;
  char sh[160];
  if (!ys->data) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys->data is NULL", call);
  int64_t k = m->layers[m->n_layers - 1].out_size;
  if (ys->rank < 1 || ys->rank > PMAP_MAX_RANK)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys has rank %d; it must be 1..%d", call,
                    ys->rank, PMAP_MAX_RANK);
  if (ys->shape[0] != b)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: ys has leading extent %lld (shape %s); it must match xs's batch %lld",
                    call, (long long)ys->shape[0], shape_str(ys, sh, sizeof sh), (long long)b);
  if (numel_from(ys, 1) < 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: ys has shape %s; every extent must be positive and their product must "
                    "fit in 64 bits",
                    call, shape_str(ys, sh, sizeof sh));
  if (m->loss == PMAP_LOSS_MSE) {
    if (ys->dtype != PMAP_F32 || ys->rank != 2 || ys->shape[1] != k)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: MSE needs ys f32 of shape (%lld, %lld); got %s %s", call, (long long)b,
                      (long long)k, dtype_name(ys->dtype), shape_str(ys, sh, sizeof sh));
    return PMAP_SUCCESS;
  }
  if (ys->dtype != PMAP_I32 || numel_from(ys, 1) != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: softmax cross-entropy needs ys i32 labels of shape (%lld) or (%lld, 1); "
                    "got %s %s",
                    call, (long long)b, (long long)b, dtype_name(ys->dtype),
                    shape_str(ys, sh, sizeof sh));
  const int32_t *labels = ys->data;
  for (int64_t i = 0; i < b; i++)
    if (labels[i] < 0 || labels[i] >= k)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: label %d at row %lld is outside [0, %lld)", call, (int)labels[i],
                      (long long)i, (long long)k);
  return PMAP_SUCCESS;
}

/* Validates xs (and ys when non-NULL) against the model and the device count, and that the
 * activation memory of the per-device batch is addressable; sets p->bd. */
static pmap_status check_batch(pmap_params *p, const pmap_array *xs, const pmap_array *ys,
                               const char *call) {
  const pmap_model *m = p->model;
  int n = p->ctx->n;
  char sh[160];
  if (!xs || !xs->data)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: xs%s is NULL", call, xs ? "->data" : "");
  if (xs->dtype != PMAP_F32)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: xs must be f32, got %s", call,
                    dtype_name(xs->dtype));
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
  if (b > PTRDIFF_MAX / 4 / m->in_size)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: xs of shape %s holds more bytes than the address space", call,
                    shape_str(xs, sh, sizeof sh));
  p->bd = b / n;
  size_t floats = 0;
  if (model_arena_floats(m, p->bd, &floats) || floats > PTRDIFF_MAX / sizeof(float))
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "%s: the activations of %lld examples per device would take more than the "
                    "address space (the model has %d layers)",
                    call, (long long)p->bd, m->n_layers);
  return ys ? check_ys(p, ys, b, call) : PMAP_SUCCESS;
}

/* This device's rows of a host array, staged into device memory where the backend needs it. */
static pmap_status shard(pmap_device *dev, const pmap_array *a, int64_t bd, int slot,
                         const void **out) {
  size_t row = (size_t)numel_from(a, 1) * 4; /* f32 and i32 */
  const char *host = (const char *)a->data + (size_t)dev->index * (size_t)bd * row;
  return backend_stage(dev, slot, host, (size_t)bd * row, out);
}

/* Device `dev` waits as if hung, until another device gives up on it (or 10 timeouts pass). */
static void stall(pmap_device *dev) {
  pmap_ctx *ctx = dev->ctx;
  int64_t limit = ctx->wait.timeout_ns >= 0 ? 10 * ctx->wait.timeout_ns : 1000000000;
  int64_t start = pmap_now_ns();
  struct timespec ms = {0, 1000000};
  while (!atomic_load(&ctx->abort) && pmap_now_ns() - start < limit) nanosleep(&ms, NULL);
}

/* The fault hooks of a step before its all-reduce (runtime/fault.h). */
static pmap_status inject_before_reduce(pmap_device *dev, pmap_params *p, replica *r) {
  pmap_fault *f = dev->ctx->fault;
  int d = dev->index;
  if (pmap_fault_fires(f, FAULT_NAN, d, p->step))
    PMAP_TRY(dev->ops->fill(dev, r->g, NAN, p->n_params));
  if (pmap_fault_fires(f, FAULT_COLLECTIVE, d, p->step))
    return PMAP_ERR(PMAP_ERR_DEVICE,
                    "device %d: the gradient all-reduce of step %lld failed (injected by "
                    "PMAP_FAULT)",
                    d, (long long)p->step);
  if (pmap_fault_fires(f, FAULT_STALL, d, p->step)) stall(dev);
  return PMAP_SUCCESS;
}

/* Moves one parameter of this replica by one ulp (runtime/fault.h: drift). */
static pmap_status drift(pmap_device *dev, replica *r) {
  float w0 = 0.0f;
  PMAP_TRY(backend_download(dev, &w0, r->w, sizeof w0));
  w0 = nextafterf(w0, INFINITY);
  PMAP_TRY(backend_upload(dev, r->w, &w0, sizeof w0));
  return backend_sync(dev);
}

/* After the all-reduce: the numeric guard and the clipping scale. Every replica holds the same
 * averaged [gradients | loss | flags] and reads the same norm, so every replica decides the
 * same. Returns the scale for the gradients, 0 to skip the step. */
static pmap_status guard_and_clip(pmap_device *dev, pmap_params *p, replica *r, float *scale) {
  int n = dev->ctx->n;
  size_t P = p->n_params;
  float *h = p->guard_host + (size_t)dev->index * ((size_t)n + 2); /* loss, flags (n), norm */
  *scale = 1.0f;
  PMAP_TRY(dev->ops->norm2(dev, r->g, P, r->g + P + 1 + n));
  PMAP_TRY(backend_download(dev, h, r->g + P, ((size_t)n + 2) * sizeof *h));
  if (p->guard) {
    int finite = 1;
    for (int i = 0; i < n + 2; i++) finite &= isfinite(h[i]) != 0;
    if (!finite) {
      if (dev->index == 0) p->numeric_bad = 1;
      *scale = 0.0f;
      return PMAP_SUCCESS;
    }
  }
  float clip = p->opt.clip_norm, norm = h[n + 1];
  if (clip > 0.0f && norm > clip) *scale = clip / norm;
  return PMAP_SUCCESS;
}

static pmap_status update_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  const pmap_model *m = p->model;
  replica *r = &p->rep[dev->index];
  const pmap_ops *ops = dev->ops;
  int n = dev->ctx->n;
  size_t P = p->n_params;
  const void *x = NULL, *y = NULL;
  PMAP_TRY(replica_reserve(dev, m, r, p->bd));
  PMAP_TRY(shard(dev, p->xs, p->bd, 0, &x));
  PMAP_TRY(shard(dev, p->ys, p->bd, 1, &y));
  PMAP_TRY(ops->fill(dev, r->g, 0.0f, grad_len(p)));
  PMAP_TRY(model_forward(dev, m, r, x, p->bd));
  PMAP_TRY(model_loss(dev, m, r, y, p->bd));
  PMAP_TRY(model_backward(dev, m, r, p->bd));
  if (dev->ctx->fault) PMAP_TRY(inject_before_reduce(dev, p, r));
  /* The guard's flag of this device: the norm of its own gradients and loss, in its slot; the
   * others' slots are 0, so after the mean a slot is non-finite exactly when its device's
   * values were. */
  if (p->guard) PMAP_TRY(ops->norm2(dev, r->g, P + 1, r->g + P + 1 + dev->index));
  /* The one all-reduce of the step: gradients, the loss slot and the guard flags after them. */
  size_t reduced = P + 1 + (p->guard ? (size_t)n : 0);
  PMAP_TRY(backend_all_reduce(dev, r->g, r->g, reduced, PMAP_RED_MEAN));
  float scale = 1.0f;
  if (p->guard || p->opt.clip_norm > 0.0f) PMAP_TRY(guard_and_clip(dev, p, r, &scale));
  if (scale == 0.0f) return PMAP_SUCCESS; /* skipped: nothing changes on any replica */
  if (scale != 1.0f) PMAP_TRY(ops->scale(dev, r->g, scale, P));
  const pmap_optimizer *o = &p->opt;
  if (o->kind == PMAP_OPT_SGD)
    PMAP_TRY(ops->sgd_step(dev, r->w, r->g, r->opt, P, o->lr, o->momentum));
  else
    PMAP_TRY(ops->adam_step(dev, r->w, r->g, r->opt, r->opt + P, P, o->lr, o->beta1, o->beta2,
                            o->eps, p->bc1, p->bc2));
  if (pmap_fault_fires(dev->ctx->fault, FAULT_DRIFT, dev->index, p->step)) PMAP_TRY(drift(dev, r));
  if (dev->index == 0) return backend_download(dev, &p->loss, r->g + P, sizeof p->loss);
  return backend_sync(dev);
}

/* The message of a step the numeric guard skipped, naming the devices whose own loss or
 * gradients were non-finite (device 0's copy of the flags; every device holds the same). */
static pmap_status numeric_error(const pmap_params *p) {
  int n = p->ctx->n;
  const float *h = p->guard_host;
  char devs[400];
  size_t len = 0;
  devs[0] = '\0';
  for (int d = 0; d < n && len < sizeof devs; d++)
    if (!isfinite(h[1 + d]))
      len += (size_t)snprintf(devs + len, sizeof devs - len, "%s%d", len ? ", " : "", d);
  char what[480];
  if (len)
    /* Across processes a flag slot is shared by local device d of every process. */
    snprintf(what, sizeof what, "the local loss or gradients of %sdevice%s %s%s were non-finite",
             p->ctx->nproc > 1 ? "local " : "", strchr(devs, ',') ? "s" : "", devs,
             p->ctx->nproc > 1 ? " (of some process)" : "");
  else
    snprintf(what, sizeof what,
             "every device's own loss and gradients were finite, their average was not "
             "(overflow)");
  return PMAP_ERR(PMAP_ERR_NUMERIC,
                  "pmap_update: step %lld: %s (averaged loss %g); the step was skipped on every "
                  "replica: parameters, optimizer state and step count are unchanged",
                  (long long)p->step, what, (double)h[0]);
}

/* Across processes the mean weighs every global device alike, which is the global mean only
 * when every process passes as many rows: one exchange checks it when the batch size changes.
 * The values live on the stack: distributed contexts are CPU ones, whose devices read host
 * memory. */
static pmap_status rows_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  float v[2] = {(float)p->bd, -(float)p->bd};
  PMAP_TRY(backend_all_reduce(dev, v, v, 2, PMAP_RED_MAX));
  if (dev->index == 0) memcpy(p->rows, v, sizeof v);
  return PMAP_SUCCESS;
}

static pmap_status check_rows(pmap_params *p) {
  if (!p->ctx->dist || p->bd == p->dist_bd) return PMAP_SUCCESS;
  PMAP_TRY(pmap_ctx_dispatch(p->ctx, rows_job, p));
  if (p->rows[0] != -p->rows[1])
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_update: the processes pass different numbers of rows (%.0f to %.0f "
                    "per device; this process %lld): each must pass the same number, so that "
                    "the mean weighs every row alike (nothing was changed)",
                    (double)-p->rows[1], (double)p->rows[0], (long long)p->bd);
  p->dist_bd = p->bd;
  return PMAP_SUCCESS;
}

pmap_status pmap_update(pmap_params *p, const pmap_array *xs, const pmap_array *ys, float *loss) {
  const char *call = "pmap_update";
  if (!p) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: params is NULL", call);
  if (!ys) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys is NULL", call);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_status st = check_batch(p, xs, ys, call);
  if (!st) st = check_rows(p);
  if (!st) {
    int64_t t = p->step + 1;
    p->bc1 = (float)(1.0 - pow((double)p->opt.beta1, (double)t));
    p->bc2 = (float)(1.0 - pow((double)p->opt.beta2, (double)t));
    p->xs = xs;
    p->ys = ys;
    p->numeric_bad = 0;
    st = pmap_ctx_dispatch(p->ctx, update_job, p);
    if (!st && p->numeric_bad) {
      st = numeric_error(p);
    } else if (!st) {
      p->step = t;
      if (loss) *loss = p->loss;
    }
  }
  pmap_ctx_unlock(p->ctx);
  return st;
}

static pmap_status predict_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  const pmap_model *m = p->model;
  replica *r = &p->rep[dev->index];
  const void *x = NULL;
  PMAP_TRY(replica_reserve(dev, m, r, p->bd));
  PMAP_TRY(shard(dev, p->xs, p->bd, 0, &x));
  PMAP_TRY(model_forward(dev, m, r, x, p->bd));
  size_t k = (size_t)m->layers[m->n_layers - 1].out_size, rows = (size_t)p->bd;
  float *dst = (float *)p->out->data + (size_t)dev->index * rows * k;
  return backend_download(dev, dst, r->out[m->n_layers - 1], rows * k * sizeof(float));
}

pmap_status pmap_predict(pmap_params *p, const pmap_array *xs, pmap_array *out) {
  const char *call = "pmap_predict";
  if (!p || !out || !out->data)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !p ? "params" : !out ? "out" : "out->data");
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_status st = check_batch(p, xs, NULL, call);
  const layer *last = &p->model->layers[p->model->n_layers - 1];
  char sh[160];
  if (!st && (out->dtype != PMAP_F32 || out->rank != 1 + last->out_rank ||
              out->shape[0] != xs->shape[0] || numel_from(out, 1) != last->out_size))
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: out must be f32 (%lld, %lld); got %s %s", call,
                  (long long)xs->shape[0], (long long)last->out_size, dtype_name(out->dtype),
                  out->rank >= 1 && out->rank <= PMAP_MAX_RANK ? shape_str(out, sh, sizeof sh)
                                                               : "of a bad rank");
  if (!st) {
    p->xs = xs;
    p->out = out;
    st = pmap_ctx_dispatch(p->ctx, predict_job, p);
  }
  pmap_ctx_unlock(p->ctx);
  return st;
}

static pmap_status read_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  if (dev->index != p->read_device) return PMAP_SUCCESS;
  return backend_download(dev, p->read_dst, p->rep[dev->index].w, p->n_params * sizeof(float));
}

pmap_status pmap_params_read(const pmap_params *cp, int device, float *dst, size_t count) {
  const char *call = "pmap_params_read";
  if (!cp || !dst)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, cp ? "dst" : "params");
  const pmap_ctx *ctx = cp->ctx;
  int first = ctx->proc * ctx->n; /* the global index of this process's device 0 */
  if (device < 0 || device >= ctx->nproc * ctx->n)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: device %d is outside [0, %d)", call, device,
                    ctx->nproc * ctx->n);
  if (device < first || device >= first + ctx->n)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: device %d lives in process %d, not in this process %d (its devices are "
                    "%d..%d); replicas are identical, so read one of this process's",
                    call, device, device / ctx->n, ctx->proc, first, first + ctx->n - 1);
  if (count != cp->n_params)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu is not the parameter count %zu",
                    call, count, cp->n_params);
  pmap_params *p = (pmap_params *)cp; /* the job fields are scratch, not state */
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  p->read_device = device - first;
  p->read_dst = dst;
  pmap_status st = pmap_ctx_dispatch(p->ctx, read_job, p);
  pmap_ctx_unlock(p->ctx);
  return st;
}

static pmap_status write_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  PMAP_TRY(backend_upload(dev, r->w, p->host_w, p->n_params * sizeof(float)));
  return backend_sync(dev);
}

pmap_status pmap_params_write(pmap_params *p, const float *src, size_t count) {
  const char *call = "pmap_params_write";
  if (!p || !src)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, p ? "src" : "params");
  if (count != p->n_params)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu is not the parameter count %zu",
                    call, count, p->n_params);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  p->host_w = src;
  pmap_status st = pmap_ctx_dispatch(p->ctx, write_job, p);
  p->host_w = NULL;
  pmap_ctx_unlock(p->ctx);
  return st;
}

static pmap_status shrink_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica_release(dev, &p->rep[dev->index]);
  return PMAP_SUCCESS;
}

pmap_status pmap_params_shrink(pmap_params *p) {
  if (!p) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_params_shrink: params is NULL");
  PMAP_TRY(pmap_ctx_lock(p->ctx, "pmap_params_shrink"));
  pmap_status st = pmap_ctx_dispatch(p->ctx, shrink_job, p);
  pmap_ctx_unlock(p->ctx);
  return st;
}
