/* bf16.c: the CPU kernels of the bf16 policy: rounding to bfloat16 and back, and the bfloat16
 * GEMMs, on oneDNN's bf16 matmul where the CPU has bf16 instructions (AVX512_BF16, AMX) or on a
 * portable path elsewhere: the operands widened to float (exactly) and multiplied by the float
 * GEMM in use, whose products of bfloat16 values are exact, so the semantics are the same
 * (bfloat16 inputs, float sums). Which one runs is chosen once per process (bf16_choice.c). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bf16.h"
#include "cpu_ops.h"
#include "ops/op_math.h"

CPU_SIMD_CLONES pmap_status cpu_round_bf16(op_queue *q, const float *x, pmap_bf16 *y16, float *y32,
                                           size_t n) {
  (void)q;
  if (y16 && y32) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) {
      uint16_t h = pmap_bf16_round(x[i]);
      y16[i] = h;
      y32[i] = pmap_bf16_widen(h);
    }
  } else if (y16) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) y16[i] = pmap_bf16_round(x[i]);
  } else {
    CPU_IVDEP for (size_t i = 0; i < n; i++) y32[i] = pmap_bf16_widen(pmap_bf16_round(x[i]));
  }
  return PMAP_SUCCESS;
}

CPU_SIMD_CLONES pmap_status cpu_widen_bf16(op_queue *q, const pmap_bf16 *x, float *y, size_t n) {
  (void)q;
  CPU_IVDEP for (size_t i = 0; i < n; i++) y[i] = pmap_bf16_widen(x[i]);
  return PMAP_SUCCESS;
}

/* rows x cols of x (leading dimension ld) widened into the packed y (cols per row). */
CPU_SIMD_CLONES static void widen_matrix(const pmap_bf16 *x, int64_t ld, int64_t rows, int64_t cols,
                                         float *y) {
  for (int64_t r = 0; r < rows; r++) {
    const pmap_bf16 *xr = x + r * ld;
    float *yr = y + r * cols;
    CPU_IVDEP for (int64_t c = 0; c < cols; c++) yr[c] = pmap_bf16_widen(xr[c]);
  }
}

/* The portable path of one GEMM of a batch: both operands widened into the calling thread's
 * scratch, as stored (a transposed operand stays transposed), then the float GEMM in use. */
static pmap_status portable_one(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b,
                                float *c) {
  int64_t ar = g->ta ? g->k : g->m, ac = g->ta ? g->m : g->k;
  int64_t br = g->tb ? g->n : g->k, bc = g->tb ? g->k : g->n;
  size_t na = (size_t)(ar * ac), nb = (size_t)(br * bc);
  float *buf = cpu_bf16_scratch(na + nb);
  if (!buf)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "gemm_bf16: out of memory for %zu floats of widened operands (m %lld n %lld k "
                    "%lld)",
                    na + nb, (long long)g->m, (long long)g->n, (long long)g->k);
  widen_matrix(a, g->lda, ar, ac, buf);
  widen_matrix(b, g->ldb, br, bc, buf + na);
  return cpu_gemm(NULL, g->ta, g->tb, g->m, g->n, g->k, g->alpha, buf, ac, buf + na, bc, g->beta, c,
                  g->ldc);
}

pmap_status cpu_bf16_portable(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b,
                              float *c) {
  for (int64_t o = 0; o < g->groups; o++)
    for (int64_t i = 0; i < g->batch; i++)
      PMAP_TRY(portable_one(g, a + o * g->ga + i * g->sa, b + o * g->gb + i * g->sb,
                            c + o * g->gc + i * g->sc));
  return PMAP_SUCCESS;
}

/* The provider in use for g: tiny shapes and k == 0 (c = beta c) always take the portable
 * path, where a library call costs more than the work. */
static pmap_status run(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b, float *c) {
  if (g->m <= 0 || g->n <= 0 || g->batch <= 0 || g->groups <= 0) return PMAP_SUCCESS;
  int native = 0;
  PMAP_TRY(cpu_bf16_native(&native));
  if (native && g->k > 0 && g->m * g->n * g->k > CPU_BF16_SMALL_MACS) {
    int done = 0;
    PMAP_TRY(cpu_bf16_onednn(g, a, b, c, &done));
    if (done) return PMAP_SUCCESS;
  }
  return cpu_bf16_portable(g, a, b, c);
}

pmap_status cpu_gemm_bf16(op_queue *q, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const pmap_bf16 *a, int64_t lda, const pmap_bf16 *b, int64_t ldb,
                          float beta, float *c, int64_t ldc) {
  (void)q;
  bf16_gemm g;
  memset(&g, 0, sizeof g); /* the cache compares keys bytewise */
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.batch = g.groups = 1, g.alpha = alpha, g.beta = beta;
  return run(&g, a, b, c);
}

pmap_status cpu_gemm_strided_bf16(op_queue *q, int ta, int tb, int64_t m, int64_t n, int64_t k,
                                  float alpha, const pmap_bf16 *a, int64_t lda, int64_t stride_a,
                                  const pmap_bf16 *b, int64_t ldb, int64_t stride_b, float beta,
                                  float *c, int64_t ldc, int64_t stride_c, int64_t batch,
                                  int64_t groups, int64_t group_a, int64_t group_b,
                                  int64_t group_c) {
  (void)q;
  bf16_gemm g;
  memset(&g, 0, sizeof g);
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.sa = stride_a, g.sb = stride_b, g.sc = stride_c, g.batch = batch;
  g.ga = group_a, g.gb = group_b, g.gc = group_c, g.groups = groups;
  g.alpha = alpha, g.beta = beta;
  return run(&g, a, b, c);
}
