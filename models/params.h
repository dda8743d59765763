/* params.h: the inside of a pmap_params (the replicated training state) for the files of models/
 * that work on it: the state (params.c), the step (step.c), the optimizer (optimizer.c),
 * checkpoints (checkpoint.c), replica checks (verify.c). */
#ifndef PMAP_MODELS_PARAMS_H
#define PMAP_MODELS_PARAMS_H

#include <stdatomic.h>

#include "model.h"
#include "runtime/backend.h"

/* The highest step count: pmap_update refuses a step past it and pmap_params_load a file holding
 * more, so every checkpoint a run saves loads, and the count + 1 of a step never overflows. */
#define PARAMS_STEP_MAX (INT64_MAX - 1)

struct pmap_params {
  pmap_ctx *ctx;
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
  replica *rep;      /* (N) */
  /* A replica's gradient buffer (params_off_*): [gradients (P) | part | loss | guard flags (G) |
   * parts (G) | micro-batch loss], then, sharded, the records of the exchange. The reduction
   * (all-reduce, or reduce-scatter when sharded) covers [0, reduced). G is the global device
   * count; [0, reduced) is split into G parts of `chunk` elements: device g's part is its shard
   * of the optimizer when sharded, and the norm is summed by parts in either case, so that both
   * paths compute it alike. */
  int guard;           /* the numeric guard is on (pmap_config.numeric_guard) */
  int shard;           /* the optimizer is sharded (pmap_config.shard_optimizer, G > 1) */
  int ng;              /* G */
  size_t reduced;      /* P + 2 (+ G with the guard) */
  size_t chunk;        /* ceil(reduced / G) rounded up to 16 floats */
  size_t g_len;        /* floats of a replica's gradient buffer */
  size_t w_len;        /* floats of a replica's parameter buffer: P, or G * chunk when sharded */
  size_t state_len;    /* floats of each optimizer slot on a device: P, or chunk when sharded */
  float *guard_host;   /* (D, params_host_len) each device's host copy of [loss | flags | parts],
                        then, sharded, of the records */
  _Atomic int stepped; /* sharded: a device stepped its part this step (the gather may follow) */
  int torn;            /* sharded: the last step's all-gather of the parameters failed twice, so
                        each replica is whole only in its own part; params_mend completes it */
  int numeric_bad;     /* the last step was skipped: non-finite values */
  /* The current job's arguments. */
  const float *host_w;
  const pmap_array *xs, *ys;
  pmap_array *out;
  int64_t batch;         /* global rows of the call */
  int64_t bd;            /* most rows any device takes */
  pmap_step_hyper hyper; /* this step's optimizer settings */
  int read_device;
  float *read_dst;
  float loss;
  /* Checkpoint and verify jobs (checkpoint.c, verify.c); host memory, set only during a call. */
  float *ckpt_w;             /* (P) parameters downloaded from device 0 or to upload */
  float *ckpt_opt;           /* (opt_slots * P) optimizer state, likewise */
  uint32_t *verify_sums;     /* (N) each device's checksum of its replica */
  unsigned char *verify_buf; /* (N, verify_chunk) one bounded download buffer per device */
  size_t verify_chunk;       /* bytes of each device's buffer */
  struct step_fast *fast;    /* captured steps and gradient buckets (step_fast.c), else NULL */
};

/* Floats of a replica's gradient buffer. */
static inline size_t params_grad_len(const pmap_params *p) { return p->g_len; }
/* Offsets into it. part: this device's part norm (sharded; 0 until the reduction); loss; the
 * guard flag of global device g at flags + g; parts: the G part norms; micro: scratch for a
 * micro-batch's loss; records (sharded): G records of params_record_len floats, each a copy of
 * one device's [part | loss | flags]. */
static inline size_t params_off_part(const pmap_params *p) { return p->n_params; }
static inline size_t params_off_loss(const pmap_params *p) { return p->n_params + 1; }
static inline size_t params_off_flags(const pmap_params *p) { return p->n_params + 2; }
static inline size_t params_off_parts(const pmap_params *p) {
  return p->n_params + 2 + (size_t)p->ng;
}
static inline size_t params_off_micro(const pmap_params *p) {
  return params_off_parts(p) + (size_t)p->ng;
}
static inline size_t params_record_len(const pmap_params *p) { return (size_t)p->ng + 2; }
static inline size_t params_off_records(const pmap_params *p) {
  size_t end = params_off_micro(p) + 1, padded = (size_t)p->ng * p->chunk;
  return end > padded ? end : padded;
}
/* Floats of a device's host tail: [loss | flags (G) | parts (G)], then the G records. */
static inline size_t params_host_len(const pmap_params *p) {
  return (size_t)p->ng + 1 + (size_t)p->ng + (size_t)p->ng * params_record_len(p);
}
/* The global index of local device d. */
static inline int params_global(const pmap_params *p, int d) {
  return p->ctx->proc * p->ctx->n + d;
}
/* Part k of the parameters: [*lo, *lo + *len), empty past P. */
static inline void params_part(const pmap_params *p, int k, size_t *lo, size_t *len) {
  size_t a = (size_t)k * p->chunk, P = p->n_params;
  *lo = a < P ? a : P;
  *len = a < P ? (P - a < p->chunk ? P - a : p->chunk) : 0;
}
/* Runs fn(dev, arg) on every device of p's context with p's op backend entered on the calling
 * thread (device 0's): how every job on params runs. */
pmap_status params_dispatch(pmap_params *p, pmap_fn fn, void *arg);
/* Sets reduced, chunk and the buffer lengths from n_params, guard, shard and the context. */
void params_layout(pmap_params *p);
/* Sharded: the all-gather of the parameters (every device sends its own part), the last act of
 * a step; its fault hook (PMAP_FAULT=gather) on update step `step`. */
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

/* optimizer.c: validation naming `call`; state buffers per parameter; the settings of step t
 * (t >= 1) after the schedule; the step over n parameters of a replica. */
pmap_status optimizer_check(const pmap_optimizer *o, const char *call);
int optimizer_slots(const pmap_optimizer *o);
pmap_step_hyper optimizer_hyper(const pmap_optimizer *o, int64_t t);
pmap_status optimizer_apply(const replica *r, const pmap_optimizer *o, const pmap_step_hyper *h,
                            float *w, const float *g, float *state, size_t stride, size_t n);
/* The step over the trained parameters among [lo, lo + len) of replica r, their gradients scaled
 * by `scale` first (1: not at all); r->opt holds the optimizer state of [lo, lo + len), slot s at
 * r->opt + s * len. The layers' state in the range is left alone. */
pmap_status optimizer_step_range(pmap_params *p, replica *r, size_t lo, size_t len, float scale);

#endif
