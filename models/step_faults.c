/* step_faults.c: the faults PMAP_FAULT injects into a step (runtime/fault.h), at the points
 * step_stages.h names: every hook of the step behind this one call. */
#include <math.h>
#include <time.h>

#include "base/error.h"
#include "runtime/runtime.h"
#include "step_stages.h"

/* Device `dev` waits as if hung, until another device gives up on it (or 10 timeouts pass). */
static void stall(pmap_device *dev) {
  const pmap_ctx *ctx = runtime_ctx_of(dev);
  int64_t timeout = runtime_timeout_ns(ctx);
  int64_t limit = timeout >= 0 ? 10 * timeout : 1000000000;
  int64_t start = pmap_now_ns();
  struct timespec ms = {0, 1000000};
  while (!runtime_aborting(ctx) && pmap_now_ns() - start < limit) nanosleep(&ms, NULL);
}

/* Moves one parameter of this replica by one ulp. */
static pmap_status drift(pmap_device *dev, replica *r) {
  float w0 = 0.0f;
  PMAP_TRY(backend_download(dev, &w0, r->w, sizeof w0));
  w0 = nextafterf(w0, INFINITY);
  PMAP_TRY(backend_upload(dev, r->w, &w0, sizeof w0));
  replica_w_changed(r);
  return backend_sync(dev);
}

pmap_status step_inject(pmap_device *dev, const step_call *c, replica *r, fault_point at) {
  int64_t step = c->t;
  if (at == AFTER_APPLY)
    return runtime_fault(dev, FAULT_DRIFT, step) ? drift(dev, r) : PMAP_SUCCESS;
  if (runtime_fault(dev, FAULT_NAN, step)) {
    r->source.injected = step;
    /* With sharded gradients the reduction ran in the backward pass: the device's part of the
     * averaged gradient is made NaN instead. */
    if (c->p->shard_grads)
      PMAP_TRY(r->ops->fill(r->q, r->gp, NAN, c->p->gl.chunk));
    else
      PMAP_TRY(r->ops->fill(r->q, r->g, NAN, c->p->n_params));
  }
  if (runtime_fault(dev, FAULT_COLLECTIVE, step))
    return PMAP_ERR(
        PMAP_ERR_DEVICE, "device %d: the gradient %s of step %lld failed (injected by PMAP_FAULT)",
        pmap_axis_index(dev), c->p->shard ? "reduce-scatter" : "all-reduce", (long long)step);
  if (runtime_fault(dev, FAULT_STALL, step)) stall(dev);
  return PMAP_SUCCESS;
}
