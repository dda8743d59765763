/* case_conv.c: the op harness's cases for the ops over NCHW images: 2-D convolution (strides,
 * padding, 1x1 and windows wider than the image with padding, large channel counts, with and
 * without the bias and the ReLU, NaN through the ReLU, scratch that starts as NaN, dx NULL) and
 * pooling (max and mean; overlapping, tiling, identity and global windows). */
#include "harness.h"
#include "ops/op_math.h"

/* ------------------------------------------------------------------------------------------ */
/* conv2d                                                                                     */

typedef struct conv_args {
  pmap_conv_shape s;
  int64_t bd;
  int relu; /* forward: apply the ReLU; backward: y is its output */
  hx_buf *x, *w, *b, *y, *col, *dy, *dx, *dw, *db, *dcol; /* b, db: NULL for none */
  const double *xd, *wd, *rd;                             /* the float64 loss's arrays */
  double *yd;                                             /* its scratch */
} conv_args;

static pmap_status call_conv_forward(const pmap_ops *o, op_queue *q, void *arg) {
  conv_args *a = arg;
  return o->conv2d_forward(q, &a->s, a->bd, HX_F(a->x), HX_F(a->w), a->b ? HX_F(a->b) : NULL,
                           a->relu, HX_F(a->y), HX_F(a->col));
}

static pmap_status call_conv_backward(const pmap_ops *o, op_queue *q, void *arg) {
  conv_args *a = arg;
  return o->conv2d_backward(q, &a->s, a->bd, HX_F(a->x), HX_F(a->w), a->relu ? HX_F(a->y) : NULL,
                            HX_F(a->dy), a->dx ? HX_F(a->dx) : NULL, HX_F(a->dw),
                            a->db ? HX_F(a->db) : NULL, HX_F(a->col), HX_F(a->dcol));
}

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

/* sum of rd y over the convolution's outputs (rd: the gradient through the ReLU). */
static double conv_loss(const void *ctx, size_t moved) {
  const conv_args *a = ctx;
  (void)moved;
  ref_conv(&a->s, a->bd, a->xd, a->wd, a->yd);
  size_t n = (size_t)(a->bd * a->s.oc * a->s.oh * a->s.ow);
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += a->rd[i] * a->yd[i];
  return sum;
}

/* bd, c, h, w, oc, kh, kw, stride, pad: odd sizes, strides 1-3 with and without padding, 1x1
 * (at strides 1 and 2), windows wider than the image, large channel counts (past the blocks of
 * 8 and 16 channels that oneDNN's layouts use, and not multiples of them). */
static const int conv_fixed[][9] = {
    {2, 3, 7, 9, 4, 3, 3, 1, 1},   {3, 2, 9, 7, 5, 3, 3, 2, 1},   {2, 4, 6, 5, 3, 1, 1, 1, 0},
    {1, 3, 11, 8, 2, 5, 3, 2, 2},  {2, 1, 5, 5, 1, 3, 3, 1, 0},   {2, 2, 8, 10, 3, 5, 3, 1, 2},
    {1, 3, 7, 7, 2, 1, 1, 2, 0},   {2, 2, 5, 6, 3, 3, 3, 2, 0},   {1, 2, 4, 4, 2, 5, 5, 1, 2},
    {2, 6, 10, 10, 8, 3, 3, 1, 1}, {1, 1, 1, 1, 1, 1, 1, 1, 0},   {2, 3, 9, 9, 4, 3, 5, 2, 2},
    {2, 16, 8, 8, 32, 3, 3, 2, 1}, {2, 33, 7, 9, 40, 3, 3, 2, 1}, {1, 64, 5, 5, 96, 1, 1, 1, 0},
    {3, 17, 6, 7, 20, 1, 1, 2, 0}, {2, 24, 6, 6, 19, 3, 3, 1, 0}, {1, 3, 12, 12, 16, 3, 3, 1, 1},
    {0, 2, 5, 5, 3, 3, 3, 1, 1}, /* no examples */
};
/* A GPU's larger images, with 5 examples and with 1 (one GEMM over the batch, or direct). */
static const int conv_large[][9] = {
    {5, 3, 9, 7, 4, 3, 3, 1, 1}, {1, 3, 9, 7, 4, 3, 3, 1, 1},   {5, 2, 8, 8, 5, 3, 2, 2, 0},
    {1, 2, 8, 8, 5, 3, 2, 2, 0}, {5, 1, 32, 32, 1, 3, 3, 1, 1}, {1, 1, 32, 32, 1, 3, 3, 1, 1},
    {5, 4, 6, 5, 3, 1, 1, 1, 0}, {1, 4, 6, 5, 3, 1, 1, 1, 0},   {5, 2, 7, 9, 3, 5, 3, 3, 2},
    {1, 2, 7, 9, 3, 5, 3, 3, 2},
};
#define NFIXED (int)(sizeof conv_fixed / sizeof conv_fixed[0])
#define NLARGE (int)(sizeof conv_large / sizeof conv_large[0])

