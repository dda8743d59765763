/* params.h: the inside of a pmap_params (the replicated training state) for the files of models/
 * that work on it: the state (params.c), the step (step.c), the optimizer (optimizer.c),
 * checkpoints (checkpoint.c), replica checks (verify.c). What a call passes to its job travels
 * with the job, not here. */
#ifndef PMAP_MODELS_PARAMS_H
#define PMAP_MODELS_PARAMS_H

#include <stdatomic.h>

#include "context.h"
#include "model.h"
#include "ops/ops.h"
#include "runtime/runtime.h"

/* A replica's gradient buffer: [gradients (P) | part | loss | flags (G) | parts (G) | micro],
 * then, with a sharded optimizer, G records of [part | loss | flags (G)]. The reduction of a
 * step (all-reduce, or reduce-scatter when sharded) covers [0, reduced), which is split into G
 * parts of `chunk` floats: global device g's part is its shard of the optimizer when sharded,
 * and the gradient norm is summed by parts in either case, so both paths compute it alike. Laid
 * out once, when the params are made (params_layout). */
typedef struct grad_layout {
  int G;             /* global devices */
  size_t part;       /* this device's part norm (sharded; 0 until the reduction) */
  size_t loss;       /* the loss */
  size_t flags;      /* the guard flag of global device g at flags + g (with the guard) */
  size_t parts;      /* the G part norms */
  size_t micro;      /* a micro-batch's loss, before it is weighed into the loss */
  size_t records;    /* sharded: G records of record_len floats */
  size_t record_len; /* [part | loss | flags (G)] */
  size_t reduced;    /* P + 2 + G (the flags' slots reduced with the guard off too) */
  size_t chunk;      /* ceil(reduced / G) rounded up to 16 floats */
  size_t len;        /* floats of the buffer */
  size_t host_len;   /* floats of a device's host tail: [loss | flags (G) | parts (G)], records */
} grad_layout;

struct pmap_params {
  pmap_ctx *ctx;
  int n;                /* devices of this process (D) */
  int first;            /* the global index of this process's device 0 */
  const op_backend *ob; /* the ops of ctx's backend: each replica has a queue of them */
  pmap_model *model;    /* a copy of the user's; custom params: one of no layers */
  pmap_grad_fn grad_fn; /* custom params: the user's gradient function, else NULL */
  void *grad_user;
  pmap_optimizer opt;
  size_t n_params;
  model_span *spans; /* the trained ranges of the parameters (model_trained_spans): the
                        optimizer steps these only, never the layers' state */
  int n_spans;
  int opt_slots; /* optimizer state buffers: of n_params each, or sharded of the device's part */
  int64_t step;
  int micro_batches; /* >= 1: each device's rows are split into this many parts */
  replica *rep;      /* (D) */
  int guard;         /* the numeric guard is on (pmap_config.numeric_guard) */
  int recompute;     /* pmap_config.recompute (PMAP_RECOMPUTE_*) */
  int recompute_on;  /* the rung the model is laid out for (model_set_recompute):
                       PMAP_RECOMPUTE_NONE, _SELECTIVE or _FULL */
  int shard;         /* the optimizer is sharded (pmap_config.shard_optimizer, G > 1) */
  /* The gradients are sharded too (PMAP_SHARD_GRADS, models/grad_window.c): each replica's g
   * holds [its part (chunk) | the tail, gradient offsets from P on (len - P) | the window
   * (gwin_cap) | the pinned range (gpin_len)], and gl.len counts all of it. */
  int shard_grads;
  size_t gwin_cap, gpin_lo, gpin_len;
  grad_layout gl;
  /* The numeric policy (models/precision.c). */
  pmap_precision precision;
  size_t w_len;           /* floats of a replica's parameter buffer: P, or G * chunk when sharded */
  size_t state_len;       /* floats of each optimizer slot on a device: P, or chunk when sharded */
  float *guard_host;      /* (D, gl.host_len) each device's host copy of its tail (scratch) */
  int torn;               /* sharded: the last step's all-gather of the parameters failed twice, so
                        each replica is whole only in its own part; params_mend completes it */
  struct step_fast *fast; /* captured steps and gradient buckets (step_fast.c), else NULL */
  /* Frees fast (set with it by step_fast.c, which params_free calls through it, so that the
   * parameters do not depend on the step that uses them). */
  void (*fast_free)(struct pmap_params *p);
};

/* The highest step count: pmap_update refuses a step past it and pmap_params_load a file holding
 * more, so every checkpoint a run saves loads, and the count + 1 of a step never overflows. */
#define PARAMS_STEP_MAX (INT64_MAX - 1)

