/* step_paths.c: the stages of a step after the gradients (step_stages.h), on one of two paths:
 *   replicated: reduce (one all-reduce, mean, of [gradients | loss | guard flags]) -> decide
 *               (the numeric guard and clipping, alike on every device) -> apply (the pending
 *               state, the optimizer over every parameter);
 *   sharded:    reduce (a reduce-scatter: each device holds its own part averaged) -> decide
 *               (a small all-gather of every device's [part norm | loss | flags]) -> apply (the
 *               pending state, the optimizer over the device's part, an all-gather of the
 *               parameters). */
#include <math.h>
#include <stdatomic.h>

#include "base/error.h"
#include "base/trace.h"
#include "ops/op_math.h"
#include "runtime/runtime.h"
#include "step_stages.h"

/* ------------------------------------------------------------------------------------------ */
/* Decide: the numeric guard and the clipping scale                                           */

typedef struct verdict {
  int skip;    /* the guard skips the step on every replica */
  float scale; /* the gradients' clipping scale (1: none) */
  float over;  /* with skip: the finite norm over params_norm_max (0: a value was not finite) */
} verdict;

/* From this device's host tail h = [loss | flags (G) | part norms (G)], which every device
 * holds alike: the norm summed from the G part norms in order, in double (alike on both paths),
 * the guard's test and the clipping scale. */
static verdict decide(const pmap_params *p, const float *h) {
  int G = p->gl.G;
  verdict v = {0, 1.0f, 0.0f};
  if (!p->guard && !(p->opt.clip_norm > 0.0f)) return v;
  double sum = 0.0;
  for (int k = 0; k < G; k++) sum += (double)h[G + 1 + k] * (double)h[G + 1 + k];
  float norm = (float)sqrt(sum);
  if (p->guard) {
    /* The averaged loss and norm decide: NaN and infinity pass through the mean, so a device's
     * own non-finite value makes them non-finite; the flags (where computed) only name the
     * devices, so a device whose own finite values have a norm past FLT_MAX skips no step. */
    int finite = isfinite(norm) && isfinite(h[0]);
    if (!finite) {
      v.skip = 1;
      return v;
    }
  }
  float clip = p->opt.clip_norm;
  if (pmap_guard_norm_over(norm, clip, params_norm_max(p))) {
    v.skip = 1;
    v.over = norm;
    return v;
  }
  /* In double: clip / norm may underflow float (a tiny clip, a huge norm); the step still takes
   * its (tiny, or with the guard off and an infinite norm, NaN-making) scale. */
  if (clip > 0.0f && !(norm <= clip)) v.scale = (float)((double)clip / (double)norm);
  return v;
}

/* The guard's flag of this device: the norm of its own gradients and loss, in the slot of its
 * global index; the others' slots are 0, so after the mean a slot is non-finite exactly when
 * its device's values were. One device's own values are the averaged ones: its flag is the norm
 * the decision computes anyway (step_replicated), not a pass of its own. With c->flags_late
 * (step.h) no device computes its flag here: a slot stays 0 and the skipped step's message
 * computes them (step.c). */
pmap_status step_guard_flag(pmap_device *dev, const step_call *c, replica *r) {
  const pmap_params *p = c->p;
  if (!p->guard || p->gl.G == 1 || c->flags_late) return PMAP_SUCCESS;
  const grad_layout *gl = &p->gl;
  return r->ops->norm2(r->q, r->g, gl->flags, replica_g(r, gl->flags) + pmap_axis_index(dev));
}

