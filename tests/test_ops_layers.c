/* test_ops_layers.c: unit test of the CPU ops behind the layers beyond dense and conv
 * (activations, add, layer norm, pooling, dropout, batch norm): forward against float64
 * references, backward against central finite differences of those references on odd shapes,
 * and the write contract (outputs and dx overwritten, dgamma and dbeta accumulated). */
#include "ops/op_math.h"
#include "ops_check.h"

/* Every finite-difference check differentiates sum_i r[i] y[i] for a random r. */

/* ------------------------------------------------------------------------------------------ */
/* Activations                                                                                */

static double ref_act(int act, double x) {
  if (act == PMAP_ACT_TANH) return tanh(x);
  if (act == PMAP_ACT_SIGMOID) return 1.0 / (1.0 + exp(-x));
  return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

typedef struct {
  int act;
  const double *x, *r;
  size_t n;
} act_ctx;

static double act_loss(const void *p) {
  const act_ctx *c = p;
  double s = 0.0;
  for (size_t i = 0; i < c->n; i++) s += c->r[i] * ref_act(c->act, c->x[i]);
  return s;
}

static void act_case(uint64_t *s, pmap_act act, size_t n) {
  static const char *const names[] = {"tanh", "sigmoid", "gelu"};
  char what[128];
  float *x = falloc(n), *y = falloc(n), *inplace = falloc(n), *r = falloc(n), *dx = falloc(n);
  double *want = dalloc(n), *xd = dalloc(n), *rd = dalloc(n);
  test_fill(x, n, s, -4.0f, 4.0f);
  test_fill(r, n, s, -1.0f, 1.0f);
  for (size_t i = 0; i < n; i++) want[i] = ref_act((int)act, x[i]);
  fill_nan(y, n);
  CHECK_OK(OPS.act_forward(NULL, act, x, y, n));
  snprintf(what, sizeof what, "%s forward n=%zu", names[act], n);
  test_close(what, y, want, n, TOL_FWD);
  memcpy(inplace, x, n * sizeof *x);
  CHECK_OK(OPS.act_forward(NULL, act, inplace, inplace, n));
  snprintf(what, sizeof what, "%s forward in place", names[act]);
  test_same_bits(what, inplace, y, n);
  fill_nan(dx, n);
  CHECK_OK(OPS.act_backward(NULL, act, x, y, r, dx, n));
  to_double(x, xd, n);
  to_double(r, rd, n);
  act_ctx ctx = {(int)act, xd, rd, n};
  snprintf(what, sizeof what, "%s backward dx vs finite differences n=%zu", names[act], n);
  fd_check(what, act_loss, &ctx, xd, n, dx, 1e-4, TOL_GRAD, s);
  free(x), free(y), free(inplace), free(r), free(dx), free(want), free(xd), free(rd);
}

/* Extreme inputs stay finite: sigmoid never computes exp of a large positive number. */
static void act_extremes(void) {
  float x[4] = {-100.0f, 100.0f, -1e30f, 1e30f}, y[4];
  for (int a = 0; a < 3; a++) {
    CHECK_OK(OPS.act_forward(NULL, (pmap_act)a, x, y, 4));
    for (int i = 0; i < 4; i++) CHECK(!isnan(y[i]), "act %d of %g is NaN", a, (double)x[i]);
  }
}

static void add_case(uint64_t *s, size_t n) {
  float *a = falloc(n), *b = falloc(n), *y = falloc(n);
  double *want = dalloc(n);
  test_fill(a, n, s, -1.0f, 1.0f);
  test_fill(b, n, s, -1.0f, 1.0f);
  for (size_t i = 0; i < n; i++) want[i] = (double)a[i] + b[i];
  fill_nan(y, n);
  CHECK_OK(OPS.add(NULL, a, b, y, n));
  test_close("add", y, want, n, 1e-7);
  CHECK_OK(OPS.add(NULL, a, b, a, n));
  test_same_bits("add in place", a, y, n);
  free(a), free(b), free(y), free(want);
}

/* ------------------------------------------------------------------------------------------ */
/* Layer norm                                                                                 */

typedef struct {
  const double *x, *g, *b, *r;
  int64_t rows, f;
  double eps;
} ln_ctx;

static void ref_layernorm(const ln_ctx *c, double *y) {
  for (int64_t r = 0; r < c->rows; r++) {
    const double *xr = c->x + r * c->f;
    double m = 0.0, v = 0.0;
    for (int64_t j = 0; j < c->f; j++) m += xr[j];
    m /= (double)c->f;
    for (int64_t j = 0; j < c->f; j++) v += (xr[j] - m) * (xr[j] - m);
    v /= (double)c->f;
    for (int64_t j = 0; j < c->f; j++)
      y[r * c->f + j] = (xr[j] - m) / sqrt(v + c->eps) * c->g[j] + c->b[j];
  }
}

static double ln_loss(const void *p) {
  const ln_ctx *c = p;
  size_t n = (size_t)(c->rows * c->f);
  double *y = dalloc(n), s = 0.0;
  ref_layernorm(c, y);
  for (size_t i = 0; i < n; i++) s += c->r[i] * y[i];
  free(y);
  return s;
}

static void layernorm_case(uint64_t *s, int64_t rows, int64_t f) {
  char what[128];
  size_t n = (size_t)(rows * f);
  float eps = 1e-5f;
  float *x = falloc(n), *y = falloc(n), *r = falloc(n), *dx = falloc(n), *stats = falloc(2 * rows);
  float *g = falloc(f), *b = falloc(f), *dg = falloc(f), *db = falloc(f), *dg0 = falloc(f),
        *db0 = falloc(f), *dg1 = falloc(f), *db1 = falloc(f);
  double *xd = dalloc(n), *gd = dalloc(f), *bd = dalloc(f), *rd = dalloc(n), *want = dalloc(n);
  test_fill(x, n, s, -2.0f, 3.0f);
  test_fill(r, n, s, -1.0f, 1.0f);
  fill_away(g, (size_t)f, s, 0.5f, 1.5f);
  test_fill(b, (size_t)f, s, -1.0f, 1.0f);
  to_double(x, xd, n), to_double(g, gd, f), to_double(b, bd, f), to_double(r, rd, n);
  ln_ctx ctx = {xd, gd, bd, rd, rows, f, eps};
  ref_layernorm(&ctx, want);
  fill_nan(y, n);
  CHECK_OK(OPS.layernorm_forward(NULL, x, g, b, rows, f, eps, y, stats));
  snprintf(what, sizeof what, "layernorm forward rows=%" PRId64 " f=%" PRId64, rows, f);
  test_close(what, y, want, n, TOL_FWD);

  /* dgamma, dbeta from zero, then twice from random starting values: += each time */
  fill_nan(dx, n);
  CHECK_OK(OPS.layernorm_backward(NULL, x, g, stats, r, rows, f, dx, dg, db));
  snprintf(what, sizeof what, "layernorm dx vs finite differences f=%" PRId64, f);
  fd_check(what, ln_loss, &ctx, xd, n, dx, 1e-3, TOL_GRAD, s);
  snprintf(what, sizeof what, "layernorm dgamma vs finite differences f=%" PRId64, f);
  fd_check(what, ln_loss, &ctx, gd, (size_t)f, dg, 1e-3, TOL_GRAD, s);
  snprintf(what, sizeof what, "layernorm dbeta vs finite differences f=%" PRId64, f);
  fd_check(what, ln_loss, &ctx, bd, (size_t)f, db, 1e-3, TOL_GRAD, s);
  test_fill(dg0, (size_t)f, s, -1.0f, 1.0f);
  test_fill(db0, (size_t)f, s, -1.0f, 1.0f);
  memcpy(dg1, dg0, f * sizeof *dg1);
  memcpy(db1, db0, f * sizeof *db1);
  CHECK_OK(OPS.layernorm_backward(NULL, x, g, stats, r, rows, f, NULL, dg1, db1));
  CHECK_OK(OPS.layernorm_backward(NULL, x, g, stats, r, rows, f, NULL, dg1, db1));
  double *e = dalloc(f);
  for (int64_t j = 0; j < f; j++) e[j] = (double)dg0[j] + 2.0 * dg[j];
  test_close("layernorm dgamma accumulates (twice, dx NULL)", dg1, e, (size_t)f, 1e-6);
  for (int64_t j = 0; j < f; j++) e[j] = (double)db0[j] + 2.0 * db[j];
  test_close("layernorm dbeta accumulates (twice, dx NULL)", db1, e, (size_t)f, 1e-6);
  free(e);
  free(x), free(y), free(r), free(dx), free(stats), free(g), free(b), free(dg), free(db);
  free(dg0), free(db0), free(dg1), free(db1), free(xd), free(gd), free(bd), free(rd), free(want);
}

/* ------------------------------------------------------------------------------------------ */
/* Pooling                                                                                    */

typedef struct {
  int is_max;
  pmap_pool_shape s;
  int64_t bd;
  const double *x, *r;
} pool_ctx;

static size_t pool_out(const pool_ctx *c) { return (size_t)(c->bd * c->s.c * c->s.oh * c->s.ow); }

static void ref_pool(const pool_ctx *c, double *y) {
  const pmap_pool_shape *s = &c->s;
  for (int64_t p = 0; p < c->bd * s->c; p++)
    for (int64_t oy = 0; oy < s->oh; oy++)
      for (int64_t ox = 0; ox < s->ow; ox++) {
        double best = -INFINITY, sum = 0.0;
        for (int i = 0; i < s->kh; i++)
          for (int j = 0; j < s->kw; j++) {
            double v = c->x[(p * s->h + oy * s->stride + i) * s->w + ox * s->stride + j];
            best = v > best ? v : best;
            sum += v;
          }
        y[(p * s->oh + oy) * s->ow + ox] = c->is_max ? best : sum / (s->kh * s->kw);
      }
}

static double pool_loss(const void *p) {
  const pool_ctx *c = p;
  size_t n = pool_out(c);
  double *y = dalloc(n), s = 0.0;
  ref_pool(c, y);
  for (size_t i = 0; i < n; i++) s += c->r[i] * y[i];
  free(y);
  return s;
}

static void pool_case(uint64_t *s, int is_max, int64_t bd, int64_t ch, int64_t h, int64_t w, int k,
                      int stride) {
  char what[160];
  pmap_pool_shape sh = {ch, h, w, (h - k) / stride + 1, (w - k) / stride + 1, k, k, stride};
  size_t nx = (size_t)(bd * ch * h * w);
  pool_ctx ctx = {is_max, sh, bd, NULL, NULL};
  size_t ny = pool_out(&ctx);
  float *x = falloc(nx), *y = falloc(ny), *r = falloc(ny), *dx = falloc(nx);
  double *xd = dalloc(nx), *rd = dalloc(ny), *want = dalloc(ny);
  /* Distinct values at least 1e-2 apart, shuffled: finite differences never swap a maximum. */
  for (size_t i = 0; i < nx; i++) x[i] = (float)((double)i * 1e-2 - (double)nx * 5e-3);
  for (size_t i = nx; i > 1; i--) {
    size_t j = (size_t)(test_rand_u64(s) % i);
    float t = x[i - 1];
    x[i - 1] = x[j], x[j] = t;
  }
  test_fill(r, ny, s, -1.0f, 1.0f);
  to_double(x, xd, nx), to_double(r, rd, ny);
  ctx.x = xd, ctx.r = rd;
  ref_pool(&ctx, want);
  fill_nan(y, ny);
  CHECK_OK(OPS.pool2d_forward(NULL, is_max, &sh, bd, x, y));
  snprintf(what, sizeof what,
           "%s forward bd=%" PRId64 " c=%" PRId64 " %" PRId64 "x%" PRId64 " k=%d stride=%d",
           is_max ? "maxpool" : "avgpool", bd, ch, h, w, k, stride);
  test_close(what, y, want, ny, TOL_FWD);
  fill_nan(dx, nx);
  CHECK_OK(OPS.pool2d_backward(NULL, is_max, &sh, bd, x, r, dx));
  snprintf(what, sizeof what, "%s dx vs finite differences k=%d stride=%d",
           is_max ? "maxpool" : "avgpool", k, stride);
  fd_check(what, pool_loss, &ctx, xd, nx, dx, 1e-3, TOL_GRAD, s);
  free(x), free(y), free(r), free(dx), free(xd), free(rd), free(want);
}

/* ------------------------------------------------------------------------------------------ */
/* Dropout                                                                                    */

static void dropout_case(uint64_t *s, size_t n, float rate) {
  char what[128];
  float *x = falloc(n), *y = falloc(n), *parts = falloc(n), *dx = falloc(n);
  double *want = dalloc(n);
  fill_away(x, n, s, 0.1f, 2.0f);
  uint64_t key = test_rand_u64(s);
  CHECK_OK(OPS.dropout_forward(NULL, x, y, n, rate, key, 1000));
  size_t dropped = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK(y[i] == 0.0f || fabs((double)y[i] - x[i] / (1.0 - rate)) <= 1e-6 * fabs((double)y[i]),
          "dropout element %zu: %g from %g", i, (double)y[i], (double)x[i]);
    dropped += y[i] == 0.0f;
  }
  double frac = (double)dropped / (double)n;
  CHECK(fabs(frac - rate) < 4.0 * sqrt(rate * (1.0 - rate) / (double)n) + 1e-9,
        "dropout rate %g dropped a fraction %g of %zu", (double)rate, frac, n);
  /* Split in two at an odd point, as two devices would hold it: the same mask. */
  size_t half = n / 2 + 1;
  CHECK_OK(OPS.dropout_forward(NULL, x, parts, half, rate, key, 1000));
  CHECK_OK(OPS.dropout_forward(NULL, x + half, parts + half, n - half, rate, key, 1000 + half));
  snprintf(what, sizeof what, "dropout mask independent of the split n=%zu", n);
  test_same_bits(what, parts, y, n);
  /* Backward: the same mask on dy (the op is linear, so this is its exact gradient). */
  fill_nan(dx, n);
  CHECK_OK(OPS.dropout_backward(NULL, x, dx, n, rate, key, 1000));
  test_same_bits("dropout backward = the forward mask", dx, y, n);
  CHECK_OK(OPS.dropout_forward(NULL, x, parts, n, rate, key + 1, 1000));
  CHECK(memcmp(parts, y, n * sizeof *y) != 0, "dropout: another key gives the same mask");
  (void)want;
  free(x), free(y), free(parts), free(dx), free(want);
}

