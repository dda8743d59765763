/* case_optim.c: the op harness's cases for the optimizer steps and the guard's and clipping's
 * reductions: SGD (plain, L2 decay, momentum, Nesterov; v untouched without momentum) and Adam
 * (from zero and random state, a large eps, AdamW's decay) over several steps against float64,
 * each with and without the bf16 copy of the updated weights (its every bit the rounding of the
 * w the same call wrote), the L2 norm (sizes 0 to a million, non-finite and overflowing inputs),
 * scale and axpy. */
#include "harness.h"
#include "ops/op_math.h"

/* ------------------------------------------------------------------------------------------ */
/* sgd_step                                                                                   */

typedef struct step_args {
  size_t n;
  pmap_step_hyper hp;
  hx_buf *w, *g, *m, *v; /* m: Adam only; v NULL: none passed */
  hx_buf *w16;           /* NULL: no bf16 copy asked for */
} step_args;

static pmap_status call_sgd(const pmap_ops *o, op_queue *q, void *arg) {
  step_args *a = arg;
  return o->sgd_step(q, HX_F(a->w), HX_F(a->g), a->v ? HX_F(a->v) : NULL,
                     a->w16 ? HX_H(a->w16) : NULL, a->n, &a->hp);
}

static pmap_status call_adam(const pmap_ops *o, op_queue *q, void *arg) {
  step_args *a = arg;
  return o->adam_step(q, HX_F(a->w), HX_F(a->g), HX_F(a->m), HX_F(a->v),
                      a->w16 ? HX_H(a->w16) : NULL, a->n, &a->hp);
}

/* With a bf16 copy: its every element the rounding of the w this call wrote. */
static void check_w16(hx *h, const step_args *a) {
  if (!a->w16) return;
  pmap_bf16 *want = (pmap_bf16 *)(void *)hx_floats(h, a->n / 2 + 1);
  for (size_t i = 0; i < a->n; i++) want[i] = pmap_bf16_round(a->w->got[i]);
  hx_same16(h, "w16", HX_H16(a->w16->got), want, a->n);
}

/* The next step starts from where the backend's last one ended. */
static void carry(hx_buf *b) {
  if (b) memcpy(b->init, b->got, b->n * sizeof(float));
}

/* variant: 0 plain (v NaN, which must stay as it is), 1 plain (v NULL), 2 L2 decay without
 * momentum, 3 momentum, 4 Nesterov, 5 Nesterov with decay. */
static void sgd_trial(hx *h, size_t n, int variant, int bf16) {
  static const char *const names[] = {"plain, v NaN", "plain, v NULL", "decay",
                                      "momentum",     "Nesterov",      "Nesterov, decay"};
  hx_trial(h, "%s%s n=%zu", names[variant], bf16 ? ", w16" : "", n);
  int mom = variant >= 3;
  step_args a = {.n = n};
  a.hp.lr = 0.05f;
  a.hp.momentum = mom ? 0.9f : 0.0f;
  a.hp.nesterov = variant >= 4;
  a.hp.weight_decay = variant == 2 || variant == 5 ? 0.01f : 0.0f;
  a.w = hx_inout(h, n, -1.0f, 1.0f, "w");
  a.g = hx_new(h, HX_IN, n, "g");
  if (variant == 0) {
    a.v = hx_new(h, HX_INOUT, n, "v");
    for (size_t i = 0; i < n; i++) a.v->init[i] = NAN;
  } else if (mom) {
    a.v = hx_inout(h, n, -0.5f, 0.5f, "v");
  }
  a.w->scale_cpu = 1.0; /* w and v start in [-1, 1) and may cancel to far less */
  if (a.v) a.v->scale_cpu = 1.0;
  if (bf16) a.w16 = hx_new16(h, HX_OUT, n, "w16");
  double *wd = hx_to_double(h, a.w->init, n), *vd = a.v ? hx_to_double(h, a.v->init, n) : NULL;
  for (int step = 1; step <= (mom ? 4 : 2); step++) {
    hx_trial(h, "%s n=%zu step %d", names[variant], n, step);
    hx_fill_away(h, a.g->init, n, 0.01f, 1.0f);
    for (size_t i = 0; i < n; i++) {
      double g = (double)a.g->init[i] + (double)a.hp.weight_decay * wd[i];
      if (mom) {
        vd[i] = (double)a.hp.momentum * vd[i] + g;
        g = a.hp.nesterov ? g + (double)a.hp.momentum * vd[i] : vd[i];
      }
      wd[i] -= (double)a.hp.lr * g;
    }
    if (a.v && a.w16)
      HX_RUN(h, call_sgd, &a, a.w, a.g, a.v, a.w16);
    else if (a.v)
      HX_RUN(h, call_sgd, &a, a.w, a.g, a.v);
    else if (a.w16)
      HX_RUN(h, call_sgd, &a, a.w, a.g, a.w16);
    else
      HX_RUN(h, call_sgd, &a, a.w, a.g);
    check_w16(h, &a);
    /* A step's few float roundings (u each, of w's and v's scale 1), over 2 to 4 steps. */
    hx_close_scale(h, "w", a.w->got, wd, n, 1e-6, 1.0);
    if (mom) hx_close_scale(h, "v", a.v->got, vd, n, 1e-6, 1.0);
    if (variant == 0)
      HX_CHECK(h, memcmp(a.v->got, a.v->init, n * sizeof(float)) == 0,
               "v was touched without momentum");
    carry(a.w), carry(a.v);
  }
}

