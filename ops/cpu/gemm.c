/* gemm.c: the CPU GEMM. Provider fixed at configure time: oneDNN's dnnl_sgemm, else a CBLAS,
 * else the portable blocked loop below; tiny shapes always take the loop (library call
 * overhead dominates there). */
#include "cpu_ops.h"

#include <string.h>

#include "runtime/error.h"

#if defined(PMAP_GEMM_DNNL)
#include <dnnl.h>
#elif defined(PMAP_GEMM_CBLAS)
#include <cblas.h>
#endif
#if defined(PMAP_HAVE_OPENMP)
#include <omp.h>
#endif

/* Below this many multiply-adds the loop beats a library call. */
#define SMALL_GEMM_MACS 4096
#define KBLOCK 256

const char *pmap_gemm_provider(void) {
#if defined(PMAP_GEMM_DNNL)
  return "onednn";
#elif defined(PMAP_GEMM_CBLAS)
  return "cblas";
#else
  return "portable";
#endif
}

int cpu_gemm_threads_set(int n) {
#if defined(PMAP_HAVE_OPENMP)
  int old = omp_get_max_threads();
  if (old != n) omp_set_num_threads(n);
  return old;
#elif defined(PMAP_HAVE_OPENBLAS_THREADS)
  extern void openblas_set_num_threads(int);
  extern int openblas_get_num_threads(void);
  int old = openblas_get_num_threads();
  if (old != n) openblas_set_num_threads(n);
  return old;
#else
  return n;
#endif
}

void cpu_gemm_portable(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                       int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                       int64_t ldc) {
  for (int64_t i = 0; i < m; i++) {
    float *ci = c + i * ldc;
    if (beta == 0.0f)
      memset(ci, 0, (size_t)n * sizeof *ci);
    else if (beta != 1.0f)
      for (int64_t j = 0; j < n; j++) ci[j] *= beta;
  }
  if (!tb) {
    /* c row i += a(i, p) * b row p: unit stride in the inner loop; k blocked so a panel of b
     * stays in cache across the rows of c. */
    for (int64_t p0 = 0; p0 < k; p0 += KBLOCK) {
      int64_t p1 = p0 + KBLOCK < k ? p0 + KBLOCK : k;
      for (int64_t i = 0; i < m; i++) {
        float *ci = c + i * ldc;
        for (int64_t p = p0; p < p1; p++) {
          float aip = alpha * (ta ? a[p * lda + i] : a[i * lda + p]);
          const float *bp = b + p * ldb;
          for (int64_t j = 0; j < n; j++) ci[j] += aip * bp[j];
        }
      }
    }
  } else {
    /* b stored (n, k): c(i, j) is a dot product of a row of op(a) and a row of b. */
    for (int64_t i = 0; i < m; i++) {
      float *ci = c + i * ldc;
      for (int64_t j = 0; j < n; j++) {
        const float *bj = b + j * ldb;
        float s = 0.0f;
        if (!ta) {
          const float *ai = a + i * lda;
          for (int64_t p = 0; p < k; p++) s += ai[p] * bj[p];
        } else {
          for (int64_t p = 0; p < k; p++) s += a[p * lda + i] * bj[p];
        }
        ci[j] += alpha * s;
      }
    }
  }
}

pmap_status cpu_gemm(pmap_device *dev, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc) {
  (void)dev;
  if (m <= 0 || n <= 0) return PMAP_SUCCESS;
  if (k <= 0 || m * n * k <= SMALL_GEMM_MACS) {
    cpu_gemm_portable(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return PMAP_SUCCESS;
  }
#if defined(PMAP_GEMM_DNNL)
  dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success)
    return PMAP_ERR(PMAP_ERR_DEVICE, "dnnl_sgemm(%c, %c, m=%lld, n=%lld, k=%lld) failed: status %d",
                    ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k,
                    (int)st);
#elif defined(PMAP_GEMM_CBLAS)
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m,
              (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
#else
  cpu_gemm_portable(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
  return PMAP_SUCCESS;
}
