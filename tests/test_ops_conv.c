/* test_ops_conv.c: unit test of the CPU conv2d, loss and optimizer ops: forward against float64
 * references (softmax cross-entropy at extreme logits too), backward against central finite
 * differences, the write contract, and several optimizer steps against a double reference. */
#include "ops_check.h"

/* ------------------------------------------------------------------------------------------ */
/* conv2d                                                                                     */

/* y (bd, oc, oh, ow) = conv(x (bd, c, h, w), w (oc, c, kh, kw)) with zero padding. */
static void ref_conv(const pmap_conv_shape *s, int64_t bd, const double *x, const double *w,
                     double *y) {
  for (int64_t b = 0; b < bd; b++)
    for (int64_t o = 0; o < s->oc; o++)
      for (int64_t oi = 0; oi < s->oh; oi++)
        for (int64_t oj = 0; oj < s->ow; oj++) {
          double sum = 0.0;
          for (int64_t c = 0; c < s->c; c++)
            for (int ki = 0; ki < s->kh; ki++) {
              int64_t ii = oi * s->stride - s->pad + ki;
              if (ii < 0 || ii >= s->h) continue;
              for (int kj = 0; kj < s->kw; kj++) {
                int64_t jj = oj * s->stride - s->pad + kj;
                if (jj < 0 || jj >= s->w) continue;
                sum += x[((b * s->c + c) * s->h + ii) * s->w + jj] *
                       w[((o * s->c + c) * s->kh + ki) * s->kw + kj];
              }
            }
          y[((b * s->oc + o) * s->oh + oi) * s->ow + oj] = sum;
        }
}

typedef struct {
  const pmap_conv_shape *s;
  int64_t bd;
  const double *x, *w, *r;
  double *y; /* scratch */
} conv_ctx;

static double conv_loss(const void *vctx) {
  const conv_ctx *c = vctx;
  ref_conv(c->s, c->bd, c->x, c->w, c->y);
  size_t n = (size_t)(c->bd * c->s->oc * c->s->oh * c->s->ow);
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += c->r[i] * c->y[i];
  return sum;
}

