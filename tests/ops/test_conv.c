/* test_conv.c: the CPU convolutions' two paths (ops/cpu/conv.h), oneDNN's primitives and
 * im2col + GEMM: each forced in turn runs the op harness's convolution cases (float64
 * references, finite differences, the same bits twice); on the same random data the two agree
 * within twice the harness's bound of a float sum of their reduction length (each is within it
 * of float64); cifar-cnn's shapes
 * take oneDNN's primitives where the build has them; and a training run of cifar-cnn on two
 * devices gives the same bits in a fresh context and in a fresh process (oneDNN's primitives are
 * made anew in each: its single-threaded convolutions sum in a fixed order), also with each
 * shape on its own path (auto: the child reads the choices from the cache the parent wrote).
 * Bad PMAP_CONV values are refused by name.
 *
 *   test_conv               the checks
 *   test_conv --train-hash  the training run alone: prints its parameters' hash */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ops/cpu/conv.h"
#include "ops/cpu/cpu_cache.h"
#include "ops/cpu/cpu_ops.h"
#include "pmap_examples.h"

static int failures;

#define EXPECT(cond, ...)                    \
  do {                                       \
    if (!(cond)) {                           \
      failures++;                            \
      fprintf(stderr, "FAIL: " __VA_ARGS__); \
      fprintf(stderr, "\n");                 \
    }                                        \
  } while (0)

/* ---- the two paths on the same data ---- */

static uint64_t rng = 99;
static float uniform(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

typedef struct outs {
  float *y, *dx, *dw, *db;
} outs;

/* On one path: the forward with bias and ReLU (relu_y NULL), or the backward through the ReLU
 * whose output relu_y is. */
static void run_path(const char *path, const pmap_conv_shape *s, int64_t bd, const float *x,
                     const float *w, const float *b, const float *relu_y, const float *dy,
                     outs *o) {
  size_t nw = (size_t)(s->oc * s->c * s->kh * s->kw);
  size_t ncol = (size_t)(s->c * s->kh * s->kw * s->oh * s->ow);
  float *col = calloc(ncol + 1, sizeof *col), *dcol = calloc(ncol + 1, sizeof *dcol);
  memset(o->dw, 0, nw * sizeof *o->dw);
  memset(o->db, 0, (size_t)s->oc * sizeof *o->db);
  EXPECT(cpu_conv_force(path) == PMAP_SUCCESS, "forcing %s: %s", path, pmap_last_error());
  if (!relu_y)
    EXPECT(pmap_cpu_ops.conv2d_forward(NULL, s, bd, x, w, b, 1, o->y, col) == PMAP_SUCCESS,
           "%s forward: %s", path, pmap_last_error());
  else
    EXPECT(pmap_cpu_ops.conv2d_backward(NULL, s, bd, x, w, relu_y, dy, o->dx, o->dw, o->db, col,
                                        dcol) == PMAP_SUCCESS,
           "%s backward: %s", path, pmap_last_error());
  free(col);
  free(dcol);
}

/* ||a - b|| <= tol max(||b||, scale sqrt(n)), NaN and infinities nowhere; the measured
 * relative difference over tol. */
static double agree(const char *what, const float *a, const float *b, size_t n, double tol,
                    double scale) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    EXPECT(isfinite(a[i]) && isfinite(b[i]), "%s: element %zu not finite: %g, %g", what, i,
           (double)a[i], (double)b[i]);
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  double ref = fmax(sqrt(den), scale * sqrt((double)n));
  EXPECT(sqrt(num) <= tol * ref, "%s: the paths differ by %.3g relative (bound %.3g)", what,
         sqrt(num) / ref, tol);
  return sqrt(num) / ref / tol;
}