/* The global index of local device d. */
static inline int params_global(const pmap_params *p, int d) { return p->first + d; }
/* Part k of the parameters: [*lo, *lo + *len), empty past P. */
static inline void params_part(const pmap_params *p, int k, size_t *lo, size_t *len) {
  size_t a = (size_t)k * p->gl.chunk, P = p->n_params;
  *lo = a < P ? a : P;
  *len = a < P ? (P - a < p->gl.chunk ? P - a : p->gl.chunk) : 0;
}
/* grad_window.c: sharded gradients. The window and the pinned range model m's backward needs
 * (the largest layer's parameters other than a pinned one's; the parameters of the one layer
 * whose gradients a later layer adds into too, a tied table): 0 where two layers' would be
 * pinned, or a layer adds into a later one's (then its gradients are not sharded). */
int grad_window_plan(const pmap_model *m, size_t *cap, size_t *pin_lo, size_t *pin_len);
/* Before a backward pass on the replica: the window on the top layer with parameters, the
 * reduction hooked after each layer (r->layer_grads_done); the buffer is zero (the caller
 * filled it). sumsq: the squares of what this device adds up are summed into r's (for the
 * guard's flag, grad_window_flag). */
pmap_status grad_window_begin(pmap_params *p, replica *r, int sumsq);
/* After the backward pass: what is left (the pinned range where no layer reduced it, the tail:
 * the loss and the guard's slots) reduced into the parts of their devices. */
pmap_status grad_window_finish(pmap_device *dev, pmap_params *p, replica *r);
/* The norm of what this device added up in the last pass begun with sumsq (its gradients and
 * its loss), the guard's flag. */
float grad_window_flag(const replica *r);
/* Runs fn(dev, arg) on every device of p's context with p's op backend entered on the calling
 * thread (device 0's): how every job on params runs. */
static inline pmap_status params_dispatch(pmap_params *p, pmap_fn fn, void *arg) {
  return models_dispatch(p->ctx, p->ob, fn, arg);
}
/* memory.c, under the context's lock. The plan of a step at `batch` (this process's rows; as
 * pmap_params_memory, which the caller checked it for), with the recomputation a step at that
 * batch takes; PMAP_ERR_INVALID_ARGUMENT naming call where it overflows. */
pmap_status params_plan(const pmap_params *p, int64_t batch, pmap_memory_plan *out,
                        const char *call);
/* Under PMAP_RECOMPUTE_AUTO: lays the model out for the recomputation a step at `batch` takes
 * (params_plan's), releasing every device's activations when that changes; else nothing. */
pmap_status params_fit_recompute(pmap_params *p, int64_t batch, const char *call);
/* Sets reduced, chunk and the buffer lengths from n_params, guard, shard and the context. */
void params_layout(pmap_params *p);
/* Sharded: the all-gather of the parameters (every device sends its own part), the last act of
 * a step; its fault hook (PMAP_FAULT=gather) on update step `step` (1 the first). */
pmap_status params_gather(pmap_device *dev, pmap_params *p, int64_t step);
/* Completes a torn step's all-gather (nothing to do when not torn); the lock is held. On failure
 * an error naming `call`, and the params stay torn. */
pmap_status params_mend(pmap_params *p, const char *call);

/* Rows [*lo, *lo + *rows) of a global batch of `batch` rows belong to device d of n: the first
 * batch % n devices take one row more, so shards differ by at most one row (and are equal when
 * batch % n == 0). No product of batch can overflow. */
static inline void params_device_rows(int64_t batch, int n, int d, int64_t *lo, int64_t *rows) {
  int64_t q = batch / n, r = batch % n;
  *lo = q * d + (d < r ? d : r);
  *rows = q + (d < r);
}

/* precision.c: pmap_params_set_precision with the context's lock held and errors naming call. */
pmap_status params_precision_set(pmap_params *p, pmap_precision precision, const char *call);

/* optimizer.c: validation naming `call`; state buffers per parameter; the settings of step t
 * (t >= 1) after the schedule; the step over n parameters of a replica. */
pmap_status optimizer_check(const pmap_optimizer *o, const char *call);
int optimizer_slots(const pmap_optimizer *o);
pmap_step_hyper optimizer_hyper(const pmap_optimizer *o, int64_t t);
/* The largest gradient norm the guard lets p's optimizer take (PMAP_ADAM_NORM_MAX for Adam and
 * AdamW with the guard on), 0 for no limit. */
float params_norm_max(const pmap_params *p);
pmap_status optimizer_apply(const replica *r, const pmap_optimizer *o, const pmap_step_hyper *h,
                            float *w, const float *g, float *state, size_t stride, pmap_bf16 *w16,
                            size_t n);
/* The step with settings h over the trained parameters among [lo, lo + len) of replica r, their
 * gradients scaled by `scale` first (1: not at all); r->opt holds the optimizer state of
 * [lo, lo + len), slot s at r->opt + s * len. The layers' state in the range is left alone.
 * Under bf16 the same pass writes the updated weights' bfloat16 copy into r->w16. */
pmap_status optimizer_step_range(const pmap_params *p, replica *r, const pmap_step_hyper *h,
                                 size_t lo, size_t len, float scale);

#endif
