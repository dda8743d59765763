/* attention.c: CPU kernels of causal self-attention and token embeddings: the strided batch of
 * GEMMs (a loop over cpu_gemm), the causal softmax and its backward (vector exp, sums in double in
 * a fixed order), and the embedding's gather and its deterministic scatter-add. */
#include <math.h>

#include "base/error.h"
#include "cpu_ops.h"
#include "ops/op_math.h"

pmap_status cpu_gemm_strided(op_queue *q, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                             float alpha, const float *a, int64_t lda, int64_t stride_a,
                             const float *b, int64_t ldb, int64_t stride_b, float beta, float *c,
                             int64_t ldc, int64_t stride_c, int64_t batch) {
  for (int64_t i = 0; i < batch; i++)
    PMAP_TRY(cpu_gemm(q, trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b,
                      ldb, beta, c + i * stride_c, ldc));
  return PMAP_SUCCESS;
}

/* The largest of scale x[j] for j < n (-inf when none is above it: NaNs never are), in
 * CPU_LANES running maxima held in one vector (each lane's `v > m ? v : m`, a compare and a
 * blend), so that the loop runs in vector instructions; the largest value is the same in any
 * order (but for the sign of a zero, which no use of it sees: x - (-0) = x - (+0)). */
typedef float cpu_f8
    __attribute__((vector_size(CPU_LANES * sizeof(float)), aligned(sizeof(float)), may_alias));
typedef int32_t cpu_i8 __attribute__((vector_size(CPU_LANES * sizeof(int32_t))));
/* m = the lane-wise `v > m ? v : m` (by pointer: a vector argument's ABI differs between the
 * clones' targets). */
CPU_INLINE void max8(cpu_f8 *m, const cpu_f8 *v) {
  cpu_i8 k = *v > *m;
  *m = (cpu_f8)(((cpu_i8)*v & k) | ((cpu_i8)*m & ~k));
}

_Static_assert(CPU_LANES == 8, "row_max's vectors are written out for 8 lanes");

CPU_INLINE float row_max(const float *x, int64_t n, float scale) {
  /* four chains of maxima, so that no compare waits on the one before */
  const float ninf = -INFINITY;
  cpu_f8 m[4] = {{ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf},
                 {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf},
                 {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf},
                 {ninf, ninf, ninf, ninf, ninf, ninf, ninf, ninf}};
  int64_t j = 0;
  for (; j + 4 * CPU_LANES <= n; j += 4 * CPU_LANES)
    for (int c = 0; c < 4; c++) {
      cpu_f8 v = scale * *(const cpu_f8 *)(const void *)(x + j + c * CPU_LANES);
      max8(&m[c], &v);
    }
  for (; j + CPU_LANES <= n; j += CPU_LANES) {
    cpu_f8 v = scale * *(const cpu_f8 *)(const void *)(x + j);
    max8(&m[0], &v);
  }
  max8(&m[0], &m[1]);
  max8(&m[2], &m[3]);
  max8(&m[0], &m[2]);
  float mx = -INFINITY;
  for (int l = 0; l < CPU_LANES; l++) mx = m[0][l] > mx ? m[0][l] : mx;
  for (; j < n; j++) mx = scale * x[j] > mx ? scale * x[j] : mx;
  return mx;
}

/* sum a[j] (b NULL) or sum a[j] b[j] for j < n, in double in CPU_LANES partial sums. */
CPU_INLINE double row_sum(const float *a, const float *b, int64_t n) {
  cpu_lanes p = {{0}, {0}};
  int64_t j = 0;
  for (; j + CPU_LANES <= n; j += CPU_LANES) {
    cpu_d4 lo = CPU_WIDEN4(CPU_F4(a + j)), hi = CPU_WIDEN4(CPU_F4(a + j + 4));
    if (b) {
      lo *= CPU_WIDEN4(CPU_F4(b + j));
      hi *= CPU_WIDEN4(CPU_F4(b + j + 4));
    }
    p.lo += lo, p.hi += hi;
  }
  double sum = cpu_lanes_total(&p);
  for (; j < n; j++) sum += b ? (double)a[j] * b[j] : a[j];
  return sum;
}

/* Each row's exponentials with ops/op_math.h's vector exp (1.5 ulps), summed in double in
 * CPU_LANES partial sums (a fixed order, cpu_ops.h), then times the float reciprocal of the sum
 * (a product where a division in double took a quarter of the kernel, long rows). */