/* Trial t's geometry: the fixed ones, a GPU's larger ones, then random ones; odd trials with
 * the bias and the ReLU, even ones without. */
static int conv_geometry(hx *h, int t, conv_args *a) {
  int g[9];
  if (t < NFIXED) {
    memcpy(g, conv_fixed[t], sizeof g);
  } else if (h->large && t < NFIXED + NLARGE) {
    memcpy(g, conv_large[t - NFIXED], sizeof g);
  } else {
    if (t >= NFIXED + (h->large ? NLARGE : 0) + hx_rounds(h, 6)) return 0;
    int kh = (int)hx_int(h, 1, 5), kw = (int)hx_int(h, 1, 5);
    int stride = (int)hx_int(h, 1, 3), pad = (int)hx_int(h, 0, 2);
    int64_t hh = hx_int(h, kh > 2 * pad ? kh - 2 * pad : 1, 12);
    int64_t ww = hx_int(h, kw > 2 * pad ? kw - 2 * pad : 1, 12);
    int rnd[9] = {(int)hx_int(h, 1, 3),
                  (int)hx_int(h, 1, 20),
                  (int)hh,
                  (int)ww,
                  (int)hx_int(h, 1, 20),
                  kh,
                  kw,
                  stride,
                  pad};
    memcpy(g, rnd, sizeof g);
  }
  pmap_conv_shape s = {.c = g[1],
                       .h = g[2],
                       .w = g[3],
                       .oc = g[4],
                       .oh = (g[2] + 2 * g[8] - g[5]) / g[7] + 1,
                       .ow = (g[3] + 2 * g[8] - g[6]) / g[7] + 1,
                       .kh = g[5],
                       .kw = g[6],
                       .stride = g[7],
                       .pad = g[8]};
  a->s = s;
  a->bd = g[0];
  a->relu = t % 2;
  hx_trial(h,
           "bd=%" PRId64 " c=%" PRId64 " %" PRId64 "x%" PRId64 " oc=%" PRId64
           " k=%dx%d stride=%d pad=%d%s",
           a->bd, s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride, s.pad, a->relu ? " bias relu" : "");
  return 1;
}

static size_t conv_sizes(const conv_args *a, size_t *nx, size_t *nw, size_t *ny) {
  const pmap_conv_shape *s = &a->s;
  *nx = (size_t)(a->bd * s->c * s->h * s->w);
  *nw = (size_t)(s->oc * s->c * s->kh * s->kw);
  *ny = (size_t)(a->bd * s->oc * s->oh * s->ow);
  return (size_t)(s->c * s->kh * s->kw * s->oh * s->ow); /* the scratch */
}

/* want (ny) = relu(conv + b) in float64, pmap_relu's way (NaN passes). */
static void ref_forward(hx *h, const conv_args *a, size_t nx, size_t nw, double *want) {
  const pmap_conv_shape *s = &a->s;
  ref_conv(s, a->bd, hx_to_double(h, a->x->init, nx), hx_to_double(h, a->w->init, nw), want);
  int64_t ohw = s->oh * s->ow;
  for (int64_t i = 0; a->b && i < a->bd * s->oc * ohw; i++) {
    want[i] += a->b->init[(i / ohw) % s->oc];
    if (a->relu) want[i] = want[i] < 0.0 ? 0.0 : want[i];
  }
}

