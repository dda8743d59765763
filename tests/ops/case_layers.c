/* case_layers.c: the op harness's cases for the ops of the layers beyond dense and conv:
 * activations (tanh, sigmoid, GELU, ReLU; in place; extreme inputs finite), the residual add, layer
 * norm (forward and its statistics; dx, dgamma and dbeta against finite differences; dgamma
 * and dbeta accumulating with dx NULL) and dropout (the mask's rate, its independence of how
 * the elements are split, the same mask backward). */
#include "harness.h"
#include "ops/op_math.h"

/* ------------------------------------------------------------------------------------------ */
/* act_forward, act_backward, add                                                             */

static const char *const act_names[] = {"tanh", "sigmoid", "gelu", "relu"};
#define NACTS 4

static double ref_act(int act, double x) {
  if (act == PMAP_ACT_TANH) return tanh(x);
  if (act == PMAP_ACT_SIGMOID) return 1.0 / (1.0 + exp(-x));
  if (act == PMAP_ACT_RELU) return x < 0.0 ? 0.0 : x;
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

typedef struct act_args {
  pmap_act act;
  size_t n;
  hx_buf *x, *y, *dy, *dx;
  const double *xd, *rd;
} act_args;

static pmap_status call_act_forward(const pmap_ops *o, op_queue *q, void *arg) {
  act_args *a = arg;
  return o->act_forward(q, a->act, HX_F(a->x), HX_F(a->y), a->n);
}

static pmap_status call_act_backward(const pmap_ops *o, op_queue *q, void *arg) {
  act_args *a = arg;
  return o->act_backward(q, a->act, HX_F(a->x), HX_F(a->y), HX_F(a->dy), HX_F(a->dx), a->n);
}

static double act_term(const void *ctx, size_t i) {
  const act_args *a = ctx;
  return a->rd[i] * ref_act((int)a->act, a->xd[i]);
}

void opcase_act_forward(hx *h) {
  for (int act = 0; act < NACTS; act++)
    for (int t = 0; t <= hx_vec_trials(h); t++, hx_release(h)) {
      int extremes = t == hx_vec_trials(h);
      act_args a = {.act = (pmap_act)act, .n = extremes ? 4 : hx_vec_size(h, t)};
      hx_trial(h, "%s n=%zu", act_names[act], a.n);
      a.x = hx_in(h, a.n, -5.0f, 5.0f, "x");
      if (extremes) { /* finite at the extremes: sigmoid never takes exp of a large number */
        static const float ext[4] = {-100.0f, 100.0f, -1e30f, 1e30f};
        memcpy(a.x->init, ext, sizeof ext);
        hx_trial(h, "%s at -100, 100, -1e30, 1e30", act_names[act]);
      }
      a.y = hx_out(h, a.n, "y");
      a.y->scale_cpu = 0.1; /* GELU's 1 + tanh cancels for negative x: held to x's scale */
      HX_RUN(h, call_act_forward, &a, a.x, a.y); /* tanhf and expf may differ by an ulp */
      double *want = hx_doubles(h, a.n);
      for (size_t i = 0; i < a.n; i++) want[i] = ref_act(act, a.x->init[i]);
      hx_close_scale(h, "y", a.y->got, want, a.n, HX_TOL_FWD, 0.1);
      act_args b = a;
      b.x = b.y = hx_new(h, HX_INOUT, a.n, "x (in place)");
      memcpy(b.x->init, a.x->init, a.n * sizeof(float));
      b.x->scale_cpu = 0.1;
      HX_RUN(h, call_act_forward, &b, b.x);
      hx_same(h, "in place", b.x->got, a.y->got, a.n);
    }
}

void opcase_act_backward(hx *h) {
  for (int act = 0; act < NACTS; act++)
    for (int t = 0; t < hx_vec_trials(h); t++, hx_release(h)) {
      act_args a = {.act = (pmap_act)act, .n = hx_vec_size(h, t)};
      hx_trial(h, "%s n=%zu", act_names[act], a.n);
      /* The ReLU's inputs off its kink, where finite differences would straddle it. */
      a.x = act == PMAP_ACT_RELU ? hx_in_away(h, a.n, 1e-2f, 4.0f, "x")
                                 : hx_in(h, a.n, -4.0f, 4.0f, "x");
      a.y = hx_new(h, HX_IN, a.n, "y"); /* the forward's output, rounded from float64 */
      for (size_t i = 0; i < a.n; i++) a.y->init[i] = (float)ref_act(act, a.x->init[i]);
      a.dy = hx_in(h, a.n, -1.0f, 1.0f, "dy");
      a.dx = hx_out(h, a.n, "dx");
      a.dx->tol_cpu = 1e-5; /* the derivative's few roundings and ulps (HX_TOL_FWD's) */
      a.dx->scale_cpu = 0.1;
      HX_RUN(h, call_act_backward, &a, a.x, a.y, a.dy, a.dx);
      a.xd = hx_to_double(h, a.x->init, a.n);
      a.rd = hx_to_double(h, a.dy->init, a.n);
      hx_fd_scale(h, "dx", act_term, &a, (double *)a.xd, a.n, a.dx->got, NULL, 1e-4, HX_TOL_GRAD,
                  0.1);
      act_args b = a;
      b.dy = b.dx = hx_new(h, HX_INOUT, a.n, "dy (in place)");
      memcpy(b.dy->init, a.dy->init, a.n * sizeof(float));
      b.dy->tol_cpu = 1e-5;
      b.dy->scale_cpu = 0.1;
      HX_RUN(h, call_act_backward, &b, b.x, b.y, b.dy);
      hx_same(h, "in place", b.dy->got, a.dx->got, a.n);
    }
}

typedef struct add_args {
  size_t n;
  hx_buf *a, *b, *y;
} add_args;

static pmap_status call_add(const pmap_ops *o, op_queue *q, void *arg) {
  add_args *a = arg;
  return o->add(q, HX_F(a->a), HX_F(a->b), HX_F(a->y), a->n);
}

void opcase_add(hx *h) {
  for (int t = 0; t < hx_vec_trials(h); t++, hx_release(h)) {
    add_args a = {.n = hx_vec_size(h, t)};
    hx_trial(h, "n=%zu", a.n);
    a.a = hx_in(h, a.n, -1.0f, 1.0f, "a");
    a.b = hx_in(h, a.n, -1.0f, 1.0f, "b");
    a.y = hx_out(h, a.n, "y");
    a.y->tol_cpu = 0.0; /* one rounded add */
    HX_RUN(h, call_add, &a, a.a, a.b, a.y);
    double *want = hx_doubles(h, a.n);
    for (size_t i = 0; i < a.n; i++) want[i] = (double)a.a->init[i] + a.b->init[i];
    hx_close(h, "y", a.y->got, want, a.n, 1e-7);
    /* In place, y = a and y = b (residual connections). */
    for (int side = 0; side < 2; side++) {
      add_args b = a;
      hx_buf *io = hx_new(h, HX_INOUT, a.n, side ? "b (in place)" : "a (in place)");
      memcpy(io->init, side ? a.b->init : a.a->init, a.n * sizeof(float));
      io->tol_cpu = 0.0;
      *(side ? &b.b : &b.a) = b.y = io;
      HX_RUN(h, call_add, &b, side ? b.a : b.b, io);
      hx_same(h, "in place", io->got, a.y->got, a.n);
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* layer norm                                                                                 */

typedef struct ln_args {
  int64_t rows, f;
  float eps;
  hx_buf *x, *g, *b, *y, *stats, *dy, *dx, *dg, *db;
  hx_buf *y16; /* the output's bfloat16 copy (every other trial; else NULL) */
  const double *xd, *gd, *bd, *rd;
} ln_args;

static pmap_status call_ln_forward(const pmap_ops *o, op_queue *q, void *arg) {
  ln_args *a = arg;
  return o->layernorm_forward(q, HX_F(a->x), HX_F(a->g), HX_F(a->b), a->rows, a->f, a->eps,
                              HX_F(a->y), HX_F(a->stats), a->y16 ? HX_H(a->y16) : NULL);
}

/* Twice when dx is NULL: dgamma and dbeta gain twice. */
static pmap_status call_ln_backward(const pmap_ops *o, op_queue *q, void *arg) {
  ln_args *a = arg;
  for (int k = 0; k < (a->dx ? 1 : 2); k++)
    HX_TRY(o->layernorm_backward(q, HX_F(a->x), HX_F(a->g), HX_F(a->stats), HX_F(a->dy), a->rows,
                                 a->f, a->dx ? HX_F(a->dx) : NULL, HX_F(a->dg), HX_F(a->db)));
  return PMAP_SUCCESS;
}

/* The mean and variance of a row x (f) in float64. */
static void ln_moments(const double *x, int64_t f, double *m, double *v) {
  *m = 0.0, *v = 0.0;
  for (int64_t j = 0; j < f; j++) *m += x[j];
  *m /= (double)f;
  for (int64_t j = 0; j < f; j++) *v += (x[j] - *m) * (x[j] - *m);
  *v /= (double)f;
}

/* sum r y over row r. */
static double ln_row(const ln_args *a, int64_t r) {
  double m, v, s = 0.0;
  ln_moments(a->xd + r * a->f, a->f, &m, &v);
  for (int64_t j = 0; j < a->f; j++)
    s += a->rd[r * a->f + j] * ((a->xd[r * a->f + j] - m) / sqrt(v + a->eps) * a->gd[j] + a->bd[j]);
  return s;
}

static double ln_loss_x(const void *ctx, size_t moved) {
  const ln_args *a = ctx;
  return ln_row(a, (int64_t)moved / a->f);
}

static double ln_loss_all(const void *ctx, size_t moved) {
  const ln_args *a = ctx;
  (void)moved;
  double s = 0.0;
  for (int64_t r = 0; r < a->rows; r++) s += ln_row(a, r);
  return s;
}

/* x (rows, f) uniform in [-2, 3), each row of two or more features drawn again until its
 * variance is at least 0.1 (as batch norm's channels: clear of the kink where they coincide). */
static hx_buf *ln_x(hx *h, const ln_args *a) {
  hx_buf *x = hx_in(h, (size_t)(a->rows * a->f), -2.0f, 3.0f, "x");
  double *xd = hx_doubles(h, (size_t)a->f);
  for (int64_t r = 0; r < a->rows; r++)
    for (;;) {
      for (int64_t j = 0; j < a->f; j++) xd[j] = x->init[r * a->f + j];
      double m, v;
      ln_moments(xd, a->f, &m, &v);
      if (a->f < 2 || v >= 0.1) break;
      hx_fill(h, x->init + r * a->f, (size_t)a->f, -2.0f, 3.0f);
    }
  return x;
}

static void ln_shape(hx *h, int t, ln_args *a) {
  static const int64_t fixed[][2] = {{1, 1},  {5, 7},     {3, 129}, {0, 4},
                                     {7, 33}, {64, 1000}, {300, 17}};
  int nf = h->large ? 7 : 4;
  a->rows = t < nf ? fixed[t][0] : hx_int(h, 1, 9);
  a->f = t < nf ? fixed[t][1] : hx_int(h, 1, 70);
  a->eps = 1e-5f;
  hx_trial(h, "rows=%" PRId64 " f=%" PRId64, a->rows, a->f);
}
#define LN_TRIALS(h) (((h)->large ? 7 : 4) + hx_rounds((h), 3))

/* The last trial scales rows 1 and 3 by 1e25: variances past FLT_MAX, which the double sums
 * still hold, normalised as any other row (not to beta through an rstd of 0). */
void opcase_layernorm_forward(hx *h) {
  for (int t = 0; t <= LN_TRIALS(h); t++, hx_release(h)) {
    ln_args a = {0};
    int big = t == LN_TRIALS(h);
    if (big) {
      a.rows = 4, a.f = 9, a.eps = 1e-5f;
      hx_trial(h, "rows=4 f=9, rows 1 and 3 times 1e25");
    } else {
      ln_shape(h, t, &a);
    }
    size_t n = (size_t)(a.rows * a.f), F = (size_t)a.f;
    a.x = ln_x(h, &a);
    for (int64_t r = 1; big && r < a.rows; r += 2)
      for (int64_t j = 0; j < a.f; j++) a.x->init[r * a.f + j] *= 1e25f;
    a.g = hx_in_away(h, F, 0.5f, 1.5f, "gamma");
    a.b = hx_in(h, F, -1.0f, 1.0f, "beta");
    a.y = hx_out(h, n, "y");
    a.stats = hx_out(h, 2 * (size_t)a.rows, "stats");
    a.y->tol_cpu = a.stats->tol_cpu = 1e-5; /* sums in double on every backend (HX_TOL_FWD) */
    if ((t & 1) && n) a.y16 = hx_new16(h, HX_OUT, n, "y16");
    if (a.y16) {
      a.y16->tol_cpu = 1e-2; /* another backend's y may round to the neighbouring bfloat16 */
      HX_RUN(h, call_ln_forward, &a, a.x, a.g, a.b, a.y, a.stats, a.y16);
      pmap_bf16 *want16 = (pmap_bf16 *)(void *)hx_floats(h, n / 2 + 1);
      for (size_t k = 0; k < n; k++) want16[k] = pmap_bf16_round(a.y->got[k]);
      hx_same16(h, "y16", HX_H16(a.y16->got), want16, n);
    } else {
      HX_RUN(h, call_ln_forward, &a, a.x, a.g, a.b, a.y, a.stats);
    }
    double *xd = hx_to_double(h, a.x->init, n), *want = hx_doubles(h, n);
    double *st = hx_doubles(h, 2 * (size_t)a.rows);
    for (int64_t r = 0; r < a.rows; r++) {
      double m, v;
      ln_moments(xd + r * a.f, a.f, &m, &v);
      st[2 * r] = m, st[2 * r + 1] = 1.0 / sqrt(v + a.eps);
      for (int64_t j = 0; j < a.f; j++)
        want[r * a.f + j] = (xd[r * a.f + j] - m) * st[2 * r + 1] * a.g->init[j] + a.b->init[j];
    }
    hx_close(h, "y", a.y->got, want, n, HX_TOL_FWD);
    hx_close(h, "stats (mean, 1/std)", a.stats->got, st, 2 * (size_t)a.rows, HX_TOL_FWD);
    if (big) { /* 1/std apart: beside means of 1e25 the relative norm could not see it */
      float got[4];
      double rs[4];
      for (int r = 0; r < 4; r++) got[r] = a.stats->got[2 * r + 1], rs[r] = st[2 * r + 1];
      hx_close(h, "1/std of the rows times 1e25", got + 1, rs + 1, 1, HX_TOL_FWD);
      hx_close(h, "1/std of the rows times 1e25", got + 3, rs + 3, 1, HX_TOL_FWD);
    }
  }
}

void opcase_layernorm_backward(hx *h) {
  for (int t = 0; t < LN_TRIALS(h); t++, hx_release(h)) {
    ln_args a = {0};
    ln_shape(h, t, &a);
    size_t n = (size_t)(a.rows * a.f), F = (size_t)a.f;
    a.x = ln_x(h, &a);
    a.g = hx_in_away(h, F, 0.5f, 1.5f, "gamma");
    a.stats = hx_new(h, HX_IN, 2 * (size_t)a.rows, "stats");
    a.xd = hx_to_double(h, a.x->init, n);
    for (int64_t r = 0; r < a.rows; r++) { /* the forward's, rounded from float64 */
      double m, v;
      ln_moments(a.xd + r * a.f, a.f, &m, &v);
      a.stats->init[2 * r] = (float)m, a.stats->init[2 * r + 1] = (float)(1.0 / sqrt(v + a.eps));
    }
    a.dy = hx_in(h, n, -1.0f, 1.0f, "dy");
    a.dx = hx_out(h, n, "dx");
    a.dg = hx_inout(h, F, -1.0f, 1.0f, "dgamma");
    a.db = hx_inout(h, F, -1.0f, 1.0f, "dbeta");
    a.gd = hx_to_double(h, a.g->init, F);
    a.bd = hx_doubles(h, F);
    a.rd = hx_to_double(h, a.dy->init, n);
    /* dx is held to the scale of its terms, gamma rstd dy: over two features it is 0 but for
     * eps, and cancels to far less. */
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) {
      double term = a.gd[i % F] * a.stats->init[2 * (i / F) + 1] * a.rd[i];
      scale += term * term / (double)n;
    }
    scale = sqrt(scale);
    a.dx->tol_cpu = a.dg->tol_cpu = a.db->tol_cpu = 1e-5; /* as the forward's */
    a.dx->scale_cpu = scale;
    HX_RUN(h, call_ln_backward, &a, a.x, a.g, a.stats, a.dy, a.dx, a.dg, a.db);
    hx_fd_scale(h, "dx", ln_loss_x, &a, (double *)a.xd, n, a.dx->got, NULL, 1e-3, HX_TOL_GRAD,
                scale);
    hx_fd(h, "dgamma (+=)", ln_loss_all, &a, (double *)a.gd, F, a.dg->got, a.dg->init, 1e-3,
          HX_TOL_GRAD);
    hx_fd(h, "dbeta (+=)", ln_loss_all, &a, (double *)a.bd, F, a.db->got, a.db->init, 1e-3,
          HX_TOL_GRAD);
    /* dx NULL, the op called twice: dgamma and dbeta gain twice as much. */
    double *g2 = hx_doubles(h, F), *b2 = hx_doubles(h, F);
    for (size_t j = 0; j < F; j++) {
      g2[j] = 2.0 * ((double)a.dg->got[j] - a.dg->init[j]);
      b2[j] = 2.0 * ((double)a.db->got[j] - a.db->init[j]);
    }
    ln_args b = a;
    b.dx = NULL;
    b.dg = hx_inout(h, F, -1.0f, 1.0f, "dgamma (dx NULL)");
    b.db = hx_inout(h, F, -1.0f, 1.0f, "dbeta (dx NULL)");
    b.dg->tol_cpu = b.db->tol_cpu = 1e-5;
    HX_RUN(h, call_ln_backward, &b, b.x, b.g, b.stats, b.dy, b.dg, b.db);
    /* The same double sums, added twice in float: g2 and b2 carry twice the rounding of a's
     * accumulation, and the gains differ by the adds' roundings alone (u of the base each). */
    hx_gain_scale(h, "dgamma (+=, twice, dx NULL)", b.dg->got, b.dg->init, g2, F, 1e-5,
                  2.0 * hx_base_scale(a.dg->init, F, 1e-5));
    hx_gain_scale(h, "dbeta (+=, twice, dx NULL)", b.db->got, b.db->init, b2, F, 1e-5,
                  2.0 * hx_base_scale(a.db->init, F, 1e-5));
  }
}

/* ------------------------------------------------------------------------------------------ */
/* dropout                                                                                    */

typedef struct drop_args {
  size_t n, half; /* half: where the split of the mask check cuts */
  float rate;
  uint64_t key, first;
  hx_buf *x, *y, *parts, *dx;
  const double *xd, *rd;
} drop_args;

static pmap_status call_drop_forward(const pmap_ops *o, op_queue *q, void *arg) {
  drop_args *a = arg;
  return o->dropout_forward(q, HX_F(a->x), HX_F(a->y), a->n, a->rate, a->key, a->first);
}

/* The same elements in two calls, as two devices would hold them. */
static pmap_status call_drop_split(const pmap_ops *o, op_queue *q, void *arg) {
  drop_args *a = arg;
  HX_TRY(o->dropout_forward(q, HX_F(a->x), HX_F(a->parts), a->half, a->rate, a->key, a->first));
  return o->dropout_forward(q, HX_F(a->x) + a->half, HX_F(a->parts) + a->half, a->n - a->half,
                            a->rate, a->key, a->first + a->half);
}

static pmap_status call_drop_backward(const pmap_ops *o, op_queue *q, void *arg) {
  drop_args *a = arg;
  return o->dropout_backward(q, HX_F(a->x), HX_F(a->dx), a->n, a->rate, a->key, a->first);
}

static double drop_term(const void *ctx, size_t i) {
  const drop_args *a = ctx;
  return a->rd[i] * a->xd[i] * (double)pmap_dropout_factor(a->key, a->first + i, a->rate);
}

static int drop_trial(hx *h, int t, drop_args *a) {
  static const size_t ns[] = {4001, 999, 1001, 0, 1};
  static const float rates[] = {0.5f, 0.1f, 0.9f, 0.5f, 0.3f};
  int nf = 5 + (h->large ? 1 : 0);
  if (t >= nf + hx_rounds(h, 3)) return 0;
  *a = (drop_args){.n = t < 5    ? ns[t]
                        : t < nf ? 100003
                                 : (size_t)hx_int(h, 2, 3000),
                   .rate = t < 5    ? rates[t]
                           : t < nf ? 0.3f
                                    : hx_uniform(h, 0.05f, 0.95f),
                   .key = hx_u64(h),
                   .first = hx_int(h, 0, 1) ? hx_u64(h) : (uint64_t)hx_int(h, 0, 5000)};
  a->half = a->n / 2 + (a->n > 2 ? 1 : 0);
  hx_trial(h, "n=%zu rate=%g first=%" PRIu64, a->n, (double)a->rate, a->first);
  return 1;
}

void opcase_dropout_forward(hx *h) {
  drop_args a;
  for (int t = 0; drop_trial(h, t, &a); t++, hx_release(h)) {
    a.x = hx_in_away(h, a.n, 0.1f, 2.0f, "x");
    a.y = hx_out(h, a.n, "y");
    a.y->tol_cpu = 0.0; /* the mask is integer arithmetic on every backend */
    HX_RUN(h, call_drop_forward, &a, a.x, a.y);
    size_t dropped = 0, bad = a.n;
    for (size_t i = 0; i < a.n; i++) {
      double x = a.x->init[i], y = a.y->got[i];
      if (y == 0.0)
        dropped++;
      else if (bad == a.n && fabs(y - x / (1.0 - a.rate)) > 1e-6 * fabs(y)) /* two roundings */
        bad = i;
    }
    HX_CHECK(h, bad == a.n, "y[%zu] = %g from x %g: neither 0 nor x / (1 - rate)", bad,
             bad < a.n ? (double)a.y->got[bad] : 0.0, bad < a.n ? (double)a.x->init[bad] : 0.0);
    double frac = a.n ? (double)dropped / (double)a.n : a.rate;
    /* Five standard deviations: a false alarm once in millions of trials. */
    HX_CHECK(h, fabs(frac - a.rate) < 5.0 * sqrt(a.rate * (1.0 - a.rate) / (double)a.n) + 1e-9,
             "dropped a fraction %g of %zu at rate %g", frac, a.n, (double)a.rate);
    /* The element's global index alone decides: y = x * the mask's factor, split or whole. */
    float *want = hx_floats(h, a.n);
    for (size_t i = 0; i < a.n; i++)
      want[i] = a.x->init[i] * pmap_dropout_factor(a.key, a.first + i, a.rate);
    hx_same(h, "y", a.y->got, want, a.n);
    a.parts = hx_out(h, a.n, "y in two parts");
    a.parts->tol_cpu = 0.0;
    HX_RUN(h, call_drop_split, &a, a.x, a.parts);
    hx_same(h, "the mask of the elements split in two", a.parts->got, a.y->got, a.n);
    drop_args b = a;
    b.key = a.key + 1;
    b.y = hx_out(h, a.n, "y under key + 1");
    HX_RUN(h, call_drop_forward, &b, b.x, b.y);
    HX_CHECK(h, a.n < 64 || memcmp(b.y->got, a.y->got, a.n * sizeof(float)) != 0,
             "another key gives the same mask");
    b = a;
    b.x = b.y = hx_new(h, HX_INOUT, a.n, "x (in place)");
    memcpy(b.x->init, a.x->init, a.n * sizeof(float));
    b.x->tol_cpu = 0.0;
    HX_RUN(h, call_drop_forward, &b, b.x);
    hx_same(h, "in place", b.x->got, a.y->got, a.n);
  }
}

void opcase_dropout_backward(hx *h) {
  drop_args a;
  for (int t = 0; drop_trial(h, t, &a); t++, hx_release(h)) {
    /* dy = x: dx must be the forward's y, bit for bit (the same mask). */
    a.x = hx_in(h, a.n, -1.0f, 1.0f, "dy");
    a.y = hx_out(h, a.n, "forward y");
    a.dx = hx_out(h, a.n, "dx");
    a.y->tol_cpu = a.dx->tol_cpu = 0.0;
    HX_RUN(h, call_drop_forward, &a, a.x, a.y);
    HX_RUN(h, call_drop_backward, &a, a.x, a.dx);
    hx_same(h, "dx against the forward's mask", a.dx->got, a.y->got, a.n);
    /* The op is linear: its gradient against finite differences of the float64 forward. */
    float *x = hx_floats(h, a.n);
    hx_fill_away(h, x, a.n, 0.1f, 2.0f);
    a.xd = hx_to_double(h, x, a.n);
    a.rd = hx_to_double(h, a.x->init, a.n);
    hx_fd(h, "dx", drop_term, &a, (double *)a.xd, a.n, a.dx->got, NULL, 1e-3, HX_TOL_GRAD);
    drop_args b = a;
    b.x = b.dx = hx_new(h, HX_INOUT, a.n, "dy (in place)");
    memcpy(b.x->init, a.x->init, a.n * sizeof(float));
    b.x->tol_cpu = 0.0;
    HX_RUN(h, call_drop_backward, &b, b.x);
    hx_same(h, "in place", b.x->got, a.dx->got, a.n);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* bias_act_forward, act_bias_backward: each against float64, and bit for bit against the two  */
/* ops it fuses, run on the same backend in the same call                                     */

typedef struct fused_args {
  pmap_act act;
  int64_t outer, ch;
  hx_buf *y, *b, *z, *y2, *z2;               /* forward: fused, then unfused */
  hx_buf *x, *zf, *dz, *dx, *db, *dx2, *db2; /* backward */
  hx_buf *out16;                             /* z16 or dx16 (every other trial; else NULL) */
  /* GELU, trials 2 and 3 of every 4: the kept slope (forward: its own buffer, or y itself in
   * trial 3; backward: made by act_backward of dy = 1 on the same backend, then multiplied),
   * against act_backward's own; ones: that dy. */
  hx_buf *slope, *slope2, *ones;
  int slope_in_y;
  int no_bias; /* forward: b NULL (the activation of a kept sum), against act_forward alone */
} fused_args;

/* The fused op's bf16 copy, every bit the rounding of the float output it wrote. */
static void check_out16(hx *h, const fused_args *a, const float *got, size_t n) {
  if (!a->out16) return;
  pmap_bf16 *want = (pmap_bf16 *)(void *)hx_floats(h, n / 2 + 1);
  for (size_t k = 0; k < n; k++) want[k] = pmap_bf16_round(got[k]);
  hx_same16(h, "bf16 copy", HX_H16(a->out16->got), want, n);
}

static pmap_status call_bias_act_forward(const pmap_ops *o, op_queue *q, void *arg) {
  fused_args *a = arg;
  float *slope = a->slope_in_y ? HX_F(a->y) : a->slope ? HX_F(a->slope) : NULL;
  size_t n = (size_t)(a->outer * a->ch);
  HX_TRY(o->bias_act_forward(q, a->act, HX_F(a->y), a->no_bias ? NULL : HX_F(a->b), a->outer, a->ch,
                             HX_F(a->z), a->out16 ? HX_H(a->out16) : NULL, slope));
  if (!a->no_bias) HX_TRY(o->bias_forward(q, HX_F(a->y2), HX_F(a->b), a->outer, a->ch, 1));
  HX_TRY(o->act_forward(q, a->act, HX_F(a->y2), HX_F(a->z2), n));
  if (!a->slope2) return PMAP_SUCCESS;
  return o->act_backward(q, a->act, HX_F(a->y2), HX_F(a->z2), HX_F(a->ones), HX_F(a->slope2), n);
}

static pmap_status call_act_bias_backward(const pmap_ops *o, op_queue *q, void *arg) {
  fused_args *a = arg;
  const float *slope = NULL;
  if (a->slope) { /* the forward's slope, as act_backward of dy = 1 leaves it */
    HX_TRY(o->act_backward(q, a->act, HX_F(a->x), HX_F(a->zf), HX_F(a->ones), HX_F(a->slope),
                           (size_t)(a->outer * a->ch)));
    slope = HX_F(a->slope);
  }
  HX_TRY(o->act_bias_backward(q, a->act, slope ? NULL : HX_F(a->x), HX_F(a->zf), HX_F(a->dz),
                              HX_F(a->dx), HX_F(a->db), a->outer, a->ch,
                              a->out16 ? HX_H(a->out16) : NULL, slope));
  HX_TRY(o->act_backward(q, a->act, HX_F(a->x), HX_F(a->zf), HX_F(a->dz), HX_F(a->dx2),
                         (size_t)(a->outer * a->ch)));
  return o->bias_backward(q, HX_F(a->dx2), HX_F(a->db2), a->outer, a->ch, 1);
}

/* (outer, ch): none, one, a dense layer's, an odd one, then random. */
static void fused_shape(hx *h, int t, int64_t *outer, int64_t *ch) {
  static const int64_t fixed[][2] = {{0, 5}, {1, 1}, {64, 32}, {7, 13}};
  if (t < 4) {
    *outer = fixed[t][0], *ch = fixed[t][1];
    return;
  }
  *outer = hx_int(h, 1, 40), *ch = hx_int(h, 1, 70);
}
#define FUSED_TRIALS(h) (4 + hx_rounds((h), 3))

void opcase_bias_act_forward(hx *h) {
  int trials = FUSED_TRIALS(h);
  for (int act = 0; act < NACTS; act++)
    for (int trial = 0; trial < 2 * trials; trial++, hx_release(h)) {
      /* The second half without a bias (b NULL): the first half's kinds of trial again (the
       * fixed shapes, and new random ones). */
      fused_args a = {.act = (pmap_act)act, .no_bias = trial >= trials};
      int t = a.no_bias ? trial - trials : trial;
      fused_shape(h, t, &a.outer, &a.ch);
      hx_trial(h, "%s outer=%" PRId64 " ch=%" PRId64 "%s", act_names[act], a.outer, a.ch,
               a.no_bias ? " b=NULL" : "");
      size_t n = (size_t)(a.outer * a.ch);
      a.y = hx_inout(h, n, -4.0f, 4.0f, "y");
      a.y2 = hx_new(h, HX_INOUT, n, "y (unfused)");
      memcpy(a.y2->init, a.y->init, n * sizeof(float));
      a.b = hx_in(h, (size_t)a.ch, -1.0f, 1.0f, "b");
      a.z = hx_out(h, n, "z");
      a.z2 = hx_out(h, n, "z (unfused)");
      a.y->tol_cpu = a.y2->tol_cpu = 0.0; /* one rounded add */
      a.z->scale_cpu = a.z2->scale_cpu = 0.1;
      if (t & 1) a.out16 = hx_new16(h, HX_OUT, n ? n : 1, "z16");
      int keep = act == PMAP_ACT_GELU && (t & 2);
      if (keep) {
        a.slope_in_y = t & 1;
        a.slope = a.slope_in_y ? NULL : hx_out(h, n, "slope");
        a.slope2 = hx_out(h, n, "slope (act_backward of 1)");
        a.ones = hx_new(h, HX_IN, n, "ones");
        for (size_t k = 0; k < n; k++) a.ones->init[k] = 1.0f;
        a.slope2->scale_cpu = 0.1;
        if (a.slope) a.slope->scale_cpu = 0.1;
        if (a.slope_in_y) a.y->tol_cpu = 1e-6, a.y->scale_cpu = 0.1; /* y holds a slope */
      }
      if (keep && a.slope_in_y) /* trial 3: with the bf16 copy */
        HX_RUN(h, call_bias_act_forward, &a, a.y, a.b, a.z, a.y2, a.z2, a.slope2, a.ones, a.out16);
      else if (keep) /* trial 2: no bf16 copy */
        HX_RUN(h, call_bias_act_forward, &a, a.y, a.b, a.z, a.y2, a.z2, a.slope2, a.ones, a.slope);
      else if (a.out16)
        HX_RUN(h, call_bias_act_forward, &a, a.y, a.b, a.z, a.y2, a.z2, a.out16);
      else
        HX_RUN(h, call_bias_act_forward, &a, a.y, a.b, a.z, a.y2, a.z2);
      if (keep) /* the slope, its own buffer or y, is act_backward's of dy = 1, bit for bit */
        hx_same(h, "slope = act_backward of 1", a.slope_in_y ? a.y->got : a.slope->got,
                a.slope2->got, n);
      if (!a.slope_in_y) hx_same(h, "y = unfused y", a.y->got, a.y2->got, n);
      hx_same(h, "z = unfused z", a.z->got, a.z2->got, n);
      check_out16(h, &a, a.z->got, n);
      double *want = hx_doubles(h, n);
      const float *sum = a.slope_in_y ? a.y2->got : a.y->got; /* y + b, the same bits */
      for (size_t k = 0; k < n; k++) want[k] = ref_act(act, (double)sum[k]);
      hx_close_scale(h, "z", a.z->got, want, n, HX_TOL_FWD, 0.1);
    }
}

void opcase_act_bias_backward(hx *h) {
  for (int act = 0; act < NACTS; act++)
    for (int t = 0; t < FUSED_TRIALS(h); t++, hx_release(h)) {
      fused_args a = {.act = (pmap_act)act};
      fused_shape(h, t, &a.outer, &a.ch);
      hx_trial(h, "%s outer=%" PRId64 " ch=%" PRId64, act_names[act], a.outer, a.ch);
      size_t n = (size_t)(a.outer * a.ch), C = (size_t)a.ch;
      a.x = hx_in(h, n, -4.0f, 4.0f, "x");
      a.zf = hx_new(h, HX_IN, n, "z");
      for (size_t k = 0; k < n; k++) a.zf->init[k] = (float)ref_act(act, a.x->init[k]);
      a.dz = hx_in(h, n, -1.0f, 1.0f, "dz");
      a.dx = hx_out(h, n, "dx");
      a.dx2 = hx_out(h, n, "dx (unfused)");
      a.db = hx_inout(h, C, -3.0f, 3.0f, "db");
      a.db2 = hx_new(h, HX_INOUT, C, "db (unfused)");
      memcpy(a.db2->init, a.db->init, C * sizeof(float));
      a.dx->tol_cpu = a.dx2->tol_cpu = 1e-5;
      a.dx->scale_cpu = a.dx2->scale_cpu = 0.1;
      /* db: float sums of outer terms, added to what it held. */
      double k_db = (double)a.outer + 1.0;
      a.db->tol_cpu = a.db2->tol_cpu = hx_tol_vs_cpu(hx_tol_sum(k_db), k_db);
      if (t & 1) a.out16 = hx_new16(h, HX_OUT, n ? n : 1, "dx16");
      if (act == PMAP_ACT_GELU && (t & 2)) { /* dx from the kept slope: the same bits */
        a.slope = hx_out(h, n, "slope");
        a.slope->scale_cpu = 0.1;
        a.ones = hx_new(h, HX_IN, n, "ones");
        for (size_t k = 0; k < n; k++) a.ones->init[k] = 1.0f;
        if (a.out16)
          HX_RUN(h, call_act_bias_backward, &a, a.x, a.zf, a.dz, a.dx, a.db, a.dx2, a.db2, a.out16,
                 a.slope, a.ones);
        else
          HX_RUN(h, call_act_bias_backward, &a, a.x, a.zf, a.dz, a.dx, a.db, a.dx2, a.db2, a.slope,
                 a.ones);
      } else if (a.out16)
        HX_RUN(h, call_act_bias_backward, &a, a.x, a.zf, a.dz, a.dx, a.db, a.dx2, a.db2, a.out16);
      else
        HX_RUN(h, call_act_bias_backward, &a, a.x, a.zf, a.dz, a.dx, a.db, a.dx2, a.db2);
      hx_same(h, "dx = unfused dx", a.dx->got, a.dx2->got, n);
      check_out16(h, &a, a.dx->got, n);
      hx_same(h, "db = unfused db", a.db->got, a.db2->got, C);
      /* dx against float64's derivative, db against the float64 sums of that dx. */
      double *want = hx_doubles(h, n), *sum = hx_doubles(h, C);
      for (size_t k = 0; k < n; k++) {
        double x = a.x->init[k], e = 1e-4 * (fabs(x) > 1.0 ? fabs(x) : 1.0);
        double d = act == PMAP_ACT_RELU ? (x > 0.0) /* exact: no difference across the kink */
                                        : (ref_act(act, x + e) - ref_act(act, x - e)) / (2.0 * e);
        want[k] = d * a.dz->init[k];
        sum[k % C] += want[k];
      }
      hx_close_scale(h, "dx", a.dx->got, want, n, HX_TOL_GRAD, 0.1);
      double scale = 0.3 * sqrt((double)(a.outer ? a.outer : 1));
      hx_gain_scale(h, "db (+=)", a.db->got, a.db->init, sum, C, HX_TOL_GRAD, scale);
    }
}
