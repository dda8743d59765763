/* test_gpu_ops.c: every CUDA op, forward and backward, against the CPU reference (ops/cpu) on
 * fresh random data on one GPU; device outputs start as NaN so an unwritten element fails, and
 * accumulated outputs start from the same random values on both sides. Skips (77) without a GPU. */
#include <stdlib.h>

#include "base/error.h"
#include "gpu_util.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "runtime/backend.h"

typedef struct env {
  pmap_device *dev;
  const pmap_ops *ops; /* the CUDA op backend's, on queue q of dev */
  op_queue *q;
  uint64_t rng;
  double tol_gemm; /* FP32 sums in another order; TF32 when PMAP_CUDA_TF32 asks for it */
} env;

/* A host array and its device twin. */
typedef struct buf {
  float *h;
  float *d;
  size_t n;
} buf;

static buf buf_new(env *e, size_t n) {
  buf b = {calloc(n ? n : 1, sizeof(float)), NULL, n};
  void *p = NULL;
  CHECK_OK(e->dev->ctx->be->alloc(e->dev, (n ? n : 1) * sizeof(float), &p));
  b.d = p;
  if (!b.h) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return b;
}

static void buf_free(env *e, buf *b) {
  free(b->h);
  if (b->d) e->dev->ctx->be->free(e->dev, b->d);
  b->h = b->d = NULL;
}

/* Waits for the copy too: the backend may read b->h until its next sync, and the CPU reference
 * overwrites some host sides right after. */
static void upload(env *e, buf *b) {
  const pmap_backend_i *be = e->dev->ctx->be;
  CHECK_OK(be->upload(e->dev, b->d, b->h, b->n * sizeof(float)));
  if (be->sync) CHECK_OK(be->sync(e->dev));
}

/* Fresh random values in [lo, hi) on both sides. */
static buf rnd(env *e, size_t n, float lo, float hi) {
  buf b = buf_new(e, n);
  test_fill(b.h, n, &e->rng, lo, hi);
  upload(e, &b);
  return b;
}

/* An output: zero on the host, NaN on the device. */
static buf poisoned(env *e, size_t n) {
  buf b = buf_new(e, n);
  CHECK_OK(e->ops->fill(e->q, b.d, NAN, n));
  return b;
}

/* Downloads the device side of b and compares it with the host side. */
static void compare(env *e, const char *what, const buf *b, double tol) {
  float *got = malloc((b->n ? b->n : 1) * sizeof *got);
  CHECK_OK(e->dev->ctx->be->download(e->dev, got, b->d, b->n * sizeof(float)));
  test_close_f(what, got, b->h, b->n, tol);
  free(got);
}

static void test_fill_op(env *e) {
  const float values[] = {0.0f, 3.25f, -1.5f};
  for (int v = 0; v < 3; v++) {
    buf x = poisoned(e, 100003);
    CHECK_OK(pmap_cpu_ops.fill(NULL, x.h, values[v], x.n));
    CHECK_OK(e->ops->fill(e->q, x.d, values[v], x.n));
    compare(e, "fill", &x, 0.0);
    buf_free(e, &x);
  }
}

/* Extracts the (m, n) window of a (m, ld) matrix so padding columns are not compared. */
static void window(const float *full, int64_t m, int64_t n, int64_t ld, float *out) {
  for (int64_t i = 0; i < m; i++) memcpy(out + i * n, full + i * ld, (size_t)n * sizeof *out);
}