/* The optimizer over [lo, lo + len), a span of the device's track. */
static pmap_status traced_optimizer(pmap_device *dev, pmap_params *p, replica *r,
                                    const step_call *c, size_t lo, size_t len, float scale) {
  trace_rec *tr = runtime_trace(p->ctx);
  runtime_span sp = tr ? runtime_span_begin(dev) : (runtime_span){0, -1};
  PMAP_TRY(optimizer_step_range(p, r, &c->hyper, lo, len, scale));
  if (tr)
    runtime_span_end(dev, sp, "optimizer", NULL, -1, "optimizer", (int64_t)(len * sizeof(float)));
  return PMAP_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* The replicated path                                                                        */

/* Every device holds every averaged gradient: it computes every part norm itself and reads
 * [loss | flags | parts] back. */
pmap_status step_replicated(pmap_device *dev, step_call *c, replica *r) {
  pmap_params *p = c->p;
  const grad_layout *gl = &p->gl;
  /* Reduce. */
  PMAP_TRY(step_guard_flag(dev, c, r));
  PMAP_TRY(
      backend_all_reduce(dev, "pmap_update's all-reduce", r->g, r->g, gl->reduced, PMAP_RED_MEAN));
  /* Decide. */
  verdict v = {0, 1.0f, 0.0f};
  int tail = p->guard || p->opt.clip_norm > 0.0f;
  float *h = step_host_tail(p, dev);
  if (tail) {
    for (int k = 0; k < gl->G; k++) {
      size_t lo = 0, len = 0;
      params_part(p, k, &lo, &len);
      PMAP_TRY(r->ops->norm2(r->q, replica_g(r, lo), len, replica_g(r, gl->parts) + k));
    }
    PMAP_TRY(backend_download(dev, h, replica_g(r, gl->loss), (2 * (size_t)gl->G + 1) * sizeof *h));
    if (gl->G == 1 && p->guard) h[1] = h[2]; /* one device: its flag is the part norm */
    v = decide(p, h);
  }
  if (v.skip) {
    if (pmap_local_index(dev) == 0) c->skipped = 1, c->over_norm = v.over;
    return PMAP_SUCCESS; /* nothing changes on any replica */
  }
  /* Apply. */
  PMAP_TRY(model_state_commit(p->model, r));
  PMAP_TRY(traced_optimizer(dev, p, r, c, 0, p->n_params, v.scale));
  r->w16_fresh = r->w16 != NULL; /* the optimizer's pass wrote the next forward's weights */
  PMAP_TRY(step_inject(dev, c, r, AFTER_APPLY));
  if (pmap_local_index(dev) != 0) return backend_sync(dev);
  if (tail) {
    c->loss = h[0];
    return backend_sync(dev);
  }
  return backend_download(dev, &c->loss, replica_g(r, gl->loss), sizeof c->loss);
}

/* ------------------------------------------------------------------------------------------ */
/* The sharded path                                                                           */

/* Each device holds only its own part averaged: it computes its part norm, and the devices
 * all-gather [part | loss | flags]; each value of the loss and flags is taken from the record
 * of the device whose part held it averaged. */
static pmap_status sharded_tail(pmap_device *dev, const pmap_params *p, replica *r, int64_t t,
                                float *h) {
  const grad_layout *gl = &p->gl;
  int G = gl->G;
  size_t lo = 0, len = 0, rec = gl->record_len;
  params_part(p, pmap_axis_index(dev), &lo, &len);
  if (p->guard || p->opt.clip_norm > 0.0f)
    PMAP_TRY(r->ops->norm2(r->q, replica_g(r, lo), len, replica_g(r, gl->part)));
  /* PMAP_FAULT's nan with sharded gradients (step_faults.c) made this device's part NaN; its
   * norm is made NaN too, for a part that holds no parameters. */
  if (p->shard_grads && r->source.injected == t)
    PMAP_TRY(r->ops->fill(r->q, replica_g(r, gl->part), NAN, 1));
  float *records = replica_g(r, gl->records);
  PMAP_TRY(backend_all_gather(dev, "pmap_update's exchange of norms", replica_g(r, gl->part),
                              records, rec));
  float *hr = h + G + 1 + G;
  PMAP_TRY(backend_download(dev, hr, records, (size_t)G * rec * sizeof *h));
  for (size_t j = 0; j <= (size_t)G; j++) { /* loss, then the flags */
    size_t at = gl->loss + j;
    size_t owner = at < gl->reduced ? at / gl->chunk : 0;
    h[j] = hr[owner * rec + 1 + j];
  }
  for (int k = 0; k < G; k++) h[G + 1 + k] = hr[(size_t)k * rec];
  return PMAP_SUCCESS;
}

/* Under bf16, after the gather: the optimizer's pass rounded this device's part [lo, lo + len)
 * into w16; the parts the others stepped are rounded here, and w16 is then the next forward's. */
static pmap_status weights16_around(const pmap_params *p, replica *r, size_t lo, size_t len) {
  if (!r->w16) return PMAP_SUCCESS;
  size_t end = lo + len;
  if (lo) PMAP_TRY(r->ops->round_bf16(r->q, r->w, r->w16, NULL, lo));
  if (end < p->n_params)
    PMAP_TRY(r->ops->round_bf16(r->q, r->w + end, r->w16 + end, NULL, p->n_params - end));
  r->w16_fresh = 1;
  return PMAP_SUCCESS;
}

pmap_status step_sharded(pmap_device *dev, step_call *c, replica *r) {
  pmap_params *p = c->p;
  const grad_layout *gl = &p->gl;
  /* Reduce. */
  PMAP_TRY(step_guard_flag(dev, c, r));
  /* With sharded gradients each device's part was reduced in the backward pass. */
  if (!p->shard_grads)
    PMAP_TRY(backend_reduce_scatter(dev, "pmap_update's reduce-scatter", r->g, gl->chunk,
                                    PMAP_RED_MEAN));
  /* Decide. */
  float *h = step_host_tail(p, dev);
  PMAP_TRY(sharded_tail(dev, p, r, c->t, h));
  verdict v = decide(p, h);
  if (v.skip) {
    if (pmap_local_index(dev) == 0) c->skipped = 1, c->over_norm = v.over;
    return PMAP_SUCCESS;
  }
  /* Apply. Every device passed the exchange (one verdict), so every device steps its part now:
   * a failure from here on leaves the step taken (pmap_update then completes the gather). Every
   * device says so itself (on CUDA the verdicts of a collective are per device). */
  atomic_store(&c->stepped, 1);
  if (pmap_local_index(dev) == 0) c->loss = h[0];
  /* The state its forward passes computed replaces the old (the same on every device, so each
   * commits its own copy of all of it). */
  PMAP_TRY(model_state_commit(p->model, r));
  size_t lo = 0, len = 0;
  params_part(p, pmap_axis_index(dev), &lo, &len);
  PMAP_TRY(traced_optimizer(dev, p, r, c, lo, len, v.scale));
  PMAP_TRY(params_gather(dev, p, c->t));
  PMAP_TRY(weights16_around(p, r, lo, len));
  PMAP_TRY(step_inject(dev, c, r, AFTER_APPLY));
  return backend_sync(dev);
}
