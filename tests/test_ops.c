/* test_ops.c: unit test of every op in pmap_cpu_ops: forward results against float64 references,
 * backward results against central finite differences of those references, and the write
 * contract (outputs and activation gradients overwritten, parameter gradients accumulated). */
#include "ops/ops.h"
#include "testutil.h"

#define OPS pmap_cpu_ops

/* Relative tolerances: fp32 forward against double, and fp32 gradients against finite
 * differences of the double reference. */
#define TOL_FWD 1e-5
#define TOL_GRAD 1e-4
/* Finite differences are taken at most at this many entries per array (sampled beyond it). */
#define FD_MAX_SAMPLES 160

static float *falloc(size_t n) {
  float *p = malloc((n ? n : 1) * sizeof *p);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

static double *dalloc(size_t n) {
  double *p = malloc((n ? n : 1) * sizeof *p);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

static int64_t rand_int(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(test_rand_u64(s) % (uint64_t)(hi - lo + 1));
}

static void fill_nan(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* Magnitudes in [lo, hi) with random signs: keeps values off zero (and off the relu kink). */
static void fill_away(float *x, size_t n, uint64_t *s, float lo, float hi) {
  for (size_t i = 0; i < n; i++) {
    float v = test_rand_uniform(s, lo, hi);
    x[i] = (test_rand_u64(s) & 1) ? v : -v;
  }
}

static void to_double(const float *x, double *d, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = x[i];
}

/* Fails when any entry is NaN, naming the first one. */
static int no_nan(const char *what, const float *x, size_t n) {
  test_checks++;
  for (size_t i = 0; i < n; i++)
    if (isnan(x[i])) {
      test_failures++;
      fprintf(stderr, "FAIL %s: NaN survived at %zu\n", what, i);
      return 0;
    }
  return 1;
}

/* expect[i] = before[i] + delta[i] in double: what an accumulating (+=) write must produce. */
static void expect_sum(const float *before, const float *delta, double *expect, size_t n) {
  for (size_t i = 0; i < n; i++) expect[i] = (double)before[i] + (double)delta[i];
}

/* A scalar function of double arrays that the caller reaches through ctx. */
typedef double (*scalar_fn)(const void *ctx);

/* Central differences (f(x + h e_i) - f(x - h e_i)) / 2h at every entry of x (or at
 * FD_MAX_SAMPLES random entries of a larger x), compared with the op's gradient `got`. */
static void fd_check(const char *what, scalar_fn f, const void *ctx, double *x, size_t n,
                     const float *got, double h, double tol, uint64_t *s) {
  size_t cnt = n <= FD_MAX_SAMPLES ? n : FD_MAX_SAMPLES;
  size_t *idx = malloc((cnt ? cnt : 1) * sizeof *idx);
  double *fd = dalloc(cnt);
  float *an = falloc(cnt);
  if (!idx) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  for (size_t j = 0; j < cnt; j++) {
    size_t i = n <= FD_MAX_SAMPLES ? j : (size_t)(test_rand_u64(s) % n);
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = f(ctx);
    x[i] = x0 - h;
    double lm = f(ctx);
    x[i] = x0;
    idx[j] = i;
    fd[j] = (lp - lm) / (2.0 * h);
    an[j] = got[i];
  }
  if (!test_close(what, an, fd, cnt, tol) && cnt < n) {
    /* test_close named a sample; name the array index it stands for. */
    size_t wj = 0;
    for (size_t j = 1; j < cnt; j++)
      if (fabs((double)an[j] - fd[j]) > fabs((double)an[wj] - fd[wj])) wj = j;
    fprintf(stderr, "  (sampled: sample %zu is index %zu of %zu)\n", wj, idx[wj], n);
  }
  free(idx);
  free(fd);
  free(an);
}

/* ------------------------------------------------------------------------------------------ */
/* gemm                                                                                       */

static double op_at(const float *a, int64_t ld, int trans, int64_t i, int64_t j) {
  return trans ? a[j * ld + i] : a[i * ld + j];
}

/* out (m, n) packed = alpha op(a) op(b) + beta c, where beta == 0 drops c entirely. */
static void ref_gemm(int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha, const float *a,
                     int64_t lda, const float *b, int64_t ldb, double beta, const float *c,
                     int64_t ldc, double *out) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; p++) sum += op_at(a, lda, ta, i, p) * op_at(b, ldb, tb, p, j);
      out[i * n + j] = alpha * sum + (beta != 0.0 ? beta * c[i * ldc + j] : 0.0);
    }
}