static void test_gemm(env *e) {
  static const int64_t shapes[][3] = {
      {1, 1, 1}, {7, 13, 5}, {33, 64, 100}, {128, 256, 64}, {3, 517, 300}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int accumulate = 0; accumulate < 2; accumulate++) {
          int64_t m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
          int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 1;
          float alpha = accumulate ? 0.75f : 1.0f, beta = accumulate ? 1.0f : 0.0f;
          buf a = rnd(e, (size_t)((ta ? k : m) * lda), -1.0f, 1.0f);
          buf b = rnd(e, (size_t)((tb ? n : k) * ldb), -1.0f, 1.0f);
          /* beta == 0 must ignore c: the device's c is NaN then. */
          size_t nc = (size_t)(m * ldc);
          buf c = accumulate ? rnd(e, nc, -1.0f, 1.0f) : poisoned(e, nc);
          CHECK_OK(
              pmap_cpu_ops.gemm(NULL, ta, tb, m, n, k, alpha, a.h, lda, b.h, ldb, beta, c.h, ldc));
          CHECK_OK(e->ops->gemm(e->q, ta, tb, m, n, k, alpha, a.d, lda, b.d, ldb, beta, c.d, ldc));
          float *got = malloc(c.n * sizeof *got), *gw = malloc((size_t)(m * n) * sizeof *gw),
                *rw = malloc((size_t)(m * n) * sizeof *rw);
          CHECK_OK(e->dev->ctx->be->download(e->dev, got, c.d, c.n * sizeof(float)));
          window(got, m, n, ldc, gw);
          window(c.h, m, n, ldc, rw);
          char what[96];
          snprintf(what, sizeof what, "gemm m %lld n %lld k %lld ta %d tb %d beta %g", (long long)m,
                   (long long)n, (long long)k, ta, tb, (double)beta);
          test_close_f(what, gw, rw, (size_t)(m * n), e->tol_gemm);
          /* The padding column past n of each row of c is not c's: it must keep its bits (NaN
           * on the device where c was poisoned). */
          for (int64_t i = 0; i < m; i++) {
            float pad = got[i * ldc + n];
            CHECK(accumulate ? memcmp(&pad, &c.h[i * ldc + n], sizeof pad) == 0 : isnan(pad),
                  "%s: padding of row %lld was written: %g", what, (long long)i, (double)pad);
          }
          free(got);
          free(gw);
          free(rw);
          buf_free(e, &a);
          buf_free(e, &b);
          buf_free(e, &c);
        }
}

static void test_bias(env *e) {
  /* (outer, ch, inner): dense shapes on both backward paths (few and many channels), conv. */
  static const int64_t shapes[][3] = {{5, 7, 1}, {64, 300, 1}, {3, 4, 81}, {2, 16, 1024}};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    int64_t outer = shapes[s][0], ch = shapes[s][1], inner = shapes[s][2];
    size_t n = (size_t)(outer * ch * inner);
    buf y = rnd(e, n, -1.0f, 1.0f), b = rnd(e, (size_t)ch, -1.0f, 1.0f);
    CHECK_OK(pmap_cpu_ops.bias_forward(NULL, y.h, b.h, outer, ch, inner));
    CHECK_OK(e->ops->bias_forward(e->q, y.d, b.d, outer, ch, inner));
    compare(e, "bias_forward", &y, 1e-6);
    buf db = rnd(e, (size_t)ch, -1.0f, 1.0f); /* accumulates */
    CHECK_OK(pmap_cpu_ops.bias_backward(NULL, y.h, db.h, outer, ch, inner));
    CHECK_OK(e->ops->bias_backward(e->q, y.d, db.d, outer, ch, inner));
    compare(e, "bias_backward", &db, 1e-5);
    buf_free(e, &y);
    buf_free(e, &b);
    buf_free(e, &db);
  }
}

static void test_relu(env *e) {
  size_t n = 77777;
  buf x = rnd(e, n, -1.0f, 1.0f), y = poisoned(e, n);
  CHECK_OK(pmap_cpu_ops.relu_forward(NULL, x.h, y.h, n));
  CHECK_OK(e->ops->relu_forward(e->q, x.d, y.d, n));
  compare(e, "relu_forward", &y, 0.0);
  buf dy = rnd(e, n, -1.0f, 1.0f), dx = poisoned(e, n);
  CHECK_OK(pmap_cpu_ops.relu_backward(NULL, y.h, dy.h, dx.h, n));
  CHECK_OK(e->ops->relu_backward(e->q, y.d, dy.d, dx.d, n));
  compare(e, "relu_backward", &dx, 0.0);
  /* In place: y = x and dx = dy. */
  CHECK_OK(pmap_cpu_ops.relu_forward(NULL, x.h, x.h, n));
  CHECK_OK(e->ops->relu_forward(e->q, x.d, x.d, n));
  compare(e, "relu_forward in place", &x, 0.0);
  CHECK_OK(pmap_cpu_ops.relu_backward(NULL, x.h, dy.h, dy.h, n));
  CHECK_OK(e->ops->relu_backward(e->q, x.d, dy.d, dy.d, n));
  compare(e, "relu_backward in place", &dy, 0.0);
  buf_free(e, &x);
  buf_free(e, &y);
  buf_free(e, &dy);
  buf_free(e, &dx);
}

