/* memory.c: pmap_params_memory, the plan of a training step's device memory before it runs:
 * the sizes the params allocated (params.c create_job) and what a step at the batch allocates
 * (exec.c replica_reserve: the activations of one micro-batch and, under bf16, the GEMMs'
 * workspace; the backend's staging). */
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "params.h"
#include "runtime/runtime.h"

/* *acc += floats in bytes; 1 on overflow (which fails the plan). */
static int add_floats(size_t *acc, size_t floats) {
  size_t bytes = 0;
  return __builtin_mul_overflow(floats, sizeof(float), &bytes) ||
         __builtin_add_overflow(*acc, bytes, acc);
}

/* The activations a device holds at `piece` rows with the model laid out for `mode`
 * (PMAP_RECOMPUTE_NONE, _SELECTIVE or _FULL): its arena and, under bf16, the GEMMs' workspace.
 * The model's layout is p's again on return. 1 on overflow. */
static int activations_for(const pmap_params *p, int64_t piece, int mode, size_t *bytes,
                           pmap_status *st, const char *call) {
  pmap_model *model = p->model;
  size_t act = 0, ws = 0;
  model_set_recompute(model, mode);
  int bad = model_arena_floats(model, piece, &act);
  model_set_recompute(model, p->recompute_on);
  *bytes = 0;
  bad = bad || add_floats(bytes, act);
  *st = bad ? PMAP_SUCCESS : model_gemm16_workspace(model, p->ob, piece, &ws);
  if (*st) *st = pmap_error_named(*st, call);
  return bad || __builtin_add_overflow(*bytes, ws, bytes);
}

/* The bytes a device may hold, for PMAP_RECOMPUTE_AUTO: pmap_config.max_memory where the backend
 * holds its devices to it (CPU); else the memory free on device 0 and what these params'
 * activations hold there now (SIZE_MAX where neither is known: no limit). */
static size_t auto_limit(const pmap_params *p, const pmap_memory_plan *m) {
  if (pmap_ctx_backend(p->ctx) == PMAP_BACKEND_CPU)
    return runtime_max_memory(p->ctx) ? runtime_max_memory(p->ctx) : SIZE_MAX;
  if (m->device_free == SIZE_MAX) return SIZE_MAX;
  size_t held = 0, free = m->device_free;
  pmap_status st = PMAP_SUCCESS;
  const replica *r = &p->rep[0];
  if (r->arena && !p->grad_fn &&
      activations_for(p, r->rows, p->recompute_on, &held, &st, "pmap_params_memory"))
    held = 0;
  return __builtin_add_overflow(free, held, &free) ? SIZE_MAX : free;
}