static void conv_case(uint64_t *rs, int64_t bd, int64_t c, int64_t h, int64_t w, int64_t oc, int kh,
                      int kw, int stride, int pad) {
  pmap_conv_shape s = {.c = c,
                       .h = h,
                       .w = w,
                       .oc = oc,
                       .oh = (h + 2 * pad - kh) / stride + 1,
                       .ow = (w + 2 * pad - kw) / stride + 1,
                       .kh = kh,
                       .kw = kw,
                       .stride = stride,
                       .pad = pad};
  char shape[128], what[200];
  snprintf(shape, sizeof shape,
           "bd=%" PRId64 " c=%" PRId64 " %" PRId64 "x%" PRId64 " oc=%" PRId64
           " k=%dx%d stride=%d pad=%d",
           bd, c, h, w, oc, kh, kw, stride, pad);
  size_t nx = (size_t)(bd * c * h * w), nw = (size_t)(oc * c * kh * kw),
         ny = (size_t)(bd * oc * s.oh * s.ow), ncol = (size_t)(c * kh * kw * s.oh * s.ow);
  float *x = falloc(nx), *wt = falloc(nw), *r = falloc(ny), *y = falloc(ny);
  float *col = falloc(ncol), *dcol = falloc(ncol);
  float *dx = falloc(nx), *dw = falloc(nw), *dx2 = falloc(nx), *dw2 = falloc(nw), *wb = falloc(nw);
  double *xd = dalloc(nx), *wd = dalloc(nw), *rd = dalloc(ny), *yd = dalloc(ny),
         *want = dalloc(ny > nw ? ny : nw);
  test_fill(x, nx, rs, -1.0f, 1.0f);
  test_fill(wt, nw, rs, -1.0f, 1.0f);
  test_fill(r, ny, rs, -1.0f, 1.0f);
  to_double(x, xd, nx);
  to_double(wt, wd, nw);
  to_double(r, rd, ny);
  conv_ctx ctx = {&s, bd, xd, wd, rd, yd};

  /* Scratch starts as NaN: the ops must not depend on what it held. */
  fill_nan(col, ncol);
  fill_nan(y, ny);
  CHECK_OK(OPS.conv2d_forward(NULL, &s, bd, x, wt, y, col));
  ref_conv(&s, bd, xd, wd, want);
  snprintf(what, sizeof what, "conv2d_forward %s", shape);
  test_close(what, y, want, ny, TOL_FWD);

  fill_nan(col, ncol);
  fill_nan(dcol, ncol);
  fill_nan(dx, nx);
  memset(dw, 0, nw * sizeof *dw);
  CHECK_OK(OPS.conv2d_backward(NULL, &s, bd, x, wt, r, dx, dw, col, dcol));
  snprintf(what, sizeof what, "conv2d_backward overwrites dx %s", shape);
  no_nan(what, dx, nx);
  snprintf(what, sizeof what, "conv2d_backward dw vs finite differences %s", shape);
  fd_check(what, conv_loss, &ctx, wd, nw, dw, 1e-3, TOL_GRAD, rs);
  snprintf(what, sizeof what, "conv2d_backward dx vs finite differences %s", shape);
  fd_check(what, conv_loss, &ctx, xd, nx, dx, 1e-3, TOL_GRAD, rs);

  /* Onto a random dw and a garbage dx: dw grows by the gradient, dx comes out the same. */
  test_fill(wb, nw, rs, -3.0f, 3.0f);
  memcpy(dw2, wb, nw * sizeof *dw2);
  test_fill(dx2, nx, rs, 100.0f, 200.0f);
  fill_nan(col, ncol);
  fill_nan(dcol, ncol);
  CHECK_OK(OPS.conv2d_backward(NULL, &s, bd, x, wt, r, dx2, dw2, col, dcol));
  expect_sum(wb, dw, want, nw);
  snprintf(what, sizeof what, "conv2d_backward accumulates dw %s", shape);
  test_close(what, dw2, want, nw, 1e-6);
  snprintf(what, sizeof what, "conv2d_backward dx overwritten %s", shape);
  test_close_f(what, dx2, dx, nx, 1e-6);

  /* dx == NULL: only dw, still accumulated. */
  memcpy(dw2, wb, nw * sizeof *dw2);
  fill_nan(col, ncol);
  fill_nan(dcol, ncol);
  CHECK_OK(OPS.conv2d_backward(NULL, &s, bd, x, wt, r, NULL, dw2, col, dcol));
  snprintf(what, sizeof what, "conv2d_backward dx=NULL accumulates dw %s", shape);
  test_close(what, dw2, want, nw, 1e-6);

  free(x);
  free(wt);
  free(r);
  free(y);
  free(col);
  free(dcol);
  free(dx);
  free(dw);
  free(dx2);
  free(dw2);
  free(wb);
  free(xd);
  free(wd);
  free(rd);
  free(yd);
  free(want);
}