static pmap_conv_shape conv_shape(int64_t c, int64_t h, int64_t w, int64_t oc, int kh, int kw,
                                  int stride, int pad) {
  int64_t oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
  pmap_conv_shape s = {c, h, w, oc, oh, ow, kh, kw, stride, pad};
  return s;
}

static void test_conv(env *e) {
  const pmap_conv_shape shapes[] = {
      conv_shape(3, 9, 7, 4, 3, 3, 1, 1), conv_shape(2, 8, 8, 5, 3, 2, 2, 0),
      conv_shape(1, 32, 32, 1, 3, 3, 1, 1), conv_shape(4, 6, 5, 3, 1, 1, 1, 0),
      conv_shape(2, 7, 9, 3, 5, 3, 3, 2)};
  const int64_t bds[] = {5, 1};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
    for (size_t j = 0; j < 2; j++) {
      const pmap_conv_shape *s = &shapes[i];
      int64_t bd = bds[j], ohw = s->oh * s->ow, ckk = s->c * s->kh * s->kw;
      size_t nx = (size_t)(bd * s->c * s->h * s->w), ny = (size_t)(bd * s->oc * ohw);
      buf x = rnd(e, nx, -1.0f, 1.0f), w = rnd(e, (size_t)(s->oc * ckk), -1.0f, 1.0f);
      buf y = poisoned(e, ny), col = buf_new(e, (size_t)(ckk * ohw)),
          dcol = buf_new(e, (size_t)(ckk * ohw));
      char what[96];
      snprintf(what, sizeof what, "conv2d shape %zu bd %lld", i, (long long)bd);
      CHECK_OK(pmap_cpu_ops.conv2d_forward(NULL, s, bd, x.h, w.h, y.h, col.h));
      CHECK_OK(e->ops->conv2d_forward(e->q, s, bd, x.d, w.d, y.d, col.d));
      compare(e, what, &y, e->tol_gemm);
      buf dy = rnd(e, ny, -1.0f, 1.0f), dw = rnd(e, w.n, -1.0f, 1.0f), dx = poisoned(e, nx);
      CHECK_OK(
          pmap_cpu_ops.conv2d_backward(NULL, s, bd, x.h, w.h, dy.h, dx.h, dw.h, col.h, dcol.h));
      CHECK_OK(e->ops->conv2d_backward(e->q, s, bd, x.d, w.d, dy.d, dx.d, dw.d, col.d, dcol.d));
      compare(e, "conv2d_backward dw", &dw, e->tol_gemm);
      compare(e, "conv2d_backward dx", &dx, e->tol_gemm);
      /* Without dx (the first layer): dw accumulates once more, nothing else is written. */
      CHECK_OK(
          pmap_cpu_ops.conv2d_backward(NULL, s, bd, x.h, w.h, dy.h, NULL, dw.h, col.h, dcol.h));
      CHECK_OK(e->ops->conv2d_backward(e->q, s, bd, x.d, w.d, dy.d, NULL, dw.d, col.d, dcol.d));
      compare(e, "conv2d_backward dw (no dx)", &dw, e->tol_gemm);
      buf *all[] = {&x, &w, &y, &col, &dcol, &dy, &dw, &dx};
      for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) buf_free(e, all[k]);
    }
}

