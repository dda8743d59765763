/* case_dense.c: the op harness's cases for the ops behind dense layers: gemm (every transpose,
 * alpha and beta, padded leading dimensions, k == 0, and as a dense layer's forward and
 * backward against finite differences), fill, copy, bias and relu. */
#include "harness.h"

/* ------------------------------------------------------------------------------------------ */
/* gemm                                                                                       */

typedef struct gemm_args {
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  hx_buf *a, *b, *c;
} gemm_args;

static pmap_status call_gemm(const pmap_ops *o, op_queue *q, void *arg) {
  gemm_args *g = arg;
  return o->gemm(q, g->ta, g->tb, g->m, g->n, g->k, g->alpha, HX_F(g->a), g->lda, HX_F(g->b),
                 g->ldb, g->beta, HX_F(g->c), g->ldc);
}

static double op_at(const float *a, int64_t ld, int trans, int64_t i, int64_t j) {
  return trans ? a[j * ld + i] : a[i * ld + j];
}

/* A stored matrix (rows, cols) with leading dimension cols + pad; the padding holds NaN so that
 * any read of it shows in the result. */
static hx_buf *padded(hx *h, int64_t rows, int64_t cols, int64_t pad, int64_t *ld,
                      const char *name) {
  *ld = cols + pad;
  hx_buf *b = hx_new(h, HX_IN, (size_t)(rows * *ld), name);
  for (int64_t r = 0; r < rows; r++) {
    hx_fill(h, b->init + r * *ld, (size_t)cols, -1.0f, 1.0f);
    for (int64_t j = cols; j < *ld; j++) b->init[r * *ld + j] = NAN;
  }
  return b;
}

static void gemm_trial(hx *h, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                       float beta, int64_t pad) {
  hx_trial(h, "ta=%d tb=%d m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " alpha=%g beta=%g pad=%" PRId64,
           ta, tb, m, n, k, (double)alpha, (double)beta, pad);
  gemm_args g = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .alpha = alpha, .beta = beta};
  g.ldc = n + pad;
  g.a = padded(h, ta ? k : m, ta ? m : k, pad, &g.lda, "a");
  g.b = padded(h, tb ? n : k, tb ? k : n, pad, &g.ldb, "b");
  /* c's padding holds a sentinel that must survive; with beta == 0, c holds NaN, which the op
   * must not read. */
  g.c = hx_new(h, HX_INOUT, (size_t)(m * g.ldc), "c");
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < g.ldc; j++)
      g.c->init[i * g.ldc + j] = j >= n ? -777.0f : beta == 0.0f ? NAN : hx_uniform(h, -1, 1);
  /* Sums of k products of values in [-1, 1) (rms sqrt(k) / 3) and beta c: the scale of their
   * rounding, where c cancels to far less. Their roundings: the k products' sum, alpha's
   * product, beta c's and their add. */
  double scale = fabs(alpha) * sqrt((double)k) / 3.0 + fabs(beta) * 0.5;
  double kr = (double)k + 3.0, tol = hx_tol_gemm(h, kr);
  g.c->tol_cpu = hx_tol_vs_cpu(tol, kr);
  g.c->scale_cpu = scale;
  HX_RUN(h, call_gemm, &g, g.a, g.b, g.c);
  size_t mn = (size_t)(m * n);
  double *want = hx_doubles(h, mn);
  float *got = hx_floats(h, mn);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; p++)
        sum += op_at(g.a->init, g.lda, ta, i, p) * op_at(g.b->init, g.ldb, tb, p, j);
      double c0 = beta != 0.0f ? (double)beta * g.c->init[i * g.ldc + j] : 0.0;
      want[i * n + j] = (double)alpha * sum + c0;
      got[i * n + j] = g.c->got[i * g.ldc + j];
    }
  hx_close_scale(h, "c", got, want, mn, tol, scale);
  int64_t bad = -1;
  for (int64_t i = 0; i < m && bad < 0; i++)
    for (int64_t j = n; j < g.ldc && bad < 0; j++)
      if (g.c->got[i * g.ldc + j] != -777.0f) bad = i * g.ldc + j;
  HX_CHECK(h, bad < 0, "c's padding written at %" PRId64 ": %g", bad,
           bad < 0 ? 0.0 : (double)g.c->got[bad]);
}

