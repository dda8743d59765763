/* step_procs.c: across processes, before a step's devices work, the processes agree on what
 * they pass: as many rows, the same step, the same optimizer settings, as many micro-batches
 * where the devices exchange values inside, and no process refused its batch. One small
 * exchange of the host per step (none in one process). */
#include <stdio.h>

#include "base/error.h"
#include "runtime/runtime.h"
#include "step.h"

/* What every process must pass alike to a step: as many rows (the mean weighs every global
 * device alike, which is the global mean only then), the same step number and the same
 * optimizer settings (replicas stepped differently would drift apart silently). */
typedef struct step_record {
  int64_t rows, step;
  uint64_t opt;   /* a hash of the optimizer's settings */
  int64_t pieces; /* micro-batches per device where they must agree (collectives inside), else 0 */
  float lr;       /* the step's learning rate, for the message */
  int32_t kind;
} step_record;

/* The pieces every device must run alike: layers with collectives inside (cross-replica batch
 * norm) and a gradient function (which may call collectives) meet once per piece, so a process
 * running another count would call other collectives than the rest. */
static int64_t agreed_pieces(const step_call *c) {
  const pmap_params *p = c->p;
  if (!p->grad_fn && !model_has_collectives(p->model)) return 0;
  int64_t fewest = c->batch / p->n;
  return p->micro_batches < fewest ? p->micro_batches : fewest;
}

static uint64_t hash_bytes(uint64_t h, const void *v, size_t n) {
  const unsigned char *b = v;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Field by field, so that padding never counts. */
static uint64_t opt_hash(const pmap_optimizer *o) {
  uint64_t h = 1469598103934665603ull;
  int32_t k = o->kind, nest = o->nesterov, sched = o->schedule;
  const float f[] = {o->lr,  o->momentum,  o->beta1,        o->beta2,
                     o->eps, o->clip_norm, o->weight_decay, o->final_lr};
  const int64_t w[] = {o->warmup_steps, o->decay_steps};
  h = hash_bytes(h, &k, sizeof k);
  h = hash_bytes(h, &nest, sizeof nest);
  h = hash_bytes(h, &sched, sizeof sched);
  h = hash_bytes(h, f, sizeof f);
  return hash_bytes(h, w, sizeof w);
}

/* The list "process 0 (host a): 8; process 1 (host b): 16" of one field of every record. */
static void list_field(const pmap_ctx *ctx, const step_record *all, int field, char *buf,
                       size_t size) {
  size_t len = 0;
  char name[128];
  buf[0] = '\0';
  for (int r = 0; r < pmap_ctx_num_processes(ctx) && len < size; r++) {
    pmap_proc_name(ctx, r, name, sizeof name);
    const step_record *x = &all[r];
    if (field == 0)
      len += (size_t)snprintf(buf + len, size - len, "%s%s: %lld", r ? "; " : "", name,
                              (long long)x->rows);
    else if (field == 1)
      len += (size_t)snprintf(buf + len, size - len, "%s%s: step %lld", r ? "; " : "", name,
                              (long long)x->step);
    else if (field == 3)
      len += (size_t)snprintf(buf + len, size - len, "%s%s: %lld", r ? "; " : "", name,
                              (long long)x->pieces);
    else
      len += (size_t)snprintf(buf + len, size - len, "%s%s: optimizer %d, lr %g (settings %016llx)",
                              r ? "; " : "", name, (int)x->kind, (double)x->lr,
                              (unsigned long long)x->opt);
  }
}

/* Every step of a distributed context runs the exchange, before any device works, refused or
 * not: whether to run it must not depend on anything one process knows and another does not. */
pmap_status step_check_processes(const step_call *c, pmap_status refused) {
  const pmap_params *p = c->p;
  pmap_ctx *ctx = p->ctx;
  if (!runtime_distributed(ctx)) return refused;
  step_record mine = {c->batch, p->step, opt_hash(&p->opt), 0, 0.0f, (int32_t)p->opt.kind};
  if (!refused) {
    mine.pieces = agreed_pieces(c);
    mine.lr = (float)pmap_optimizer_lr(&p->opt, p->step + 1);
  }
  const void *got = NULL;
  PMAP_TRY(pmap_ctx_exchange(ctx, "pmap_update's step check", refused, &mine, sizeof mine, &got));
  const step_record *all = got;
  int field = -1;
  for (int r = 0; r < pmap_ctx_num_processes(ctx) && field < 0; r++)
    field = all[r].rows != mine.rows       ? 0
            : all[r].step != mine.step     ? 1
            : all[r].opt != mine.opt       ? 2
            : all[r].pieces != mine.pieces ? 3
                                           : -1;
  if (field < 0) return PMAP_SUCCESS;
  static const char *const what[] = {
      "pass different numbers of rows (%s): each must pass the same number, so that the mean "
      "weighs every row alike",
      "are at different steps (%s): they resumed from different checkpoints or one skipped a "
      "step",
      "have different optimizer settings (%s): every replica must take the same step",
      "run different numbers of micro-batches per device (%s): with layers that exchange values "
      "between devices (batch norm across replicas) or a gradient function, every device must "
      "run as many (pmap_params_set_micro_batches)"};
  char list[700], why[900];
  list_field(ctx, all, field, list, sizeof list);
  snprintf(why, sizeof why, what[field], list);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_update: the processes %s (nothing was changed)",
                  why);
}

pmap_status pmap_update_refuse(pmap_params *p, pmap_status status, const char *why) {
  const char *call = "pmap_update_refuse";
  if (!p) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: params is NULL", call);
  if (status <= PMAP_SUCCESS || status > PMAP_ERR_NUMERIC) status = PMAP_ERR_INVALID_ARGUMENT;
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_error_set(status, "%s",
                 why && *why ? why : "the caller refused this step (no reason given)");
  step_call c = {.p = p};
  atomic_init(&c.stepped, 0);
  pmap_status st = step_check_processes(&c, status);
  pmap_ctx_unlock(p->ctx);
  return st;
}