static void test_mse(env *e) {
  const size_t sizes[] = {1, 37, 3000, 200003};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t n = sizes[i];
    buf p = rnd(e, n, -2.0f, 2.0f), t = rnd(e, n, -2.0f, 2.0f), dp = poisoned(e, n);
    buf loss = poisoned(e, 1);
    CHECK_OK(pmap_cpu_ops.mse(NULL, p.h, t.h, n, dp.h, loss.h));
    CHECK_OK(e->ops->mse(e->q, p.d, t.d, n, dp.d, loss.d));
    compare(e, "mse dpred", &dp, 1e-6);
    compare(e, "mse loss", &loss, 1e-6);
    buf *all[] = {&p, &t, &dp, &loss};
    for (size_t k = 0; k < 4; k++) buf_free(e, all[k]);
  }
}

static void test_xent(env *e) {
  static const int64_t shapes[][2] = {{1, 2}, {33, 10}, {300, 2}, {70000, 10}, {5, 1000}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int64_t rows = shapes[i][0], k = shapes[i][1];
    size_t n = (size_t)(rows * k);
    buf z = rnd(e, n, -3.0f, 3.0f), dz = poisoned(e, n), loss = poisoned(e, 1);
    int32_t *labels = malloc((size_t)rows * sizeof *labels);
    void *dlabels = NULL;
    for (int64_t r = 0; r < rows; r++) labels[r] = (int32_t)(test_rand_u64(&e->rng) % (uint64_t)k);
    CHECK_OK(e->dev->ctx->be->alloc(e->dev, (size_t)rows * sizeof *labels, &dlabels));
    CHECK_OK(e->dev->ctx->be->upload(e->dev, dlabels, labels, (size_t)rows * sizeof *labels));
    CHECK_OK(pmap_cpu_ops.softmax_xent(NULL, z.h, labels, rows, k, dz.h, loss.h));
    CHECK_OK(e->ops->softmax_xent(e->q, z.d, dlabels, rows, k, dz.d, loss.d));
    compare(e, "softmax_xent dlogits", &dz, 1e-5);
    compare(e, "softmax_xent loss", &loss, 1e-5);
    e->dev->ctx->be->free(e->dev, dlabels);
    free(labels);
    buf_free(e, &z);
    buf_free(e, &dz);
    buf_free(e, &loss);
  }
}

static void test_optimizers(env *e) {
  size_t n = 100007;
  for (int variant = 0; variant < 4; variant++) {
    /* plain, momentum, Nesterov, Nesterov with weight decay */
    int with_momentum = variant > 0;
    pmap_step_hyper h = {.lr = 0.01f,
                         .momentum = with_momentum ? 0.9f : 0.0f,
                         .nesterov = variant >= 2,
                         .weight_decay = variant == 3 ? 0.01f : 0.0f};
    buf w = rnd(e, n, -1.0f, 1.0f), g = rnd(e, n, -1.0f, 1.0f), v = rnd(e, n, -1.0f, 1.0f);
    CHECK_OK(pmap_cpu_ops.sgd_step(NULL, w.h, g.h, with_momentum ? v.h : NULL, n, &h));
    CHECK_OK(e->ops->sgd_step(e->q, w.d, g.d, with_momentum ? v.d : NULL, n, &h));
    compare(e, "sgd_step w", &w, 1e-6);
    compare(e, "sgd_step v", &v, 1e-6);
    buf_free(e, &w);
    buf_free(e, &g);
    buf_free(e, &v);
  }
  buf w = rnd(e, n, -1.0f, 1.0f), g = rnd(e, n, -1.0f, 1.0f), m = rnd(e, n, -0.1f, 0.1f),
      v = rnd(e, n, 0.0f, 0.01f);
  float bc1 = 1.0f - 0.9f * 0.9f * 0.9f, bc2 = 1.0f - 0.999f * 0.999f * 0.999f;
  for (int step = 0; step < 4; step++) {
    /* Adam, then AdamW (decoupled weight decay) */
    pmap_step_hyper h = {.lr = 1e-3f,
                         .beta1 = 0.9f,
                         .beta2 = 0.999f,
                         .eps = 1e-8f,
                         .bc1 = bc1,
                         .bc2 = bc2,
                         .weight_decay = step >= 2 ? 0.01f : 0.0f};
    CHECK_OK(pmap_cpu_ops.adam_step(NULL, w.h, g.h, m.h, v.h, n, &h));
    CHECK_OK(e->ops->adam_step(e->q, w.d, g.d, m.d, v.d, n, &h));
  }
  compare(e, "adam_step w", &w, 1e-6);
  compare(e, "adam_step m", &m, 1e-6);
  compare(e, "adam_step v", &v, 1e-6);
  buf *all[] = {&w, &g, &m, &v};
  for (size_t k = 0; k < 4; k++) buf_free(e, all[k]);
}

