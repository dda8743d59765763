/* simd_check.c: the CPU kernels' SIMD builds (ops/cpu/cpu_ops.h, CPU_KERNEL) give the same
 * bits. tests/ops/meson.build compiles the kernel files with this driver once per target, each
 * copy built for that target alone (CPU_SIMD_ONLY / CPU_SIMD_BASELINE) and linked in place of
 * the library's clones; every copy runs every cloned kernel through the op table on the same
 * data (random values with NaN, infinities, denormals, signed zeros and values past exp's range,
 * at sizes that leave vector tails), and the baseline's copy compares the others' results with
 * its own, bit for bit (a NaN against any NaN).
 *
 *   simd_check --dump              write this target's results to stdout (exit 77: this CPU
 *                                  cannot run the target)
 *   simd_check --compare PROG...   run each PROG --dump and compare it with this one's */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "ops/cpu/conv.h"
#include "ops/cpu/cpu_ops.h"

#ifndef SIMD_TARGET
#define SIMD_TARGET "baseline"
#endif

/* ---- the results: records of (name, floats) in memory ---- */

typedef struct rec {
  char name[64];
  size_t n;
  float *v;
} rec;

static rec *recs;
static int nrecs, caprecs;

static void keep(const char *name, const float *v, size_t n) {
  if (nrecs == caprecs) {
    caprecs = caprecs ? 2 * caprecs : 64;
    recs = realloc(recs, (size_t)caprecs * sizeof *recs);
    if (!recs) exit(2);
  }
  rec *r = &recs[nrecs++];
  snprintf(r->name, sizeof r->name, "%s", name);
  r->n = n;
  r->v = malloc(n * sizeof *r->v + 1);
  if (!r->v) exit(2);
  if (n) memcpy(r->v, v, n * sizeof *v);
}

/* ---- data ---- */

static uint64_t rng = 0x5eed5eedull;
static uint32_t next_u32(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}
static float uniform(float lo, float hi) {
  return lo + (hi - lo) * (float)(next_u32() & 0xffffff) / 16777216.0f;
}

/* x (n): uniform in [lo, hi), every 13th element one of the special values. */
static void fill(float *x, size_t n, float lo, float hi) {
  static const float special[] = {NAN,    -NAN,    INFINITY, -INFINITY, 1e-40f,  -3e-42f,
                                  0.0f,   -0.0f,   1e30f,    -1e30f,    1e-30f,  1.17549435e-38f,
                                  88.75f, -104.0f, 10.0f,    -10.0f,    3.4e38f, -0.5f};
  for (size_t i = 0; i < n; i++)
    x[i] = i % 13 == 5 ? special[next_u32() % (sizeof special / sizeof *special)] : uniform(lo, hi);
}

static float *arr(size_t n) {
  float *p = calloc(n + 1, sizeof *p);
  if (!p) exit(2);
  return p;
}
static float *filled(size_t n, float lo, float hi) {
  float *p = arr(n);
  fill(p, n, lo, hi);
  return p;
}

/* ---- the kernels ---- */

#define N 1037 /* not a multiple of any vector width: every loop has a tail */
#define OPS pmap_cpu_ops

/* Keeps n values of out under name after the op call `run` (which must succeed). */
#define KEEP(name, run, out, n)         \
  do {                                  \
    if ((run) != PMAP_SUCCESS) exit(2); \
    keep((name), (out), (n));           \
  } while (0)