static void test_conv(void) {
  /* bd, c, h, w, oc, kh, kw, stride, pad */
  static const int g[][9] = {
      {2, 3, 7, 9, 4, 3, 3, 1, 1},   {3, 2, 9, 7, 5, 3, 3, 2, 1}, {2, 4, 6, 5, 3, 1, 1, 1, 0},
      {1, 3, 11, 8, 2, 5, 3, 2, 2},  {2, 1, 5, 5, 1, 3, 3, 1, 0}, {2, 2, 8, 10, 3, 5, 3, 1, 2},
      {1, 3, 7, 7, 2, 1, 1, 2, 0},   {2, 2, 5, 6, 3, 3, 3, 2, 0}, {1, 2, 4, 4, 2, 5, 5, 1, 2},
      {2, 6, 10, 10, 8, 3, 3, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 0}, {2, 3, 9, 9, 4, 3, 5, 2, 2},
  };
  uint64_t s = 505;
  for (size_t i = 0; i < sizeof g / sizeof g[0]; i++)
    conv_case(&s, g[i][0], g[i][1], g[i][2], g[i][3], g[i][4], g[i][5], g[i][6], g[i][7], g[i][8]);
  for (uint64_t seed = 41; seed < 47; seed++) {
    uint64_t r = seed;
    int kh = (int)rand_int(&r, 1, 5), kw = (int)rand_int(&r, 1, 5);
    int stride = (int)rand_int(&r, 1, 2), pad = (int)rand_int(&r, 0, 2);
    int64_t h = rand_int(&r, kh > 2 * pad ? kh - 2 * pad : 1, 12);
    int64_t w = rand_int(&r, kw > 2 * pad ? kw - 2 * pad : 1, 12);
    conv_case(&r, rand_int(&r, 1, 3), rand_int(&r, 1, 4), h, w, rand_int(&r, 1, 4), kh, kw, stride,
              pad);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* mse                                                                                        */

typedef struct {
  const double *p, *t;
  size_t n;
} mse_ctx;

static double mse_loss(const void *vctx) {
  const mse_ctx *c = vctx;
  double sum = 0.0;
  for (size_t i = 0; i < c->n; i++) sum += (c->p[i] - c->t[i]) * (c->p[i] - c->t[i]);
  return sum / (double)c->n;
}

static void mse_case(uint64_t *s, size_t n) {
  char what[96];
  float *p = falloc(n), *t = falloc(n), *dp = falloc(n), loss = NAN;
  double *pd = dalloc(n), *td = dalloc(n), *want = dalloc(n);
  test_fill(p, n, s, -2.0f, 2.0f);
  test_fill(t, n, s, -2.0f, 2.0f);
  to_double(p, pd, n);
  to_double(t, td, n);
  fill_nan(dp, n);
  CHECK_OK(OPS.mse(NULL, p, t, n, dp, &loss));
  mse_ctx ctx = {pd, td, n};
  double want_loss = mse_loss(&ctx);
  snprintf(what, sizeof what, "mse loss n=%zu", n);
  test_close(what, &loss, &want_loss, 1, 1e-6);
  for (size_t i = 0; i < n; i++) want[i] = 2.0 * (pd[i] - td[i]) / (double)n;
  snprintf(what, sizeof what, "mse dpred n=%zu", n);
  test_close(what, dp, want, n, 1e-6);
  snprintf(what, sizeof what, "mse dpred vs finite differences n=%zu", n);
  fd_check(what, mse_loss, &ctx, pd, n, dp, 1e-3, TOL_GRAD, s);
  free(p);
  free(t);
  free(dp);
  free(pd);
  free(td);
  free(want);
}

static void test_mse(void) {
  uint64_t s = 606;
  mse_case(&s, 1);
  mse_case(&s, 37);
  mse_case(&s, 1000);
  for (uint64_t seed = 51; seed < 54; seed++) {
    uint64_t r = seed;
    mse_case(&r, (size_t)rand_int(&r, 1, 500));
  }
}

/* ------------------------------------------------------------------------------------------ */
/* softmax cross-entropy                                                                      */

typedef struct {
  const double *z;
  const int32_t *labels;
  int64_t rows, k;
} xent_ctx;

static double row_max(const double *z, int64_t k) {
  double m = z[0];
  for (int64_t j = 1; j < k; j++) m = z[j] > m ? z[j] : m;
  return m;
}

static double xent_loss(const void *vctx) {
  const xent_ctx *c = vctx;
  double sum = 0.0;
  for (int64_t r = 0; r < c->rows; r++) {
    const double *z = c->z + r * c->k;
    double m = row_max(z, c->k), se = 0.0;
    for (int64_t j = 0; j < c->k; j++) se += exp(z[j] - m);
    sum += log(se) + m - z[c->labels[r]];
  }
  return sum / (double)c->rows;
}

/* logits given (extreme) or random in [-4, 4). */
static void xent_case(uint64_t *s, int64_t rows, int64_t k, const float *given,
                      const int32_t *given_labels, const char *tag) {
  char what[128];
  size_t n = (size_t)(rows * k);
  float *z = falloc(n), *dz = falloc(n), loss = NAN;
  int32_t *labels = malloc((size_t)rows * sizeof *labels);
  double *zd = dalloc(n), *want = dalloc(n);
  if (!labels) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  if (given) {
    memcpy(z, given, n * sizeof *z);
    memcpy(labels, given_labels, (size_t)rows * sizeof *labels);
  } else {
    test_fill(z, n, s, -4.0f, 4.0f);
    for (int64_t r = 0; r < rows; r++) labels[r] = (int32_t)rand_int(s, 0, k - 1);
  }
  to_double(z, zd, n);
  xent_ctx ctx = {zd, labels, rows, k};
  fill_nan(dz, n);
  CHECK_OK(OPS.softmax_xent(NULL, z, labels, rows, k, dz, &loss));
  double want_loss = xent_loss(&ctx);
  snprintf(what, sizeof what, "softmax_xent loss %s rows=%" PRId64 " k=%" PRId64, tag, rows, k);
  test_close(what, &loss, &want_loss, 1, 1e-6);
  for (int64_t r = 0; r < rows; r++) {
    const double *zr = zd + r * k;
    double m = row_max(zr, k), se = 0.0;
    for (int64_t j = 0; j < k; j++) se += exp(zr[j] - m);
    for (int64_t j = 0; j < k; j++)
      want[r * k + j] = (exp(zr[j] - m) / se - (j == labels[r] ? 1.0 : 0.0)) / (double)rows;
  }
  snprintf(what, sizeof what, "softmax_xent dlogits %s rows=%" PRId64 " k=%" PRId64, tag, rows, k);
  test_close(what, dz, want, n, TOL_FWD);
  snprintf(what, sizeof what,
           "softmax_xent dlogits vs finite differences %s rows=%" PRId64 " k=%" PRId64, tag, rows,
           k);
  fd_check(what, xent_loss, &ctx, zd, n, dz, 1e-4, TOL_GRAD, s);
  free(z);
  free(dz);
  free(labels);
  free(zd);
  free(want);
}

static void test_xent(void) {
  uint64_t s = 707;
  xent_case(&s, 7, 10, NULL, NULL, "random");
  xent_case(&s, 1, 2, NULL, NULL, "random");
  xent_case(&s, 33, 100, NULL, NULL, "random");
  /* Rows where a naive exp overflows float (exp(88.8) > FLT_MAX; five exp(88.5) sum past it)
   * or underflows to a zero sum; some labels sit on the smallest logit. */
  static const float extreme[] = {
      1000.0f,  -1000.0f, 0.0f,     3.0f,     -3.0f,    /* label 1: loss about 2000 */
      -1000.0f, -1000.0f, -1000.0f, -1000.0f, -1000.0f, /* all underflow naively */
      88.0f,    87.0f,    89.0f,    100.0f,   -88.0f,   /* exp(100) overflows */
      1000.0f,  1000.0f,  999.0f,   -1000.0f, 0.5f,     /* label on -1000 */
      88.5f,    88.5f,    88.5f,    88.5f,    88.5f,    /* ties */
      -88.0f,   -103.0f,  -1000.0f, 50.0f,    1.0f,
  };
  static const int32_t extreme_labels[] = {1, 2, 0, 3, 4, 1};
  xent_case(&s, 6, 5, extreme, extreme_labels, "extreme");
  for (uint64_t seed = 61; seed < 64; seed++) {
    uint64_t r = seed;
    int64_t rows = rand_int(&r, 1, 20), k = rand_int(&r, 2, 40);
    xent_case(&r, rows, k, NULL, NULL, "random");
  }
}

/* ------------------------------------------------------------------------------------------ */
/* optimizers                                                                                 */

static void test_sgd(void) {
  uint64_t s = 808;
  const size_t n = 101;
  const float lr = 0.05f;
  float *w = falloc(n), *g = falloc(n), *v = falloc(n), *vcopy = falloc(n);
  double *wd = dalloc(n), *vd = dalloc(n);
  char what[96];

  /* momentum 0: v (NaN) must be neither read nor written */
  test_fill(w, n, &s, -1.0f, 1.0f);
  fill_away(g, n, &s, 0.01f, 1.0f);
  fill_nan(v, n);
  memcpy(vcopy, v, n * sizeof *v);
  for (size_t i = 0; i < n; i++) wd[i] = (double)w[i] - (double)lr * (double)g[i];
  pmap_step_hyper plain = {.lr = lr};
  CHECK_OK(OPS.sgd_step(NULL, w, g, v, n, &plain));
  test_close("sgd_step momentum=0 w", w, wd, n, 1e-6);
  test_same_bits("sgd_step momentum=0 leaves v alone", v, vcopy, n);

  const float mom = 0.9f;
  test_fill(w, n, &s, -1.0f, 1.0f);
  test_fill(v, n, &s, -0.5f, 0.5f);
  to_double(w, wd, n);
  to_double(v, vd, n);
  for (int step = 1; step <= 4; step++) {
    fill_away(g, n, &s, 0.01f, 1.0f);
    for (size_t i = 0; i < n; i++) {
      vd[i] = (double)mom * vd[i] + (double)g[i];
      wd[i] -= (double)lr * vd[i];
    }
    pmap_step_hyper h = {.lr = lr, .momentum = mom};
    CHECK_OK(OPS.sgd_step(NULL, w, g, v, n, &h));
    snprintf(what, sizeof what, "sgd_step momentum=0.9 step %d w", step);
    test_close(what, w, wd, n, 1e-6);
    snprintf(what, sizeof what, "sgd_step momentum=0.9 step %d v", step);
    test_close(what, v, vd, n, 1e-6);
  }
  free(w);
  free(g);
  free(v);
  free(vcopy);
  free(wd);
  free(vd);
}

/* Six Adam steps against a double reference. eps and the gradient scale gmax are parameters
 * because only a large eps next to small gradients shows where eps enters the update. */
static void adam_run(uint64_t *s, size_t n, int random_state, float eps, float gmax,
                     const char *tag) {
  const float lr = 0.01f, beta1 = 0.9f, beta2 = 0.999f;
  float *w = falloc(n), *g = falloc(n), *m = falloc(n), *v = falloc(n), *w0 = falloc(n);
  double *wd = dalloc(n), *md = dalloc(n), *vd = dalloc(n), *delta = dalloc(n);
  float *dgot = falloc(n);
  char what[128];
  test_fill(w, n, s, -1.0f, 1.0f);
  if (random_state) {
    test_fill(m, n, s, -0.1f, 0.1f);
    test_fill(v, n, s, 0.01f * gmax * gmax, 0.1f * gmax * gmax);
  } else {
    memset(m, 0, n * sizeof *m);
    memset(v, 0, n * sizeof *v);
  }
  to_double(w, wd, n);
  to_double(m, md, n);
  to_double(v, vd, n);
  for (int t = 1; t <= 6; t++) {
    fill_away(g, n, s, 0.01f * gmax, gmax);
    double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
    for (size_t i = 0; i < n; i++) {
      md[i] = (double)beta1 * md[i] + (1.0 - (double)beta1) * (double)g[i];
      vd[i] = (double)beta2 * vd[i] + (1.0 - (double)beta2) * (double)g[i] * (double)g[i];
      delta[i] = -(double)lr * (md[i] / bc1) / (sqrt(vd[i] / bc2) + (double)eps);
      wd[i] += delta[i];
    }
    memcpy(w0, w, n * sizeof *w);
    pmap_step_hyper h = {
        .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .bc1 = (float)bc1, .bc2 = (float)bc2};
    CHECK_OK(OPS.adam_step(NULL, w, g, m, v, n, &h));
    /* The step itself, not only w: a wrong bias correction moves w by ~lr, small next to w. */
    for (size_t i = 0; i < n; i++) dgot[i] = w[i] - w0[i];
    snprintf(what, sizeof what, "adam_step %s t=%d update", tag, t);
    test_close(what, dgot, delta, n, 1e-4);
    snprintf(what, sizeof what, "adam_step %s t=%d w", tag, t);
    test_close(what, w, wd, n, 1e-6);
    snprintf(what, sizeof what, "adam_step %s t=%d m", tag, t);
    test_close(what, m, md, n, 1e-5);
    snprintf(what, sizeof what, "adam_step %s t=%d v", tag, t);
    test_close(what, v, vd, n, 1e-5);
  }
  free(w);
  free(g);
  free(m);
  free(v);
  free(w0);
  free(wd);
  free(md);
  free(vd);
  free(delta);
  free(dgot);
}

static void test_adam(void) {
  uint64_t s = 909;
  adam_run(&s, 101, 0, 1e-8f, 1.0f, "from zero state");
  adam_run(&s, 57, 1, 1e-8f, 1.0f, "from random state");
  adam_run(&s, 33, 0, 1e-3f, 0.01f, "eps=1e-3");
}

int main(void) {
  test_conv();
  test_mse();
  test_xent();
  test_sgd();
  test_adam();
  return test_exit("ops-conv");
}