/* The guard's and clipping's reductions: the L2 norm (one block and many, and n = 0, which
 * must write 0), the in-place scale and axpy. */
static void test_norm_scale_axpy(env *e) {
  const size_t sizes[] = {0, 1, 255, 4097, 1000003};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    buf x = rnd(e, n, -3.0f, 3.0f), norm = poisoned(e, 1);
    CHECK_OK(pmap_cpu_ops.norm2(NULL, x.h, n, norm.h));
    CHECK_OK(e->ops->norm2(e->q, x.d, n, norm.d));
    char what[64];
    snprintf(what, sizeof what, "norm2 of %zu", n);
    compare(e, what, &norm, 1e-6);
    buf_free(e, &x);
    buf_free(e, &norm);
  }
  size_t n = 300007;
  buf x = rnd(e, n, -1.0f, 1.0f), y = rnd(e, n, -1.0f, 1.0f);
  CHECK_OK(pmap_cpu_ops.scale(NULL, x.h, -0.37f, n));
  CHECK_OK(e->ops->scale(e->q, x.d, -0.37f, n));
  compare(e, "scale", &x, 0.0);
  CHECK_OK(pmap_cpu_ops.axpy(NULL, 1.75f, x.h, y.h, n));
  CHECK_OK(e->ops->axpy(e->q, 1.75f, x.d, y.d, n));
  compare(e, "axpy", &y, 1e-6); /* a fused multiply-add on the device */
  buf_free(e, &x);
  buf_free(e, &y);
}

/* The same GEMM twice gives the same bits (no atomics, no algorithm chosen per call). */
static void test_gemm_repeatable(env *e) {
  int64_t m = 256, n = 512, k = 1024;
  buf a = rnd(e, (size_t)(m * k), -1.0f, 1.0f), b = rnd(e, (size_t)(k * n), -1.0f, 1.0f);
  buf c1 = poisoned(e, (size_t)(m * n)), c2 = poisoned(e, (size_t)(m * n));
  CHECK_OK(e->ops->gemm(e->q, 0, 0, m, n, k, 1.0f, a.d, k, b.d, n, 0.0f, c1.d, n));
  CHECK_OK(e->ops->gemm(e->q, 0, 0, m, n, k, 1.0f, a.d, k, b.d, n, 0.0f, c2.d, n));
  CHECK_OK(e->dev->ctx->be->download(e->dev, c1.h, c1.d, c1.n * sizeof(float)));
  CHECK_OK(e->dev->ctx->be->download(e->dev, c2.h, c2.d, c2.n * sizeof(float)));
  test_same_bits("gemm repeated", c1.h, c2.h, c1.n);
  buf *all[] = {&a, &b, &c1, &c2};
  for (size_t k2 = 0; k2 < 4; k2++) buf_free(e, all[k2]);
}

/* ---- layers beyond dense and conv ---- */

static void test_act(env *e) {
  static const char *const names[] = {"tanh", "sigmoid", "gelu"};
  size_t n = 50021;
  for (int a = 0; a < 3; a++) {
    char what[64];
    buf x = rnd(e, n, -5.0f, 5.0f), y = poisoned(e, n), dy = rnd(e, n, -1.0f, 1.0f),
        dx = poisoned(e, n);
    CHECK_OK(pmap_cpu_ops.act_forward(NULL, (pmap_act)a, x.h, y.h, n));
    CHECK_OK(e->ops->act_forward(e->q, (pmap_act)a, x.d, y.d, n));
    snprintf(what, sizeof what, "%s forward", names[a]);
    compare(e, what, &y, 1e-6); /* device tanhf and expf may differ from the host's by an ulp */
    CHECK_OK(pmap_cpu_ops.act_backward(NULL, (pmap_act)a, x.h, y.h, dy.h, dx.h, n));
    CHECK_OK(e->ops->act_backward(e->q, (pmap_act)a, x.d, y.d, dy.d, dx.d, n));
    snprintf(what, sizeof what, "%s backward", names[a]);
    compare(e, what, &dx, 1e-5);
    buf *all[] = {&x, &y, &dy, &dx};
    for (size_t k = 0; k < 4; k++) buf_free(e, all[k]);
  }
}