void opcase_sgd_step(hx *h) {
  for (int t = 0; t < hx_vec_trials(h); t++) {
    size_t n = hx_vec_size(h, t);
    for (int variant = 0; variant < 6; variant++)
      for (int bf16 = 0; bf16 < 2; bf16++, hx_release(h)) sgd_trial(h, n, variant, bf16);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* adam_step                                                                                  */

/* Six steps against float64. eps and the gradients' scale gmax are parameters: only a large eps
 * next to small gradients shows where eps enters the update. */
static void adam_trial(hx *h, size_t n, int random_state, float eps, float gmax, float decay,
                       int bf16, const char *tag) {
  const float lr = 0.01f, beta1 = 0.9f, beta2 = 0.999f;
  step_args a = {.n = n};
  a.w = hx_inout(h, n, -1.0f, 1.0f, "w");
  a.g = hx_new(h, HX_IN, n, "g");
  a.m = hx_new(h, HX_INOUT, n, "m");
  a.v = hx_new(h, HX_INOUT, n, "v");
  if (random_state) {
    hx_fill(h, a.m->init, n, -0.1f, 0.1f);
    hx_fill(h, a.v->init, n, 0.01f * gmax * gmax, 0.1f * gmax * gmax);
  }
  a.w->scale_cpu = 1.0, a.m->scale_cpu = 0.1 * gmax, a.v->scale_cpu = 0.01 * gmax * gmax;
  if (bf16) a.w16 = hx_new16(h, HX_OUT, n, "w16");
  double *wd = hx_to_double(h, a.w->init, n), *md = hx_to_double(h, a.m->init, n);
  double *vd = hx_to_double(h, a.v->init, n), *delta = hx_doubles(h, n);
  for (int t = 1; t <= 6; t++) {
    hx_trial(h, "%s n=%zu step %d", tag, n, t);
    hx_fill_away(h, a.g->init, n, 0.01f * gmax, gmax);
    double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
    for (size_t i = 0; i < n; i++) {
      double g = a.g->init[i];
      md[i] = (double)beta1 * md[i] + (1.0 - (double)beta1) * g;
      vd[i] = (double)beta2 * vd[i] + (1.0 - (double)beta2) * g * g;
      delta[i] = -(double)lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + (double)eps) -
                 (double)lr * (double)decay * wd[i];
      wd[i] += delta[i];
    }
    a.hp = (pmap_step_hyper){.lr = lr,
                             .beta1 = beta1,
                             .beta2 = beta2,
                             .eps = eps,
                             .bc1 = (float)bc1,
                             .bc2 = (float)bc2,
                             .weight_decay = decay};
    if (a.w16)
      HX_RUN(h, call_adam, &a, a.w, a.g, a.m, a.v, a.w16);
    else
      HX_RUN(h, call_adam, &a, a.w, a.g, a.m, a.v);
    check_w16(h, &a);
    /* The step itself, not only w: a wrong bias correction moves w by ~lr, small next to w.
     * Read back as w + step - w, it carries the rounding of w + step, u of |w| < 1: 6e-6 of the
     * step at lr 1e-2, above the step's own ten or so roundings. m and v: three roundings a
     * step, carried over six; w a few more. */
    hx_gain_scale(h, "update", a.w->got, a.w->init, delta, n, 1e-4, lr);
    hx_close_scale(h, "w", a.w->got, wd, n, 1e-6, 1.0);
    hx_close_scale(h, "m", a.m->got, md, n, 1e-5, 0.1 * gmax);
    hx_close_scale(h, "v", a.v->got, vd, n, 1e-5, 0.01 * gmax * gmax);
    carry(a.w), carry(a.m), carry(a.v);
  }
}

void opcase_adam_step(hx *h) {
  for (int t = 0; t < hx_vec_trials(h); t++) {
    size_t n = hx_vec_size(h, t);
    adam_trial(h, n, 0, 1e-8f, 1.0f, 0.0f, 0, "from zero state"), hx_release(h);
    adam_trial(h, n, 1, 1e-8f, 1.0f, 0.0f, 0, "from random state"), hx_release(h);
    adam_trial(h, n, 0, 1e-3f, 0.01f, 0.0f, 0, "eps=1e-3"), hx_release(h);
    adam_trial(h, n, 1, 1e-8f, 1.0f, 0.01f, 0, "AdamW decay=0.01"), hx_release(h);
    adam_trial(h, n, 1, 1e-8f, 1.0f, 0.0f, 1, "from random state, w16"), hx_release(h);
    adam_trial(h, n, 1, 1e-8f, 1.0f, 0.01f, 1, "AdamW decay=0.01, w16"), hx_release(h);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* norm2, scale, axpy                                                                         */

typedef struct red_args {
  size_t n;
  float s;
  hx_buf *x, *y;
} red_args;

static pmap_status call_norm2(const pmap_ops *o, op_queue *q, void *arg) {
  red_args *a = arg;
  return o->norm2(q, HX_F(a->x), a->n, HX_F(a->y));
}

static pmap_status call_scale(const pmap_ops *o, op_queue *q, void *arg) {
  red_args *a = arg;
  return o->scale(q, HX_F(a->x), a->s, a->n);
}

static pmap_status call_axpy(const pmap_ops *o, op_queue *q, void *arg) {
  red_args *a = arg;
  return o->axpy(q, a->s, HX_F(a->x), HX_F(a->y), a->n);
}

/* The norm of x (n), filled by the caller, against want (NaN and infinities exactly). */
static void norm_trial(hx *h, red_args *a, double want) {
  a->y = hx_out(h, 1, "norm");
  a->y->keep_nan = 1;
  HX_RUN(h, call_norm2, a, a->x, a->y);
  hx_close(h, "norm", a->y->got, &want, 1, 1e-6); /* summed in double: one rounding of the root */
}

void opcase_norm2(hx *h) {
  static const size_t fixed[] = {0, 1, 255, 4097, 1000003};
  for (int t = 0; t < 5 + hx_rounds(h, 3); t++, hx_release(h)) {
    red_args a = {.n = t < 5 ? fixed[t] : (size_t)hx_int(h, 2, 5000) | 1};
    hx_trial(h, "n=%zu", a.n);
    a.x = hx_in(h, a.n, -3.0f, 3.0f, "x");
    double sum = 0.0;
    for (size_t i = 0; i < a.n; i++) sum += (double)a.x->init[i] * a.x->init[i];
    norm_trial(h, &a, sqrt(sum)); /* n == 0 writes 0 */
  }
  /* Non-finite exactly when an element is, or when the norm passes FLT_MAX; squares past
   * FLT_MAX are summed in double and stay finite. */
  const size_t n = 1001;
  for (int kind = 0; kind < 5; kind++, hx_release(h)) {
    static const char *const names[] = {"a NaN", "+inf", "-inf", "squares past FLT_MAX",
                                        "norm past FLT_MAX"};
    red_args a = {.n = kind >= 3 ? 17 : n};
    hx_trial(h, "%s n=%zu", names[kind], a.n);
    a.x = hx_in(h, a.n, -3.0f, 3.0f, "x");
    size_t at = (size_t)hx_int(h, 0, (int64_t)a.n - 1);
    double want = NAN;
    if (kind == 1 || kind == 2) a.x->init[at] = kind == 1 ? INFINITY : -INFINITY, want = INFINITY;
    if (kind == 0) a.x->init[at] = NAN;
    if (kind >= 3) {
      float v = kind == 3 ? 1e20f : 3e38f;
      for (size_t i = 0; i < a.n; i++) a.x->init[i] = (i & 1) ? v : -v;
      want = kind == 3 ? (double)v * sqrt((double)a.n) : INFINITY;
    }
    norm_trial(h, &a, want);
  }
}

void opcase_scale(hx *h) {
  for (int t = 0; t < hx_vec_trials(h); t++) {
    float scales[] = {-0.37f, 0.0f, hx_uniform(h, -4.0f, 4.0f)};
    for (int k = 0; k < 3; k++, hx_release(h)) {
      red_args a = {.n = hx_vec_size(h, t), .s = scales[k]};
      hx_trial(h, "n=%zu s=%g", a.n, (double)a.s);
      a.x = hx_inout(h, a.n, -1.0f, 1.0f, "x");
      a.x->tol_cpu = 0.0; /* one rounded product */
      HX_RUN(h, call_scale, &a, a.x);
      float *want = hx_floats(h, a.n);
      for (size_t i = 0; i < a.n; i++) want[i] = a.x->init[i] * a.s;
      hx_same(h, "x", a.x->got, want, a.n);
    }
  }
}

void opcase_axpy(hx *h) {
  for (int t = 0; t < hx_vec_trials(h); t++) {
    float alphas[] = {1.75f, hx_uniform(h, -4.0f, 4.0f)};
    for (int k = 0; k < 2; k++, hx_release(h)) {
      red_args a = {.n = hx_vec_size(h, t), .s = alphas[k]};
      hx_trial(h, "n=%zu alpha=%g", a.n, (double)a.s);
      a.x = hx_in(h, a.n, -1.0f, 1.0f, "x");
      a.y = hx_inout(h, a.n, -1.0f, 1.0f, "y");
      a.y->scale_cpu = 1.0; /* a fused multiply-add on a GPU: y may cancel to far less */
      HX_RUN(h, call_axpy, &a, a.x, a.y);
      double *want = hx_doubles(h, a.n);
      for (size_t i = 0; i < a.n; i++) want[i] = (double)a.y->init[i] + (double)a.s * a.x->init[i];
      hx_close_scale(h, "y", a.y->got, want, a.n, 1e-6, 1.0); /* two roundings (one fused) */
    }
  }
}