/* A dense layer, y (B, out) = x (B, in) op(W) + b, and its backward through gemm and bias as
 * models/layers run them: dW (+=) and db (+=) start from random values, dx (=) from NaN. */
typedef struct dense_args {
  int64_t bs, in, out;
  int wt; /* W stored (out, in) and used transposed, else stored (in, out) */
  hx_buf *x, *w, *b, *y, *r, *dx, *dw, *db;
  const double *xd, *wd, *bd, *rd; /* the float64 loss's arrays */
} dense_args;

static pmap_status call_dense_forward(const pmap_ops *o, op_queue *q, void *arg) {
  dense_args *d = arg;
  if (d->wt)
    HX_TRY(o->gemm(q, 0, 1, d->bs, d->out, d->in, 1.0f, HX_F(d->x), d->in, HX_F(d->w), d->in, 0.0f,
                   HX_F(d->y), d->out));
  else
    HX_TRY(o->gemm(q, 0, 0, d->bs, d->out, d->in, 1.0f, HX_F(d->x), d->in, HX_F(d->w), d->out, 0.0f,
                   HX_F(d->y), d->out));
  return o->bias_forward(q, HX_F(d->y), HX_F(d->b), d->bs, d->out, 1);
}

static pmap_status call_dense_backward(const pmap_ops *o, op_queue *q, void *arg) {
  dense_args *d = arg;
  int64_t bs = d->bs, in = d->in, out = d->out;
  float *x = HX_F(d->x), *w = HX_F(d->w), *r = HX_F(d->r);
  if (d->wt) {
    /* dW (out, in) += dy^T x; dx (B, in) = dy W */
    HX_TRY(o->gemm(q, 1, 0, out, in, bs, 1.0f, r, out, x, in, 1.0f, HX_F(d->dw), in));
    HX_TRY(o->gemm(q, 0, 0, bs, in, out, 1.0f, r, out, w, in, 0.0f, HX_F(d->dx), in));
  } else {
    /* dW (in, out) += x^T dy; dx (B, in) = dy W^T */
    HX_TRY(o->gemm(q, 1, 0, in, out, bs, 1.0f, x, in, r, out, 1.0f, HX_F(d->dw), out));
    HX_TRY(o->gemm(q, 0, 1, bs, in, out, 1.0f, r, out, w, out, 0.0f, HX_F(d->dx), in));
  }
  return o->bias_backward(q, r, HX_F(d->db), bs, out, 1);
}

static double dense_y(const dense_args *d, int64_t i, int64_t o) {
  double y = d->bd[o];
  for (int64_t p = 0; p < d->in; p++)
    y += d->xd[i * d->in + p] * (d->wt ? d->wd[o * d->in + p] : d->wd[p * d->out + o]);
  return y;
}

/* sum r y over the whole batch (x's rows other than the moved one could be left out). */
static double dense_loss(const void *ctx, size_t moved) {
  const dense_args *d = ctx;
  (void)moved;
  double sum = 0.0;
  for (int64_t i = 0; i < d->bs; i++)
    for (int64_t o = 0; o < d->out; o++) sum += d->rd[i * d->out + o] * dense_y(d, i, o);
  return sum;
}

