/* gemm.c: the CPU GEMM providers: oneDNN's dnnl_sgemm and a CBLAS where the build found them,
 * and the portable blocked loop, always (gemm.h). The op cpu_gemm (gemm_choice.c) calls the one
 * chosen for the machine; tiny shapes always take the loop (library call overhead dominates
 * there). */
#include "gemm.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"
#include "cpu_isa.h"

#if defined(PMAP_GEMM_DNNL)
#include <dnnl.h>
#endif
#if defined(PMAP_GEMM_CBLAS)
#include <cblas.h>
#endif
#if defined(PMAP_HAVE_OPENMP)
#include <omp.h>
#endif

#define KBLOCK 256

CPU_KERNEL_VOID(extern, cpu_gemm_portable,
                (int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc),
                (ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)) {
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

#if defined(PMAP_GEMM_PORTABLE)
static pmap_status portable_run(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                                const float *a, int64_t lda, const float *b, int64_t ldb,
                                float beta, float *c, int64_t ldc) {
  cpu_gemm_portable(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  return PMAP_SUCCESS;
}
#endif

#if defined(PMAP_GEMM_DNNL)
static pmap_status dnnl_run(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                            float *c, int64_t ldc) {
  (void)cpu_isa_active(); /* oneDNN's cap is set before its first call */
  dnnl_status_t st =
      dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success)
    return PMAP_ERR(PMAP_ERR_DEVICE, "dnnl_sgemm(%c, %c, m=%lld, n=%lld, k=%lld) failed: status %d",
                    ta ? 'T' : 'N', tb ? 'T' : 'N', (long long)m, (long long)n, (long long)k,
                    (int)st);
  return PMAP_SUCCESS;
}

#if defined(PMAP_HAVE_OPENMP)
/* oneDNN runs on OpenMP, whose thread count is a setting of the calling thread. */
static int omp_threads_set(int n) {
  int old = omp_get_max_threads();
  if (old != n) omp_set_num_threads(n);
  return old;
}
#endif
#endif

#if defined(PMAP_GEMM_CBLAS)
static pmap_status cblas_run(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                             float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m,
              (int)n, (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
  return PMAP_SUCCESS;
}

#if defined(PMAP_HAVE_OPENBLAS_THREADS)
extern void openblas_set_num_threads(int);
extern int openblas_get_num_threads(void);
extern int openblas_get_parallel(void);
/* OpenBLAS's pthread build (Debian's default) keeps one count for the process; its OpenMP build
 * passes the count to OpenMP, per calling thread. */
static int openblas_threads_set(int n) {
  int old = openblas_get_num_threads();
  if (old != n) openblas_set_num_threads(n);
  return old;
}

static int openblas_process_wide(void) { return openblas_get_parallel() == 1; }
#endif

#if defined(PMAP_HAVE_OPENBLAS_CORENAME)
extern char *openblas_get_corename(void);
/* OpenBLAS chooses its kernels when it loads (by the CPU, or OPENBLAS_CORETYPE): the level of
 * the core it chose, by the names of its x86-64 cores with AVX-512 and with AVX2. */
static int openblas_isa(void) {
  const char *core = openblas_get_corename();
  static const char *const avx512[] = {"skylakex", "cooperlake", "sapphirerapids"};
  static const char *const avx2[] = {"haswell", "zen", "excavator", "steamroller"};
  for (size_t i = 0; core && i < sizeof avx512 / sizeof avx512[0]; i++)
    if (strcasecmp(core, avx512[i]) == 0) return CPU_ISA_AVX512;
  for (size_t i = 0; core && i < sizeof avx2 / sizeof avx2[0]; i++)
    if (strcasecmp(core, avx2[i]) == 0) return CPU_ISA_AVX2;
  return CPU_ISA_BASELINE;
}
#endif
#endif

static const cpu_gemm_provider providers[] = {
#if defined(PMAP_GEMM_DNNL)
    {.name = "onednn",
     .run = dnnl_run,
#if defined(PMAP_HAVE_OPENMP)
     .threads_set = omp_threads_set,
#endif
     .threads_process_wide = NULL},
#endif
#if defined(PMAP_GEMM_CBLAS)
    {
        .name = "cblas",
        .run = cblas_run,
#if defined(PMAP_HAVE_OPENBLAS_THREADS)
        .threads_set = openblas_threads_set,
        .threads_process_wide = openblas_process_wide,
#endif
#if defined(PMAP_HAVE_OPENBLAS_CORENAME)
        .isa = openblas_isa,
#endif
    },
#endif
#if defined(PMAP_GEMM_PORTABLE)
    {.name = "portable", .run = portable_run, .threads_set = NULL, .threads_process_wide = NULL},
#endif
};
_Static_assert(sizeof providers > 0, "the build has no CPU GEMM provider (meson.build)");

const cpu_gemm_provider *cpu_gemm_list(int *count) {
  *count = (int)(sizeof providers / sizeof providers[0]);
  return providers;
}

const cpu_gemm_provider *cpu_gemm_find(const char *name) {
  for (size_t i = 0; name && i < sizeof providers / sizeof providers[0]; i++)
    if (strcmp(providers[i].name, name) == 0) return &providers[i];
  return NULL;
}

static char names[64];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void names_make(void) {
  size_t len = 0;
  for (size_t i = 0; i < sizeof providers / sizeof providers[0]; i++)
    len +=
        (size_t)snprintf(names + len, sizeof names - len, "%s%s", i ? "," : "", providers[i].name);
}

const char *pmap_gemm_providers(void) {
  pthread_once(&names_once, names_make);
  return names;
}

pmap_status cpu_gemm_with(const cpu_gemm_provider *p, int ta, int tb, int64_t m, int64_t n,
                          int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                          int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return PMAP_SUCCESS;
  if (k <= 0 || m * n * k <= CPU_GEMM_SMALL_MACS) {
    cpu_gemm_portable(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return PMAP_SUCCESS;
  }
  return p->run(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
