/* case_bf16.c: the op harness's cases for the ops of the bf16 policy: rounding to bfloat16
 * against a float64 rounding of its own (ties both ways, subnormals, the overflow boundary,
 * infinities, NaNs of either sign; one output or both, in place), widening (exact), and the
 * bfloat16 GEMMs against float64 sums of their bfloat16 operands (every transpose, alpha, beta,
 * padding that must not be read, k == 0, strided batches with gaps that must stay untouched).
 *
 * Tolerances. The GEMMs' operands are bfloat16 values, whose products are exact in float, so
 * the only error is the float summation: hx_tol_gemm16 holds them to it, in the reduction length
 * k (harness.c: bound_sum(k) on the CPU, 6e-7 at k = 3 to 2.5e-5 at k = 4900; CUDA's tensor
 * cores sum in float too but truncate while aligning addends and normalising, 1e-4 at k = 4900).
 * Anything that rounds an operand or the result to bfloat16 again errs by about 2^-9 = 2e-3 of
 * it and fails. Rounding and widening are exact: the same bits on every backend. */
#include "harness.h"
#include "ops/op_math.h"

/* ------------------------------------------------------------------------------------------ */
/* round_bf16, widen_bf16                                                                     */

/* The magnitude of bfloat16 bits h (sign clear) in float64; the code past the largest finite
 * one (0x7f80) stands for 2^128, the boundary of rounding to infinity. */
static double mag16(uint16_t h) {
  if (h >= 0x7f80u) return ldexp(1.0, 128);
  int e = (h >> 7) & 0xff, f = h & 0x7f;
  return e ? ldexp(1.0 + f / 128.0, e - 127) : ldexp(f / 128.0, -126);
}

/* x rounded to bfloat16 by comparing its distances to the two bfloat16 neighbours of its
 * magnitude in float64, a tie to the even one; a NaN keeps its sign, quiet. */
static uint16_t ref_round(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if (isnan(x)) return (uint16_t)((u >> 16) | 0x40u);
  uint16_t sign = (uint16_t)((u >> 31) << 15);
  if (isinf(x)) return sign | 0x7f80u;
  uint16_t lo = (uint16_t)((u & 0x7fffffffu) >> 16), hi = (uint16_t)(lo + 1);
  double ax = fabs((double)x), dlo = ax - mag16(lo), dhi = mag16(hi) - ax;
  uint16_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1u) ? hi : lo;
  return sign | pick;
}

/* A float whose rounding is worth checking: any bits, ties and their neighbours, subnormals,
 * the values near the largest float and the top of the bfloat16 range, infinities and NaNs. */