void opcase_conv2d_forward(hx *h) {
  conv_args a;
  for (int t = 0; conv_geometry(h, t, &a); t++, hx_release(h)) {
    size_t nx, nw, ny, ncol = conv_sizes(&a, &nx, &nw, &ny);
    a.x = hx_in(h, nx, -1.0f, 1.0f, "x");
    a.w = hx_in(h, nw, -1.0f, 1.0f, "w");
    a.b = a.relu ? hx_in(h, (size_t)a.s.oc, -1.0f, 1.0f, "b") : NULL;
    a.y = hx_out(h, ny, "y");
    a.col = hx_scratch(h, ncol, "col");
    /* See case_dense.c's gemm: sums of c kh kw products (fewer at the edges) and the bias. */
    double scale = sqrt((double)(a.s.c * a.s.kh * a.s.kw)) / 3.0;
    double k = (double)(a.s.c * a.s.kh * a.s.kw) + 1.0, tol = hx_tol_gemm(h, k);
    a.y->tol_cpu = hx_tol_vs_cpu(tol, k);
    a.y->scale_cpu = scale;
    if (a.b)
      HX_RUN(h, call_conv_forward, &a, a.x, a.w, a.b, a.y, a.col);
    else
      HX_RUN(h, call_conv_forward, &a, a.x, a.w, a.y, a.col);
    double *want = hx_doubles(h, ny);
    ref_forward(h, &a, nx, nw, want);
    hx_close_scale(h, "y", a.y->got, want, ny, tol, scale);
    if (!a.relu || !nx) continue;
    /* A NaN and an infinity in x: NaN in every output that reads it, through the ReLU too (a
     * ReLU that maps NaN to 0 would hide it from the numeric guard). */
    conv_args n = a;
    n.x = hx_new(h, HX_IN, nx, "x (NaN, inf)");
    memcpy(n.x->init, a.x->init, nx * sizeof(float));
    n.x->init[nx / 2] = NAN;
    n.x->init[nx / 3] = INFINITY;
    n.y = hx_out(h, ny, "y (NaN, inf)");
    n.y->keep_nan = 1;
    n.y->tol_cpu = a.y->tol_cpu;
    n.y->scale_cpu = scale;
    HX_RUN(h, call_conv_forward, &n, n.x, n.w, n.b, n.y, n.col);
    ref_forward(h, &n, nx, nw, want);
    hx_close_scale(h, "y (NaN, inf)", n.y->got, want, ny, tol, scale);
  }
}

