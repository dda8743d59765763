/* step_stages.h: the stages of a pmap_update on one device, each in its own file, which
 * step.c runs in order and which call only downward (into the params, the model, the batch and
 * the runtime):
 *   step_grads.c   the gradients of the device's rows, in micro-batches (forward, loss,
 *                  backward, or the user's gradient function);
 *   step_paths.c   reduce -> decide -> apply, replicated (one all-reduce) or sharded (a
 *                  reduce-scatter, each device stepping its part, an all-gather);
 *   step_faults.c  the injected faults (PMAP_FAULT) at the points between them. */
#ifndef PMAP_MODELS_STEP_STAGES_H
#define PMAP_MODELS_STEP_STAGES_H

#include "step.h"

/* step_grads.c: every piece of this device's rows into r->g (zeroed by the caller). Its share
 * of the mean weighs rows * N / B (1 for an even batch), split over the pieces by their rows. */
pmap_status step_grads(pmap_device *dev, step_call *c, replica *r);

/* step_faults.c: the points of a step where PMAP_FAULT may fire (runtime/fault.h). */
typedef enum fault_point {
  BEFORE_REDUCE, /* nan, collective, stall: the device's own gradients are complete */
  AFTER_APPLY    /* drift: the replica is stepped */
} fault_point;
pmap_status step_inject(pmap_device *dev, const step_call *c, replica *r, fault_point at);

/* step_paths.c: reduce, decide and apply, on the replicated path or on the sharded one. The
 * guard's flag of this device, into its slot of r->g (nothing with c->flags_late). */
pmap_status step_guard_flag(pmap_device *dev, const step_call *c, replica *r);
pmap_status step_replicated(pmap_device *dev, step_call *c, replica *r);
pmap_status step_sharded(pmap_device *dev, step_call *c, replica *r);

/* This device's host tail [loss | flags (G) | part norms (G)] (device 0's is what the call
 * reports). */
static inline float *step_host_tail(const pmap_params *p, pmap_device *dev) {
  return p->guard_host + (size_t)pmap_local_index(dev) * p->gl.host_len;
}

#endif