static float tricky(hx *h) {
  uint32_t u = (uint32_t)hx_u64(h), top = u & 0xffff0000u;
  switch (hx_int(h, 0, 9)) {
  case 0: u = top | 0x8000u; break;                                     /* a tie */
  case 1: u = top | (hx_u64(h) & 1 ? 0x7fffu : 0x8001u); break;         /* beside a tie */
  case 2: u = (u & 0x807fffffu); break;                                 /* subnormal or zero */
  case 3: u = (u & 0x80000000u) | 0x7f7f8000u; break;                   /* the top tie: to inf */
  case 4: u = (u & 0x80000000u) | (0x7f7f0000u + (u & 0xffffu)); break; /* near the top */
  case 5: u = (u & 0x80000000u) | 0x7f800000u; break;                   /* an infinity */
  case 6: u = (u & 0x80000000u) | 0x7f800000u | (u & 0x7fffffu) | 1u; break; /* a NaN */
  default: break;                                                            /* any bits */
  }
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

typedef struct round_args {
  hx_buf *x, *y16, *y32;
  int inplace; /* y32 is x */
  size_t n;
} round_args;

static pmap_status call_round(const pmap_ops *o, op_queue *q, void *arg) {
  round_args *a = arg;
  return o->round_bf16(q, HX_F(a->x), a->y16 ? HX_H(a->y16) : NULL,
                       a->inplace ? HX_F(a->x)
                       : a->y32   ? HX_F(a->y32)
                                  : NULL,
                       a->n);
}

void opcase_round_bf16(hx *h) {
  for (int t = 0; t < hx_vec_trials(h) * 2; t++, hx_release(h)) {
    round_args a = {.n = hx_vec_size(h, t / 2), .inplace = t % 4 == 3};
    int mode = t % 4; /* 0 both outputs, 1 y16 alone, 2 y32 alone, 3 both with y32 == x */
    hx_trial(h, "n=%zu outputs=%s", a.n,
             mode == 0   ? "y16,y32"
             : mode == 1 ? "y16"
             : mode == 2 ? "y32"
                         : "y16,y32=x");
    a.x = hx_new(h, a.inplace ? HX_INOUT : HX_IN, a.n, "x");
    for (size_t i = 0; i < a.n; i++) a.x->init[i] = tricky(h);
    if (mode != 2) {
      a.y16 = hx_new16(h, HX_OUT, a.n, "y16");
      a.y16->keep_nan = 1; /* NaN inputs; hx_same16 below checks every element's bits */
    }
    if (mode == 0 || mode == 2) {
      a.y32 = hx_out(h, a.n, "y32");
      a.y32->keep_nan = 1; /* NaN inputs */
      a.y32->tol_cpu = 0.0;
    }
    if (a.inplace) a.x->tol_cpu = 0.0;
    if (mode == 0)
      HX_RUN(h, call_round, &a, a.x, a.y16, a.y32);
    else if (mode == 2)
      HX_RUN(h, call_round, &a, a.x, a.y32);
    else
      HX_RUN(h, call_round, &a, a.x, a.y16);
    pmap_bf16 *want = (pmap_bf16 *)(void *)hx_floats(h, a.n / 2 + 1);
    float *want32 = hx_floats(h, a.n);
    for (size_t i = 0; i < a.n; i++) {
      want[i] = ref_round(a.x->init[i]);
      want32[i] = pmap_float_of_bits((uint32_t)want[i] << 16);
    }
    if (a.y16) hx_same16(h, "y16", HX_H16(a.y16->got), want, a.n);
    const float *y32 = a.inplace ? a.x->got : a.y32 ? a.y32->got : NULL;
    if (y32) /* every bit, NaN payloads included */
      hx_same16(h, "y32", (const pmap_bf16 *)(const void *)y32,
                (const pmap_bf16 *)(const void *)want32, 2 * a.n);
  }
}

typedef struct widen_args {
  hx_buf *x, *y;
  size_t n;
} widen_args;

static pmap_status call_widen(const pmap_ops *o, op_queue *q, void *arg) {
  widen_args *a = arg;
  return o->widen_bf16(q, HX_H(a->x), HX_F(a->y), a->n);
}

void opcase_widen_bf16(hx *h) {
  for (int t = 0; t < hx_vec_trials(h); t++, hx_release(h)) {
    widen_args a = {.n = hx_vec_size(h, t)};
    hx_trial(h, "n=%zu", a.n);
    a.x = hx_new16(h, HX_IN, a.n, "x");
    for (size_t i = 0; i < a.n; i++) HX_H16(a.x->init)[i] = (pmap_bf16)hx_u64(h); /* any bits */
    a.y = hx_out(h, a.n, "y");
    a.y->keep_nan = 1;
    a.y->tol_cpu = 0.0;
    HX_RUN(h, call_widen, &a, a.x, a.y);
    float *want = hx_floats(h, a.n);
    for (size_t i = 0; i < a.n; i++)
      want[i] = pmap_float_of_bits((uint32_t)HX_H16(a.x->init)[i] << 16);
    hx_same16(h, "y", (const pmap_bf16 *)(const void *)a.y->got,
              (const pmap_bf16 *)(const void *)want, 2 * a.n);
  }
}

typedef struct block_args {
  hx_buf *x, *y;
  hx_buf *b, *db; /* NULL: none */
  int64_t ldx, ldy, rows, cols;
} block_args;

static pmap_status call_block(const pmap_ops *o, op_queue *q, void *arg) {
  block_args *a = arg;
  return o->round_bf16_block(q, HX_F(a->x), a->ldx, a->b ? HX_F(a->b) : NULL,
                             a->db ? HX_F(a->db) : NULL, HX_H(a->y), a->ldy, a->rows, a->cols);
}

/* A block of x rounded into a block of y, both padded: the block's elements against the float64
 * rounding, y's padding (a sentinel) unchanged, and an empty block that writes nothing; with a
 * bias (added in float before the rounding: bias_forward's one add), and with a bias gradient
 * (ldx = cols: db += the column sums, bias_backward's bits). */
void opcase_round_bf16_block(hx *h) {
  int trials = hx_rounds(h, 8) + 3;
  for (int t = 0; t < trials; t++, hx_release(h)) {
    block_args a = {.rows = hx_int(h, 1, h->large ? 300 : 70),
                    .cols = hx_int(h, 1, h->large ? 400 : 130)};
    if (t == 0) a.rows = 0, a.cols = 5; /* empty blocks */
    if (t == 1) a.rows = 1;
    if (t == 2) a.cols = 0;
    if (t == 3) a.rows = 64, a.cols = 128; /* attention's shape: one part of (T, 3E) */
    int with_b = t % 3 == 1, with_db = t % 3 == 2 && a.cols > 0;
    a.ldx = with_db ? a.cols : a.cols + hx_int(h, 0, 3);
    a.ldy = a.cols + hx_int(h, 0, t == 3 ? 256 : 5);
    hx_trial(h, "rows=%lld cols=%lld ldx=%lld ldy=%lld", (long long)a.rows, (long long)a.cols,
             (long long)a.ldx, (long long)a.ldy);
    size_t nx = (size_t)(a.rows * a.ldx), ny = (size_t)(a.rows * a.ldy);
    a.x = hx_new(h, HX_IN, nx > 0 ? nx : 1, "x");
    for (size_t i = 0; i < a.x->n; i++) /* values that round every way; finite for the sums */
      a.x->init[i] = with_db ? hx_uniform(h, -1.0f, 1.0f) : tricky(h);
    a.y = hx_new16(h, HX_INOUT, ny > 0 ? ny : 1, "y16");
    pmap_bf16 *y0 = HX_H16(a.y->init);
    for (size_t i = 0; i < a.y->n16; i++) y0[i] = 0x1234u; /* the sentinel */
    if (with_b) a.b = hx_in(h, a.cols > 0 ? (size_t)a.cols : 1, -2.0f, 2.0f, "b");
    if (with_db) {
      a.db = hx_inout(h, (size_t)a.cols, -1.0f, 1.0f, "db");
      double k = (double)a.rows + 1.0; /* float sums of rows terms, added to what db held */
      a.db->tol_cpu = hx_tol_vs_cpu(hx_tol_sum(k), k);
    }
    if (a.db)
      HX_RUN(h, call_block, &a, a.x, a.db, a.y);
    else if (a.b)
      HX_RUN(h, call_block, &a, a.x, a.b, a.y);
    else
      HX_RUN(h, call_block, &a, a.x, a.y);
    pmap_bf16 *want = (pmap_bf16 *)(void *)hx_floats(h, a.y->n16 / 2 + 1);
    memcpy(want, y0, a.y->n16 * sizeof *want);
    for (int64_t r = 0; r < a.rows; r++)
      for (int64_t c = 0; c < a.cols; c++) {
        float v = a.x->init[r * a.ldx + c];
        want[r * a.ldy + c] = ref_round(a.b ? v + a.b->init[c] : v);
      }
    hx_same16(h, "y16 (block and padding)", HX_H16(a.y->got), want, a.y->n16);
    if (a.db) { /* against float64's sums: float sums of rows + 1 terms */
      double *sum = hx_doubles(h, (size_t)a.cols);
      for (int64_t c = 0; c < a.cols; c++) sum[c] = a.db->init[c];
      for (int64_t r = 0; r < a.rows; r++)
        for (int64_t c = 0; c < a.cols; c++) sum[c] += a.x->init[r * a.ldx + c];
      double k = (double)a.rows + 1.0;
      hx_close_scale(h, "db", a.db->got, sum, (size_t)a.cols, hx_tol_sum(k), sqrt(k / 3.0));
    }
  }
}

/* ------------------------------------------------------------------------------------------ */
/* gemm_bf16, gemm_strided_bf16                                                               */

static double at16(const pmap_bf16 *a, int64_t ld, int trans, int64_t i, int64_t j) {
  return pmap_bf16_widen(trans ? a[j * ld + i] : a[i * ld + j]);
}

/* A stored bfloat16 matrix (rows, cols), leading dimension cols + pad: values in [-1, 1), the
 * padding a NaN, so that any read of it shows in the result. */
static hx_buf *padded16(hx *h, int64_t rows, int64_t cols, int64_t pad, int64_t *ld,
                        const char *name) {
  *ld = cols + pad;
  hx_buf *b = hx_new16(h, HX_IN, (size_t)(rows * *ld), name);
  pmap_bf16 *v = HX_H16(b->init);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < *ld; j++)
      v[r * *ld + j] = j < cols ? pmap_bf16_round(hx_uniform(h, -1.0f, 1.0f)) : 0x7fc0u;
  return b;
}

