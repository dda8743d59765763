/* params.c: the replicated training state: creating it (built-in models and your own gradient
 * function), destroying it, reading and writing replicas, micro-batch setting and shrinking.
 * The step is in step.c, the optimizer in optimizer.c. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "params.h"
#include "runtime/backend.h"
#include "base/error.h"
#include "runtime/fault.h"
#include "step_fast.h"

static float *r_w(pmap_params *p, pmap_device *dev) { return p->rep[dev->index].w; }

/* PMAP_SHARD_AUTO shards the optimizer of models from this many parameters on: below it the
 * step's two extra collectives cost more than the optimizer work they save (README, "Sharded
 * optimizer", has the measurements). */
#define SHARD_MIN_PARAMS 65536

void params_layout(pmap_params *p) {
  const pmap_ctx *ctx = p->ctx;
  size_t P = p->n_params;
  p->ng = ctx->n * ctx->nproc;
  /* Not across processes (docs/distributed.md). AUTO: from SHARD_MIN_PARAMS parameters on, with
   * optimizer state to shard, and not when a CUDA fast path (graphs, overlap) is switched on:
   * those step the replicated way only. */
  int fast = 0;
  const pmap_fast_i *fi = backend_fast(ctx);
  if (fi) {
    int graphs = 0, overlap = 0;
    size_t bucket = 0;
    fi->modes(ctx, &graphs, &overlap, &bucket);
    fast = graphs || overlap;
  }
  int want = ctx->shard == PMAP_SHARD_ON ||
             (ctx->shard == PMAP_SHARD_AUTO && P >= SHARD_MIN_PARAMS && p->opt_slots > 0 && !fast);
  p->shard = want && ctx->nproc == 1 && p->ng > 1;
  p->reduced = P + 2 + (p->guard ? (size_t)p->ng : 0); /* a guard flag per global device */
  size_t chunk = (p->reduced + (size_t)p->ng - 1) / (size_t)p->ng;
  p->chunk = (chunk + 15) / 16 * 16;
  size_t end = params_off_micro(p) + 1;
  p->g_len = p->shard ? params_off_records(p) + (size_t)p->ng * params_record_len(p) : end;
  p->w_len = p->shard ? (size_t)p->ng * p->chunk : P;
  p->state_len = p->shard ? p->chunk : P;
}

pmap_status params_gather(pmap_device *dev, pmap_params *p, int64_t step) {
  int g = params_global(p, dev->index);
  if (pmap_fault_fires(dev->ctx->fault, FAULT_GATHER, dev->index, step))
    return PMAP_ERR(PMAP_ERR_DEVICE,
                    "device %d: the all-gather of the parameters of step %lld failed (injected "
                    "by PMAP_FAULT)",
                    dev->index, (long long)step);
  return backend_all_gather(dev, "pmap_update's all-gather", r_w(p, dev) + (size_t)g * p->chunk,
                            r_w(p, dev), p->chunk);
}

static pmap_status mend_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  PMAP_TRY(params_gather(dev, p, p->step - 1));
  return backend_sync(dev);
}

pmap_status params_mend(pmap_params *p, const char *call) {
  if (!p->torn) return PMAP_SUCCESS;
  pmap_status st = params_dispatch(p, mend_job, p);
  if (!st) {
    p->torn = 0;
    return PMAP_SUCCESS;
  }
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", pmap_error_message());
  return pmap_error_set(st,
                        "%s: the parameters are incomplete since step %lld (each device holds only "
                        "its own part up to date) and completing them failed again: %s",
                        call, (long long)p->step, msg);
}

/* Device memory for an op queue's scratch: the device's allocator. */
static pmap_status queue_alloc(void *owner, size_t bytes, void **out) {
  return backend_alloc(owner, bytes, out);
}
static void queue_free(void *owner, void *ptr) { backend_free(owner, ptr); }

/* The device's op queue, made on its own thread from its native handles. */
static pmap_status queue_open(pmap_device *dev, pmap_params *p, replica *r) {
  op_queue_init init = {.device = dev->index,
                        .stream = pmap_device_stream(dev),
                        .blas = pmap_device_blas(dev),
                        .alloc = queue_alloc,
                        .free = queue_free,
                        .owner = dev};
  r->ops = p->ob->ops;
  return p->ob->queue_create(&init, &r->q);
}

typedef struct ops_job {
  pmap_fn fn;
  void *arg;
  const op_backend *ob;
} ops_job;

/* Device 0 runs on the caller's thread: the op backend's enter and leave around its work. */
static pmap_status ops_job_run(pmap_device *dev, void *arg) {
  const ops_job *j = arg;
  if (dev->index != 0 || !j->ob->enter) return j->fn(dev, j->arg);
  int saved = j->ob->enter();
  pmap_status st = j->fn(dev, j->arg);
  j->ob->leave(saved);
  return st;
}

