/* params.c: the replicated training state: its layout, creating it (built-in models and your own
 * gradient function) with an op queue per replica, destroying it, and the dispatch of every job
 * on it (models/context.c). Reading and writing replicas is params_access.c's, the step step.c's, the optimizer
 * optimizer.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "params.h"
#include "runtime/runtime.h"

/* PMAP_SHARD_AUTO shards the optimizer of models from this many parameters on: below it the
 * step's two extra collectives cost more than the optimizer work they save (README, "Sharded
 * optimizer", has the measurements). */
#define SHARD_MIN_PARAMS 65536

void params_layout(pmap_params *p) {
  const pmap_ctx *ctx = p->ctx;
  size_t P = p->n_params;
  int G = runtime_global_devices(ctx), setting = runtime_shard(ctx);
  grad_layout *l = &p->gl;
  l->G = G;
  l->part = P;
  l->loss = P + 1;
  l->flags = P + 2;
  l->parts = l->flags + (size_t)G;
  l->micro = l->parts + (size_t)G;
  l->record_len = (size_t)G + 2;
  /* A guard flag per global device, reduced with the guard off too: the parts (and so the
   * gradient norm that clipping scales by, summed from their norms) are then the same with the
   * guard on or off, and so are the steps. */
  l->reduced = P + 2 + (size_t)G;
  size_t chunk = (l->reduced + (size_t)G - 1) / (size_t)G;
  l->chunk = (chunk + 15) / 16 * 16;
  size_t end = l->micro + 1, padded = (size_t)G * l->chunk;
  l->records = end > padded ? end : padded;
  /* The floats of parameters, gradients and optimizer state a device holds in either layout
   * (the sharded one pads the parameters to equal parts). */
  size_t slots = (size_t)p->opt_slots;
  double replicated = (double)P + (double)end + (double)slots * (double)P;
  double sharded = (double)padded + (double)l->records + (double)G * (double)l->record_len +
                   (double)slots * (double)l->chunk;
  /* Not across processes (docs/distributed.md). AUTO: from SHARD_MIN_PARAMS parameters on, or
   * at any size where the sharded layout holds less under a memory limit the devices are held
   * to (pmap_config.max_memory, CPU: its steps are the same bits, and memory is what the limit
   * asks for), with optimizer state to shard, and not when a CUDA fast path (graphs, overlap)
   * is switched on: those step the replicated way only. */
  int graphs = 0, overlap = 0;
  size_t bucket = 0;
  runtime_fast_modes(ctx, &graphs, &overlap, &bucket);
  int limited = runtime_max_memory(ctx) > 0 && pmap_ctx_backend(ctx) == PMAP_BACKEND_CPU &&
                sharded < replicated;
  int want = setting == PMAP_SHARD_ON || setting == PMAP_SHARD_GRADS ||
             (setting == PMAP_SHARD_AUTO && (P >= SHARD_MIN_PARAMS || limited) &&
              p->opt_slots > 0 && !graphs && !overlap);
  p->shard = want && !runtime_distributed(ctx) && G > 1;
  l->len = p->shard ? l->records + (size_t)G * l->record_len : end;
  /* PMAP_SHARD_GRADS: the gradients too, for the built-in models (a gradient function writes
   * the whole gradient), where the model's layers allow (grad_window.c). The buffer: the
   * device's part, the tail from P on, the window and the pinned range. */
  p->shard_grads = p->shard && setting == PMAP_SHARD_GRADS && !p->grad_fn &&
                   grad_window_plan(p->model, &p->gwin_cap, &p->gpin_lo, &p->gpin_len);
  /* Only where that holds less than the whole gradient: the window takes the largest layer's,
   * so a model of mostly one layer keeps it whole (the same bits either way). */
  size_t windowed = l->chunk + (l->len - P) + p->gwin_cap + p->gpin_len;
  p->shard_grads = p->shard_grads && windowed < l->len;
  if (p->shard_grads) l->len = windowed;
  l->host_len = (size_t)G + 1 + (size_t)G + (size_t)G * l->record_len;
  p->w_len = p->shard ? padded : P;
  p->state_len = p->shard ? l->chunk : P;
}