typedef struct g16_args {
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  hx_buf *a, *b, *c;
} g16_args;

static pmap_status call_g16(const pmap_ops *o, op_queue *q, void *arg) {
  g16_args *g = arg;
  return o->gemm_bf16(q, g->ta, g->tb, g->m, g->n, g->k, g->alpha, HX_H(g->a), g->lda, HX_H(g->b),
                      g->ldb, g->beta, HX_F(g->c), g->ldc);
}

static void g16_trial(hx *h, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                      float beta, int64_t pad) {
  hx_trial(h, "ta=%d tb=%d m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " alpha=%g beta=%g pad=%" PRId64,
           ta, tb, m, n, k, (double)alpha, (double)beta, pad);
  g16_args g = {.ta = ta, .tb = tb, .m = m, .n = n, .k = k, .alpha = alpha, .beta = beta};
  g.ldc = n + pad;
  g.a = padded16(h, ta ? k : m, ta ? m : k, pad, &g.lda, "a");
  g.b = padded16(h, tb ? n : k, tb ? k : n, pad, &g.ldb, "b");
  g.c = hx_new(h, HX_INOUT, (size_t)(m * g.ldc), "c"); /* padding: a sentinel to keep */
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < g.ldc; j++)
      g.c->init[i * g.ldc + j] = j >= n ? -777.0f : beta == 0.0f ? NAN : hx_uniform(h, -1, 1);
  /* As case_dense.c's gemm: the rms of the sums, and k + 3 roundings (alpha, beta c, add). */
  double scale = fabs(alpha) * sqrt((double)k) / 3.0 + fabs(beta) * 0.5;
  double kr = (double)k + 3.0, tol = hx_tol_gemm16(h, kr);
  g.c->tol_cpu = hx_tol_vs_cpu(tol, kr);
  g.c->scale_cpu = scale;
  HX_RUN(h, call_g16, &g, g.a, g.b, g.c);
  size_t mn = (size_t)(m * n);
  double *want = hx_doubles(h, mn);
  float *got = hx_floats(h, mn);
  const pmap_bf16 *a = HX_H16(g.a->init), *b = HX_H16(g.b->init);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; p++) sum += at16(a, g.lda, ta, i, p) * at16(b, g.ldb, tb, p, j);
      double c0 = beta != 0.0f ? (double)beta * g.c->init[i * g.ldc + j] : 0.0;
      want[i * n + j] = (double)alpha * sum + c0;
      got[i * n + j] = g.c->got[i * g.ldc + j];
    }
  hx_close_scale(h, "c", got, want, mn, tol, scale);
  int64_t bad = -1;
  for (int64_t i = 0; i < m && bad < 0; i++)
    for (int64_t j = n; j < g.ldc && bad < 0; j++)
      if (g.c->got[i * g.ldc + j] != -777.0f) bad = i * g.ldc + j;
  HX_CHECK(h, bad < 0, "c's padding written at %" PRId64, bad);
}

