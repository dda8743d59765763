/* test_ops_dense.c: unit test of the CPU ops behind dense layers (gemm, fill, bias, relu and
 * their composition): forward against float64 references, backward against central finite
 * differences, and the write contract (activation gradients =, parameter gradients +=). The
 * GEMM and dense cases run once with every CPU GEMM provider of the build. */
#include "ops/cpu/gemm.h"
#include "ops_check.h"

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
      {1, 1, 1},
      {3, 5, 7},
      {4, 9, 2},
      {2, 1, 13},
      {16, 16, 16},
      /* the large-shape path; the last two run k over more than one cache block */
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
  snprintf(what, sizeof what, "bias_forward outer=%" PRId64 " ch=%" PRId64 " inner=%" PRId64, outer,
           ch, inner);
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
  size_t nx = (size_t)(bs * in), nw = (size_t)(in * out), ny = (size_t)(bs * out), nb = (size_t)out;
  float *x = falloc(nx), *w = falloc(nw), *b = falloc(nb), *r = falloc(ny), *y = falloc(ny);
  float *dx = falloc(nx), *dw = falloc(nw), *db = falloc(nb);
  float *dx2 = falloc(nx), *dw2 = falloc(nw), *db2 = falloc(nb), *wb = falloc(nw), *bb = falloc(nb);
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

/* Every provider of the build, forced in turn, through the op table. */
static void test_gemm_providers(void) {
  int n = 0;
  const cpu_gemm_provider *list = cpu_gemm_list(&n);
  for (int i = 0; i < n; i++) {
    CHECK_OK(cpu_gemm_force(list[i].name));
    CHECK(strcmp(pmap_gemm_provider(), list[i].name) == 0, "forcing %s: %s in use", list[i].name,
          pmap_gemm_provider());
    int before = test_failures;
    test_gemm();
    test_dense();
    printf("gemm provider %s: %s\n", list[i].name, test_failures == before ? "ok" : "FAILED");
  }
  CHECK(cpu_gemm_force("bogus") == PMAP_ERR_INVALID_ARGUMENT, "forcing bogus was accepted");
}

int main(void) {
  test_gemm_providers();
  test_fill_op();
  test_bias();
  test_relu();
  return test_exit("ops-dense");
}