/* A stored matrix (rows, cols) with leading dimension cols + pad; the padding holds NaN so any
 * read of it shows up in the result. */
static float *padded_random(uint64_t *s, int64_t rows, int64_t cols, int64_t pad, int64_t *ld) {
  *ld = cols + pad;
  size_t total = (size_t)(rows * *ld);
  float *a = falloc(total);
  fill_nan(a, total);
  for (int64_t r = 0; r < rows; r++) test_fill(a + r * *ld, (size_t)cols, s, -1.0f, 1.0f);
  return a;
}

static void gemm_case(uint64_t *s, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                      float beta, int64_t pad) {
  char what[160];
  snprintf(what, sizeof what,
           "gemm ta=%d tb=%d m=%" PRId64 " n=%" PRId64 " k=%" PRId64
           " alpha=%g beta=%g pad=%" PRId64,
           ta, tb, m, n, k, (double)alpha, (double)beta, pad);
  int64_t lda, ldb, ldc = n + pad;
  float *a = padded_random(s, ta ? k : m, ta ? m : k, pad, &lda);
  float *b = padded_random(s, tb ? n : k, tb ? k : n, pad, &ldb);
  size_t csize = (size_t)(m * ldc);
  float *c = falloc(csize), *c0 = falloc(csize), *got = falloc((size_t)(m * n));
  double *want = dalloc((size_t)(m * n));
  /* The padding of c holds a sentinel that must survive; beta == 0 gets NaN where it must not
   * look. */
  for (size_t i = 0; i < csize; i++) c[i] = -777.0f;
  for (int64_t i = 0; i < m; i++) {
    if (beta == 0.0f)
      fill_nan(c + i * ldc, (size_t)n);
    else
      test_fill(c + i * ldc, (size_t)n, s, -1.0f, 1.0f);
  }
  memcpy(c0, c, csize * sizeof *c);
  ref_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c0, ldc, want);
  CHECK_OK(OPS.gemm(NULL, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
  for (int64_t i = 0; i < m; i++) memcpy(got + i * n, c + i * ldc, (size_t)n * sizeof *got);
  test_close(what, got, want, (size_t)(m * n), TOL_FWD);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = n; j < ldc; j++)
      CHECK(c[i * ldc + j] == -777.0f,
            "%s: padding of c at (%" PRId64 ", %" PRId64 ") overwritten with %g", what, i, j,
            (double)c[i * ldc + j]);
  free(a);
  free(b);
  free(c);
  free(c0);
  free(got);
  free(want);
}