pmap_status params_plan(const pmap_params *p, int64_t batch, pmap_memory_plan *out,
                        const char *call) {
  int n = p->n;
  pmap_memory_plan m = {0};
  const pmap_model *model = p->model;
  /* The most rows any device takes, and its micro-batches as step_grads splits them. */
  int64_t rows = (batch + n - 1) / n, fewest = batch / n;
  int64_t limit = p->grad_fn || model_has_collectives(model) ? fewest : rows;
  int64_t k = p->micro_batches < limit ? p->micro_batches : limit;
  int64_t piece = (rows + k - 1) / k;
  /* The state sits in the parameters' buffer (after the trained ones), and a step computes its
   * new value into a pending copy. */
  int bad = add_floats(&m.params, p->w_len - model->n_state) || add_floats(&m.grads, p->gl.len) ||
            add_floats(&m.optimizer, (size_t)p->opt_slots * p->state_len) ||
            add_floats(&m.state, 2 * model->n_state);
  if (!p->grad_fn) {
    pmap_status st = PMAP_SUCCESS;
    bad = bad || activations_for(p, piece, PMAP_RECOMPUTE_NONE, &m.activations_stored, &st, call) ||
          (!st &&
           activations_for(p, piece, PMAP_RECOMPUTE_FULL, &m.activations_recomputed, &st, call)) ||
          (!st && activations_for(p, piece, PMAP_RECOMPUTE_SELECTIVE, &m.activations_selective, &st,
                                  call));
    if (st) return st;
  }
  /* bf16: the weights' bfloat16 copy. */
  if (p->precision == PMAP_PRECISION_BF16)
    bad = bad || __builtin_add_overflow(m.params, p->n_params * sizeof(pmap_bf16), &m.params);
  if (runtime_stages(p->ctx)) {
    /* One buffer per slot, of a piece's rows: the inputs (f32) and the labels (i32 class or
     * f32 targets). */
    size_t in = 0, lab = 0;
    if (!p->grad_fn) {
      in = (size_t)model->in_size;
      lab = model->loss == PMAP_LOSS_MSE ? (size_t)model->layers[model->n_layers - 1].out_size : 1;
    }
    bad = bad || add_floats(&m.staging, (size_t)piece * (in + lab));
  }
  m.optimizer_sharded = p->shard != 0;
  m.grads_sharded = p->shard_grads;
  size_t in_use = 0;
  runtime_device_memory(runtime_device(p->ctx, 0), &in_use, &m.device_free);
  /* Everything but the activations, then the layout's: stored, recomputed, or under AUTO the
   * first of stored, selective and full that fits the limit (full where none does). */
  size_t rest = m.params;
  bad = bad || __builtin_add_overflow(rest, m.grads, &rest) ||
        __builtin_add_overflow(rest, m.optimizer, &rest) ||
        __builtin_add_overflow(rest, m.state, &rest) ||
        __builtin_add_overflow(rest, m.staging, &rest);
  int mode = p->recompute;
  if (!bad && mode == PMAP_RECOMPUTE_AUTO) {
    size_t cap = auto_limit(p, &m), with = 0;
    mode = PMAP_RECOMPUTE_FULL;
    if (!__builtin_add_overflow(rest, m.activations_selective, &with) && with <= cap)
      mode = PMAP_RECOMPUTE_SELECTIVE;
    if (!__builtin_add_overflow(rest, m.activations_stored, &with) && with <= cap)
      mode = PMAP_RECOMPUTE_NONE;
  }
  /* A rung that saves nothing (no block to recompute) is planned as none. */
  size_t act = mode == PMAP_RECOMPUTE_FULL        ? m.activations_recomputed
               : mode == PMAP_RECOMPUTE_SELECTIVE ? m.activations_selective
                                                  : m.activations_stored;
  m.recompute = act < m.activations_stored ? mode : PMAP_RECOMPUTE_NONE;
  m.activations = act < m.activations_stored ? act : m.activations_stored;
  bad =
      bad || __builtin_add_overflow(rest, m.activations, &m.total) || m.total > (size_t)PTRDIFF_MAX;
  if (bad)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the memory of batch %lld does not fit in the address space", call,
                    (long long)batch);
  *out = m;
  return PMAP_SUCCESS;
}

/* A job: releases the device's activations (their layout changes). */
static pmap_status release_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica_release(dev, &p->rep[pmap_local_index(dev)]);
  return PMAP_SUCCESS;
}

pmap_status params_fit_recompute(pmap_params *p, int64_t batch, const char *call) {
  if (p->recompute != PMAP_RECOMPUTE_AUTO || p->grad_fn) return PMAP_SUCCESS;
  pmap_memory_plan m;
  PMAP_TRY(params_plan(p, batch, &m, call));
  int on = m.recompute;
  if (on == p->recompute_on) return PMAP_SUCCESS;
  PMAP_TRY(params_dispatch(p, release_job, p));
  p->recompute_on = on;
  model_set_recompute(p->model, on);
  return PMAP_SUCCESS;
}

pmap_status pmap_params_memory(const pmap_params *p, int64_t batch, pmap_memory_plan *out) {
  const char *call = "pmap_params_memory";
  if (!p || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, !p ? "params" : "out");
  int n = p->n;
  if (batch < n || batch > (INT64_C(1) << 40))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: batch %lld is outside %d..%lld (at least a row per device of this "
                    "process)",
                    call, (long long)batch, n, (long long)(INT64_C(1) << 40));
  if (!runtime_uneven(p->ctx) && batch % n != 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: batch %lld is not a multiple of this process's %d devices, which "
                    "pmap_update refuses (pmap_config.uneven_batches is off)",
                    call, (long long)batch, n);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_status st = params_plan(p, batch, out, call);
  pmap_ctx_unlock(p->ctx);
  return st;
}