static void dense_trial(hx *h, int64_t bs, int64_t in, int64_t out, int wt) {
  hx_trial(h, "dense B=%" PRId64 " in=%" PRId64 " out=%" PRId64 " wt=%d", bs, in, out, wt);
  size_t nx = (size_t)(bs * in), nw = (size_t)(in * out), ny = (size_t)(bs * out);
  dense_args d = {.bs = bs, .in = in, .out = out, .wt = wt};
  d.x = hx_in(h, nx, -1.0f, 1.0f, "x");
  d.w = hx_in(h, nw, -1.0f, 1.0f, "w");
  d.b = hx_in_away(h, (size_t)out, 0.1f, 1.0f, "b");
  d.y = hx_out(h, ny, "y");
  /* Reductions (and roundings): y over in products and the bias; dx over out products; dW and
   * db over the B rows, added to what they held. */
  double k_y = (double)in + 1.0, k_dx = (double)out, k_rows = (double)bs + 1.0;
  double tol_y = hx_tol_gemm(h, k_y), tol_dx = hx_tol_gemm(h, k_dx);
  double tol_dw = hx_tol_gemm(h, k_rows), tol_db = hx_tol_sum(k_rows);
  d.y->tol_cpu = hx_tol_vs_cpu(tol_y, k_y);
  d.y->scale_cpu = sqrt((double)in) / 3.0;
  HX_RUN(h, call_dense_forward, &d, d.x, d.w, d.b, d.y);
  d.xd = hx_to_double(h, d.x->init, nx);
  d.wd = hx_to_double(h, d.w->init, nw);
  d.bd = hx_to_double(h, d.b->init, (size_t)out);
  double *want = hx_doubles(h, ny);
  for (int64_t i = 0; i < bs; i++)
    for (int64_t o = 0; o < out; o++) want[i * out + o] = dense_y(&d, i, o);
  hx_close_scale(h, "y", d.y->got, want, ny, tol_y, sqrt((double)in) / 3.0);

  d.r = hx_in(h, ny, -1.0f, 1.0f, "dy");
  d.dx = hx_out(h, nx, "dx");
  d.dw = hx_inout(h, nw, -3.0f, 3.0f, "dW");
  d.db = hx_inout(h, (size_t)out, -3.0f, 3.0f, "db");
  d.dx->tol_cpu = hx_tol_vs_cpu(tol_dx, k_dx);
  d.dw->tol_cpu = hx_tol_vs_cpu(tol_dw, k_rows);
  d.db->tol_cpu = hx_tol_vs_cpu(tol_db, k_rows);
  d.dx->scale_cpu = sqrt((double)out) / 3.0;
  HX_RUN(h, call_dense_backward, &d, d.x, d.w, d.r, d.dx, d.dw, d.db);
  d.rd = hx_to_double(h, d.r->init, ny);
  /* Each held to the rms of its sums (of products of values in [-1, 1), rms 1/3 each; of dy
   * alone, rms 1/sqrt(3)), which a few entries may cancel far below. The loss is bilinear: its
   * central differences are exact but for the float64 loss's rounding, and the gradient's own
   * bound decides where it is the larger. */
  hx_fd_scale(h, "dW (+=)", dense_loss, &d, (double *)d.wd, nw, d.dw->got, d.dw->init, 1e-3,
              fmax(HX_TOL_GRAD, tol_dw), sqrt((double)bs) / 3.0);
  hx_fd_scale(h, "db (+=)", dense_loss, &d, (double *)d.bd, (size_t)out, d.db->got, d.db->init,
              1e-3, fmax(HX_TOL_GRAD, tol_db), sqrt((double)bs / 3.0));
  hx_fd_scale(h, "dx", dense_loss, &d, (double *)d.xd, nx, d.dx->got, NULL, 1e-3,
              fmax(HX_TOL_GRAD, tol_dx), d.dx->scale_cpu);
}