static void test_gemm(void) {
  static const int64_t shapes[][3] = {
      /* tiny: at most 4096 multiply-adds */
      {1, 1, 1}, {3, 5, 7}, {4, 9, 2}, {2, 1, 13}, {16, 16, 16},
      /* the large-shape path; the last two run k over more than one cache block */
      {16, 16, 17}, {67, 45, 129}, {1, 70, 90}, {50, 1, 100}, {5, 7, 300}, {3, 2, 600},
  };

  static const float ab[][2] = {
      {1.0f, 0.0f}, {-0.75f, 0.0f}, {1.25f, 0.5f}, {0.5f, 1.0f}, {1.0f, -2.0f}};
  uint64_t s = 101;
  int pads[] = {0, 3, 1};
  int pi = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (size_t ai = 0; ai < sizeof ab / sizeof ab[0]; ai++)
          gemm_case(&s, ta, tb, shapes[si][0], shapes[si][1], shapes[si][2], ab[ai][0], ab[ai][1],
                    pads[pi++ % 3]);
  /* k == 0: c = beta c, and beta == 0 must still clear the NaN. */
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      gemm_case(&s, ta, tb, 3, 4, 0, 1.0f, 0.0f, 2);
      gemm_case(&s, ta, tb, 3, 4, 0, 1.0f, 0.5f, 2);
    }
  static const uint64_t seeds[] = {1, 2, 3, 4};
  for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
    uint64_t r = seeds[i];
    for (int rep = 0; rep < 6; rep++) {
      int64_t m = rand_int(&r, 1, 48), n = rand_int(&r, 1, 48), k = rand_int(&r, 1, 48);
      const float *p = ab[rand_int(&r, 0, 4)];
      gemm_case(&r, (int)rand_int(&r, 0, 1), (int)rand_int(&r, 0, 1), m, n, k, p[0], p[1],
                rand_int(&r, 0, 5));
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* fill                                                                                       */

static void test_fill_op(void) {
  const size_t cap = 40;
  const float values[] = {0.0f, -2.5f, 3.0e7f};
  float *x = falloc(cap), *want = falloc(cap);
  const size_t ns[] = {37, 1, 0};
  for (size_t vi = 0; vi < sizeof values / sizeof values[0]; vi++)
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      size_t n = ns[ni];
      fill_nan(x, cap);
      for (size_t i = 0; i < cap; i++) want[i] = i < n ? values[vi] : NAN;
      CHECK_OK(OPS.fill(NULL, x, values[vi], n));
      char what[64];
      snprintf(what, sizeof what, "fill value=%g n=%zu", (double)values[vi], n);
      test_same_bits(what, x, want, cap);
    }
  free(x);
  free(want);
}

/* ------------------------------------------------------------------------------------------ */
/* bias                                                                                       */

typedef struct {
  const double *b, *r;
  int64_t outer, ch, inner;
} bias_ctx;

/* L(b) = sum r * (y + b broadcast); the y term does not depend on b, so it is left out. */
static double bias_loss(const void *vctx) {
  const bias_ctx *c = vctx;
  double sum = 0.0;
  for (int64_t o = 0; o < c->outer; o++)
    for (int64_t ch = 0; ch < c->ch; ch++)
      for (int64_t i = 0; i < c->inner; i++)
        sum += c->r[(o * c->ch + ch) * c->inner + i] * c->b[ch];
  return sum;
}

static void bias_case(uint64_t *s, int64_t outer, int64_t ch, int64_t inner) {
  char what[128];
  size_t n = (size_t)(outer * ch * inner);
  float *y = falloc(n), *b = falloc((size_t)ch), *r = falloc(n);
  float *db = falloc((size_t)ch), *db2 = falloc((size_t)ch), *before = falloc((size_t)ch);
  double *want = dalloc(n), *bd = dalloc((size_t)ch), *rd = dalloc(n);
  fill_away(y, n, s, 0.1f, 2.0f);
  fill_away(b, (size_t)ch, s, 0.1f, 2.0f);
  fill_away(r, n, s, 0.1f, 1.0f);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t c = 0; c < ch; c++)
      for (int64_t i = 0; i < inner; i++) {
        size_t at = (size_t)((o * ch + c) * inner + i);
        want[at] = (double)y[at] + (double)b[c];
      }
  CHECK_OK(OPS.bias_forward(NULL, y, b, outer, ch, inner));
  snprintf(what, sizeof what, "bias_forward outer=%" PRId64 " ch=%" PRId64 " inner=%" PRId64,
           outer, ch, inner);
  test_close(what, y, want, n, TOL_FWD);

  memset(db, 0, (size_t)ch * sizeof *db);
  CHECK_OK(OPS.bias_backward(NULL, r, db, outer, ch, inner));
  to_double(b, bd, (size_t)ch);
  to_double(r, rd, n);
  bias_ctx ctx = {bd, rd, outer, ch, inner};
  snprintf(what, sizeof what, "bias_backward db vs finite differences inner=%" PRId64, inner);
  fd_check(what, bias_loss, &ctx, bd, (size_t)ch, db, 1e-3, TOL_GRAD, s);

  test_fill(before, (size_t)ch, s, -3.0f, 3.0f);
  memcpy(db2, before, (size_t)ch * sizeof *db2);
  CHECK_OK(OPS.bias_backward(NULL, r, db2, outer, ch, inner));
  expect_sum(before, db, want, (size_t)ch);
  snprintf(what, sizeof what, "bias_backward accumulates into db inner=%" PRId64, inner);
  test_close(what, db2, want, (size_t)ch, 1e-6);
  free(y);
  free(b);
  free(r);
  free(db);
  free(db2);
  free(before);
  free(want);
  free(bd);
  free(rd);
}

