/* params.h: the inside of a pmap_params (the replicated training state) for the files of models/
 * that work on it: the state (params.c), the step (step.c), the optimizer (optimizer.c),
 * checkpoints (checkpoint.c), replica checks (verify.c). */
#ifndef PMAP_MODELS_PARAMS_H
#define PMAP_MODELS_PARAMS_H

#include "model.h"
#include "runtime/backend.h"

struct pmap_params {
  pmap_ctx *ctx;
  pmap_model *model;    /* a copy of the user's; custom params: one of no layers */
  pmap_grad_fn grad_fn; /* custom params: the user's gradient function, else NULL */
  void *grad_user;
  pmap_optimizer opt;
  size_t n_params;
  int opt_slots; /* optimizer state buffers of n_params each */
  int64_t step;
  int micro_batches; /* >= 1: each device's rows are split into this many parts */
  replica *rep;      /* (N) */
  /* The gradient buffer of a replica is [gradients (P) | loss | guard flags (N) | norm |
   * micro-batch loss]: the all-reduce covers the first P + 1 (+ N with the numeric guard). */
  int guard;         /* the numeric guard is on (pmap_config.numeric_guard) */
  float *guard_host; /* (N, N + 2) each device's host copy of [loss | flags | norm] */
  int numeric_bad;   /* the last step was skipped: non-finite values */
  /* The current job's arguments. */
  const float *host_w;
  const pmap_array *xs, *ys;
  pmap_array *out;
  int64_t batch;         /* global rows of the call */
  int64_t bd;            /* most rows any device takes */
  pmap_step_hyper hyper; /* this step's optimizer settings */
  int64_t dist_bd;       /* across processes: the rows per device every process last agreed on */
  float rows[2];         /* the exchange of that agreement: max and -min over the processes */
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
static inline size_t params_grad_len(const pmap_params *p) {
  return p->n_params + 3 + (size_t)p->ctx->n;
}

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
pmap_status optimizer_apply(pmap_device *dev, const pmap_optimizer *o, const pmap_step_hyper *h,
                            float *w, const float *g, float *state, size_t n);

#endif