static void elementwise(void) {
  float *x = filled(N, -4, 4), *y = filled(N, -4, 4), *dy = filled(N, -2, 2), *o = arr(N);
  float *b = filled(61, -1, 1), *db = arr(61), *z = arr(N), r = 0.0f;
  pmap_bf16 *h16 = (pmap_bf16 *)(void *)arr(N / 2 + 1); /* the fused ops' bf16 copies */
  KEEP("fill", OPS.fill(NULL, o, 1.5f, N), o, N);
  memcpy(o, x, sizeof(float) * N);
  KEEP("bias rows", OPS.bias_forward(NULL, o, b, 17, 61, 1), o, 17 * 61);
  memcpy(o, x, sizeof(float) * N);
  KEEP("bias planes", OPS.bias_forward(NULL, o, b, 3, 61, 5), o, 3 * 61 * 5);
  KEEP("bias_backward rows", OPS.bias_backward(NULL, x, db, 17, 61, 1), db, 61);
  KEEP("bias_backward planes", OPS.bias_backward(NULL, x, db, 3, 61, 5), db, 61);
  KEEP("relu", OPS.relu_forward(NULL, x, o, N), o, N);
  KEEP("relu_backward", OPS.relu_backward(NULL, y, dy, o, N), o, N);
  KEEP("add", OPS.add(NULL, x, y, o, N), o, N);
  memcpy(o, x, sizeof(float) * N);
  KEEP("scale", OPS.scale(NULL, o, 0.3f, N), o, N);
  memcpy(o, y, sizeof(float) * N);
  KEEP("axpy", OPS.axpy(NULL, -0.7f, x, o, N), o, N);
  KEEP("norm2", OPS.norm2(NULL, x, N, &r), &r, 1);
  KEEP("norm2 (finite part)", OPS.norm2(NULL, y + 100, 500, &r), &r, 1);
  KEEP("mse dpred", OPS.mse(NULL, x, y, N, o, &r), o, N);
  keep("mse loss", &r, 1);
  static const char *const act[] = {"tanh", "sigmoid", "gelu", "relu"};
  char name[64];
  for (int a = 0; a < 4; a++) {
    snprintf(name, sizeof name, "act %s", act[a]);
    KEEP(name, OPS.act_forward(NULL, (pmap_act)a, x, o, N), o, N);
    snprintf(name, sizeof name, "act_backward %s", act[a]);
    KEEP(name, OPS.act_backward(NULL, (pmap_act)a, x, o, dy, z, N), z, N);
    memcpy(o, x, sizeof(float) * N);
    snprintf(name, sizeof name, "bias_act %s", act[a]);
    KEEP(name, OPS.bias_act_forward(NULL, (pmap_act)a, o, b, 17, 61, z, h16, NULL), o, 17 * 61);
    keep(name, z, 17 * 61);
    keep(name, (float *)(void *)h16, 17 * 61 / 2);
    memset(db, 0, 61 * sizeof *db);
    snprintf(name, sizeof name, "act_bias_backward %s", act[a]);
    KEEP(name, OPS.act_bias_backward(NULL, (pmap_act)a, x, y, dy, o, db, 17, 61, h16, NULL), o,
         17 * 61);
    keep(name, db, 61);
    keep(name, (float *)(void *)h16, 17 * 61 / 2);
  }
  /* GELU's kept slope (into y itself), and the backward's product with it. */
  memcpy(o, x, sizeof(float) * N);
  KEEP("bias_act gelu slope", OPS.bias_act_forward(NULL, PMAP_ACT_GELU, o, b, 17, 61, z, h16, o), o,
       17 * 61);
  keep("bias_act gelu slope", z, 17 * 61);
  memset(db, 0, 61 * sizeof *db);
  float *dx = arr(N);
  KEEP("act_bias_backward gelu slope",
       OPS.act_bias_backward(NULL, PMAP_ACT_GELU, NULL, y, dy, dx, db, 17, 61, h16, o), dx,
       17 * 61);
  keep("act_bias_backward gelu slope", db, 61);
  /* The transcendentals' tails and clamps too (GELU's e held at 2^-126 below x ~ -10.2, its
   * clamps at -12 and 10.5, tanh's and sigmoid's saturation). */
  float *xw = filled(N, -24, 24);
  for (int a = 0; a < 3; a++) {
    snprintf(name, sizeof name, "act %s (wide)", act[a]);
    KEEP(name, OPS.act_forward(NULL, (pmap_act)a, xw, o, N), o, N);
    snprintf(name, sizeof name, "act_backward %s (wide)", act[a]);
    KEEP(name, OPS.act_backward(NULL, (pmap_act)a, xw, o, dy, z, N), z, N);
  }
  free(xw);
  free(x), free(y), free(dy), free(o), free(b), free(db), free(z), free(h16), free(dx);
}