static void test_bias(void) {
  uint64_t s = 202;
  bias_case(&s, 5, 7, 1);
  bias_case(&s, 5, 7, 13);
  bias_case(&s, 1, 1, 1);
  bias_case(&s, 3, 4, 49);
  for (uint64_t seed = 11; seed < 14; seed++) {
    uint64_t r = seed;
    bias_case(&r, rand_int(&r, 1, 9), rand_int(&r, 1, 9),
              rand_int(&r, 1, 2) == 1 ? 1 : rand_int(&r, 2, 30));
  }
}

/* ------------------------------------------------------------------------------------------ */
/* relu                                                                                       */

typedef struct {
  const double *x, *r;
  size_t n;
} relu_ctx;

static double relu_loss(const void *vctx) {
  const relu_ctx *c = vctx;
  double sum = 0.0;
  for (size_t i = 0; i < c->n; i++) sum += c->r[i] * (c->x[i] > 0.0 ? c->x[i] : 0.0);
  return sum;
}

static void relu_case(uint64_t *s, size_t n) {
  char what[96];
  float *x = falloc(n), *y = falloc(n), *inplace = falloc(n), *r = falloc(n), *dx = falloc(n);
  double *want = dalloc(n), *xd = dalloc(n), *rd = dalloc(n);
  /* |x| >= 0.05 keeps every finite-difference step of h = 1e-4 on one side of the kink. */
  fill_away(x, n, s, 0.05f, 2.0f);
  fill_away(r, n, s, 0.1f, 1.0f);
  for (size_t i = 0; i < n; i++) want[i] = x[i] > 0.0f ? x[i] : 0.0;
  fill_nan(y, n);
  CHECK_OK(OPS.relu_forward(NULL, x, y, n));
  snprintf(what, sizeof what, "relu_forward n=%zu", n);
  test_close(what, y, want, n, 0.0);
  memcpy(inplace, x, n * sizeof *x);
  CHECK_OK(OPS.relu_forward(NULL, inplace, inplace, n));
  snprintf(what, sizeof what, "relu_forward in place n=%zu", n);
  test_same_bits(what, inplace, y, n);

  fill_nan(dx, n);
  CHECK_OK(OPS.relu_backward(NULL, y, r, dx, n));
  snprintf(what, sizeof what, "relu_backward overwrites dx n=%zu", n);
  no_nan(what, dx, n);
  to_double(x, xd, n);
  to_double(r, rd, n);
  relu_ctx ctx = {xd, rd, n};
  snprintf(what, sizeof what, "relu_backward dx vs finite differences n=%zu", n);
  fd_check(what, relu_loss, &ctx, xd, n, dx, 1e-4, TOL_GRAD, s);
  memcpy(inplace, r, n * sizeof *r);
  CHECK_OK(OPS.relu_backward(NULL, y, inplace, inplace, n));
  snprintf(what, sizeof what, "relu_backward in place n=%zu", n);
  test_same_bits(what, inplace, dx, n);
  free(x);
  free(y);
  free(inplace);
  free(r);
  free(dx);
  free(want);
  free(xd);
  free(rd);
}

static void test_relu(void) {
  uint64_t s = 303;
  relu_case(&s, 1);
  relu_case(&s, 7);
  relu_case(&s, 1000);
  for (uint64_t seed = 21; seed < 24; seed++) {
    uint64_t r = seed;
    relu_case(&r, (size_t)rand_int(&r, 1, 300));
  }
}

/* ------------------------------------------------------------------------------------------ */
/* dense layer: gemm + bias, y (B, out) = x (B, in) op(W) + b                                 */