static void test_add(env *e) {
  size_t n = 40009;
  buf a = rnd(e, n, -1.0f, 1.0f), b = rnd(e, n, -1.0f, 1.0f), y = poisoned(e, n);
  CHECK_OK(pmap_cpu_ops.add(NULL, a.h, b.h, y.h, n));
  CHECK_OK(e->ops->add(e->q, a.d, b.d, y.d, n));
  compare(e, "add", &y, 0.0);
  CHECK_OK(pmap_cpu_ops.add(NULL, a.h, b.h, a.h, n));
  CHECK_OK(e->ops->add(e->q, a.d, b.d, a.d, n));
  compare(e, "add in place", &a, 0.0);
  buf *all[] = {&a, &b, &y};
  for (size_t k = 0; k < 3; k++) buf_free(e, all[k]);
}

static void test_layernorm(env *e) {
  static const int64_t shapes[][2] = {{1, 1}, {7, 33}, {64, 1000}, {300, 17}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    int64_t rows = shapes[i][0], f = shapes[i][1];
    size_t n = (size_t)(rows * f);
    buf x = rnd(e, n, -2.0f, 3.0f), g = rnd(e, (size_t)f, 0.5f, 1.5f),
        b = rnd(e, (size_t)f, -1.0f, 1.0f), y = poisoned(e, n), st = poisoned(e, 2 * (size_t)rows);
    CHECK_OK(pmap_cpu_ops.layernorm_forward(NULL, x.h, g.h, b.h, rows, f, 1e-5f, y.h, st.h));
    CHECK_OK(e->ops->layernorm_forward(e->q, x.d, g.d, b.d, rows, f, 1e-5f, y.d, st.d));
    compare(e, "layernorm forward", &y, 1e-5);
    compare(e, "layernorm stats", &st, 1e-5);
    /* Backward from the CPU's stats on both sides; dgamma and dbeta accumulate onto the same
     * random values. */
    upload(e, &st);
    buf dy = rnd(e, n, -1.0f, 1.0f), dx = poisoned(e, n), dg = rnd(e, (size_t)f, -1.0f, 1.0f),
        db = rnd(e, (size_t)f, -1.0f, 1.0f);
    CHECK_OK(
        pmap_cpu_ops.layernorm_backward(NULL, x.h, g.h, st.h, dy.h, rows, f, dx.h, dg.h, db.h));
    CHECK_OK(e->ops->layernorm_backward(e->q, x.d, g.d, st.d, dy.d, rows, f, dx.d, dg.d, db.d));
    compare(e, "layernorm dx", &dx, 1e-5);
    compare(e, "layernorm dgamma (accumulated)", &dg, 1e-5);
    compare(e, "layernorm dbeta (accumulated)", &db, 1e-5);
    buf *all[] = {&x, &g, &b, &y, &st, &dy, &dx, &dg, &db};
    for (size_t k = 0; k < 9; k++) buf_free(e, all[k]);
  }
}