/* ------------------------------------------------------------------------------------------ */
/* Batch norm                                                                                 */

typedef struct {
  const double *x, *g, *b, *r;
  int64_t outer, c, inner;
  double eps;
} bn_ctx;

static void ref_bn(const bn_ctx *k, double *y) {
  for (int64_t ch = 0; ch < k->c; ch++) {
    double m = 0.0, v = 0.0, cnt = (double)(k->outer * k->inner);
    for (int64_t o = 0; o < k->outer; o++)
      for (int64_t i = 0; i < k->inner; i++) m += k->x[(o * k->c + ch) * k->inner + i];
    m /= cnt;
    for (int64_t o = 0; o < k->outer; o++)
      for (int64_t i = 0; i < k->inner; i++) {
        double d = k->x[(o * k->c + ch) * k->inner + i] - m;
        v += d * d;
      }
    v /= cnt;
    for (int64_t o = 0; o < k->outer; o++)
      for (int64_t i = 0; i < k->inner; i++) {
        size_t at = (size_t)((o * k->c + ch) * k->inner + i);
        y[at] = (k->x[at] - m) / sqrt(v + k->eps) * k->g[ch] + k->b[ch];
      }
  }
}

static double bn_loss(const void *p) {
  const bn_ctx *k = p;
  size_t n = (size_t)(k->outer * k->c * k->inner);
  double *y = dalloc(n), s = 0.0;
  ref_bn(k, y);
  for (size_t i = 0; i < n; i++) s += k->r[i] * y[i];
  free(y);
  return s;
}