void opcase_gemm_bf16(hx *h) {
  /* Every transpose at sizes past the CPU's small-shape cut-off (the library path) and at tiny
   * ones, k == 0 (c = beta c), alpha and beta, padded leading dimensions. */
  for (int t = 0; t < 4; t++) {
    g16_trial(h, t & 1, t >> 1, 33, 47, 29, 1.0f, 0.0f, 0), hx_release(h);
    g16_trial(h, t & 1, t >> 1, 3, 5, 2, 0.5f, 1.0f, 3), hx_release(h);
    g16_trial(h, t & 1, t >> 1, 17, 40, 64, -1.5f, 0.75f, 5), hx_release(h);
  }
  g16_trial(h, 0, 0, 9, 11, 0, 1.0f, 0.5f, 1), hx_release(h);
  g16_trial(h, 1, 1, 1, 1, 1, 1.0f, 0.0f, 0), hx_release(h);
  /* k = 63, which oneDNN 2.x's AMX kernels cannot run (an illegal instruction, at m 136 or 584
   * with n 2 or 3 among others): the library path must not take it there. */
  for (int t = 0; t < 4; t++) {
    g16_trial(h, t & 1, t >> 1, 136, 2, 63, 1.0f, 0.0f, 0), hx_release(h);
    g16_trial(h, t & 1, t >> 1, 584, 3, 63, 1.0f, 1.0f, 1), hx_release(h);
  }
  /* Past the CPU portable path's scratch (k (m + n) > 512 x 2048 floats): k cut into slices of
   * 2048 and a shorter last one; k whole and c cut into tiles of rows, the last one shorter; k
   * sliced and c cut into tiles of rows and of columns (256 each, then shorter ones). */
  g16_trial(h, 0, 1, 280, 600, 2200, 1.0f, 0.5f, 1), hx_release(h);
  g16_trial(h, 1, 0, 90, 160, 4500, -1.5f, 0.75f, 3), hx_release(h);
  g16_trial(h, 0, 1, 70, 150, 4900, 1.0f, 0.0f, 0), hx_release(h);
  g16_trial(h, 0, 0, 1250, 1100, 450, 0.5f, 1.0f, 2), hx_release(h);
  g16_trial(h, 1, 1, 1300, 30, 830, 1.0f, 0.0f, 1), hx_release(h);
  for (int r = 0; r < hx_rounds(h, 9); r++, hx_release(h)) {
    int64_t hi = h->large ? 300 : 70;
    g16_trial(h, (int)hx_int(h, 0, 1), (int)hx_int(h, 0, 1), hx_int(h, 1, hi), hx_int(h, 1, hi),
              hx_int(h, 1, hi), r % 3 ? 1.0f : 0.25f, r % 2 ? 1.0f : 0.0f, hx_int(h, 0, 4));
  }
}