pmap_status params_dispatch(pmap_params *p, pmap_fn fn, void *arg) {
  ops_job j = {fn, arg, p->ob};
  return pmap_ctx_dispatch(p->ctx, ops_job_run, &j);
}

/* Allocates the device's buffers; device 0 uploads the host parameters and a broadcast
 * replicates them, so every replica starts bitwise equal. */
static pmap_status create_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  size_t P = p->n_params;
  void *w = NULL, *g = NULL, *opt = NULL;
  PMAP_TRY(queue_open(dev, p, r));
  PMAP_TRY(backend_alloc(dev, p->w_len * sizeof(float), &w));
  r->w = w;
  if (p->w_len > P) PMAP_TRY(r->ops->fill(r->q, r->w + P, 0.0f, p->w_len - P));
  PMAP_TRY(backend_alloc(dev, params_grad_len(p) * sizeof(float), &g));
  r->g = g;
  PMAP_TRY(r->ops->fill(r->q, r->g, 0.0f, params_grad_len(p)));
  if (p->opt_slots) {
    PMAP_TRY(backend_alloc(dev, (size_t)p->opt_slots * p->state_len * sizeof(float), &opt));
    r->opt = opt;
    PMAP_TRY(r->ops->fill(r->q, r->opt, 0.0f, (size_t)p->opt_slots * p->state_len));
  }
  if (p->model->n_state) {
    void *pending = NULL;
    PMAP_TRY(backend_alloc(dev, p->model->n_state * sizeof(float), &pending));
    r->pending = pending;
  }
  if (dev->index == 0) PMAP_TRY(backend_upload(dev, r->w, p->host_w, P * sizeof(float)));
  PMAP_TRY(backend_broadcast(dev, "pmap_params_create's broadcast", r->w, r->w, P, 0));
  return backend_sync(dev);
}

static pmap_status destroy_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  replica_release(dev, r);
  /* The queue only after its device's work is over: a device whose work does not end keeps it
   * (as the backend keeps what such a device holds). */
  if (r->q && backend_sync(dev) == PMAP_SUCCESS) p->ob->queue_destroy(r->q);
  r->q = NULL;
  backend_free(dev, r->w);
  backend_free(dev, r->g);
  backend_free(dev, r->opt);
  backend_free(dev, r->pending);
  r->w = r->g = r->opt = r->pending = NULL;
  return PMAP_SUCCESS;
}

/* Frees everything; p->ctx's lock is held or p was never handed out. */
static void params_free(pmap_params *p) {
  step_fast_free(p);
  if (p->rep) params_dispatch(p, destroy_job, p);
  free(p->rep);
  free(p->guard_host);
  free(p->spans);
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

/* Creates params around p->model (already set) with host_w as the initial parameters. */
static pmap_status params_open(pmap_ctx *ctx, pmap_params *p, const pmap_optimizer *opt,
                               const float *host_w, const char *call) {
  pmap_status st = PMAP_ERR_OUT_OF_MEMORY;
  p->ctx = ctx;
  PMAP_TRY(ops_backend(pmap_backend_name(pmap_ctx_backend(ctx)), call, &p->ob));
  p->opt = *opt;
  p->opt_slots = optimizer_slots(opt);
  p->micro_batches = 1;
  p->guard = ctx->numeric_guard == PMAP_GUARD_ON;
  params_layout(p);
  p->rep = calloc((size_t)ctx->n, sizeof *p->rep);
  p->guard_host = calloc((size_t)ctx->n * params_host_len(p), sizeof *p->guard_host);
  p->spans = calloc((size_t)p->model->n_layers + 1, sizeof *p->spans);
  if (!p->rep || !p->guard_host || !p->spans) return PMAP_ERR(st, "%s: out of memory", call);
  p->n_spans = model_trained_spans(p->model, p->spans);
  p->host_w = host_w;
  st = params_dispatch(p, create_job, p);
  p->host_w = NULL;
  return st;
}

/* Finishes a create: hands p out, or frees it keeping the failure's message. Holds the lock. */
static pmap_status params_close_create(pmap_ctx *ctx, pmap_params *p, pmap_status st,
                                       pmap_params **out) {
  if (st == PMAP_SUCCESS) {
    atomic_fetch_add(&ctx->live_params, 1);
    pmap_ctx_unlock(ctx);
    *out = p;
    return PMAP_SUCCESS;
  }
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", pmap_error_message());
  params_free(p);
  pmap_ctx_unlock(ctx);
  return pmap_error_set(st, "%s", msg);
}

pmap_status pmap_params_create(pmap_ctx *ctx, const pmap_model *model, const pmap_optimizer *opt,
                               uint64_t seed, pmap_params **out) {
  const char *call = "pmap_params_create";
  if (!ctx || !model || !opt || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !ctx     ? "ctx"
                    : !model ? "model"
                    : !opt   ? "opt"
                             : "out");
  if (model->n_layers == 0 || model->n_params == 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the model has %d layers and %zu parameters; it needs at least one "
                    "dense or conv2d layer",
                    call, model->n_layers, model->n_params);
  const layer *last = &model->layers[model->n_layers - 1];
  if (last->out_rank != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the model's output has rank %d; the loss needs rank 1 (add flatten)", call,
                    last->out_rank);
  PMAP_TRY(optimizer_check(opt, call));
  pmap_params *p = calloc(1, sizeof *p);
  float *host_w = malloc(model->n_params * sizeof *host_w);
  if (!p || !host_w) {
    free(p);
    free(host_w);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu parameters", call,
                    model->n_params);
  }
  pmap_status st = pmap_ctx_lock(ctx, call);
  if (st) {
    free(p);
    free(host_w);
    return st;
  }
  p->n_params = model->n_params;
  st = model_clone(model, &p->model);
  if (!st) {
    model_init_params(model, seed, host_w);
    st = params_open(ctx, p, opt, host_w, call);
  }
  free(host_w);
  return params_close_create(ctx, p, st, out);
}