static void optimizers(void) {
  float *w = filled(N, -2, 2), *g = filled(N, -1, 1), *v = filled(N, -1, 1), *m = filled(N, -1, 1);
  float *v2 = arr(N);
  for (size_t i = 0; i < N; i++) v2[i] = v[i] * v[i]; /* Adam's second moment is not negative */
  pmap_step_hyper plain = {.lr = 0.01f};
  pmap_step_hyper mom = {.lr = 0.01f, .momentum = 0.9f, .nesterov = 1, .weight_decay = 1e-4f};
  pmap_step_hyper adam = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
  adam.bc1 = 0.1f, adam.bc2 = 0.001f;
  KEEP("sgd", OPS.sgd_step(NULL, w, g, v, NULL, N, &plain), w, N);
  KEEP("sgd momentum", OPS.sgd_step(NULL, w, g, v, NULL, N, &mom), w, N);
  keep("sgd velocity", v, N);
  KEEP("adam", OPS.adam_step(NULL, w, g, m, v2, NULL, N, &adam), w, N);
  keep("adam m", m, N);
  adam.weight_decay = 0.01f;
  KEEP("adamw", OPS.adam_step(NULL, w, g, m, v2, NULL, N, &adam), w, N);
  keep("adamw v", v2, N);
  /* The bf16 copy of the updated weights, its bits kept as floats two to one. */
  pmap_bf16 *w16 = (pmap_bf16 *)(void *)arr(N / 2 + 1);
  KEEP("sgd momentum w16", OPS.sgd_step(NULL, w, g, v, w16, N, &mom), (float *)(void *)w16, N / 2);
  KEEP("adamw w16", OPS.adam_step(NULL, w, g, m, v2, w16, N, &adam), (float *)(void *)w16, N / 2);
  free(w), free(g), free(v), free(m), free(v2), free(w16);
}

static void rows(void) {
  enum { R = 13, F = 77, C = 11, IN = 19, NB = 3 * C * IN };
  float *x = filled(R * F, -3, 3), *dy = filled(R * F, -1, 1), *ga = filled(F, 0, 2);
  float *be = filled(F, -1, 1), *y = arr(R * F), *st = arr(2 * R), *dg = arr(F), *dbe = arr(F);
  pmap_bf16 *y16 = (pmap_bf16 *)(void *)arr(R * F / 2 + 1);
  KEEP("layernorm", OPS.layernorm_forward(NULL, x, ga, be, R, F, 1e-5f, y, st, y16), y, R * F);
  keep("layernorm y16", (float *)(void *)y16, R * F / 2);
  keep("layernorm stats", st, 2 * R);
  KEEP("layernorm dx", OPS.layernorm_backward(NULL, x, ga, st, dy, R, F, y, dg, dbe), y, R * F);
  keep("layernorm dgamma", dg, F);
  keep("layernorm dbeta", dbe, F);
  int32_t labels[R];
  for (int r = 0; r < R; r++) labels[r] = (int32_t)(next_u32() % F);
  float loss = 0.0f;
  KEEP("xent", OPS.softmax_xent(NULL, x, labels, R, F, y, &loss), y, R * F);
  keep("xent loss", &loss, 1);
  /* batch norm over (3, C, IN) */
  float *bx = filled(NB, -2, 2), *bdy = filled(NB, -1, 1), *s1 = arr(3 * C + 1);
  float *s2 = arr(3 * C + 1), *run = arr(2 * C), *by = arr(NB), *sums = arr(2 * C);
  KEEP("bn_stats", OPS.bn_stats(NULL, bx, 3, C, IN, NULL, s1), s1, 3 * C + 1);
  KEEP("bn_stats shifted", OPS.bn_stats(NULL, bx, 3, C, IN, s1, s2), s2, 3 * C + 1);
  KEEP("bn_forward", OPS.bn_forward(NULL, bx, s2, s2, run, ga, be, 3, C, IN, 1e-5f, 0.9f, 1, by),
       by, NB);
  keep("bn running", run, 2 * C);
  KEEP("bn sums", OPS.bn_backward_sums(NULL, bx, bdy, s2, 3, C, IN, 1e-5f, sums), sums, 2 * C);
  KEEP("bn dx", OPS.bn_backward_dx(NULL, bx, bdy, s2, ga, sums, 3, C, IN, 1e-5f, by), by, NB);
  free(x), free(dy), free(ga), free(be), free(y), free(st), free(dg), free(dbe);
  free(bx), free(bdy), free(s1), free(s2), free(run), free(by), free(sums), free(y16);
}

