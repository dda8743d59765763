/* step_fast.h: the fast paths of pmap_update (models/step_fast.c) over a backend's optional
 * fast primitives (runtime/runtime.h): the whole step captured into a graph and replayed, and gradient buckets
 * all-reduced while backward still runs. step.c calls these; nothing here exists on CPU. */
#ifndef PMAP_MODELS_STEP_FAST_H
#define PMAP_MODELS_STEP_FAST_H

#include "step.h"

/* A device's gradients of the current call (step_grads, step_stages.h). */
typedef pmap_status (*step_grads_fn)(pmap_device *dev, step_call *c, replica *r);

/* On the calling thread before the step's dispatch, after the batch was checked: decides, the
 * same for every device, whether this step runs plainly, eagerly with the fast path's device
 * decisions, captured or replayed (c->want_loss: the caller asked for the loss; else no device
 * waits for the step when the numeric guard is off). Returns 1 when the fast way takes the
 * step, 0 when it runs plainly. */
int step_fast_prepare(step_call *c);
/* In update_job on every device: runs the step the fast way and sets *handled, or leaves
 * *handled 0 for the plain step. */
pmap_status step_fast_update(pmap_device *dev, step_call *c, replica *r, step_grads_fn grads,
                             int *handled);
/* Frees the captured graphs on every device and the state (p->ctx's lock held). */
void step_fast_free(pmap_params *p);

/* 1 while p steps by replaying captured graphs (for tests). */
int step_fast_graphs_live(const pmap_params *p);

/* The first gradient offset that is complete once layers i..L-1 ran backward, for each layer i
 * (lo (L)): where a bucket may start after layer i's backward. */
void step_fast_bucket_starts(const pmap_model *m, size_t *lo);

#endif