static void test_pool(env *e) {
  /* c, h, w, kernel, stride: overlapping, tiling, global */
  static const int pools[][5] = {{3, 17, 15, 3, 2}, {16, 32, 32, 2, 2}, {8, 7, 7, 7, 1}};
  int64_t bd = 5;
  for (size_t i = 0; i < sizeof pools / sizeof *pools; i++)
    for (int is_max = 0; is_max < 2; is_max++) {
      const int *q = pools[i];
      pmap_pool_shape s = {q[0], q[1], q[2], (q[1] - q[3]) / q[4] + 1, (q[2] - q[3]) / q[4] + 1,
                           q[3], q[3], q[4]};
      size_t nx = (size_t)(bd * s.c * s.h * s.w), ny = (size_t)(bd * s.c * s.oh * s.ow);
      buf x = rnd(e, nx, -1.0f, 1.0f), y = poisoned(e, ny), dy = rnd(e, ny, -1.0f, 1.0f),
          dx = poisoned(e, nx);
      CHECK_OK(pmap_cpu_ops.pool2d_forward(NULL, is_max, &s, bd, x.h, y.h));
      CHECK_OK(e->ops->pool2d_forward(e->q, is_max, &s, bd, x.d, y.d));
      compare(e, is_max ? "maxpool forward" : "avgpool forward", &y, 1e-6);
      CHECK_OK(pmap_cpu_ops.pool2d_backward(NULL, is_max, &s, bd, x.h, dy.h, dx.h));
      CHECK_OK(e->ops->pool2d_backward(e->q, is_max, &s, bd, x.d, dy.d, dx.d));
      compare(e, is_max ? "maxpool backward" : "avgpool backward", &dx, 1e-6);
      buf *all[] = {&x, &y, &dy, &dx};
      for (size_t k = 0; k < 4; k++) buf_free(e, all[k]);
    }
}

/* The same mask bit for bit: the hash is integer arithmetic on both sides. */
static void test_dropout(env *e) {
  size_t n = 100003;
  buf x = rnd(e, n, -1.0f, 1.0f), y = poisoned(e, n), dx = poisoned(e, n);
  CHECK_OK(pmap_cpu_ops.dropout_forward(NULL, x.h, y.h, n, 0.3f, 0xfeedull, 12345));
  CHECK_OK(e->ops->dropout_forward(e->q, x.d, y.d, n, 0.3f, 0xfeedull, 12345));
  compare(e, "dropout forward", &y, 0.0);
  CHECK_OK(pmap_cpu_ops.dropout_backward(NULL, x.h, dx.h, n, 0.3f, 0xfeedull, 12345));
  CHECK_OK(e->ops->dropout_backward(e->q, x.d, dx.d, n, 0.3f, 0xfeedull, 12345));
  compare(e, "dropout backward", &dx, 0.0);
  buf *all[] = {&x, &y, &dx};
  for (size_t k = 0; k < 3; k++) buf_free(e, all[k]);
}