static void compare_paths(void) {
  /* bd, c, h, w, oc, k, stride, pad: cifar-cnn's three layers, odd sizes, 1x1, large channels,
   * and rows whose input and output pass CPU_CONV_PIECE_BYTES (oneDNN's path runs them in pieces
   * of 16, 16 and 15 rows, the weight and bias gradients summed over the pieces) */
  static const int shapes[][8] = {{16, 3, 32, 32, 16, 3, 1, 1},  {16, 16, 32, 32, 32, 3, 2, 1},
                                  {16, 32, 16, 16, 32, 3, 2, 0}, {3, 33, 9, 7, 40, 3, 2, 1},
                                  {2, 64, 6, 6, 96, 1, 1, 0},    {5, 5, 11, 13, 7, 5, 3, 2},
                                  {47, 32, 24, 24, 48, 3, 1, 1}};
  for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
    const int *g = shapes[t];
    pmap_conv_shape s = {g[1],
                         g[2],
                         g[3],
                         g[4],
                         (g[2] + 2 * g[7] - g[5]) / g[6] + 1,
                         (g[3] + 2 * g[7] - g[5]) / g[6] + 1,
                         g[5],
                         g[5],
                         g[6],
                         g[7]};
    int64_t bd = g[0];
    size_t nx = (size_t)(bd * s.c * s.h * s.w), ny = (size_t)(bd * s.oc * s.oh * s.ow);
    size_t nw = (size_t)(s.oc * s.c * s.kh * s.kw);
    float *x = malloc(nx * 4), *w = malloc(nw * 4), *b = malloc((size_t)s.oc * 4);
    float *dy = malloc(ny * 4);
    for (size_t i = 0; i < nx; i++) x[i] = uniform();
    for (size_t i = 0; i < nw; i++) w[i] = uniform();
    for (int64_t i = 0; i < s.oc; i++) b[i] = uniform();
    for (size_t i = 0; i < ny; i++) dy[i] = uniform();
    outs o[2];
    for (int p = 0; p < 2; p++)
      o[p] = (outs){malloc(ny * 4), malloc(nx * 4), malloc(nw * 4), malloc((size_t)s.oc * 4)};
    run_path("im2col", &s, bd, x, w, b, NULL, dy, &o[0]);
    if (strstr(cpu_conv_paths(), "onednn")) {
      run_path("onednn", &s, bd, x, w, b, NULL, dy, &o[1]);
      /* Both backward passes through im2col's ReLU output: where the paths' y straddle 0 (one
       * element in a million here) their masks would differ by a whole term, not by rounding. */
      run_path("im2col", &s, bd, x, w, b, o[0].y, dy, &o[0]);
      run_path("onednn", &s, bd, x, w, b, o[0].y, dy, &o[1]);
      /* Float sums of c kh kw products and the bias (y), oc kh kw (dx), bd oh ow (dw, db) of
       * values in [-1, 1), at their rms scale: each path within bound_sum of its length of
       * float64 (the harness's model, case_conv.c), two orders within twice that. */
      double ckk = (double)(s.c * s.kh * s.kw), okk = (double)(s.oc * s.kh * s.kw);
      double pix = (double)(bd * s.oh * s.ow);
      char what[96];
      double r[4];
      snprintf(what, sizeof what, "shape %zu y", t);
      r[0] = agree(what, o[1].y, o[0].y, ny, 2.0 * bound_sum(ckk + 1.0), sqrt(ckk) / 3.0);
      snprintf(what, sizeof what, "shape %zu dx", t);
      r[1] = agree(what, o[1].dx, o[0].dx, nx, 2.0 * bound_sum(okk), sqrt(okk) / 3.0);
      snprintf(what, sizeof what, "shape %zu dw", t);
      r[2] = agree(what, o[1].dw, o[0].dw, nw, 2.0 * bound_sum(pix), sqrt(pix) / 3.0);
      snprintf(what, sizeof what, "shape %zu db", t);
      r[3] = agree(what, o[1].db, o[0].db, (size_t)s.oc, 2.0 * bound_sum(pix), sqrt(pix) / 3.0);
      printf(
          "shape %zu: oneDNN against im2col, y %.3f, dx %.3f, dw %.3f, db %.3f of their "
          "bounds (%.2g, %.2g, %.2g, %.2g)\n",
          t, r[0], r[1], r[2], r[3], 2.0 * bound_sum(ckk + 1.0), 2.0 * bound_sum(okk),
          2.0 * bound_sum(pix), 2.0 * bound_sum(pix));
      if (t < 3) EXPECT(conv_dnnl_serves(NULL, &s, bd), "cifar-cnn's layer %zu runs on im2col", t);
      if (t == 6) EXPECT(conv_dnnl_serves(NULL, &s, bd), "the shape cut in pieces runs on im2col");
    }
    for (int p = 0; p < 2; p++) free(o[p].y), free(o[p].dx), free(o[p].dw), free(o[p].db);
    free(x), free(w), free(b), free(dy);
  }
  /* The workspace of this thread's cache, grown to the largest shape's need: the last one's
   * rows whole would take 8.7 MB of input and output; in pieces of 16 rows 2.9 MB, within the
   * bound, with 1 MiB of room above it for the weights' layouts (three copies of 55 kB here) and
   * oneDNN's scratchpad. */
  size_t ws = cpu_cache_workspace_bytes(cpu_cache_of(NULL));
  printf("conv workspace of this thread: %zu bytes\n", ws);
  if (strstr(cpu_conv_paths(), "onednn"))
    EXPECT(ws <= CPU_CONV_PIECE_BYTES + ((size_t)1 << 20),
           "the convolutions' workspace holds %zu bytes, over the pieces' bound %zu + 1 MiB", ws,
           CPU_CONV_PIECE_BYTES);
}