pmap_status params_gather(pmap_device *dev, pmap_params *p, int64_t step) {
  int d = pmap_local_index(dev), g = params_global(p, d);
  float *w = p->rep[d].w;
  replica_w_changed(&p->rep[d]);
  if (runtime_fault(dev, FAULT_GATHER, step))
    return PMAP_ERR(PMAP_ERR_DEVICE,
                    "device %d: the all-gather of the parameters of step %lld failed (injected "
                    "by PMAP_FAULT)",
                    g, (long long)step);
  return backend_all_gather(dev, "pmap_update's all-gather", w + (size_t)g * p->gl.chunk, w,
                            p->gl.chunk);
}

static pmap_status mend_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  PMAP_TRY(params_gather(dev, p, p->step)); /* the torn step's own number */
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
  snprintf(msg, sizeof msg, "%s", pmap_last_error());
  return pmap_error_set(st,
                        "%s: the parameters are incomplete since step %lld (each device holds only "
                        "its own part up to date) and completing them failed again: %s",
                        call, (long long)p->step, msg);
}

/* Where the parts of replica d's gradient buffer lie (replica.gp, gt; params.h's shard_grads). */
static void replica_grads_place(const pmap_params *p, replica *r, int d) {
  size_t P = p->n_params;
  r->gp = r->g;
  r->gp_lo = 0;
  r->gp_len = P;
  r->gt = r->g + P;
  r->gt_lo = P;
  if (!p->shard_grads) return;
  size_t chunk = p->gl.chunk, tail = p->gl.len - chunk - p->gwin_cap - p->gpin_len;
  r->gp_lo = (size_t)params_global(p, d) * chunk;
  r->gp_len = chunk;
  r->gt = r->g + chunk;
  r->gwin = r->gt + tail;
  r->gwin_cap = p->gwin_cap;
  r->gpin = r->gwin + p->gwin_cap;
  r->gpin_lo = p->gpin_lo;
  r->gpin_len = p->gpin_len;
}

/* Device memory for an op queue's scratch: the device's allocator. */
static pmap_status queue_alloc(void *owner, size_t bytes, void **out) {
  return backend_alloc(owner, bytes, out);
}
static void queue_free(void *owner, void *ptr) { backend_free(owner, ptr); }

/* The device's op queue, made on its own thread from its native handles. */
static pmap_status queue_open(pmap_device *dev, pmap_params *p, replica *r) {
  op_queue_init init = {.device = pmap_local_index(dev),
                        .stream = pmap_device_stream(dev),
                        .blas = pmap_device_blas(dev),
                        .alloc = queue_alloc,
                        .free = queue_free,
                        .owner = dev};
  r->ops = p->ob->ops;
  r->ob = p->ob;
  return p->ob->queue_create(&init, &r->q);
}

/* A create's job: the params and the initial parameters (host memory). */
typedef struct create_call {
  pmap_params *p;
  const float *init; /* (P) */
} create_call;

/* Allocates the device's buffers; device 0 uploads the initial parameters and a broadcast
 * replicates them, so every replica starts bitwise equal. */
static pmap_status create_job(pmap_device *dev, void *arg) {
  const create_call *c = arg;
  pmap_params *p = c->p;
  int d = pmap_local_index(dev);
  replica *r = &p->rep[d];
  size_t P = p->n_params;
  void *w = NULL, *g = NULL, *opt = NULL;
  PMAP_TRY(queue_open(dev, p, r));
  PMAP_TRY(backend_alloc(dev, p->w_len * sizeof(float), &w));
  r->w = w;
  if (p->w_len > P) PMAP_TRY(r->ops->fill(r->q, r->w + P, 0.0f, p->w_len - P));
  PMAP_TRY(backend_alloc(dev, p->gl.len * sizeof(float), &g));
  r->g = g;
  PMAP_TRY(r->ops->fill(r->q, r->g, 0.0f, p->gl.len));
  replica_grads_place(p, r, d);
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
  if (d == 0) PMAP_TRY(backend_upload(dev, r->w, c->init, P * sizeof(float)));
  PMAP_TRY(backend_broadcast(dev, "pmap_params_create's broadcast", r->w, r->w, P, 0));
  return backend_sync(dev);
}