void opcase_conv2d_backward(hx *h) {
  conv_args a;
  for (int t = 0; conv_geometry(h, t, &a); t++, hx_release(h)) {
    size_t nx, nw, ny, ncol = conv_sizes(&a, &nx, &nw, &ny);
    a.x = hx_in(h, nx, -1.0f, 1.0f, "x");
    a.w = hx_in(h, nw, -1.0f, 1.0f, "w");
    a.dy = hx_in(h, ny, -1.0f, 1.0f, "dy");
    a.dx = hx_out(h, nx, "dx");
    a.dw = hx_inout(h, nw, -3.0f, 3.0f, "dw");
    a.col = hx_scratch(h, ncol, "col");
    a.dcol = hx_scratch(h, ncol, "dcol");
    /* Reductions: dx over oc kh kw products (fewer at the edges), dw and db over the examples'
     * pixels, bd oh ow, each added to what it held. */
    double k_dx = (double)(a.s.oc * a.s.kh * a.s.kw), k_dw = (double)(a.bd * a.s.oh * a.s.ow) + 1.0;
    double tol_dx = hx_tol_gemm(h, k_dx), tol_dw = hx_tol_gemm(h, k_dw), tol_db = hx_tol_sum(k_dw);
    a.dx->tol_cpu = hx_tol_vs_cpu(tol_dx, k_dx);
    a.dw->tol_cpu = hx_tol_vs_cpu(tol_dw, k_dw);
    a.dx->scale_cpu = sqrt((double)(a.s.oc * a.s.kh * a.s.kw)) / 3.0;
    /* With the ReLU: its output y, 0 at about a third of the outputs (the gradient stops
     * there), and the bias gradient. */
    a.y = a.db = NULL;
    double *g = hx_doubles(h, ny); /* the gradient through the ReLU */
    for (size_t i = 0; i < ny; i++) g[i] = a.dy->init[i];
    if (a.relu) {
      a.y = hx_new(h, HX_IN, ny, "y");
      for (size_t i = 0; i < ny; i++) {
        float v = hx_uniform(h, -0.5f, 1.0f);
        a.y->init[i] = v < 0.0f ? 0.0f : v;
        if (a.y->init[i] <= 0.0f) g[i] = 0.0;
      }
      a.db = hx_inout(h, (size_t)a.s.oc, -3.0f, 3.0f, "db");
      a.db->tol_cpu = hx_tol_vs_cpu(tol_db, k_dw);
      HX_RUN(h, call_conv_backward, &a, a.x, a.w, a.y, a.dy, a.dx, a.dw, a.db, a.col, a.dcol);
    } else {
      HX_RUN(h, call_conv_backward, &a, a.x, a.w, a.dy, a.dx, a.dw, a.col, a.dcol);
    }
    a.xd = hx_to_double(h, a.x->init, nx);
    a.wd = hx_to_double(h, a.w->init, nw);
    a.rd = g;
    a.yd = hx_doubles(h, ny);
    /* Held to the rms of their sums (see case_dense.c's gemm), which may cancel far below. The
     * loss is bilinear (as case_dense.c's): the gradient's own bound decides where larger. */
    double dw_scale = sqrt((double)(a.bd * a.s.oh * a.s.ow)) / 3.0;
    hx_fd_scale(h, "dw (+=)", conv_loss, &a, (double *)a.wd, nw, a.dw->got, a.dw->init, 1e-3,
                fmax(HX_TOL_GRAD, tol_dw), dw_scale);
    hx_fd_scale(h, "dx", conv_loss, &a, (double *)a.xd, nx, a.dx->got, NULL, 1e-3,
                fmax(HX_TOL_GRAD, tol_dx), a.dx->scale_cpu);
    if (a.db) { /* the float64 sums of the gradient through the ReLU */
      double *want = hx_doubles(h, (size_t)a.s.oc);
      int64_t ohw = a.s.oh * a.s.ow;
      for (size_t i = 0; i < ny; i++) want[(i / (size_t)ohw) % (size_t)a.s.oc] += g[i];
      hx_gain_scale(h, "db (+=)", a.db->got, a.db->init, want, (size_t)a.s.oc, tol_db, dw_scale);
    }
    /* dx NULL (a first layer): dw alone, still accumulated, by the same amount. */
    double *gain = hx_doubles(h, nw);
    for (size_t i = 0; i < nw; i++) gain[i] = (double)a.dw->got[i] - a.dw->init[i];
    conv_args b = a;
    b.dx = NULL;
    b.dw = hx_inout(h, nw, -3.0f, 3.0f, "dw (dx NULL)");
    b.dw->tol_cpu = a.dw->tol_cpu;
    if (b.relu) {
      b.db = hx_inout(h, (size_t)b.s.oc, -3.0f, 3.0f, "db (dx NULL)");
      b.db->tol_cpu = a.db->tol_cpu;
      HX_RUN(h, call_conv_backward, &b, b.x, b.w, b.y, b.dy, b.dw, b.db, b.col, b.dcol);
    } else {
      HX_RUN(h, call_conv_backward, &b, b.x, b.w, b.dy, b.dw, b.col, b.dcol);
    }
    /* Another path of the backend: each within tol_dw of float64, so within twice that of each
     * other; gain carries a.dw's rounding onto its base too. */
    hx_gain_scale(h, "dw (+=) with dx NULL", b.dw->got, b.dw->init, gain, nw, 2.0 * tol_dw,
                  fmax(dw_scale, hx_base_scale(a.dw->init, nw, 2.0 * tol_dw)));
  }
}

/* ------------------------------------------------------------------------------------------ */
/* pool2d                                                                                     */

typedef struct pool_args {
  int is_max;
  pmap_pool_shape s;
  int64_t bd;
  hx_buf *x, *y, *dy, *dx;
  const double *xd, *rd;
} pool_args;

static pmap_status call_pool_forward(const pmap_ops *o, op_queue *q, void *arg) {
  pool_args *a = arg;
  return o->pool2d_forward(q, a->is_max, &a->s, a->bd, HX_F(a->x), HX_F(a->y));
}