/* Where the matrices of a batched operand lie: matrix (g, i) at g group + i stride, rows ld
 * apart. Packed: each matrix whole (rows padded), a gap after each and after each group.
 * Interleaved, as attention's heads: the batch side by side along each row (stride = cols), a
 * group the rows of all of them. */
typedef struct layout {
  int64_t ld, stride, group, size;
} layout;

static layout lay(hx *h, int interleaved, int64_t rows, int64_t cols, int64_t batch,
                  int64_t groups) {
  layout l;
  int64_t pad = hx_int(h, 0, 2), gap = hx_int(h, 0, 3);
  if (interleaved) {
    l.ld = batch * cols + pad;
    l.stride = cols;
    l.group = rows * l.ld + gap;
  } else {
    l.ld = cols + pad;
    l.stride = rows * l.ld + gap;
    l.group = batch * l.stride + gap;
  }
  l.size = groups * l.group + 1;
  return l;
}

/* The operand's matrices filled with bfloat16 values in [-1, 1), everything else a NaN. */
static hx_buf *operand16(hx *h, const layout *l, int64_t rows, int64_t cols, int64_t batch,
                         int64_t groups, const char *name) {
  hx_buf *b = hx_new16(h, HX_IN, (size_t)l->size, name);
  pmap_bf16 *v = HX_H16(b->init);
  for (int64_t i = 0; i < l->size; i++) v[i] = 0x7fc0u;
  for (int64_t g = 0; g < groups; g++)
    for (int64_t i = 0; i < batch; i++)
      for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
          v[g * l->group + i * l->stride + r * l->ld + c] =
              pmap_bf16_round(hx_uniform(h, -1.0f, 1.0f));
  return b;
}

typedef struct gs16_args {
  int ta, tb;
  int64_t m, n, k, batch, groups;
  layout la, lb, lc;
  float alpha, beta;
  hx_buf *a, *b, *c;
} gs16_args;

static pmap_status call_gs16(const pmap_ops *o, op_queue *q, void *arg) {
  gs16_args *g = arg;
  return o->gemm_strided_bf16(q, g->ta, g->tb, g->m, g->n, g->k, g->alpha, HX_H(g->a), g->la.ld,
                              g->la.stride, HX_H(g->b), g->lb.ld, g->lb.stride, g->beta, HX_F(g->c),
                              g->lc.ld, g->lc.stride, g->batch, g->groups, g->la.group, g->lb.group,
                              g->lc.group);
}