static pmap_status destroy_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[pmap_local_index(dev)];
  replica_release(dev, r);
  /* The queue only after its device's work is over: a device whose work does not end keeps it
   * (as the backend keeps what such a device holds). */
  if (r->q && backend_sync(dev) == PMAP_SUCCESS) p->ob->queue_destroy(r->q);
  r->q = NULL;
  backend_free(dev, r->w);
  backend_free(dev, r->g);
  backend_free(dev, r->opt);
  backend_free(dev, r->pending);
  backend_free(dev, r->w16);
  r->w = r->g = r->opt = r->pending = NULL;
  r->gp = r->gt = r->gwin = r->gpin = NULL;
  r->w16 = NULL;
  return PMAP_SUCCESS;
}

/* Frees everything; p->ctx's lock is held or p was never handed out. */
static void params_free(pmap_params *p) {
  if (p->fast_free) p->fast_free(p);
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
  runtime_params_live(ctx, -1);
  pmap_ctx_unlock(ctx);
}

/* The params' fields from the context and the optimizer, and their host buffers. */
static pmap_status params_setup(pmap_ctx *ctx, pmap_params *p, const pmap_optimizer *opt,
                                const char *call) {
  p->ctx = ctx;
  p->n = pmap_ctx_num_devices(ctx);
  p->first = pmap_ctx_process_index(ctx) * p->n;
  PMAP_TRY(ops_backend(pmap_backend_name(pmap_ctx_backend(ctx)), call, &p->ob));
  p->opt = *opt;
  p->opt_slots = optimizer_slots(opt);
  p->micro_batches = 1;
  p->guard = runtime_guard(ctx);
  p->recompute = runtime_recompute(ctx);
  p->recompute_on = p->recompute == PMAP_RECOMPUTE_AUTO ? PMAP_RECOMPUTE_NONE : p->recompute;
  model_set_recompute(p->model, p->recompute_on);
  params_layout(p);
  if (!p->shard && runtime_fault_is(ctx, FAULT_GATHER))
    return PMAP_ERR(
        PMAP_ERR_INVALID_ARGUMENT,
        "%s: the environment variable PMAP_FAULT asks for a gather fault, which fires "
        "in the all-gather of a sharded optimizer, and these params' optimizer state is "
        "replicated (%zu parameters; sharded from 65536 with optimizer state or under "
        "max_memory, or with PMAP_SHARD_ON): the fault would never fire",
        call, p->n_params);
  p->rep = calloc((size_t)p->n, sizeof *p->rep);
  p->guard_host = calloc((size_t)p->n * p->gl.host_len, sizeof *p->guard_host);
  p->spans = calloc((size_t)p->model->n_layers + 1, sizeof *p->spans);
  if (!p->rep || !p->guard_host || !p->spans)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  p->n_spans = model_trained_spans(p->model, p->spans);
  return PMAP_SUCCESS;
}

/* Across processes, before the broadcast of the initial parameters: every process creates as
 * many parameters, and none refused its create. A process that refused takes part all the
 * same: had it stayed away, the others' broadcast would pair with its next call. */
static pmap_status params_agree(pmap_ctx *ctx, const pmap_params *p, pmap_status refused,
                                const char *call) {
  if (!runtime_distributed(ctx)) return refused;
  int64_t mine = refused ? 0 : (int64_t)p->n_params;
  const void *got = NULL;
  PMAP_TRY(
      pmap_ctx_exchange(ctx, "the check of a params creation", refused, &mine, sizeof mine, &got));
  const int64_t *all = got;
  int differ = 0;
  for (int r = 0; r < pmap_ctx_num_processes(ctx); r++) differ |= all[r] != mine;
  if (!differ) return PMAP_SUCCESS;
  char list[700], name[128];
  size_t len = 0;
  list[0] = '\0';
  for (int r = 0; r < pmap_ctx_num_processes(ctx) && len < sizeof list; r++)
    len += (size_t)snprintf(list + len, sizeof list - len, "%s%s: %lld", r ? "; " : "",
                            pmap_proc_name(ctx, r, name, sizeof name), (long long)all[r]);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: the processes create params of different sizes (%s parameters): every "
                  "process must create the same model (nothing was created)",
                  call, list);
}

/* Creates params around p->model (already set) with init as the initial parameters; st: a
 * failure before (p may then be NULL), which the processes' check still hears of. */