static pmap_status call_pool_backward(const pmap_ops *o, op_queue *q, void *arg) {
  pool_args *a = arg;
  return o->pool2d_backward(q, a->is_max, &a->s, a->bd, HX_F(a->x), HX_F(a->dy), HX_F(a->dx));
}

/* The output (oy, ox) of plane p. */
static double ref_window(const pool_args *a, const double *x, int64_t p, int64_t oy, int64_t ox) {
  const pmap_pool_shape *s = &a->s;
  double best = -INFINITY, sum = 0.0;
  for (int i = 0; i < s->kh; i++)
    for (int j = 0; j < s->kw; j++) {
      double v = x[(p * s->h + oy * s->stride + i) * s->w + ox * s->stride + j];
      best = v > best ? v : best;
      sum += v;
    }
  return a->is_max ? best : sum / (s->kh * s->kw);
}

/* sum r y over the plane holding element `moved` of x. */
static double pool_loss(const void *ctx, size_t moved) {
  const pool_args *a = ctx;
  int64_t p = (int64_t)moved / (a->s.h * a->s.w);
  double sum = 0.0;
  for (int64_t oy = 0; oy < a->s.oh; oy++)
    for (int64_t ox = 0; ox < a->s.ow; ox++)
      sum += a->rd[(p * a->s.oh + oy) * a->s.ow + ox] * ref_window(a, a->xd, p, oy, ox);
  return sum;
}

/* bd, c, h, w, kernel, stride: overlapping windows with a ragged edge, tiling, identity,
 * global, none; a GPU's larger ones. */
static const int pool_fixed[][6] = {{2, 3, 7, 9, 3, 2},
                                    {3, 2, 8, 6, 2, 2},
                                    {1, 1, 5, 5, 1, 1},
                                    {2, 5, 5, 5, 5, 1},
                                    {0, 2, 4, 4, 2, 2}};
static const int pool_large[][6] = {
    {5, 3, 17, 15, 3, 2}, {5, 16, 32, 32, 2, 2}, {5, 8, 7, 7, 7, 1}};

static int pool_geometry(hx *h, int t, pool_args *a) {
  const int nf = (int)(sizeof pool_fixed / sizeof pool_fixed[0]);
  const int nl = h->large ? (int)(sizeof pool_large / sizeof pool_large[0]) : 0;
  int g[6];
  if (t < nf) {
    memcpy(g, pool_fixed[t], sizeof g);
  } else if (t < nf + nl) {
    memcpy(g, pool_large[t - nf], sizeof g);
  } else {
    if (t >= nf + nl + hx_rounds(h, 4)) return 0;
    int k = (int)hx_int(h, 1, 4);
    int rnd[6] = {(int)hx_int(h, 1, 3),
                  (int)hx_int(h, 1, 4),
                  (int)hx_int(h, k, k + 8),
                  (int)hx_int(h, k, k + 8),
                  k,
                  (int)hx_int(h, 1, 3)};
    memcpy(g, rnd, sizeof g);
  }
  pmap_pool_shape s = {g[1], g[2], g[3], (g[2] - g[4]) / g[5] + 1, (g[3] - g[4]) / g[5] + 1,
                       g[4], g[4], g[5]};
  a->s = s;
  a->bd = g[0];
  hx_trial(h, "%s bd=%" PRId64 " c=%" PRId64 " %" PRId64 "x%" PRId64 " k=%d stride=%d",
           a->is_max ? "max" : "mean", a->bd, s.c, s.h, s.w, s.kh, s.stride);
  return 1;
}

/* x (n): distinct values at least 1e-2 apart, shuffled: no ties, and finite differences never
 * move a maximum. */
static hx_buf *pool_input(hx *h, size_t n) {
  hx_buf *x = hx_new(h, HX_IN, n, "x");
  for (size_t i = 0; i < n; i++) x->init[i] = (float)((double)i * 1e-2 - (double)n * 5e-3);
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(hx_u64(h) % i);
    float t = x->init[i - 1];
    x->init[i - 1] = x->init[j], x->init[j] = t;
  }
  return x;
}