static void windows(void) {
  enum { NX = 2 * 3 * 10 * 12 };
  pmap_pool_shape tiled = {3, 10, 12, 5, 6, 2, 2, 2}, over = {3, 10, 12, 4, 5, 3, 3, 2};
  float *x = filled(NX, -3, 3), *dy = filled(2 * 3 * 5 * 6, -1, 1);
  float *y = arr(2 * 3 * 5 * 6), *dx = arr(NX), *d = arr(NX);
  const pmap_pool_shape *ps[] = {&tiled, &over};
  char name[64];
  for (int is_max = 0; is_max < 2; is_max++)
    for (int k = 0; k < 2; k++) {
      snprintf(name, sizeof name, "pool %s %s", is_max ? "max" : "mean", k ? "overlap" : "tiled");
      size_t ny = (size_t)(2 * 3 * ps[k]->oh * ps[k]->ow);
      KEEP(name, OPS.pool2d_forward(NULL, is_max, ps[k], 2, x, y), y, ny);
      KEEP(name, OPS.pool2d_backward(NULL, is_max, ps[k], 2, x, dy, dx), dx, NX);
    }
  KEEP("dropout", OPS.dropout_forward(NULL, x, d, NX, 0.3f, 1234, 77), d, NX);
  KEEP("dropout backward", OPS.dropout_backward(NULL, x, d, NX, 0.3f, 1234, 77), d, NX);
  /* causal softmax of 3 (21, 21) matrices (rows of 1 to 21 columns: the kernels' partial sums
   * of 8 and the columns after them), embeddings */
  enum { ST = 21, SN = 3 * ST * ST };
  float *sx = filled(SN, -6, 6), *sy = arr(SN), *sdx = arr(SN), *sdy = filled(SN, -1, 1);
  pmap_bf16 *s16 = (pmap_bf16 *)(void *)arr(SN / 2 + 1),
            *d16 = (pmap_bf16 *)(void *)arr(SN / 2 + 1);
  KEEP("causal softmax",
       OPS.causal_softmax_forward(NULL, sx, sy, 3, ST, ST, 0, 0.5f, s16, NULL, NULL), sy, SN);
  keep("causal softmax y16", (float *)(void *)s16, SN / 2);
  KEEP("causal softmax dx",
       OPS.causal_softmax_backward(NULL, sy, sdy, sdx, 3, ST, ST, 0, 0.5f, NULL, NULL), sdx, SN);
  KEEP("causal softmax dx from y16",
       OPS.causal_softmax_backward(NULL, NULL, sdy, sdx, 3, ST, ST, 0, 0.5f, s16, d16), sdx, SN);
  keep("causal softmax dx16", (float *)(void *)d16, SN / 2);
  /* a block of 5 rows of 21 columns from position 16 (a blocked attention's last block), its
   * rows' statistics, and the block again from them */
  float *sst = arr(3 * 5 * 2);
  KEEP("causal softmax block",
       OPS.causal_softmax_forward(NULL, sx, sy, 3, 5, ST, 16, 0.5f, s16, NULL, sst), sy,
       3 * 5 * ST);
  keep("causal softmax block statistics", sst, 3 * 5 * 2);
  KEEP("causal softmax block again",
       OPS.causal_softmax_forward(NULL, sx, sy, 3, 5, ST, 16, 0.5f, s16, sst, NULL), sy,
       3 * 5 * ST);
  KEEP("causal softmax block dx",
       OPS.causal_softmax_backward(NULL, NULL, sdy, sdx, 3, 5, ST, 16, 0.5f, s16, d16), sdx,
       3 * 5 * ST);
  int32_t ids[9] = {0, 3, 3, 7, -1, 2, 9, 3, 1};
  float *table = filled(8 * 21, -1, 1), *e = arr(9 * 21), *de = filled(9 * 21, -1, 1);
  float *dt = arr(8 * 21);
  KEEP("embedding", OPS.embedding_forward(NULL, ids, table, 9, 8, 21, e), e, 9 * 21);
  KEEP("embedding backward", OPS.embedding_backward(NULL, ids, de, 9, 8, 21, dt), dt, 8 * 21);
  free(x), free(dy), free(y), free(dx), free(d), free(sx), free(sy), free(sdx), free(sdy);
  free(s16), free(d16), free(sst);
  free(table), free(e), free(de), free(dt);
}