/* The sums of two shards, as the all-reduce of cross-replica batch norm gives them. */
static void sum_into(float *dst, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
}

/* Statistics (3c + 1): the sums and the count add, the shifts are the same on both. */
static void sum_stats(float *dst, const float *a, const float *b, size_t c) {
  sum_into(dst, a, b, 2 * c + 1);
  memcpy(dst + 2 * c + 1, a + 2 * c + 1, c * sizeof *dst);
}

static void batchnorm_case(uint64_t *s, int64_t outer, int64_t c, int64_t inner) {
  char what[160];
  size_t n = (size_t)(outer * c * inner), C = (size_t)c;
  float eps = 1e-5f, mom = 0.9f;
  float *x = falloc(n), *y = falloc(n), *r = falloc(n), *dx = falloc(n), *g = falloc(C),
        *b = falloc(C), *first = falloc(3 * C + 1), *stats = falloc(3 * C + 1),
        *sums = falloc(2 * C), *running = falloc(2 * C), *run0 = falloc(2 * C);
  double *xd = dalloc(n), *gd = dalloc(C), *bd = dalloc(C), *rd = dalloc(n), *want = dalloc(n);
  test_fill(x, n, s, -1.0f, 3.0f);
  test_fill(r, n, s, -1.0f, 1.0f);
  fill_away(g, C, s, 0.5f, 1.5f);
  test_fill(b, C, s, -1.0f, 1.0f);
  test_fill(running, 2 * C, s, 0.5f, 1.5f);
  memcpy(run0, running, 2 * C * sizeof *run0);
  to_double(x, xd, n), to_double(g, gd, C), to_double(b, bd, C), to_double(r, rd, n);
  bn_ctx ctx = {xd, gd, bd, rd, outer, c, inner, eps};
  ref_bn(&ctx, want);
  fill_nan(stats, 3 * C + 1);
  CHECK_OK(OPS.bn_stats(NULL, x, outer, c, inner, NULL, first));
  CHECK_OK(OPS.bn_stats(NULL, x, outer, c, inner, first, stats));
  fill_nan(y, n);
  CHECK_OK(OPS.bn_forward(NULL, x, stats, stats, running, g, b, outer, c, inner, eps, mom, 1, y));
  snprintf(what, sizeof what, "batchnorm forward outer=%" PRId64 " c=%" PRId64 " inner=%" PRId64,
           outer, c, inner);
  test_close(what, y, want, n, TOL_FWD);
  /* running = mom running + (1 - mom) batch moments */
  double *rw = dalloc(2 * C);
  for (size_t ch = 0; ch < C; ch++) {
    double cnt = (double)(outer * inner), m = 0.0, v = 0.0;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < inner; i++) m += xd[(o * c + (int64_t)ch) * inner + i];
    m /= cnt;
    for (int64_t o = 0; o < outer; o++)
      for (int64_t i = 0; i < inner; i++) {
        double d = xd[(o * c + (int64_t)ch) * inner + i] - m;
        v += d * d;
      }
    rw[ch] = mom * run0[ch] + (1.0 - mom) * m;
    rw[C + ch] = mom * run0[C + ch] + (1.0 - mom) * v / cnt;
  }
  test_close("batchnorm running statistics", running, rw, 2 * C, 1e-5);

  fill_nan(sums, 2 * C);
  CHECK_OK(OPS.bn_backward_sums(NULL, x, r, stats, outer, c, inner, eps, sums));
  fill_nan(dx, n);
  CHECK_OK(OPS.bn_backward_dx(NULL, x, r, stats, g, sums, outer, c, inner, eps, dx));
  snprintf(what, sizeof what, "batchnorm dx vs finite differences c=%" PRId64 " inner=%" PRId64, c,
           inner);
  fd_check(what, bn_loss, &ctx, xd, n, dx, 1e-3, TOL_GRAD, s);
  fd_check("batchnorm dgamma (sum dy xhat) vs finite differences", bn_loss, &ctx, gd, C, sums + C,
           1e-3, TOL_GRAD, s);
  fd_check("batchnorm dbeta (sum dy) vs finite differences", bn_loss, &ctx, bd, C, sums, 1e-3,
           TOL_GRAD, s);

  /* Two shards with summed statistics (two passes, as layers.c takes them) and summed sums give
   * the whole batch's y and dx. */
  if (outer >= 2) {
    int64_t o1 = outer / 2 + (outer & 1), o2 = outer - o1;
    size_t n1 = (size_t)(o1 * c * inner), S = 3 * C + 1;
    float *s1 = falloc(S), *s2 = falloc(S), *g1 = falloc(S), *sg = falloc(S);
    float *u1 = falloc(2 * C), *u2 = falloc(2 * C), *ug = falloc(2 * C);
    float *ys = falloc(n), *dxs = falloc(n);
    CHECK_OK(OPS.bn_stats(NULL, x, o1, c, inner, NULL, s1));
    CHECK_OK(OPS.bn_stats(NULL, x + n1, o2, c, inner, NULL, s2));
    sum_stats(g1, s1, s2, C);
    CHECK_OK(OPS.bn_stats(NULL, x, o1, c, inner, g1, s1));
    CHECK_OK(OPS.bn_stats(NULL, x + n1, o2, c, inner, g1, s2));
    sum_stats(sg, s1, s2, C);
    CHECK_OK(OPS.bn_forward(NULL, x, sg, sg, NULL, g, b, o1, c, inner, eps, mom, 1, ys));
    CHECK_OK(OPS.bn_forward(NULL, x + n1, sg, sg, NULL, g, b, o2, c, inner, eps, mom, 1, ys + n1));
    test_close("batchnorm forward over two shards with summed statistics", ys, want, n, TOL_FWD);
    CHECK_OK(OPS.bn_backward_sums(NULL, x, r, sg, o1, c, inner, eps, u1));
    CHECK_OK(OPS.bn_backward_sums(NULL, x + n1, r + n1, sg, o2, c, inner, eps, u2));
    sum_into(ug, u1, u2, 2 * C);
    CHECK_OK(OPS.bn_backward_dx(NULL, x, r, sg, g, ug, o1, c, inner, eps, dxs));
    CHECK_OK(OPS.bn_backward_dx(NULL, x + n1, r + n1, sg, g, ug, o2, c, inner, eps, dxs + n1));
    test_close_f("batchnorm dx over two shards with summed sums", dxs, dx, n, 1e-5);
    free(s1), free(s2), free(g1), free(sg), free(u1), free(u2), free(ug), free(ys), free(dxs);
  }

  /* Inference: the running statistics, and running stays as it was. */
  memcpy(run0, running, 2 * C * sizeof *run0);
  CHECK_OK(OPS.bn_forward(NULL, x, NULL, NULL, running, g, b, outer, c, inner, eps, mom, 0, y));
  for (int64_t o = 0; o < outer; o++)
    for (int64_t ch = 0; ch < c; ch++)
      for (int64_t i = 0; i < inner; i++) {
        size_t at = (size_t)((o * c + ch) * inner + i);
        want[at] =
            (xd[at] - running[ch]) / sqrt((double)running[C + (size_t)ch] + eps) * gd[ch] + bd[ch];
      }
  test_close("batchnorm inference forward", y, want, n, TOL_FWD);
  test_same_bits("batchnorm inference leaves running alone", running, run0, 2 * C);
  free(rw);
  free(x), free(y), free(r), free(dx), free(g), free(b), free(first), free(stats), free(sums);
  free(running);
  free(run0), free(xd), free(gd), free(bd), free(rd), free(want);
}

