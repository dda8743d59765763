/* optimizer.c: optimizer settings (SGD with momentum, Nesterov and L2 weight decay; Adam;
 * AdamW), learning-rate schedules, their validation, and the step over a replica's flat buffers
 * through the op table (the per-element math is in ops/op_math.h). */
#include <math.h>

#include "params.h"
#include "base/error.h"
#include "ops/op_math.h"

pmap_optimizer pmap_sgd(float lr, float momentum) {
  pmap_optimizer o = {.kind = PMAP_OPT_SGD, .lr = lr, .momentum = momentum};
  return o;
}

pmap_optimizer pmap_adam(float lr) {
  pmap_optimizer o = {
      .kind = PMAP_OPT_ADAM, .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  return o;
}

pmap_optimizer pmap_adamw(float lr, float weight_decay) {
  pmap_optimizer o = pmap_adam(lr);
  o.kind = PMAP_OPT_ADAMW;
  o.weight_decay = weight_decay;
  return o;
}

double pmap_optimizer_lr(const pmap_optimizer *o, int64_t t) {
  if (!o) return 0.0;
  double lr = o->lr, f = o->final_lr;
  if (o->schedule == PMAP_SCHEDULE_CONSTANT || t < 1) return lr;
  int64_t w = o->warmup_steps, d = o->decay_steps > 0 ? o->decay_steps : 1;
  if (t <= w) return lr * (double)t / (double)w;
  double frac = (double)(t - w < d ? t - w : d) / (double)d;
  if (o->schedule == PMAP_SCHEDULE_WARMUP_COSINE)
    return f + (lr - f) * (1.0 + cos(3.14159265358979323846 * frac)) / 2.0;
  return lr - (lr - f) * frac;
}

static pmap_status check_schedule(const pmap_optimizer *o, const char *call) {
  if (o->warmup_steps < 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: warmup_steps %lld must be >= 0", call,
                    (long long)o->warmup_steps);
  switch (o->schedule) {
  case PMAP_SCHEDULE_CONSTANT: return PMAP_SUCCESS;
  case PMAP_SCHEDULE_WARMUP_COSINE:
  case PMAP_SCHEDULE_WARMUP_LINEAR:
    if (o->warmup_steps < 0 || o->decay_steps <= 0 || !(o->final_lr >= 0.0f) ||
        !(o->final_lr <= o->lr))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: schedule warm-up %lld steps, decay %lld steps, final lr %g: need "
                      "warm-up >= 0, decay > 0 and 0 <= final lr <= lr %g",
                      call, (long long)o->warmup_steps, (long long)o->decay_steps,
                      (double)o->final_lr, (double)o->lr);
    return PMAP_SUCCESS;
  }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: unknown schedule %d", call, (int)o->schedule);
}

pmap_status optimizer_check(const pmap_optimizer *o, const char *call) {
  if (!(o->lr > 0.0f) || !isfinite(o->lr))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: learning rate %g must be > 0 and finite", call,
                    (double)o->lr);
  if (!(o->clip_norm >= 0.0f) || !isfinite(o->clip_norm))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: clip_norm %g must be >= 0 and finite", call,
                    (double)o->clip_norm);
  if (!(o->weight_decay >= 0.0f) || !isfinite(o->weight_decay))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: weight_decay %g must be >= 0 and finite", call,
                    (double)o->weight_decay);
  PMAP_TRY(check_schedule(o, call));
  switch (o->kind) {
  case PMAP_OPT_SGD:
    if (!(o->momentum >= 0.0f && o->momentum < 1.0f))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: SGD momentum %g is outside [0, 1)", call,
                      (double)o->momentum);
    if (o->nesterov != 0 && (o->nesterov != 1 || o->momentum == 0.0f))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: nesterov %d needs momentum > 0 and the value 1 (momentum %g)", call,
                      o->nesterov, (double)o->momentum);
    return PMAP_SUCCESS;
  case PMAP_OPT_ADAM:
  case PMAP_OPT_ADAMW:
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f) || !(o->beta2 >= 0.0f && o->beta2 < 1.0f) ||
        !(o->eps > 0.0f) || !isfinite(o->eps))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: Adam beta1 %g, beta2 %g, eps %g: betas must be in [0, 1), eps > 0", call,
                      (double)o->beta1, (double)o->beta2, (double)o->eps);
    if (o->kind == PMAP_OPT_ADAM && o->weight_decay != 0.0f)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: Adam with weight_decay %g: use PMAP_OPT_ADAMW (pmap_adamw) for "
                      "decoupled weight decay",
                      call, (double)o->weight_decay);
    return PMAP_SUCCESS;
  }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: unknown optimizer kind %d", call, (int)o->kind);
}

int optimizer_slots(const pmap_optimizer *o) {
  if (o->kind == PMAP_OPT_SGD) return o->momentum != 0.0f ? 1 : 0;
  return 2;
}

pmap_step_hyper optimizer_hyper(const pmap_optimizer *o, int64_t t) {
  pmap_step_hyper h = {.lr = (float)pmap_optimizer_lr(o, t),
                       .momentum = o->momentum,
                       .nesterov = o->nesterov,
                       .weight_decay = o->weight_decay,
                       .beta1 = o->beta1,
                       .beta2 = o->beta2,
                       .eps = o->eps};
  if (o->kind != PMAP_OPT_SGD) {
    h.momentum = 0.0f;
    h.bc1 = (float)(1.0 - pow((double)o->beta1, (double)t));
    h.bc2 = (float)(1.0 - pow((double)o->beta2, (double)t));
  }
  return h;
}

float params_norm_max(const pmap_params *p) {
  return p->guard && p->opt.kind != PMAP_OPT_SGD ? PMAP_ADAM_NORM_MAX : 0.0f;
}

/* state: slot s of these n parameters at state + s * stride; w16: their bf16 copy, written in
 * the same pass (NULL: none). */
pmap_status optimizer_apply(const replica *r, const pmap_optimizer *o, const pmap_step_hyper *h,
                            float *w, const float *g, float *state, size_t stride, pmap_bf16 *w16,
                            size_t n) {
  if (o->kind == PMAP_OPT_SGD) return r->ops->sgd_step(r->q, w, g, state, w16, n, h);
  return r->ops->adam_step(r->q, w, g, state, state + stride, w16, n, h);
}

pmap_status optimizer_step_range(const pmap_params *p, replica *r, const pmap_step_hyper *h,
                                 size_t lo, size_t len, float scale) {
  for (int k = 0; k < p->n_spans; k++) {
    size_t a = p->spans[k].off, b = a + p->spans[k].len;
    a = a > lo ? a : lo;
    b = b < lo + len ? b : lo + len;
    if (a >= b) continue;
    if (scale != 1.0f) PMAP_TRY(r->ops->scale(r->q, replica_g(r, a), scale, b - a));
    float *state = r->opt ? r->opt + (a - lo) : NULL;
    PMAP_TRY(optimizer_apply(r, &p->opt, h, r->w + a, replica_g(r, a), state, len,
                             r->w16 ? r->w16 + a : NULL, b - a));
  }
  return PMAP_SUCCESS;
}
