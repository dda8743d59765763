/* bf16.c: the CPU kernels of the bf16 policy: rounding to bfloat16 and back, and the portable
 * path of the bfloat16 GEMMs: the operands widened to float (exactly) and multiplied by the
 * float GEMM in use, whose products of bfloat16 values are exact, so the semantics are oneDNN's
 * bf16 matmul's (bfloat16 inputs, float sums; bf16_onednn.c). Which one runs is chosen once per
 * process (bf16_choice.c). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bf16.h"
#include "cpu_ops.h"
#include "ops/op_math.h"

CPU_KERNEL(extern, pmap_status, cpu_round_bf16,
           (op_queue *q, const float *x, pmap_bf16 *y16, float *y32, size_t n),
           (q, x, y16, y32, n)) {
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

CPU_KERNEL(extern, pmap_status, cpu_round_bf16_block,
           (op_queue *q, const float *x, int64_t ldx, const float *b, float *db, pmap_bf16 *y16,
            int64_t ldy, int64_t rows, int64_t cols),
           (q, x, ldx, b, db, y16, ldy, rows, cols)) {
  (void)q;
  if (db && ldx != cols)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "round_bf16_block: a bias gradient needs ldx %lld = cols %lld", (long long)ldx,
                    (long long)cols);
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * ldx;
    pmap_bf16 *yr = y16 + r * ldy;
    if (b)
      CPU_IVDEP for (int64_t c = 0; c < cols; c++) yr[c] = pmap_bf16_round(xr[c] + b[c]);
    else
      CPU_IVDEP for (int64_t c = 0; c < cols; c++) yr[c] = pmap_bf16_round(xr[c]);
    if (db)
      for (int64_t c = 0; c < cols; c++) db[c] += xr[c];
  }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_widen_bf16,
           (op_queue *q, const pmap_bf16 *x, float *y, size_t n), (q, x, y, n)) {
  (void)q;
  CPU_IVDEP for (size_t i = 0; i < n; i++) y[i] = pmap_bf16_widen(x[i]);
  return PMAP_SUCCESS;
}

/* rows x cols of x (leading dimension ld) widened into the packed y (cols per row). */
CPU_KERNEL_VOID(static, widen_matrix,
                (const pmap_bf16 *x, int64_t ld, int64_t rows, int64_t cols, float *y),
                (x, ld, rows, cols, y)) {
  for (int64_t r = 0; r < rows; r++) {
    const pmap_bf16 *xr = x + r * ld;
    float *yr = y + r * cols;
    CPU_IVDEP for (int64_t c = 0; c < cols; c++) yr[c] = pmap_bf16_widen(xr[c]);
  }
}

/* rows x cols of op(x) starting at (r0, c0), where op(x) is x or, trans, x's transpose (x at
 * leading dimension ld), widened into the packed y as stored: *ld_y is y's leading dimension. */
static void widen_block(const pmap_bf16 *x, int64_t ld, int trans, int64_t r0, int64_t c0,
                        int64_t rows, int64_t cols, float *y, int64_t *ld_y) {
  if (trans) {
    widen_matrix(x + c0 * ld + r0, ld, cols, rows, y);
    *ld_y = rows;
  } else {
    widen_matrix(x + r0 * ld + c0, ld, rows, cols, y);
    *ld_y = cols;
  }
}

/* The portable path of one GEMM of a batch: the operands widened into the calling thread's
 * scratch, as stored (a transposed operand stays transposed), then the float GEMM in use. When
 * both fit in CPU_BF16_SCRATCH floats they are widened whole and multiplied by one call;
 * otherwise k is cut into slices of at most CPU_BF16_BLOCK_K and c into tiles of as many rows and
 * columns as keep a slice of both operands within the scratch (256 at least), each tile summed
 * over the slices in order (c = alpha a b + beta c on the first, + c on the next): the scratch
 * stays within CPU_BF16_SCRATCH floats whatever the shape. */
/* The tiles portable_one cuts g into: slices of kb of k, tiles of mb rows and nb columns. */
static void portable_tiles(const bf16_gemm *g, int64_t *kb, int64_t *mb, int64_t *nb) {
  int64_t m = g->m, n = g->n, k = g->k;
  int whole = (double)k * (double)(m + n) <= (double)CPU_BF16_SCRATCH;
  *kb = whole || k < CPU_BF16_BLOCK_K ? k : CPU_BF16_BLOCK_K;
  int64_t side = *kb > 0 ? CPU_BF16_SCRATCH / 2 / *kb : 0; /* rows of a tile, and columns */
  *mb = whole || m < side ? m : side;
  *nb = whole || n < side ? n : side;
}

size_t cpu_bf16_portable_scratch(const bf16_gemm *g) {
  int64_t kb, mb, nb;
  portable_tiles(g, &kb, &mb, &nb);
  size_t floats = (size_t)(mb * kb) + (size_t)(kb * nb);
  return (floats > 0 ? floats : 1) * sizeof(float);
}

static pmap_status portable_one(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b,
                                float *c, bf16_ws ws) {
  int64_t m = g->m, n = g->n, k = g->k, kb, mb, nb;
  portable_tiles(g, &kb, &mb, &nb);
  size_t na = (size_t)(mb * kb), bytes = cpu_bf16_portable_scratch(g);
  float *buf = cpu_bf16_scratch_in(ws, bytes);
  if (!buf)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "gemm_bf16: out of memory for %zu floats of widened operands (m %lld n %lld k "
                    "%lld)",
                    bytes / sizeof(float), (long long)m, (long long)n, (long long)k);
  for (int64_t i = 0; i < m; i += mb) {
    int64_t mi = m - i < mb ? m - i : mb;
    for (int64_t j = 0; j < n; j += nb) {
      int64_t nj = n - j < nb ? n - j : nb;
      float *cij = c + i * g->ldc + j;
      /* k == 0 still runs once: c = beta c. */
      for (int64_t p = 0; p < k || p == 0; p += kb) {
        int64_t kp = k - p < kb ? k - p : kb;
        int64_t lda = 1, ldb = 1;
        if (kp > 0) {
          widen_block(a, g->lda, g->ta, i, p, mi, kp, buf, &lda);
          widen_block(b, g->ldb, g->tb, p, j, kp, nj, buf + na, &ldb);
        }
        PMAP_TRY(cpu_gemm(NULL, g->ta, g->tb, mi, nj, kp, g->alpha, buf, lda, buf + na, ldb,
                          p == 0 ? g->beta : 1.0f, cij, g->ldc));
        if (kp == 0) break;
      }
    }
  }
  return PMAP_SUCCESS;
}

pmap_status cpu_bf16_portable(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b, float *c,
                              bf16_ws ws) {
  for (int64_t o = 0; o < g->groups; o++)
    for (int64_t i = 0; i < g->batch; i++)
      PMAP_TRY(portable_one(g, a + o * g->ga + i * g->sa, b + o * g->gb + i * g->sb,
                            c + o * g->gc + i * g->sc, ws));
  return PMAP_SUCCESS;
}