void opcase_gemm(hx *h) {
  static const int64_t shapes[][3] = {
      /* tiny: at most 4096 multiply-adds (the CPU's portable loop) */
      {1, 1, 1},
      {3, 5, 7},
      {4, 9, 2},
      {2, 1, 13},
      {16, 16, 16},
      /* past the small-shape cut-off; the last two run k over more than one cache block */
      {16, 16, 17},
      {67, 45, 129},
      {1, 70, 90},
      {50, 1, 100},
      {5, 7, 300},
      {3, 2, 600},
      /* odd sizes past the libraries' register blocks */
      {37, 129, 65},
      {131, 33, 17},
  };
  static const float ab[][2] = {
      {1.0f, 0.0f}, {-0.75f, 0.0f}, {1.25f, 0.5f}, {0.5f, 1.0f}, {1.0f, -2.0f}};
  static const int64_t pads[] = {0, 3, 1};
  const int nab = (int)(sizeof ab / sizeof ab[0]);
  int pi = 0;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int a = 0; a < nab; a++, hx_release(h))
          gemm_trial(h, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], ab[a][0], ab[a][1],
                     pads[pi++ % 3]);
  /* k == 0: c = beta c, and beta == 0 still clears the NaN; m or n == 0: nothing written. */
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      gemm_trial(h, ta, tb, 3, 4, 0, 1.0f, 0.0f, 2), hx_release(h);
      gemm_trial(h, ta, tb, 3, 4, 0, 1.0f, 0.5f, 2), hx_release(h);
      gemm_trial(h, ta, tb, 0, 5, 3, 1.0f, 0.5f, 1), hx_release(h);
      gemm_trial(h, ta, tb, 4, 0, 3, 1.0f, 0.0f, 1), hx_release(h);
    }
  for (int r = 0; r < hx_rounds(h, 24); r++, hx_release(h)) {
    int64_t m = hx_int(h, 1, 48), n = hx_int(h, 1, 48), k = hx_int(h, 1, 48);
    const float *p = ab[hx_int(h, 0, nab - 1)];
    int ta = (int)hx_int(h, 0, 1), tb = (int)hx_int(h, 0, 1);
    gemm_trial(h, ta, tb, m, n, k, p[0], p[1], hx_int(h, 0, 5));
  }
  if (h->large) {
    static const int64_t big[][3] = {{33, 64, 100}, {128, 256, 64}, {3, 517, 300}};
    for (size_t s = 0; s < sizeof big / sizeof big[0]; s++)
      for (int t = 0; t < 4; t++) {
        gemm_trial(h, t & 1, t >> 1, big[s][0], big[s][1], big[s][2], 1.0f, 0.0f, 3);
        hx_release(h);
        gemm_trial(h, t & 1, t >> 1, big[s][0], big[s][1], big[s][2], 0.75f, 1.0f, 1);
        hx_release(h);
      }
    gemm_trial(h, 0, 0, 256, 512, 1024, 1.0f, 0.0f, 0); /* repeatable at a size that splits k */
    hx_release(h);
  }
  for (int wt = 0; wt < 2; wt++) {
    dense_trial(h, 5, 7, 3, wt), hx_release(h);    /* every GEMM tiny */
    dense_trial(h, 17, 33, 21, wt), hx_release(h); /* every GEMM past the cut-off */
    dense_trial(h, 1, 1, 1, wt), hx_release(h);
  }
  for (int r = 0; r < hx_rounds(h, 4); r++, hx_release(h))
    dense_trial(h, hx_int(h, 1, 24), hx_int(h, 1, 40), hx_int(h, 1, 30), r & 1);
}

/* ------------------------------------------------------------------------------------------ */
/* fill, copy                                                                                 */

typedef struct vec_args {
  hx_buf *x, *y, *z; /* inputs and outputs as each op uses them */
  size_t n;
  float s; /* a value, a scale */
} vec_args;

static pmap_status call_fill(const pmap_ops *o, op_queue *q, void *arg) {
  vec_args *v = arg;
  return o->fill(q, HX_F(v->y), v->s, v->n);
}