static pmap_status params_open(pmap_ctx *ctx, pmap_params *p, const pmap_optimizer *opt,
                               const float *init, const char *call, pmap_status st) {
  if (!st) st = params_setup(ctx, p, opt, call);
  PMAP_TRY(params_agree(ctx, p, st, call));
  create_call c = {p, init};
  return params_dispatch(p, create_job, &c);
}

/* Finishes a create: hands p out, or frees it keeping the failure's message. Holds the lock. */
static pmap_status params_close_create(pmap_ctx *ctx, pmap_params *p, pmap_status st,
                                       pmap_params **out) {
  if (st == PMAP_SUCCESS) {
    runtime_params_live(ctx, 1);
    pmap_ctx_unlock(ctx);
    *out = p;
    return PMAP_SUCCESS;
  }
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", pmap_last_error());
  if (p) params_free(p);
  pmap_ctx_unlock(ctx);
  return pmap_error_set(st, "%s", msg);
}

/* The arguments of pmap_params_create, checked under the context's lock. */
static pmap_status create_checks(const pmap_model *model, const pmap_optimizer *opt,
                                 pmap_params **out, const char *call) {
  if (!model || !opt || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !model ? "model"
                    : !opt ? "opt"
                           : "out");
  if (model->n_layers == 0 || model->n_params == 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the model has %d layers and %zu parameters; it needs at least one "
                    "dense or conv2d layer",
                    call, model->n_layers, model->n_params);
  const layer *last = &model->layers[model->n_layers - 1];
  if (model->loss == PMAP_LOSS_TOKEN_XENT ? last->out_rank != 2 : last->out_rank != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the model's output has rank %d; the loss needs rank %d (%s)", call,
                    last->out_rank, model->loss == PMAP_LOSS_TOKEN_XENT ? 2 : 1,
                    model->loss == PMAP_LOSS_TOKEN_XENT ? "(T, V) logits" : "add flatten");
  return optimizer_check(opt, call);
}

/* Every check after the lock: across processes a refusal is brought to the processes' check
 * before the broadcast (params_open). */
pmap_status pmap_params_create(pmap_ctx *ctx, const pmap_model *model, const pmap_optimizer *opt,
                               uint64_t seed, pmap_params **out) {
  const char *call = "pmap_params_create";
  if (!ctx) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", call);
  PMAP_TRY(pmap_ctx_lock(ctx, call));
  pmap_params *p = NULL;
  float *init = NULL;
  pmap_status st = create_checks(model, opt, out, call);
  if (!st) {
    p = calloc(1, sizeof *p);
    init = malloc(model->n_params * sizeof *init);
    if (!p || !init)
      st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu parameters", call,
                    model->n_params);
  }
  if (!st) {
    p->n_params = model->n_params;
    st = model_clone(model, call, &p->model);
  }
  if (!st) model_init_params(model, seed, init);
  st = params_open(ctx, p, opt, init, call, st);
  free(init);
  return params_close_create(ctx, p, st, out);
}

static pmap_status create_custom_checks(size_t num_params, const float *init, pmap_grad_fn fn,
                                        const pmap_optimizer *opt, pmap_params **out,
                                        const char *call) {
  if (!init || !fn || !opt || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !init  ? "init"
                    : !fn  ? "fn"
                    : !opt ? "opt"
                           : "out");
  if (num_params == 0 || num_params > ((size_t)1 << 31))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: num_params %zu is outside 1..%zu", call,
                    num_params, (size_t)1 << 31);
  return optimizer_check(opt, call);
}

pmap_status pmap_params_create_custom(pmap_ctx *ctx, size_t num_params, const float *init,
                                      pmap_grad_fn fn, void *user, const pmap_optimizer *opt,
                                      pmap_params **out) {
  const char *call = "pmap_params_create_custom";
  if (!ctx) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", call);
  PMAP_TRY(pmap_ctx_lock(ctx, call));
  pmap_params *p = NULL;
  pmap_status st = create_custom_checks(num_params, init, fn, opt, out, call);
  if (!st && !(p = calloc(1, sizeof *p)))
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  if (!st) {
    p->n_params = num_params;
    p->grad_fn = fn;
    p->grad_user = user;
    int64_t one = 1;
    st = pmap_model_create(1, &one, &p->model);
  }
  if (!st) p->model->n_params = num_params; /* no layers: the parameters are fn's */
  st = params_open(ctx, p, opt, init, call, st);
  return params_close_create(ctx, p, st, out);
}