CPU_KERNEL(extern, pmap_status, cpu_causal_softmax_forward,
           (op_queue *q, const float *x, float *y, int64_t n, int64_t rows, int64_t t,
            int64_t first, float scale, pmap_bf16 *y16, const float *stats_in,
            float *stats_out),
           (q, x, y, n, rows, t, first, scale, y16, stats_in, stats_out)) {
  (void)q;
  for (int64_t r = 0, k = 0; r < n * rows; r++, k = k + 1 < rows ? k + 1 : 0) {
    int64_t i = first + k; /* the row's position: it sees columns 0..i */
    const float *xr = x + r * t;
    float *yr = y + r * t;
    float mx = stats_in ? stats_in[2 * r] : row_max(xr, i + 1, scale);
    /* The exponentials up to a whole 16 columns where the row has them (0 past column i), so
     * that the vector loop has no scalar remainder: short rows are most of a causal block. */
    int64_t end = (i + 16) / 16 * 16;
    if (end > t) end = i + 1;
    CPU_IVDEP for (int64_t j = 0; j < end; j++) yr[j] =
        pmap_sel(j <= i, pmap_exp(scale * xr[j] - mx), 0.0f);
    float inv = stats_in ? stats_in[2 * r + 1] : (float)(1.0 / row_sum(yr, NULL, i + 1));
    CPU_IVDEP for (int64_t j = 0; j <= i; j++) yr[j] *= inv;
    for (int64_t j = i + 1; j < t; j++) yr[j] = 0.0f;
    if (y16) CPU_IVDEP for (int64_t j = 0; j < t; j++) y16[r * t + j] = pmap_bf16_round(yr[j]);
    if (stats_out) stats_out[2 * r] = mx, stats_out[2 * r + 1] = inv;
  }
  return PMAP_SUCCESS;
}

/* The longest row the backward widens from bfloat16 probabilities (attention's context limit). */
#define CPU_SOFTMAX_MAX_T 4096

/* One row of the backward: dot is sum_j y dy over the row's first i + 1 columns, y widened from
 * y16 when it is given (exact: the same floats as y). */
CPU_INLINE void softmax_back_row(const float *yr, const pmap_bf16 *y16r, const float *dyr,
                                 float *dxr, pmap_bf16 *dx16r, int64_t i, int64_t t, float scale,
                                 float *wide) {
  if (y16r) {
    CPU_IVDEP for (int64_t j = 0; j <= i; j++) wide[j] = pmap_bf16_widen(y16r[j]);
    yr = wide;
  }
  float dot = (float)row_sum(yr, dyr, i + 1);
  CPU_IVDEP for (int64_t j = 0; j <= i; j++) dxr[j] = scale * yr[j] * (dyr[j] - dot);
  for (int64_t j = i + 1; j < t; j++) dxr[j] = 0.0f;
  if (dx16r) CPU_IVDEP for (int64_t j = 0; j < t; j++) dx16r[j] = pmap_bf16_round(dxr[j]);
}

CPU_KERNEL(extern, pmap_status, cpu_causal_softmax_backward,
           (op_queue *q, const float *y, const float *dy, float *dx, int64_t n, int64_t rows,
            int64_t t, int64_t first, float scale, const pmap_bf16 *y16, pmap_bf16 *dx16),
           (q, y, dy, dx, n, rows, t, first, scale, y16, dx16)) {
  (void)q;
  float wide[CPU_SOFTMAX_MAX_T]; /* a row's widened probabilities (dx may be dy: not there) */
  if (y16 && first + rows > CPU_SOFTMAX_MAX_T)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "causal_softmax_backward: rows of %lld from bfloat16 probabilities: at most %d",
                    (long long)(first + rows), CPU_SOFTMAX_MAX_T);
  for (int64_t r = 0, k = 0; r < n * rows; r++, k = k + 1 < rows ? k + 1 : 0)
    softmax_back_row(y16 ? NULL : y + r * t, y16 ? y16 + r * t : NULL, dy + r * t, dx + r * t,
                     dx16 ? dx16 + r * t : NULL, first + k, t, scale, wide);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_embedding_forward,
           (op_queue *q, const int32_t *ids, const float *table, int64_t n, int64_t v, int64_t d,
            float *y),
           (q, ids, table, n, v, d, y)) {
  (void)q;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = ids[i];
    for (int64_t j = 0; j < d; j++) y[i * d + j] = id >= 0 && id < v ? table[id * d + j] : 0.0f;
  }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_embedding_backward,
           (op_queue *q, const int32_t *ids, const float *dy, int64_t n, int64_t v, int64_t d,
            float *dtable),
           (q, ids, dy, n, v, d, dtable)) {
  (void)q;
  for (int64_t i = 0; i < n; i++) {
    int64_t id = ids[i];
    if (id < 0 || id >= v) continue;
    for (int64_t j = 0; j < d; j++) dtable[id * d + j] += dy[i * d + j];
  }
  return PMAP_SUCCESS;
}
