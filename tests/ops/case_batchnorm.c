/* case_batchnorm.c: the op harness's cases for batch norm over x (outer, c, inner): its
 * statistics in two passes (the second around the first's mean, which keeps the variance of a
 * channel with a large mean), the forward in training (running statistics moved, or left as
 * they were by a non-finite batch) and inference, the backward sums (dgamma, dbeta) and dx
 * against finite differences, and two shards with summed statistics equal to the whole. */
#include "harness.h"
#include "ops/op_math.h"

typedef struct bn_args {
  int64_t outer, c, inner;
  float eps, mom;
  int training;
  hx_buf *x, *first, *stats, *running, *g, *b, *y, *dy, *sums, *dx;
  hx_buf *s1, *s2, *sg, *u1, *u2, *ug, *ys, *dxs; /* two shards */
  const double *xd, *gd, *bd, *rd;
} bn_args;

static size_t bn_n(const bn_args *a) { return (size_t)(a->outer * a->c * a->inner); }
static int64_t bn_channel(const bn_args *a, size_t i) {
  return (int64_t)(i / (size_t)a->inner % (size_t)a->c);
}

/* Channel ch's mean and biased variance in float64. */
static void bn_moments(const bn_args *a, const double *x, int64_t ch, double *m, double *v) {
  double cnt = (double)(a->outer * a->inner), s = 0.0, ss = 0.0;
  for (int64_t o = 0; o < a->outer; o++)
    for (int64_t i = 0; i < a->inner; i++) s += x[(o * a->c + ch) * a->inner + i];
  *m = s / cnt;
  for (int64_t o = 0; o < a->outer; o++)
    for (int64_t i = 0; i < a->inner; i++) {
      double d = x[(o * a->c + ch) * a->inner + i] - *m;
      ss += d * d;
    }
  *v = ss / cnt;
}

/* Statistics (3c + 1) of x as bn_stats lays them out, taken in float64 around the float mean
 * (what two passes give) and rounded: the input of the ops that read statistics. */
static void bn_host_stats(const bn_args *a, const double *x, float *st) {
  size_t C = (size_t)a->c;
  for (int64_t ch = 0; ch < a->c; ch++) {
    double m, v, s = 0.0, ss = 0.0;
    bn_moments(a, x, ch, &m, &v);
    float shift = (float)m;
    for (int64_t o = 0; o < a->outer; o++)
      for (int64_t i = 0; i < a->inner; i++) {
        double d = x[(o * a->c + ch) * a->inner + i] - (double)shift;
        s += d, ss += d * d;
      }
    st[ch] = (float)s, st[C + (size_t)ch] = (float)ss, st[2 * C + 1 + (size_t)ch] = shift;
  }
  st[2 * C] = (float)(a->outer * a->inner);
}

/* sum r y over channel ch, y the float64 batch norm of x with gamma, beta. */
static double bn_channel_loss(const bn_args *a, int64_t ch) {
  double m, v, s = 0.0;
  bn_moments(a, a->xd, ch, &m, &v);
  for (int64_t o = 0; o < a->outer; o++)
    for (int64_t i = 0; i < a->inner; i++) {
      size_t at = (size_t)((o * a->c + ch) * a->inner + i);
      s += a->rd[at] * ((a->xd[at] - m) / sqrt(v + a->eps) * a->gd[ch] + a->bd[ch]);
    }
  return s;
}

/* The rms of gamma rstd dy, the terms of dx: with few elements in a channel dx cancels to far
 * below them (two elements: exactly 0 but for eps), and is held to their scale. */
static double bn_dx_scale(hx *h, const bn_args *a) {
  double *rstd = hx_doubles(h, (size_t)a->c), s = 0.0;
  for (int64_t ch = 0; ch < a->c; ch++) {
    double m, v;
    bn_moments(a, a->xd, ch, &m, &v);
    rstd[ch] = 1.0 / sqrt(v + a->eps);
  }
  for (size_t i = 0; i < bn_n(a); i++) {
    int64_t ch = bn_channel(a, i);
    double t = a->gd[ch] * rstd[ch] * a->rd[i];
    s += t * t;
  }
  return bn_n(a) ? sqrt(s / (double)bn_n(a)) : 0.0;
}