void opcase_pool2d_forward(hx *h) {
  for (int is_max = 0; is_max < 2; is_max++) {
    pool_args a = {.is_max = is_max};
    for (int t = 0; pool_geometry(h, t, &a); t++, hx_release(h)) {
      size_t nx = (size_t)(a.bd * a.s.c * a.s.h * a.s.w),
             ny = (size_t)(a.bd * a.s.c * a.s.oh * a.s.ow);
      a.x = pool_input(h, nx);
      a.y = hx_out(h, ny, "y");
      /* A mean: a float sum of kh kw terms and the division (a maximum is exact). */
      double k = (double)(a.s.kh * a.s.kw) + 1.0, tol = is_max ? HX_TOL_FWD : hx_tol_sum(k);
      a.y->tol_cpu = is_max ? 0.0 : hx_tol_vs_cpu(tol, k);
      HX_RUN(h, call_pool_forward, &a, a.x, a.y);
      double *want = hx_doubles(h, ny), *xd = hx_to_double(h, a.x->init, nx);
      for (int64_t p = 0; p < a.bd * a.s.c; p++)
        for (int64_t oy = 0; oy < a.s.oh; oy++)
          for (int64_t ox = 0; ox < a.s.ow; ox++)
            want[(p * a.s.oh + oy) * a.s.ow + ox] = ref_window(&a, xd, p, oy, ox);
      hx_close(h, "y", a.y->got, want, ny, tol);
    }
  }
}

void opcase_pool2d_backward(hx *h) {
  for (int is_max = 0; is_max < 2; is_max++) {
    pool_args a = {.is_max = is_max};
    for (int t = 0; pool_geometry(h, t, &a); t++, hx_release(h)) {
      size_t nx = (size_t)(a.bd * a.s.c * a.s.h * a.s.w),
             ny = (size_t)(a.bd * a.s.c * a.s.oh * a.s.ow);
      a.x = pool_input(h, nx);
      a.dy = hx_in(h, ny, -1.0f, 1.0f, "dy");
      a.dx = hx_out(h, nx, "dx");
      /* Mean: a float sum over the windows that hold an element (at most kh kw), each term
       * divided (a maximum's gradient is one term, exact). */
      double k_dx = 2.0 * a.s.kh * a.s.kw;
      a.dx->tol_cpu = is_max ? 0.0 : hx_tol_vs_cpu(hx_tol_sum(k_dx), k_dx);
      HX_RUN(h, call_pool_backward, &a, a.x, a.dy, a.dx);
      a.xd = hx_to_double(h, a.x->init, nx);
      a.rd = hx_to_double(h, a.dy->init, ny);
      hx_fd(h, "dx", pool_loss, &a, (double *)a.xd, nx, a.dx->got, NULL, 1e-3, HX_TOL_GRAD);
      /* Ties, a NaN and -0 gradients: every element bit for bit as op_math.h's pmap_pool_dx
       * defines it (the first maximum of a window; 0 + dy), whichever path a backend takes. */
      pool_args b = a;
      b.x = hx_new(h, HX_IN, nx, "x (ties, NaN)");
      for (size_t k = 0; k < nx; k++) b.x->init[k] = (float)hx_int(h, -2, 2);
      if (nx) b.x->init[nx / 2] = NAN;
      b.dy = hx_new(h, HX_IN, ny, "dy (-0)");
      for (size_t k = 0; k < ny; k++) b.dy->init[k] = k % 3 ? hx_uniform(h, -1.0f, 1.0f) : -0.0f;
      b.dx = hx_out(h, nx, "dx (ties)");
      b.dx->tol_cpu = a.dx->tol_cpu;
      HX_RUN(h, call_pool_backward, &b, b.x, b.dy, b.dx);
      float *want = hx_floats(h, nx);
      const pmap_pool_shape *s = &b.s;
      for (int64_t p = 0; p < b.bd * s->c; p++)
        for (int64_t iy = 0; iy < s->h; iy++)
          for (int64_t ix = 0; ix < s->w; ix++)
            want[(p * s->h + iy) * s->w + ix] =
                pmap_pool_dx(is_max, b.x->init + p * s->h * s->w, b.dy->init + p * s->oh * s->ow,
                             s->w, s->oh, s->ow, s->kh, s->kw, s->stride, iy, ix);
      if (is_max || h->oracle) hx_same(h, "dx (ties) = pmap_pool_dx", b.dx->got, want, nx);
    }
  }
}