typedef struct {
  const double *x, *w, *b, *r;
  int64_t bs, in, out;
  int wt; /* W stored (out, in) and used transposed, else stored (in, out) */
} dense_ctx;

static double dense_loss(const void *vctx) {
  const dense_ctx *c = vctx;
  double sum = 0.0;
  for (int64_t i = 0; i < c->bs; i++)
    for (int64_t o = 0; o < c->out; o++) {
      double y = c->b[o];
      for (int64_t p = 0; p < c->in; p++)
        y += c->x[i * c->in + p] * (c->wt ? c->w[o * c->in + p] : c->w[p * c->out + o]);
      sum += c->r[i * c->out + o] * y;
    }
  return sum;
}

/* dW (+=), db (+=) and dx (=) of the dense layer for dy = r. */
static void dense_backward(const dense_ctx *c, const float *x, const float *w, const float *r,
                           float *dx, float *dw, float *db) {
  int64_t bs = c->bs, in = c->in, out = c->out;
  if (c->wt) {
    /* dW (out, in) += dy^T (out, B) x (B, in); dx (B, in) = dy (B, out) W (out, in) */
    CHECK_OK(OPS.gemm(NULL, 1, 0, out, in, bs, 1.0f, r, out, x, in, 1.0f, dw, in));
    CHECK_OK(OPS.gemm(NULL, 0, 0, bs, in, out, 1.0f, r, out, w, in, 0.0f, dx, in));
  } else {
    /* dW (in, out) += x^T (in, B) dy (B, out); dx (B, in) = dy (B, out) W^T (out, in) */
    CHECK_OK(OPS.gemm(NULL, 1, 0, in, out, bs, 1.0f, x, in, r, out, 1.0f, dw, out));
    CHECK_OK(OPS.gemm(NULL, 0, 1, bs, in, out, 1.0f, r, out, w, out, 0.0f, dx, in));
  }
  CHECK_OK(OPS.bias_backward(NULL, r, db, bs, out, 1));
}