static double bn_loss_x(const void *ctx, size_t moved) {
  return bn_channel_loss(ctx, bn_channel(ctx, moved));
}
static double bn_loss_ch(const void *ctx, size_t moved) {
  return bn_channel_loss(ctx, (int64_t)moved);
}

/* x (outer, c, inner) uniform in [lo, hi), each channel of two or more elements drawn again
 * until its variance is at least 0.1: clear of the kink where a channel's elements coincide
 * (there the gradient is ~1/sqrt(eps) and finite differences no longer hold). */
static hx_buf *bn_x(hx *h, const bn_args *a, float lo, float hi) {
  hx_buf *x = hx_in(h, bn_n(a), lo, hi, "x");
  double *xd = hx_doubles(h, bn_n(a));
  for (int64_t ch = 0; ch < a->c; ch++)
    for (;;) {
      for (size_t i = 0; i < bn_n(a); i++) xd[i] = x->init[i];
      double m, v;
      bn_moments(a, xd, ch, &m, &v);
      if (a->outer * a->inner < 2 || v >= 0.1) break;
      for (size_t i = 0; i < bn_n(a); i++)
        if (bn_channel(a, i) == ch) x->init[i] = hx_uniform(h, lo, hi);
    }
  return x;
}

static int bn_shape(hx *h, int t, bn_args *a) {
  static const int64_t fixed[][3] = {{7, 3, 1}, {5, 4, 9},    {2, 1, 11},    {1, 2, 3},
                                     {0, 3, 4}, {64, 100, 1}, {8, 16, 1024}, {3, 5, 49}};
  int nf = h->large ? 8 : 5;
  if (t >= nf + hx_rounds(h, 3)) return 0;
  *a = (bn_args){.eps = 1e-5f, .mom = 0.9f, .training = 1};
  a->outer = t < nf ? fixed[t][0] : hx_int(h, 1, 7);
  a->c = t < nf ? fixed[t][1] : hx_int(h, 1, 5);
  a->inner = t < nf ? fixed[t][2] : hx_int(h, 1, 12);
  hx_trial(h, "outer=%" PRId64 " c=%" PRId64 " inner=%" PRId64, a->outer, a->c, a->inner);
  return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* bn_stats                                                                                   */

/* The first pass, and the second around its mean (not when there is nothing to average). */
static pmap_status call_stats(const pmap_ops *o, op_queue *q, void *arg) {
  bn_args *a = arg;
  HX_TRY(o->bn_stats(q, HX_F(a->x), a->outer, a->c, a->inner, NULL, HX_F(a->first)));
  if (!a->stats) return PMAP_SUCCESS;
  return o->bn_stats(q, HX_F(a->x), a->outer, a->c, a->inner, HX_F(a->first), HX_F(a->stats));
}

/* stats (3c + 1) from x around shift[ch] (NULL: 0) in float64. */
static void want_stats(const bn_args *a, const float *shift, double *want) {
  size_t C = (size_t)a->c;
  for (int64_t ch = 0; ch < a->c; ch++) {
    double s = 0.0, ss = 0.0, sh = shift ? shift[ch] : 0.0;
    for (int64_t o = 0; o < a->outer; o++)
      for (int64_t i = 0; i < a->inner; i++) {
        double d = a->xd[(o * a->c + ch) * a->inner + i] - sh;
        s += d, ss += d * d;
      }
    want[ch] = s, want[C + (size_t)ch] = ss, want[2 * C + 1 + (size_t)ch] = sh;
  }
  want[2 * C] = (double)(a->outer * a->inner);
}

static void stats_trial(hx *h, bn_args *a, float lo, float hi) {
  size_t n = bn_n(a), C = (size_t)a->c, S = 3 * C + 1;
  a->x = hx_in(h, n, lo, hi, "x");
  a->first = hx_out(h, S, "first pass");
  a->stats = a->outer * a->inner != 0 ? hx_out(h, S, "second pass") : NULL;
  /* Sums in double on every backend, each rounded once to float (u: 1e-6); the second pass
   * rounds x - shift in float first (HX_TOL_FWD's few roundings). */
  a->first->tol_cpu = 1e-6;
  if (a->stats) a->stats->tol_cpu = 1e-5;
  hx_buf *bufs[] = {a->x, a->first, a->stats, NULL}; /* ends early without a second pass */
  hx_run(h, call_stats, a, bufs);
  a->xd = hx_to_double(h, a->x->init, n);
  double *want = hx_doubles(h, S);
  want_stats(a, NULL, want);
  hx_close(h, "first pass", a->first->got, want, S, 1e-6);
  if (!a->stats) return;
  /* Around the mean of the backend's first pass, as the op takes it. */
  float *shift = hx_floats(h, C), unused;
  for (int64_t ch = 0; ch < a->c; ch++)
    pmap_bn_moments(a->first->got, a->c, ch, &shift[ch], &unused);
  want_stats(a, shift, want);
  hx_close(h, "second pass", a->stats->got, want, S, 1e-5);
  /* The moments they give, against float64's: a few roundings of the sums around the mean,
   * which do not cancel (1e-4 of the variance is far above them, and far below what one pass's
   * E[x^2] - E[x]^2 loses of the mean-1000 channel's). */
  double *mv = hx_doubles(h, 2 * C);
  float *got = hx_floats(h, 2 * C);
  for (int64_t ch = 0; ch < a->c; ch++) {
    bn_moments(a, a->xd, ch, &mv[ch], &mv[C + (size_t)ch]);
    pmap_bn_moments(a->stats->got, a->c, ch, &got[ch], &got[C + (size_t)ch]);
    HX_CHECK(h, fabs(got[C + (size_t)ch] - mv[C + (size_t)ch]) <= 1e-4 * mv[C + (size_t)ch],
             "channel %" PRId64 ": variance %.9g, want %.9g (mean %.9g)", ch,
             (double)got[C + (size_t)ch], mv[C + (size_t)ch], mv[ch]);
  }
  hx_close(h, "mean and variance", got, mv, 2 * C, 1e-5);
}

void opcase_bn_stats(hx *h) {
  bn_args a;
  for (int t = 0; bn_shape(h, t, &a); t++, hx_release(h)) stats_trial(h, &a, -1.0f, 3.0f);
  /* A large mean and a small spread: E[x^2] - E[x]^2 in float would lose the variance. */
  a = (bn_args){.outer = 999, .c = 1, .inner = 1, .eps = 1e-5f};
  hx_trial(h, "mean 1000, spread 1: outer=999 c=1 inner=1");
  stats_trial(h, &a, 999.5f, 1000.5f);
  hx_release(h);
}

/* ------------------------------------------------------------------------------------------ */
/* bn_forward                                                                                 */

static pmap_status call_forward(const pmap_ops *o, op_queue *q, void *arg) {
  bn_args *a = arg;
  const float *st = a->training ? HX_F(a->stats) : NULL;
  return o->bn_forward(q, HX_F(a->x), st, st, a->running ? HX_F(a->running) : NULL, HX_F(a->g),
                       HX_F(a->b), a->outer, a->c, a->inner, a->eps, a->mom, a->training,
                       HX_F(a->y));
}

/* y of x normalised by mean m (c) and variance v (c), in float64. */
static void want_y(const bn_args *a, const double *m, const double *v, double *want) {
  for (size_t i = 0; i < bn_n(a); i++) {
    int64_t ch = bn_channel(a, i);
    want[i] = (a->xd[i] - m[ch]) / sqrt(v[ch] + a->eps) * a->g->init[ch] + a->b->init[ch];
  }
}

void opcase_bn_forward(hx *h) {
  bn_args a;
  for (int t = 0; bn_shape(h, t, &a); t++, hx_release(h)) {
    if (!a.outer) continue; /* statistics of nothing normalise nothing */
    size_t n = bn_n(&a), C = (size_t)a.c;
    a.x = bn_x(h, &a, -1.0f, 3.0f);
    a.xd = hx_to_double(h, a.x->init, n);
    a.stats = hx_new(h, HX_IN, 3 * C + 1, "stats");
    bn_host_stats(&a, a.xd, a.stats->init);
    a.running = hx_inout(h, 2 * C, 0.5f, 1.5f, "running");
    a.g = hx_in_away(h, C, 0.5f, 1.5f, "gamma");
    a.b = hx_in(h, C, -1.0f, 1.0f, "beta");
    a.y = hx_out(h, n, "y");
    a.y->tol_cpu = 1e-5; /* element-wise from the statistics: HX_TOL_FWD's few roundings */
    HX_RUN(h, call_forward, &a, a.x, a.stats, a.running, a.g, a.b, a.y);
    double *m = hx_doubles(h, C), *v = hx_doubles(h, C), *run = hx_doubles(h, 2 * C);
    double *want = hx_doubles(h, n);
    for (int64_t ch = 0; ch < a.c; ch++) {
      bn_moments(&a, a.xd, ch, &m[ch], &v[ch]);
      run[ch] = a.mom * (double)a.running->init[ch] + (1.0 - a.mom) * m[ch];
      run[C + (size_t)ch] = a.mom * (double)a.running->init[C + (size_t)ch] + (1.0 - a.mom) * v[ch];
    }
    want_y(&a, m, v, want);
    hx_close(h, "y (training)", a.y->got, want, n, HX_TOL_FWD);
    /* mom r + (1 - mom) m: three roundings, of statistics within HX_TOL_FWD's few. */
    hx_close(h, "running statistics", a.running->got, run, 2 * C, 1e-5);
    /* Training without running statistics: the same y. */
    bn_args b = a;
    b.running = NULL;
    b.y = hx_out(h, n, "y (no running)");
    HX_RUN(h, call_forward, &b, b.x, b.stats, b.g, b.b, b.y);
    hx_same(h, "y (no running)", b.y->got, a.y->got, n);
    /* Inference: the running statistics, which stay as they are (an input here). */
    b = a;
    b.training = 0;
    b.running = hx_new(h, HX_IN, 2 * C, "running (inference)");
    memcpy(b.running->init, a.running->got, 2 * C * sizeof(float));
    b.y = hx_out(h, n, "y (inference)");
    b.y->tol_cpu = 1e-5;
    HX_RUN(h, call_forward, &b, b.x, b.running, b.g, b.b, b.y);
    for (size_t ch = 0; ch < C; ch++) m[ch] = b.running->init[ch], v[ch] = b.running->init[C + ch];
    want_y(&a, m, v, want);
    hx_close(h, "y (inference)", b.y->got, want, n, HX_TOL_FWD);
    /* A NaN in channel 0: its running statistics stay as they were (the guard skips such a
     * step), the other channels' move as before. */
    b = a;
    b.x = hx_new(h, HX_IN, n, "x with a NaN");
    memcpy(b.x->init, a.x->init, n * sizeof(float));
    b.x->init[0] = NAN;
    b.stats = hx_new(h, HX_IN, 3 * C + 1, "stats with a NaN");
    bn_host_stats(&a, hx_to_double(h, b.x->init, n), b.stats->init);
    b.running = hx_new(h, HX_INOUT, 2 * C, "running (NaN batch)");
    memcpy(b.running->init, a.running->init, 2 * C * sizeof(float));
    b.y = hx_out(h, n, "y (NaN batch)");
    b.y->keep_nan = 1;
    b.y->tol_cpu = 1e-5;
    HX_RUN(h, call_forward, &b, b.x, b.stats, b.running, b.g, b.b, b.y);
    HX_CHECK(h, b.running->got[0] == b.running->init[0] && b.running->got[C] == b.running->init[C],
             "channel 0's running statistics moved with a NaN: %g %g", (double)b.running->got[0],
             (double)b.running->got[C]);
    for (size_t ch = 1; ch < C; ch++)
      HX_CHECK(h,
               b.running->got[ch] == a.running->got[ch] &&
                   b.running->got[C + ch] == a.running->got[C + ch],
               "channel %zu's running statistics differ beside a NaN in channel 0", ch);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* bn_backward_sums, bn_backward_dx                                                           */

static pmap_status call_sums(const pmap_ops *o, op_queue *q, void *arg) {
  bn_args *a = arg;
  return o->bn_backward_sums(q, HX_F(a->x), HX_F(a->dy), HX_F(a->stats), a->outer, a->c, a->inner,
                             a->eps, HX_F(a->sums));
}

static pmap_status call_dx(const pmap_ops *o, op_queue *q, void *arg) {
  bn_args *a = arg;
  return o->bn_backward_dx(q, HX_F(a->x), HX_F(a->dy), HX_F(a->stats), HX_F(a->g), HX_F(a->sums),
                           a->outer, a->c, a->inner, a->eps, HX_F(a->dx));
}

/* sums (2c) = sum of dy and of dy xhat per channel, xhat from the statistics as the ops take
 * them (their float mean and variance), in float64. */
static void want_sums(const bn_args *a, const float *stats, double *want) {
  size_t C = (size_t)a->c;
  for (size_t k = 0; k < 2 * C; k++) want[k] = 0.0;
  for (size_t i = 0; i < bn_n(a); i++) {
    int64_t ch = bn_channel(a, i);
    float m, v;
    pmap_bn_moments(stats, a->c, ch, &m, &v);
    want[ch] += a->rd[i];
    want[C + (size_t)ch] += a->rd[i] * ((a->xd[i] - m) / sqrt((double)v + a->eps));
  }
}

/* x, dy, gamma, beta and the statistics of a trial, and the loss's arrays. */
static void bn_inputs(hx *h, bn_args *a) {
  size_t n = bn_n(a), C = (size_t)a->c;
  a->x = bn_x(h, a, -1.0f, 3.0f);
  a->dy = hx_in(h, n, -1.0f, 1.0f, "dy");
  a->g = hx_in_away(h, C, 0.5f, 1.5f, "gamma");
  a->xd = hx_to_double(h, a->x->init, n);
  a->rd = hx_to_double(h, a->dy->init, n);
  a->gd = hx_to_double(h, a->g->init, C);
  double *bd = hx_doubles(h, C);
  for (size_t k = 0; k < C; k++) bd[k] = hx_uniform(h, -1.0f, 1.0f);
  a->bd = bd;
  a->stats = hx_new(h, HX_IN, 3 * C + 1, "stats");
  bn_host_stats(a, a->xd, a->stats->init);
}

void opcase_bn_backward_sums(hx *h) {
  bn_args a;
  for (int t = 0; bn_shape(h, t, &a); t++, hx_release(h)) {
    size_t C = (size_t)a.c;
    bn_inputs(h, &a);
    /* Sums of count terms of rms ~ rms(dy) (xhat's rms is 1) cancel to far less than the
     * scale of their rounding, sqrt(count) rms(dy). */
    double scale = 0.0;
    for (size_t i = 0; i < bn_n(&a); i++) scale += a.rd[i] * a.rd[i];
    scale = bn_n(&a) ? sqrt(scale / (double)bn_n(&a) * (double)(a.outer * a.inner)) : 0.0;
    a.sums = hx_out(h, 2 * C, "sums");
    a.sums->tol_cpu = 1e-5; /* summed in double on every backend: HX_TOL_FWD's argument */
    a.sums->scale_cpu = scale;
    HX_RUN(h, call_sums, &a, a.x, a.dy, a.stats, a.sums);
    double *want = hx_doubles(h, 2 * C);
    want_sums(&a, a.stats->init, want);
    hx_close_scale(h, "sums", a.sums->got, want, 2 * C, 1e-5, scale);
    if (!a.outer) continue;
    hx_fd_scale(h, "dgamma (sum of dy xhat)", bn_loss_ch, &a, (double *)a.gd, C, a.sums->got + C,
                NULL, 1e-3, HX_TOL_GRAD, scale);
    hx_fd_scale(h, "dbeta (sum of dy)", bn_loss_ch, &a, (double *)a.bd, C, a.sums->got, NULL, 1e-3,
                HX_TOL_GRAD, scale);
  }
}

/* Two shards (the first outer1 rows, the rest) with every sum added across them by the ops
 * themselves, as the all-reduce of cross-replica batch norm does: the two-pass statistics, the
 * forward, the backward sums and dx. */
static pmap_status call_shards(const pmap_ops *o, op_queue *q, void *arg) {
  bn_args *a = arg;
  int64_t o1 = a->outer / 2 + (a->outer & 1), o2 = a->outer - o1, c = a->c, in = a->inner;
  size_t n1 = (size_t)(o1 * c * in), C = (size_t)c, S = 3 * C + 1;
  float *x = HX_F(a->x), *dy = HX_F(a->dy), *s1 = HX_F(a->s1), *s2 = HX_F(a->s2);
  float *sg = HX_F(a->sg), *u1 = HX_F(a->u1), *u2 = HX_F(a->u2), *ug = HX_F(a->ug);
  for (int pass = 0; pass < 2; pass++) {
    HX_TRY(o->bn_stats(q, x, o1, c, in, pass ? sg : NULL, s1));
    HX_TRY(o->bn_stats(q, x + n1, o2, c, in, pass ? sg : NULL, s2));
    HX_TRY(o->add(q, s1, s2, sg, 2 * C + 1)); /* the sums and counts add; shifts are alike */
    HX_TRY(o->copy(q, s1 + 2 * C + 1, sg + 2 * C + 1, S - (2 * C + 1)));
  }
  float *ys = HX_F(a->ys), *g = HX_F(a->g), *b = HX_F(a->b), *dxs = HX_F(a->dxs);
  HX_TRY(o->bn_forward(q, x, sg, sg, NULL, g, b, o1, c, in, a->eps, a->mom, 1, ys));
  HX_TRY(o->bn_forward(q, x + n1, sg, sg, NULL, g, b, o2, c, in, a->eps, a->mom, 1, ys + n1));
  HX_TRY(o->bn_backward_sums(q, x, dy, sg, o1, c, in, a->eps, u1));
  HX_TRY(o->bn_backward_sums(q, x + n1, dy + n1, sg, o2, c, in, a->eps, u2));
  HX_TRY(o->add(q, u1, u2, ug, 2 * C));
  HX_TRY(o->bn_backward_dx(q, x, dy, sg, g, ug, o1, c, in, a->eps, dxs));
  return o->bn_backward_dx(q, x + n1, dy + n1, sg, g, ug, o2, c, in, a->eps, dxs + n1);
}

void opcase_bn_backward_dx(hx *h) {
  bn_args a;
  for (int t = 0; bn_shape(h, t, &a); t++, hx_release(h)) {
    if (!a.outer) continue; /* no batch, no normalisation to differentiate */
    size_t n = bn_n(&a), C = (size_t)a.c;
    bn_inputs(h, &a);
    a.sums = hx_new(h, HX_IN, 2 * C, "sums");
    double *sums = hx_doubles(h, 2 * C);
    want_sums(&a, a.stats->init, sums);
    for (size_t k = 0; k < 2 * C; k++) a.sums->init[k] = (float)sums[k];
    a.dx = hx_out(h, n, "dx");
    double scale = bn_dx_scale(h, &a);
    a.dx->tol_cpu = 1e-5; /* element-wise from the sums: HX_TOL_FWD's few roundings */
    a.dx->scale_cpu = scale;
    HX_RUN(h, call_dx, &a, a.x, a.dy, a.stats, a.g, a.sums, a.dx);
    hx_fd_scale(h, "dx", bn_loss_x, &a, (double *)a.xd, n, a.dx->got, NULL, 1e-3, HX_TOL_GRAD,
                scale);
    if (a.outer < 2) continue;
    size_t S = 3 * C + 1;
    a.b = hx_in(h, C, -1.0f, 1.0f, "beta");
    for (size_t k = 0; k < C; k++) ((double *)a.bd)[k] = a.b->init[k];
    a.s1 = hx_out(h, S, "shard 1 statistics"), a.s2 = hx_out(h, S, "shard 2 statistics");
    a.sg = hx_out(h, S, "summed statistics");
    a.u1 = hx_out(h, 2 * C, "shard 1 sums"), a.u2 = hx_out(h, 2 * C, "shard 2 sums");
    a.ug = hx_out(h, 2 * C, "summed sums");
    a.ys = hx_out(h, n, "y over two shards"), a.dxs = hx_out(h, n, "dx over two shards");
    hx_buf *all[] = {a.s1, a.s2, a.sg, a.u1, a.u2, a.ug, a.ys, a.dxs};
    /* Sums in double on every backend (HX_TOL_FWD's argument). */
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) all[k]->tol_cpu = 1e-5;
    a.dxs->scale_cpu = scale;
    HX_RUN(h, call_shards, &a, a.x, a.dy, a.g, a.b, a.s1, a.s2, a.sg, a.u1, a.u2, a.ug, a.ys,
           a.dxs);
    double *m = hx_doubles(h, C), *v = hx_doubles(h, C), *want = hx_doubles(h, n);
    for (int64_t ch = 0; ch < a.c; ch++) bn_moments(&a, a.xd, ch, &m[ch], &v[ch]);
    want_y(&a, m, v, want);
    hx_close(h, "y over two shards with summed statistics", a.ys->got, want, n, HX_TOL_FWD);
    /* Each shard's double sums rounded to float and added in float: two roundings more than
     * the whole's one, which move dx by a few u of its terms' scale. */
    hx_close_scale(h, "dx over two shards with summed sums", a.dxs->got,
                   hx_to_double(h, a.dx->got, n), n, 1e-5, scale);
  }
}
