/* params_access.c: what the caller reads and sets of params between steps: counts and settings,
 * the step count, one replica's parameters (all, or one named block), every replica's
 * parameters at once, the micro-batch count, and the release of the activation memory. */
#include <stdlib.h>

#include "base/error.h"
#include "params.h"
#include "runtime/runtime.h"

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
  if (pmap_ctx_lock(p->ctx, "pmap_params_step")) return p->step;
  int64_t step = p->step;
  pmap_ctx_unlock(p->ctx);
  return step;
}

typedef struct read_call {
  const pmap_params *p;
  int device;        /* local */
  size_t off, count; /* the range of the parameters read */
  float *dst;        /* (count) host */
} read_call;

static pmap_status read_job(pmap_device *dev, void *arg) {
  const read_call *c = arg;
  int d = pmap_local_index(dev);
  if (d != c->device) return PMAP_SUCCESS;
  return backend_download(dev, c->dst, c->p->rep[d].w + c->off, c->count * sizeof(float));
}

/* The checks of a read from device `device` (global) naming call. */
static pmap_status check_read(const pmap_params *p, const char *call, int device) {
  int n = p->n, first = p->first, G = p->gl.G;
  if (device < 0 || device >= G)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: device %d is outside [0, %d)", call, device, G);
  if (device < first || device >= first + n)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: device %d lives in process %d, not in this process %d (its devices are "
                    "%d..%d); replicas are identical, so read one of this process's",
                    call, device, device / n, first / n, first, first + n - 1);
  return PMAP_SUCCESS;
}

/* [off, off + count) of device `device`'s replica into dst, under the lock. */
static pmap_status read_range(const pmap_params *cp, const char *call, int device, size_t off,
                              size_t count, float *dst) {
  pmap_params *p = (pmap_params *)cp; /* a torn step is completed: its replicas change */
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  read_call c = {p, device - p->first, off, count, dst};
  pmap_status st = params_mend(p, call);
  if (!st) st = params_dispatch(p, read_job, &c);
  pmap_ctx_unlock(p->ctx);
  return st;
}

pmap_status pmap_params_read(const pmap_params *cp, int device, float *dst, size_t count) {
  const char *call = "pmap_params_read";
  if (!cp || !dst)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, cp ? "dst" : "params");
  PMAP_TRY(check_read(cp, call, device));
  if (count != cp->n_params)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu is not the parameter count %zu", call,
                    count, cp->n_params);
  return read_range(cp, call, device, 0, count, dst);
}

pmap_status pmap_params_read_named(const pmap_params *cp, int device, const char *name, float *dst,
                                   size_t count) {
  const char *call = "pmap_params_read_named";
  if (!cp || !name || !dst)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !cp     ? "params"
                    : !name ? "name"
                            : "dst");
  PMAP_TRY(check_read(cp, call, device));
  if (cp->grad_fn)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: no parameter block \"%.80s\": params of a gradient function "
                    "(pmap_params_create_custom) have no named blocks; use pmap_params_read",
                    call, name);
  pmap_param_block b;
  PMAP_TRY(model_find_block(cp->model, call, name, &b));
  if (count != b.count) {
    char shape[96];
    model_block_shape(&b, shape, sizeof shape);
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu is not the %zu elements of %s %s",
                    call, count, b.count, b.name, shape);
  }
  return read_range(cp, call, device, b.offset, count, dst);
}

typedef struct write_call {
  const pmap_params *p;
  const float *src; /* (P) host */
} write_call;

static pmap_status write_job(pmap_device *dev, void *arg) {
  const write_call *c = arg;
  replica *r = &c->p->rep[pmap_local_index(dev)];
  PMAP_TRY(backend_upload(dev, r->w, c->src, c->p->n_params * sizeof(float)));
  replica_w_changed(r);
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
  write_call c = {p, src};
  pmap_status st = params_dispatch(p, write_job, &c);
  if (!st) p->torn = 0; /* every replica is whole again */
  pmap_ctx_unlock(p->ctx);
  return st;
}

static pmap_status shrink_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica_release(dev, &p->rep[pmap_local_index(dev)]);
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
  if (k > 1 && p->shard_grads) {
    pmap_ctx_unlock(p->ctx);
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: %d micro-batches with sharded gradients (PMAP_SHARD_GRADS): each "
                    "layer's gradients are reduced as its backward ends, so a device holds "
                    "those of one micro-batch only; use PMAP_SHARD_ON (the optimizer alone "
                    "sharded) to accumulate micro-batches (nothing was changed)",
                    call, k);
  }
  p->micro_batches = k;
  pmap_ctx_unlock(p->ctx);
  return PMAP_SUCCESS;
}
