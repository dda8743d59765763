/* step.h: one call of pmap_update as its jobs see it (the arguments travel with the job, never
 * on the params), and the pieces the step's files share: the processes' agreement on a step
 * (step_procs.c), the fast paths (step_fast.c). The batch's checks and staging, which
 * pmap_predict shares, are batch.h's. */
#ifndef PMAP_MODELS_STEP_H
#define PMAP_MODELS_STEP_H

#include <stdatomic.h>

#include "batch.h"
#include "params.h"

/* One pmap_update. */
typedef struct step_call {
  pmap_params *p;
  const pmap_array *xs, *ys; /* this process's rows */
  int64_t batch;             /* their count */
  int64_t t;                 /* the step being taken: the params' step + 1 */
  pmap_step_hyper hyper;     /* its optimizer settings after the schedule */
  int want_loss;             /* the caller asked for the loss */
  /* 1: the guard's flags (each device's own norm) are not computed before the reduction but
   * only for the message of a skipped step, from its gradients computed once more (step.c): the
   * plain step on several devices without a user's gradient function. A non-finite value of any
   * device makes the averaged one non-finite, so the decision needs only the averaged values. */
  int flags_late;
  float loss;          /* out: the averaged loss (device 0) */
  int skipped;         /* out: the numeric guard skipped the step (device 0) */
  float over_norm;     /* out: with skipped, the finite norm over params_norm_max, else 0 */
  _Atomic int stepped; /* out, sharded: a device stepped its part (the gather may follow) */
} step_call;

/* step_procs.c. Across processes, before any device works: every process passes as many rows,
 * at the same step, with the same optimizer settings and, where the devices exchange values
 * inside the step, as many micro-batches (else PMAP_ERR_INVALID_ARGUMENT naming each process's
 * value, nothing changed). refused: this process's own refusal of the call (its message the
 * thread's), which it brings to the exchange all the same, so that every process refuses the
 * step (pmap_ctx_exchange). One process: returns refused. */
pmap_status step_check_processes(const step_call *c, pmap_status refused);

#endif