pmap_status pmap_params_create_custom(pmap_ctx *ctx, size_t num_params, const float *init,
                                      pmap_grad_fn fn, void *user, const pmap_optimizer *opt,
                                      pmap_params **out) {
  const char *call = "pmap_params_create_custom";
  if (!ctx || !init || !fn || !opt || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !ctx    ? "ctx"
                    : !init ? "init"
                    : !fn   ? "fn"
                    : !opt  ? "opt"
                            : "out");
  if (num_params == 0 || num_params > ((size_t)1 << 31))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: num_params %zu is outside 1..%zu", call,
                    num_params, (size_t)1 << 31);
  PMAP_TRY(optimizer_check(opt, call));
  pmap_params *p = calloc(1, sizeof *p);
  if (!p) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  pmap_status st = pmap_ctx_lock(ctx, call);
  if (st) {
    free(p);
    return st;
  }
  p->n_params = num_params;
  p->grad_fn = fn;
  p->grad_user = user;
  int64_t one = 1;
  st = pmap_model_create(1, &one, &p->model);
  if (!st) {
    p->model->n_params = num_params; /* no layers: the parameters are fn's */
    st = params_open(ctx, p, opt, init, call);
  }
  return params_close_create(ctx, p, st, out);
}

size_t pmap_params_count(const pmap_params *p) { return p ? p->n_params : 0; }
int pmap_params_sharded(const pmap_params *p) { return p ? p->shard : 0; }
size_t pmap_params_optimizer_bytes(const pmap_params *p) {
  if (!p) return 0;
  return (size_t)p->opt_slots * p->state_len * sizeof(float); /* as allocated on each device */
}
/* Under the context's lock, as every public call (a pmap_update may run on another thread);
 * from inside one of its jobs no update can run, and in a forked child no other thread exists
 * (and the lock may be held by one that does not): the lock is not taken there. */
int64_t pmap_params_step(const pmap_params *p) {
  if (!p) return 0;
  if (pmap_ctx_in_job(p->ctx) || pmap_ctx_foreign(p->ctx)) return p->step;
  pthread_mutex_lock(&p->ctx->lock);
  int64_t step = p->step;
  pthread_mutex_unlock(&p->ctx->lock);
  return step;
}

/* ------------------------------------------------------------------------------------------ */
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
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu is not the parameter count %zu", call,
                    count, cp->n_params);
  pmap_params *p = (pmap_params *)cp; /* the job fields are scratch, not state */
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  p->read_device = device - first;
  p->read_dst = dst;
  pmap_status st = params_mend(p, call);
  if (!st) st = params_dispatch(p, read_job, p);
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
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu is not the parameter count %zu", call,
                    count, p->n_params);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  p->host_w = src;
  pmap_status st = params_dispatch(p, write_job, p);
  p->host_w = NULL;
  if (!st) p->torn = 0; /* every replica is whole again */
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
  pmap_status st = params_dispatch(p, shrink_job, p);
  pmap_ctx_unlock(p->ctx);
  return st;
}

pmap_status pmap_params_set_micro_batches(pmap_params *p, int k) {
  const char *call = "pmap_params_set_micro_batches";
  if (!p) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: params is NULL", call);
  if (k < 1 || k > 65536)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %d micro-batches is outside 1..65536", call, k);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  p->micro_batches = k;
  pmap_ctx_unlock(p->ctx);
  return PMAP_SUCCESS;
}