/* A NaN in the batch leaves the running statistics as they were (the guard skips such a step). */
static void batchnorm_nan_keeps_running(void) {
  float x[6] = {1.0f, 2.0f, NAN, 4.0f, 5.0f, 6.0f}, g[2] = {1.0f, 1.0f}, b[2] = {0.0f, 0.0f};
  float st[7], y[6], run[4] = {0.5f, -0.5f, 2.0f, 3.0f}, run0[4];
  memcpy(run0, run, sizeof run);
  CHECK_OK(OPS.bn_stats(NULL, x, 3, 2, 1, NULL, st));
  CHECK_OK(OPS.bn_forward(NULL, x, st, st, run, g, b, 3, 2, 1, 1e-5f, 0.9f, 1, y));
  CHECK(run[0] == run0[0] && run[2] == run0[2], "channel 0 moved with a NaN: %g %g", (double)run[0],
        (double)run[2]);
  CHECK(run[1] != run0[1] && run[3] != run0[3], "channel 1 (finite) did not move");
}

/* A channel with a large mean and a small spread: the second pass around the first's mean
 * keeps the variance (E[x^2] - E[x]^2 in float would lose it entirely). */
static void batchnorm_large_mean(uint64_t *s) {
  enum { N = 999 };
  float x[N], first[4], st[4];
  double m = 0.0, v = 0.0;
  for (int i = 0; i < N; i++) x[i] = 1000.0f + test_rand_uniform(s, -0.5f, 0.5f);
  for (int i = 0; i < N; i++) m += x[i];
  m /= N;
  for (int i = 0; i < N; i++) v += (x[i] - m) * (x[i] - m);
  v /= N;
  CHECK_OK(OPS.bn_stats(NULL, x, N, 1, 1, NULL, first));
  CHECK_OK(OPS.bn_stats(NULL, x, N, 1, 1, first, st));
  float mean, var;
  pmap_bn_moments(st, 1, 0, &mean, &var);
  CHECK(fabs(mean - m) <= 1e-4 && fabs(var - v) <= 1e-4 * v,
        "batchnorm large mean: mean %.9g var %.9g, want %.9g %.9g", (double)mean, (double)var, m,
        v);
}