/* ---- a training run, twice ---- */

/* FNV-1a of cifar-cnn's parameters after 4 SGD steps on 2 devices (global batch 16). */
static uint64_t train_hash(void) {
  pmap_model *m = NULL;
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  uint64_t h = 1469598103934665603ull;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  if (pmap_example_info_get("cifar-cnn", &info) || pmap_example_model("cifar-cnn", &m) ||
      pmap_ctx_create(&cfg, &ctx) || pmap_params_create(ctx, m, &info.opt, 5, &p) ||
      pmap_example_data("cifar-cnn", 5, 16, &xs, &ys)) {
    EXPECT(0, "the training run: %s", pmap_last_error());
    h = 0;
  }
  for (int step = 0; h && step < 4; step++)
    EXPECT(pmap_update(p, &xs, &ys, NULL) == PMAP_SUCCESS, "step %d: %s", step, pmap_last_error());
  size_t n = p ? pmap_params_count(p) : 0;
  float *w = calloc(n + 1, sizeof *w);
  for (int d = 0; h && d < 2; d++) {
    EXPECT(pmap_params_read(p, d, w, n) == PMAP_SUCCESS, "read: %s", pmap_last_error());
    const unsigned char *c = (const unsigned char *)w;
    for (size_t i = 0; i < n * sizeof *w; i++) h = (h ^ c[i]) * 1099511628211ull;
  }
  free(w);
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_ctx_destroy(ctx);
  pmap_model_destroy(m);
  return h;
}

static void check_reproducible(const char *self) {
  uint64_t a = train_hash(), b = train_hash();
  EXPECT(a && a == b, "two runs in one process: %016llx, %016llx", (unsigned long long)a,
         (unsigned long long)b);
  char cmd[4200], line[64] = "";
  snprintf(cmd, sizeof cmd, "'%s' --train-hash", self);
  FILE *f = popen(cmd, "r");
  EXPECT(f && fgets(line, sizeof line, f), "cannot run %s", cmd);
  if (f) EXPECT(pclose(f) == 0, "%s failed", cmd);
  unsigned long long c = strtoull(line, NULL, 16);
  EXPECT(c == a, "a run in another process: %016llx, here %016llx", c, (unsigned long long)a);
  printf("conv path %s: cifar-cnn's run %016llx in both processes\n", cpu_conv_path(),
         (unsigned long long)a);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 2 && !strcmp(argv[1], "--train-hash")) {
    printf("%016llx\n", (unsigned long long)train_hash());
    return failures ? 1 : 0;
  }
  /* Each path forced, then each shape's own choice (auto: im2col alone without oneDNN). */
  const char *paths[] = {"onednn", "im2col", "auto"};
  for (int i = 0; i < 3; i++) {
    if (i < 2 && !strstr(cpu_conv_paths(), paths[i])) {
      EXPECT(cpu_conv_force(paths[i]) == PMAP_ERR_UNAVAILABLE, "forcing %s, not built", paths[i]);
      printf("conv path %s: not built\n", paths[i]);
      continue;
    }
    EXPECT(cpu_conv_force(paths[i]) == PMAP_SUCCESS, "forcing %s", paths[i]);
    const char *want = i < 2 || strstr(cpu_conv_paths(), "onednn") ? paths[i] : "im2col";
    EXPECT(!strcmp(cpu_conv_path(), want), "forced %s, in use %s", paths[i], cpu_conv_path());
    hx_opts o = {.only = "conv2d_forward,conv2d_backward", .seed = 11, .verbose = 1};
    int checks = 0, fails = 0;
    int r = hx_backend_run("cpu", &o, &checks, &fails);
    EXPECT(r == 1 && checks > 1000, "conv path %s: %d of %d checks failed", paths[i], fails,
           checks);
    printf("conv path %s: %d harness checks, %d failed\n", paths[i], checks, fails);
    setenv("PMAP_CONV", paths[i], 1); /* the child's path */
    check_reproducible(argv[0]);
  }
  compare_paths();
  EXPECT(cpu_conv_force("bogus") == PMAP_ERR_INVALID_ARGUMENT && strstr(pmap_last_error(), "bogus"),
         "forcing bogus: %s", pmap_last_error());
  printf("test_conv: %s\n", failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
