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
  pmap_memory_plan m = {0};
  const pmap_model *model = p->model;
  m.recompute = model->recompute;
  /* The most rows any device takes, and its micro-batches as step_grads splits them. */
  int64_t rows = (batch + n - 1) / n, fewest = batch / n;
  int64_t limit = p->grad_fn || model_has_collectives(model) ? fewest : rows;
  int64_t k = p->micro_batches < limit ? p->micro_batches : limit;
  int64_t piece = (rows + k - 1) / k;
  size_t act = 0;
  /* The state sits in the parameters' buffer (after the trained ones), and a step computes its
   * new value into a pending copy. */
  int bad = add_floats(&m.params, p->w_len - model->n_state) || add_floats(&m.grads, p->gl.len) ||
            add_floats(&m.optimizer, (size_t)p->opt_slots * p->state_len) ||
            add_floats(&m.state, 2 * model->n_state);
  size_t ws = 0; /* bf16: the GEMMs' workspace, in the arena after the activations */
  if (!p->grad_fn) {
    bad = bad || model_arena_floats(model, piece, &act) || add_floats(&m.activations, act);
    pmap_status st = bad ? PMAP_SUCCESS : model_gemm16_workspace(model, p->ob, piece, &ws);
    if (st) {
      pmap_ctx_unlock(p->ctx);
      return pmap_error_named(st, call);
    }
    bad = bad || __builtin_add_overflow(m.activations, ws, &m.activations);
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
  m.total = m.params;
  bad = bad || __builtin_add_overflow(m.total, m.grads, &m.total) ||
        __builtin_add_overflow(m.total, m.optimizer, &m.total) ||
        __builtin_add_overflow(m.total, m.state, &m.total) ||
        __builtin_add_overflow(m.total, m.activations, &m.total) ||
        __builtin_add_overflow(m.total, m.staging, &m.total) || m.total > (size_t)PTRDIFF_MAX;
  if (bad) {
    pmap_ctx_unlock(p->ctx);
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the memory of batch %lld does not fit in the address space", call,
                    (long long)batch);
  }
  m.optimizer_sharded = p->shard != 0;
  size_t in_use = 0;
  runtime_device_memory(runtime_device(p->ctx, 0), &in_use, &m.device_free);
  pmap_ctx_unlock(p->ctx);
  *out = m;
  return PMAP_SUCCESS;
}