int main(void) {
  uint64_t s = 0x1a7e5u;
  for (int a = 0; a < 3; a++) {
    act_case(&s, (pmap_act)a, 1);
    act_case(&s, (pmap_act)a, 257);
  }
  act_extremes();
  add_case(&s, 301);
  layernorm_case(&s, 1, 1);
  layernorm_case(&s, 5, 7);
  layernorm_case(&s, 3, 129);
  for (int is_max = 0; is_max < 2; is_max++) {
    pool_case(&s, is_max, 2, 3, 7, 9, 3, 2); /* overlapping windows, a ragged edge */
    pool_case(&s, is_max, 3, 2, 8, 6, 2, 2); /* tiling */
    pool_case(&s, is_max, 1, 1, 5, 5, 1, 1); /* identity */
    pool_case(&s, is_max, 2, 5, 5, 5, 5, 1); /* global */
  }
  dropout_case(&s, 4001, 0.5f);
  dropout_case(&s, 999, 0.1f);
  dropout_case(&s, 1001, 0.9f);
  batchnorm_case(&s, 7, 3, 1);
  batchnorm_case(&s, 5, 4, 9);
  batchnorm_case(&s, 2, 1, 11);
  batchnorm_nan_keeps_running();
  batchnorm_large_mean(&s);
  return test_exit("ops-layers");
}