/* The GEMM's and the im2col convolution's loops at shapes under the cut-off where every
 * provider takes the portable loop (gemm.h, CPU_GEMM_SMALL_MACS); the blocked layouts' loops. */
static void products(void) {
  float *a = filled(256, -1, 1), *b = filled(256, -1, 1), *c = arr(256);
  for (int t = 0; t < 4; t++) {
    int ta = t & 1, tb = t >> 1;
    memset(c, 0, 256 * sizeof *c);
    KEEP("gemm",
         OPS.gemm(NULL, ta, tb, 9, 13, 15, 0.75f, a, ta ? 9 : 15, b, tb ? 15 : 13, 0.5f, c, 13), c,
         9 * 13);
  }
  if (cpu_conv_force("im2col")) exit(2);
  pmap_conv_shape s = {3, 6, 7, 4, 3, 4, 3, 3, 2, 1}; /* 6x7, stride 2, pad 1 -> 3x4 */
  size_t nx = 2 * 3 * 6 * 7, ny = 2 * 4 * 3 * 4, nw = 4 * 27, ncol = 27 * 12;
  float *x = filled(nx, -1, 1), *w = filled(nw, -1, 1), *bias = filled(4, -1, 1), *y = arr(ny);
  float *dy = filled(ny, -1, 1), *dx = arr(nx), *dw = arr(nw), *db = arr(4), *col = arr(ncol);
  float *dcol = arr(ncol);
  KEEP("conv", OPS.conv2d_forward(NULL, &s, 2, x, w, bias, 1, y, col), y, ny);
  KEEP("conv dx", OPS.conv2d_backward(NULL, &s, 2, x, w, y, dy, dx, dw, db, col, dcol), dx, nx);
  keep("conv dw", dw, nw);
  keep("conv db", db, 4);
  int blocks[] = {1, 4, 8, 16};
  for (int k = 0; k < 4; k++) {
    conv_layout l = {.n = 3, .c = 21, .hw = 37, .block = blocks[k]};
    size_t nb = (size_t)(3 * ((21 + blocks[k] - 1) / blocks[k]) * blocks[k] * 37);
    float *src = filled(nb, -2, 2), *out = arr(nb), *g = filled(3 * 21 * 37, -1, 1);
    conv_unblock(&l, src, 1, out);
    keep("unblock relu", out, 3 * 21 * 37);
    conv_block_grad(&l, src, g, out);
    keep("block relu grad", out, nb);
    free(src), free(out), free(g);
  }
  free(a), free(b), free(c), free(x), free(w), free(bias), free(y), free(dy), free(dx), free(dw);
  free(db), free(col), free(dcol);
}