static void test_batchnorm(env *e) {
  static const int64_t shapes[][3] = {{64, 100, 1}, {8, 16, 1024}, {3, 5, 49}};
  for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
    int64_t outer = shapes[i][0], c = shapes[i][1], inner = shapes[i][2];
    size_t n = (size_t)(outer * c * inner), C = (size_t)c;
    buf x = rnd(e, n, -1.0f, 3.0f), g = rnd(e, C, 0.5f, 1.5f), b = rnd(e, C, -1.0f, 1.0f);
    buf first = poisoned(e, 3 * C + 1), st = poisoned(e, 3 * C + 1);
    buf run = rnd(e, 2 * C, 0.5f, 1.5f), y = poisoned(e, n);
    CHECK_OK(pmap_cpu_ops.bn_stats(NULL, x.h, outer, c, inner, NULL, first.h));
    CHECK_OK(e->ops->bn_stats(e->q, x.d, outer, c, inner, NULL, first.d));
    compare(e, "bn_stats, first pass", &first, 1e-6);
    upload(e, &first); /* the same statistics on both sides from here */
    CHECK_OK(pmap_cpu_ops.bn_stats(NULL, x.h, outer, c, inner, first.h, st.h));
    CHECK_OK(e->ops->bn_stats(e->q, x.d, outer, c, inner, first.d, st.d));
    compare(e, "bn_stats, around the first pass's mean", &st, 1e-5);
    upload(e, &st);
    CHECK_OK(pmap_cpu_ops.bn_forward(NULL, x.h, st.h, st.h, run.h, g.h, b.h, outer, c, inner, 1e-5f,
                                     0.9f, 1, y.h));
    CHECK_OK(e->ops->bn_forward(e->q, x.d, st.d, st.d, run.d, g.d, b.d, outer, c, inner, 1e-5f,
                                0.9f, 1, y.d));
    compare(e, "bn_forward training", &y, 1e-5);
    compare(e, "bn_forward running statistics", &run, 1e-6);
    buf yi = poisoned(e, n);
    CHECK_OK(pmap_cpu_ops.bn_forward(NULL, x.h, NULL, NULL, run.h, g.h, b.h, outer, c, inner, 1e-5f,
                                     0.9f, 0, yi.h));
    CHECK_OK(e->ops->bn_forward(e->q, x.d, NULL, NULL, run.d, g.d, b.d, outer, c, inner, 1e-5f,
                                0.9f, 0, yi.d));
    compare(e, "bn_forward inference", &yi, 1e-5);
    buf dy = rnd(e, n, -1.0f, 1.0f), sums = poisoned(e, 2 * C), dx = poisoned(e, n);
    CHECK_OK(pmap_cpu_ops.bn_backward_sums(NULL, x.h, dy.h, st.h, outer, c, inner, 1e-5f, sums.h));
    CHECK_OK(e->ops->bn_backward_sums(e->q, x.d, dy.d, st.d, outer, c, inner, 1e-5f, sums.d));
    compare(e, "bn_backward_sums", &sums, 1e-5);
    upload(e, &sums);
    CHECK_OK(pmap_cpu_ops.bn_backward_dx(NULL, x.h, dy.h, st.h, g.h, sums.h, outer, c, inner, 1e-5f,
                                         dx.h));
    CHECK_OK(
        e->ops->bn_backward_dx(e->q, x.d, dy.d, st.d, g.d, sums.d, outer, c, inner, 1e-5f, dx.d));
    compare(e, "bn_backward_dx", &dx, 1e-5);
    buf *all[] = {&x, &g, &b, &first, &st, &run, &y, &yi, &dy, &sums, &dx};
    for (size_t k = 0; k < 11; k++) buf_free(e, all[k]);
  }
}

static pmap_status queue_alloc(void *owner, size_t bytes, void **out) {
  return backend_alloc(owner, bytes, out);
}
static void queue_free(void *owner, void *ptr) { backend_free(owner, ptr); }

static pmap_status ops_job(pmap_device *dev, void *arg) {
  env *e = arg;
  e->dev = dev;
  const op_backend *ob = NULL;
  PMAP_TRY(ops_backend("cuda", "test_gpu_ops", &ob));
  op_queue_init init = {0,  pmap_device_stream(dev), pmap_device_blas(dev), queue_alloc, queue_free,
                        dev};
  PMAP_TRY(ob->queue_create(&init, &e->q));
  e->ops = ob->ops;
  test_fill_op(e);
  test_gemm(e);
  test_gemm_repeatable(e);
  test_bias(e);
  test_relu(e);
  test_conv(e);
  test_mse(e);
  test_xent(e);
  test_optimizers(e);
  test_norm_scale_axpy(e);
  test_act(e);
  test_add(e);
  test_layernorm(e);
  test_pool(e);
  test_dropout(e);
  test_batchnorm(e);
  PMAP_TRY(backend_sync(dev));
  ob->queue_destroy(e->q);
  return PMAP_SUCCESS;
}

int main(void) {
  int gpus = gpu_count();
  if (gpus == 0) return GPU_SKIP;
  if (gpus < 0) return 1;
  pmap_ctx *ctx = NULL;
  if (gpu_ctx(1, 1, 0.0, &ctx) != PMAP_SUCCESS) return test_exit("gpu_ops");
  /* gpu_count() left PMAP_CUDA_TF32 set: "0" unless the caller asked for TF32. */
  const char *tf32 = getenv("PMAP_CUDA_TF32");
  env e = {NULL, NULL, NULL, 0x5eedull, tf32 && strcmp(tf32, "0") != 0 ? 5e-3 : 2e-5};
  CHECK_OK(pmap_run(ctx, ops_job, &e));
  pmap_ctx_destroy(ctx);
  return test_exit("gpu_ops");
}