void opcase_gemm_strided_bf16(hx *h) {
  for (int r = 0; r < 6 + hx_rounds(h, 10); r++, hx_release(h)) {
    gs16_args g = {.ta = r & 1, .tb = (r >> 1) & 1, .alpha = r % 3 ? 1.0f : 0.5f};
    int64_t hi = r < 4 ? 9 : h->large ? 96 : 40; /* tiny, then past the CPU's cut-off */
    g.m = hx_int(h, 1, hi), g.n = hx_int(h, 1, hi), g.k = hx_int(h, r == 5 ? 0 : 1, hi);
    g.batch = r == 3 ? 0 : hx_int(h, 1, 5);
    g.groups = r == 4 ? 0 : r < 6 ? 1 : hx_int(h, 1, 4);
    g.beta = r % 4 == 2 ? 0.75f : 0.0f;
    int inter = r >= 6 && (r & 4) != 0; /* attention's layout: the batch along each row */
    int64_t nb = g.batch ? g.batch : 1, ng = g.groups ? g.groups : 1;
    g.la = lay(h, inter, g.ta ? g.k : g.m, g.ta ? g.m : g.k, nb, ng);
    g.lb = lay(h, inter, g.tb ? g.n : g.k, g.tb ? g.k : g.n, nb, ng);
    g.lc = lay(h, inter, g.m, g.n, nb, ng);
    hx_trial(h,
             "ta=%d tb=%d m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " batch=%" PRId64
             " groups=%" PRId64 " %s beta=%g",
             g.ta, g.tb, g.m, g.n, g.k, g.batch, g.groups, inter ? "interleaved" : "packed",
             (double)g.beta);
    g.a = operand16(h, &g.la, g.ta ? g.k : g.m, g.ta ? g.m : g.k, g.batch, g.groups, "a");
    g.b = operand16(h, &g.lb, g.tb ? g.n : g.k, g.tb ? g.k : g.n, g.batch, g.groups, "b");
    size_t nc = (size_t)g.lc.size;
    g.c = hx_new(h, HX_INOUT, nc, "c");
    unsigned char *inside = (unsigned char *)hx_floats(h, nc / 4 + 1);
    memset(inside, 0, nc);
    for (int64_t o = 0; o < g.groups; o++)
      for (int64_t bi = 0; bi < g.batch; bi++)
        for (int64_t i = 0; i < g.m; i++)
          for (int64_t j = 0; j < g.n; j++)
            inside[o * g.lc.group + bi * g.lc.stride + i * g.lc.ld + j] = 1;
    for (size_t i = 0; i < nc; i++) /* the rest holds a sentinel; beta 0 must not read c */
      g.c->init[i] = !inside[i] ? -777.0f : g.beta == 0.0f ? NAN : hx_uniform(h, -1, 1);
    double scale = sqrt((double)g.k) / 3.0 + 0.5;
    double kr = (double)g.k + 3.0, tol = hx_tol_gemm16(h, kr);
    g.c->tol_cpu = hx_tol_vs_cpu(tol, kr);
    g.c->scale_cpu = scale;
    HX_RUN(h, call_gs16, &g, g.a, g.b, g.c);
    size_t mn = (size_t)(g.m * g.n);
    double *want = hx_doubles(h, mn);
    float *got = hx_floats(h, mn);
    for (int64_t o = 0; o < g.groups; o++)
      for (int64_t bi = 0; bi < g.batch; bi++) {
        const pmap_bf16 *a = HX_H16(g.a->init) + o * g.la.group + bi * g.la.stride;
        const pmap_bf16 *b = HX_H16(g.b->init) + o * g.lb.group + bi * g.lb.stride;
        int64_t c0 = o * g.lc.group + bi * g.lc.stride;
        for (int64_t i = 0; i < g.m; i++)
          for (int64_t j = 0; j < g.n; j++) {
            double sum = 0.0;
            for (int64_t p = 0; p < g.k; p++)
              sum += at16(a, g.la.ld, g.ta, i, p) * at16(b, g.lb.ld, g.tb, p, j);
            int64_t at = c0 + i * g.lc.ld + j;
            want[i * g.n + j] =
                g.alpha * sum + (g.beta != 0.0f ? g.beta * (double)g.c->init[at] : 0.0);
            got[i * g.n + j] = g.c->got[at];
          }
        hx_close_scale(h, "c", got, want, mn, tol, scale);
      }
    size_t bad = 0;
    for (size_t i = 0; i < nc; i++)
      if (!inside[i]) bad += g.c->got[i] != g.c->init[i];
    HX_CHECK(h, bad == 0, "%zu elements outside the matrices were written", bad);
  }
}