static void run_all(void) {
  elementwise();
  optimizers();
  rows();
  windows();
  products();
}

/* ---- writing and comparing ---- */

static int same(float a, float b) { return (a != a && b != b) || !memcmp(&a, &b, sizeof a); }

/* Reads PROG --dump and compares it with recs: the count of differing records, -1 when PROG
 * could not run this target here. */
static int compare(const char *prog) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "'%s' --dump", prog);
  FILE *f = popen(cmd, "r");
  if (!f) return printf("%s: cannot run\n", prog), 1;
  int bad = 0, got = 0;
  for (int i = 0; i < nrecs; i++) {
    rec r;
    if (fread(r.name, sizeof r.name, 1, f) != 1 || fread(&r.n, sizeof r.n, 1, f) != 1) break;
    got++;
    r.v = malloc(r.n * sizeof *r.v + 1);
    if (!r.v || fread(r.v, sizeof *r.v, r.n, f) != r.n) exit(2);
    const rec *m = &recs[i];
    size_t diff = 0, first = 0;
    for (size_t k = 0; k < r.n && r.n == m->n; k++)
      if (!same(r.v[k], m->v[k]) && !diff++) first = k;
    if (strcmp(r.name, m->name) || r.n != m->n) {
      printf("  record %d: %s (%zu) against %s (%zu)\n", i, r.name, r.n, m->name, m->n);
      bad++;
    } else if (diff) {
      printf("  %s: %zu of %zu differ, first at %zu: %.9g against the baseline's %.9g\n", m->name,
             diff, m->n, first, (double)r.v[first], (double)m->v[first]);
      bad++;
    }
    free(r.v);
  }
  int st = pclose(f);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 77) return -1;
  if (got != nrecs || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    printf("  %s: %d of %d records (exit status %d)\n", prog, got, nrecs, st);
    bad++;
  }
  return bad;
}

static int runs_here(void) {
  __builtin_cpu_init();
#if defined(CPU_SIMD_ONLY)
  if (!strcmp(SIMD_TARGET, "avx2")) return __builtin_cpu_supports("avx2");
  if (!strcmp(SIMD_TARGET, "x86-64-v4")) return __builtin_cpu_supports("x86-64-v4");
#endif
  return 1;
}

int main(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "--dump")) {
    if (!runs_here()) return 77;
    run_all();
    for (int i = 0; i < nrecs; i++) {
      fwrite(recs[i].name, sizeof recs[i].name, 1, stdout);
      fwrite(&recs[i].n, sizeof recs[i].n, 1, stdout);
      fwrite(recs[i].v, sizeof *recs[i].v, recs[i].n, stdout);
    }
    return fflush(stdout) ? 1 : 0;
  }
  if (argc < 3 || strcmp(argv[1], "--compare") != 0) {
    fprintf(stderr, "usage: simd_check --dump | --compare PROG...\n");
    return 2;
  }
  run_all();
  size_t values = 0;
  for (int i = 0; i < nrecs; i++) values += recs[i].n;
  int bad = 0, compared = 0;
  for (int i = 2; i < argc; i++) {
    int d = compare(argv[i]);
    printf("%s: %s\n", argv[i],
           d < 0 ? "not run (this CPU lacks its instructions)"
           : d   ? "DIFFERS"
                 : "same bits");
    if (d >= 0) compared++, bad += d;
  }
  printf(
      "simd clones: %d records, %zu values; %d targets compared with the baseline, %d "
      "records differ\n",
      nrecs, values, compared, bad);
  return bad ? 1 : compared ? 0 : 77;
}