static void dense_case(uint64_t *s, int64_t bs, int64_t in, int64_t out, int wt) {
  char what[160];
  char shape[80];
  snprintf(shape, sizeof shape, "B=%" PRId64 " in=%" PRId64 " out=%" PRId64 " wt=%d", bs, in, out,
           wt);
  size_t nx = (size_t)(bs * in), nw = (size_t)(in * out), ny = (size_t)(bs * out),
         nb = (size_t)out;
  float *x = falloc(nx), *w = falloc(nw), *b = falloc(nb), *r = falloc(ny), *y = falloc(ny);
  float *dx = falloc(nx), *dw = falloc(nw), *db = falloc(nb);
  float *dx2 = falloc(nx), *dw2 = falloc(nw), *db2 = falloc(nb), *wb = falloc(nw),
        *bb = falloc(nb);
  double *xd = dalloc(nx), *wd = dalloc(nw), *bd = dalloc(nb), *rd = dalloc(ny),
         *want = dalloc(ny > nw ? ny : nw);
  test_fill(x, nx, s, -1.0f, 1.0f);
  test_fill(w, nw, s, -1.0f, 1.0f);
  fill_away(b, nb, s, 0.1f, 1.0f);
  test_fill(r, ny, s, -1.0f, 1.0f);
  to_double(x, xd, nx);
  to_double(w, wd, nw);
  to_double(b, bd, nb);
  to_double(r, rd, ny);
  dense_ctx ctx = {xd, wd, bd, rd, bs, in, out, wt};

  fill_nan(y, ny);
  if (wt)
    CHECK_OK(OPS.gemm(NULL, 0, 1, bs, out, in, 1.0f, x, in, w, in, 0.0f, y, out));
  else
    CHECK_OK(OPS.gemm(NULL, 0, 0, bs, out, in, 1.0f, x, in, w, out, 0.0f, y, out));
  CHECK_OK(OPS.bias_forward(NULL, y, b, bs, out, 1));
  for (int64_t i = 0; i < bs; i++)
    for (int64_t o = 0; o < out; o++) {
      double v = bd[o];
      for (int64_t p = 0; p < in; p++)
        v += xd[i * in + p] * (wt ? wd[o * in + p] : wd[p * out + o]);
      want[i * out + o] = v;
    }
  snprintf(what, sizeof what, "dense forward %s", shape);
  test_close(what, y, want, ny, TOL_FWD);

  fill_nan(dx, nx);
  memset(dw, 0, nw * sizeof *dw);
  memset(db, 0, nb * sizeof *db);
  dense_backward(&ctx, x, w, r, dx, dw, db);
  snprintf(what, sizeof what, "dense dW vs finite differences %s", shape);
  fd_check(what, dense_loss, &ctx, wd, nw, dw, 1e-3, TOL_GRAD, s);
  snprintf(what, sizeof what, "dense db vs finite differences %s", shape);
  fd_check(what, dense_loss, &ctx, bd, nb, db, 1e-3, TOL_GRAD, s);
  snprintf(what, sizeof what, "dense dx vs finite differences %s", shape);
  fd_check(what, dense_loss, &ctx, xd, nx, dx, 1e-3, TOL_GRAD, s);

  /* Again onto random dW/db and a garbage dx: dW, db must grow by the same amounts, dx must come
   * out the same. */
  test_fill(wb, nw, s, -3.0f, 3.0f);
  test_fill(bb, nb, s, -3.0f, 3.0f);
  memcpy(dw2, wb, nw * sizeof *dw2);
  memcpy(db2, bb, nb * sizeof *db2);
  test_fill(dx2, nx, s, 100.0f, 200.0f);
  dense_backward(&ctx, x, w, r, dx2, dw2, db2);
  expect_sum(wb, dw, want, nw);
  snprintf(what, sizeof what, "dense dW accumulates %s", shape);
  test_close(what, dw2, want, nw, 1e-6);
  expect_sum(bb, db, want, nb);
  snprintf(what, sizeof what, "dense db accumulates %s", shape);
  test_close(what, db2, want, nb, 1e-6);
  snprintf(what, sizeof what, "dense dx overwritten %s", shape);
  test_close_f(what, dx2, dx, nx, 1e-6);

  free(x);
  free(w);
  free(b);
  free(r);
  free(y);
  free(dx);
  free(dw);
  free(db);
  free(dx2);
  free(dw2);
  free(db2);
  free(wb);
  free(bb);
  free(xd);
  free(wd);
  free(bd);
  free(rd);
  free(want);
}

static void test_dense(void) {
  uint64_t s = 404;
  for (int wt = 0; wt < 2; wt++) {
    dense_case(&s, 5, 7, 3, wt);    /* every GEMM tiny */
    dense_case(&s, 17, 33, 21, wt); /* every GEMM on the large-shape path */
    dense_case(&s, 1, 1, 1, wt);
  }
  for (uint64_t seed = 31; seed < 35; seed++) {
    uint64_t r = seed;
    int64_t bs = rand_int(&r, 1, 24), in = rand_int(&r, 1, 40), out = rand_int(&r, 1, 30);
    dense_case(&r, bs, in, out, (int)(seed & 1));
  }
}

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

static void conv_case(uint64_t *rs, int64_t bd, int64_t c, int64_t h, int64_t w, int64_t oc,
                      int kh, int kw, int stride, int pad) {
  pmap_conv_shape s = {.c = c, .h = h, .w = w, .oc = oc,
                       .oh = (h + 2 * pad - kh) / stride + 1, .ow = (w + 2 * pad - kw) / stride + 1,
                       .kh = kh, .kw = kw, .stride = stride, .pad = pad};
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
  CHECK_OK(OPS.sgd_step(NULL, w, g, v, n, lr, 0.0f));
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
    CHECK_OK(OPS.sgd_step(NULL, w, g, v, n, lr, mom));
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
    CHECK_OK(OPS.adam_step(NULL, w, g, m, v, n, lr, beta1, beta2, eps, (float)bc1, (float)bc2));
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
  test_gemm();
  test_fill_op();
  test_bias();
  test_relu();
  test_dense();
  test_conv();
  test_mse();
  test_xent();
  test_sgd();
  test_adam();
  return test_exit("ops");
}