static pmap_status call_copy(const pmap_ops *o, op_queue *q, void *arg) {
  vec_args *v = arg;
  return o->copy(q, HX_F(v->x), HX_F(v->y), v->n);
}

void opcase_fill(hx *h) {
  for (int i = 0; i < hx_vec_trials(h); i++) {
    float values[] = {0.0f, -2.5f, 3.0e7f, hx_uniform(h, -9.0f, 9.0f)};
    for (int v = 0; v < 4; v++, hx_release(h)) {
      vec_args a = {.n = hx_vec_size(h, i), .s = values[v]};
      hx_trial(h, "n=%zu value=%g", a.n, (double)a.s);
      /* Three elements past n must keep their NaN. */
      a.y = hx_new(h, HX_INOUT, a.n + 3, "x");
      float *want = hx_floats(h, a.n + 3);
      for (size_t k = 0; k < a.n + 3; k++) a.y->init[k] = NAN, want[k] = k < a.n ? a.s : NAN;
      a.y->tol_cpu = 0.0;
      HX_RUN(h, call_fill, &a, a.y);
      hx_same(h, "x", a.y->got, want, a.n + 3);
    }
  }
}

void opcase_copy(hx *h) {
  for (int i = 0; i < hx_vec_trials(h); i++, hx_release(h)) {
    vec_args a = {.n = hx_vec_size(h, i)};
    hx_trial(h, "n=%zu", a.n);
    a.x = hx_in(h, a.n, -5.0f, 5.0f, "x");
    a.y = hx_new(h, HX_INOUT, a.n + 3, "y");
    float *want = hx_floats(h, a.n + 3);
    for (size_t k = 0; k < a.n + 3; k++) a.y->init[k] = NAN, want[k] = k < a.n ? a.x->init[k] : NAN;
    a.y->tol_cpu = 0.0;
    HX_RUN(h, call_copy, &a, a.x, a.y);
    hx_same(h, "y", a.y->got, want, a.n + 3);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* bias                                                                                       */

typedef struct bias_args {
  int64_t outer, ch, inner;
  hx_buf *y, *b, *dy, *db;
  const double *bd, *rd;
} bias_args;

static pmap_status call_bias_forward(const pmap_ops *o, op_queue *q, void *arg) {
  bias_args *a = arg;
  return o->bias_forward(q, HX_F(a->y), HX_F(a->b), a->outer, a->ch, a->inner);
}

static pmap_status call_bias_backward(const pmap_ops *o, op_queue *q, void *arg) {
  bias_args *a = arg;
  return o->bias_backward(q, HX_F(a->dy), HX_F(a->db), a->outer, a->ch, a->inner);
}

/* sum r (y + b broadcast) over channel `moved` (the other channels and y do not move). */
static double bias_loss(const void *ctx, size_t moved) {
  const bias_args *a = ctx;
  double sum = 0.0;
  for (int64_t o = 0; o < a->outer; o++)
    for (int64_t i = 0; i < a->inner; i++)
      sum += a->rd[(o * a->ch + (int64_t)moved) * a->inner + i] * a->bd[moved];
  return sum;
}

/* (outer, ch, inner): dense (inner 1, few and many channels: the GPU's two backward paths),
 * conv, single elements, none. */
static void bias_shape(hx *h, int i, int64_t s[3]) {
  static const int64_t fixed[][3] = {{5, 7, 1}, {5, 7, 13},   {1, 1, 1},    {3, 4, 49},
                                     {0, 3, 5}, {64, 300, 1}, {2, 16, 1024}};
  const int nfixed = h->large ? 7 : 5;
  if (i < nfixed) {
    memcpy(s, fixed[i], sizeof fixed[i]);
    return;
  }
  s[0] = hx_int(h, 1, 9), s[1] = hx_int(h, 1, 9);
  s[2] = hx_int(h, 0, 1) ? 1 : hx_int(h, 2, 30);
}
#define BIAS_TRIALS(h) (((h)->large ? 7 : 5) + hx_rounds((h), 3))

void opcase_bias_forward(hx *h) {
  for (int t = 0; t < BIAS_TRIALS(h); t++, hx_release(h)) {
    int64_t s[3];
    bias_shape(h, t, s);
    hx_trial(h, "outer=%" PRId64 " ch=%" PRId64 " inner=%" PRId64, s[0], s[1], s[2]);
    size_t n = (size_t)(s[0] * s[1] * s[2]);
    bias_args a = {.outer = s[0], .ch = s[1], .inner = s[2]};
    a.y = hx_new(h, HX_INOUT, n, "y");
    hx_fill_away(h, a.y->init, n, 0.1f, 2.0f);
    a.b = hx_in_away(h, (size_t)s[1], 0.1f, 2.0f, "b");
    a.y->tol_cpu = 0.0; /* one rounded add on every backend */
    HX_RUN(h, call_bias_forward, &a, a.y, a.b);
    double *want = hx_doubles(h, n);
    for (size_t k = 0; k < n; k++)
      want[k] = (double)a.y->init[k] + a.b->init[k / (size_t)s[2] % (size_t)s[1]];
    hx_close(h, "y", a.y->got, want, n, HX_TOL_FWD);
  }
}

void opcase_bias_backward(hx *h) {
  for (int t = 0; t < BIAS_TRIALS(h); t++, hx_release(h)) {
    int64_t s[3];
    bias_shape(h, t, s);
    hx_trial(h, "outer=%" PRId64 " ch=%" PRId64 " inner=%" PRId64, s[0], s[1], s[2]);
    size_t n = (size_t)(s[0] * s[1] * s[2]), C = (size_t)s[1];
    bias_args a = {.outer = s[0], .ch = s[1], .inner = s[2]};
    a.dy = hx_in_away(h, n, 0.1f, 1.0f, "dy");
    a.db = hx_inout(h, C, -3.0f, 3.0f, "db");
    /* Float sums of outer * inner terms of random sign, added to db. */
    double k = (double)(s[0] * s[2]) + 1.0, tol = hx_tol_sum(k);
    a.db->tol_cpu = hx_tol_vs_cpu(tol, k);
    HX_RUN(h, call_bias_backward, &a, a.dy, a.db);
    double *sum = hx_doubles(h, C);
    for (size_t j = 0; j < n; j++) sum[j / (size_t)s[2] % C] += a.dy->init[j];
    /* Sums of outer * inner terms of rms 0.6 may cancel far below that scale. */
    double scale = 0.6 * sqrt((double)(s[0] * s[2]));
    hx_gain_scale(h, "db (+=)", a.db->got, a.db->init, sum, C, tol, scale);
    a.bd = hx_doubles(h, C);
    a.rd = hx_to_double(h, a.dy->init, n);
    for (size_t c = 0; c < C; c++) ((double *)a.bd)[c] = hx_uniform(h, 0.1f, 2.0f);
    hx_fd_scale(h, "db (+=)", bias_loss, &a, (double *)a.bd, C, a.db->got, a.db->init, 1e-3,
                fmax(HX_TOL_GRAD, tol), scale);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* relu                                                                                       */

typedef struct relu_args {
  hx_buf *x, *y, *dy, *dx;
  size_t n;
  const double *xd, *rd;
} relu_args;

static pmap_status call_relu_forward(const pmap_ops *o, op_queue *q, void *arg) {
  relu_args *a = arg;
  return o->relu_forward(q, HX_F(a->x), HX_F(a->y), a->n);
}

static pmap_status call_relu_backward(const pmap_ops *o, op_queue *q, void *arg) {
  relu_args *a = arg;
  return o->relu_backward(q, HX_F(a->y), HX_F(a->dy), HX_F(a->dx), a->n);
}

static double relu_term(const void *ctx, size_t i) {
  const relu_args *a = ctx;
  return a->rd[i] * (a->xd[i] > 0.0 ? a->xd[i] : 0.0);
}

void opcase_relu_forward(hx *h) {
  for (int t = 0; t < hx_vec_trials(h); t++, hx_release(h)) {
    size_t n = hx_vec_size(h, t);
    hx_trial(h, "n=%zu", n);
    relu_args a = {.n = n};
    /* |x| >= 0.05: off the kink; one NaN, which must pass through (as in JAX). */
    a.x = hx_in_away(h, n, 0.05f, 2.0f, "x");
    size_t at = n ? (size_t)hx_int(h, 0, (int64_t)n - 1) : 0;
    if (n > 1) a.x->init[at] = NAN;
    a.y = hx_out(h, n, "y");
    a.y->keep_nan = 1;
    a.y->tol_cpu = 0.0;
    HX_RUN(h, call_relu_forward, &a, a.x, a.y);
    float *want = hx_floats(h, n);
    for (size_t i = 0; i < n; i++) want[i] = a.x->init[i] > 0.0f ? a.x->init[i] : 0.0f;
    if (n > 1) want[at] = NAN;
    hx_same(h, "y", a.y->got, want, n);
    /* In place: y = x. */
    relu_args b = {.n = n};
    b.x = b.y = hx_new(h, HX_INOUT, n, "x (in place)");
    memcpy(b.x->init, a.x->init, n * sizeof(float));
    b.x->tol_cpu = 0.0;
    HX_RUN(h, call_relu_forward, &b, b.x);
    hx_same(h, "in place", b.x->got, want, n);
  }
}

void opcase_relu_backward(hx *h) {
  for (int t = 0; t < hx_vec_trials(h); t++, hx_release(h)) {
    size_t n = hx_vec_size(h, t);
    hx_trial(h, "n=%zu", n);
    relu_args a = {.n = n};
    float *x = hx_floats(h, n);
    hx_fill_away(h, x, n, 0.05f, 2.0f);
    a.y = hx_new(h, HX_IN, n, "y");
    for (size_t i = 0; i < n; i++) a.y->init[i] = x[i] > 0.0f ? x[i] : 0.0f;
    size_t at = n ? (size_t)hx_int(h, 0, (int64_t)n - 1) : 0;
    if (n > 1) a.y->init[at] = NAN; /* a NaN output passes NaN back */
    a.dy = hx_in(h, n, -1.0f, 1.0f, "dy");
    a.dx = hx_out(h, n, "dx");
    a.dx->keep_nan = 1;
    a.dx->tol_cpu = 0.0;
    HX_RUN(h, call_relu_backward, &a, a.y, a.dy, a.dx);
    HX_CHECK(h, n < 2 || isnan(a.dx->got[at]), "dx at %zu: %g where y is NaN", at,
             n < 2 ? 0.0 : (double)a.dx->got[at]);
    if (n > 1) a.dx->got[at] = 0.0f, x[at] = 1.0f; /* the rest against finite differences */
    a.xd = hx_to_double(h, x, n);
    a.rd = hx_to_double(h, a.dy->init, n);
    if (n > 1) ((double *)a.rd)[at] = 0.0;
    hx_fd(h, "dx", relu_term, &a, (double *)a.xd, n, a.dx->got, NULL, 1e-4, HX_TOL_GRAD);
    /* In place: dx = dy. */
    relu_args b = {.n = n, .y = a.y};
    b.dy = b.dx = hx_new(h, HX_INOUT, n, "dy (in place)");
    memcpy(b.dy->init, a.dy->init, n * sizeof(float));
    b.dy->tol_cpu = 0.0;
    HX_RUN(h, call_relu_backward, &b, b.y, b.dy);
    if (n > 1) b.dy->got[at] = 0.0f;
    hx_same(h, "in place", b.dy->got, a.dx->got, n);
  }
}
