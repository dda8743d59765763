/* ops_check.h: what the op tests share: allocation, random fills kept off zero, NaN checks,
 * the accumulate-contract expectation and central finite differences against a float64
 * reference. Included by test_ops_dense.c and test_ops_conv.c. */
#ifndef PMAP_OPS_CHECK_H
#define PMAP_OPS_CHECK_H

#include "ops/ops.h"
#include "testutil.h"

#define OPS pmap_cpu_ops

/* Relative tolerances: fp32 forward against double, and fp32 gradients against finite
 * differences of the double reference. */
#define TOL_FWD 1e-5
#define TOL_GRAD 1e-4
/* Finite differences are taken at most at this many entries per array (sampled beyond it). */
#define FD_MAX_SAMPLES 160

static inline float *falloc(size_t n) {
  float *p = calloc(n ? n : 1, sizeof *p);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

static inline double *dalloc(size_t n) {
  double *p = calloc(n ? n : 1, sizeof *p);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

static inline int64_t rand_int(uint64_t *s, int64_t lo, int64_t hi) {
  return lo + (int64_t)(test_rand_u64(s) % (uint64_t)(hi - lo + 1));
}

static inline void fill_nan(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = NAN;
}

/* Magnitudes in [lo, hi) with random signs: keeps values off zero (and off the relu kink). */
static inline void fill_away(float *x, size_t n, uint64_t *s, float lo, float hi) {
  for (size_t i = 0; i < n; i++) {
    float v = test_rand_uniform(s, lo, hi);
    x[i] = (test_rand_u64(s) & 1) ? v : -v;
  }
}

static inline void to_double(const float *x, double *d, size_t n) {
  for (size_t i = 0; i < n; i++) d[i] = x[i];
}

/* Fails when any entry is NaN, naming the first one. */
static inline int no_nan(const char *what, const float *x, size_t n) {
  test_checks++;
  for (size_t i = 0; i < n; i++)
    if (isnan(x[i])) {
      test_failures++;
      fprintf(stderr, "FAIL %s: NaN survived at %zu\n", what, i);
      return 0;
    }
  return 1;
}

/* expect[i] = before[i] + delta[i] in double: what an accumulating (+=) write must produce. */
static inline void expect_sum(const float *before, const float *delta, double *expect, size_t n) {
  for (size_t i = 0; i < n; i++) expect[i] = (double)before[i] + (double)delta[i];
}

/* A scalar function of double arrays that the caller reaches through ctx. */
typedef double (*scalar_fn)(const void *ctx);

/* Central differences (f(x + h e_i) - f(x - h e_i)) / 2h at every entry of x (or at
 * FD_MAX_SAMPLES random entries of a larger x), compared with the op's gradient `got`. */
static inline void fd_check(const char *what, scalar_fn f, const void *ctx, double *x, size_t n,
                            const float *got, double h, double tol, uint64_t *s) {
  size_t cnt = n <= FD_MAX_SAMPLES ? n : FD_MAX_SAMPLES;
  size_t *idx = malloc((cnt ? cnt : 1) * sizeof *idx);
  double *fd = dalloc(cnt);
  float *an = falloc(cnt);
  if (!idx) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  for (size_t j = 0; j < cnt; j++) {
    size_t i = n <= FD_MAX_SAMPLES ? j : (size_t)(test_rand_u64(s) % n);
    double x0 = x[i];
    x[i] = x0 + h;
    double lp = f(ctx);
    x[i] = x0 - h;
    double lm = f(ctx);
    x[i] = x0;
    idx[j] = i;
    fd[j] = (lp - lm) / (2.0 * h);
    an[j] = got[i];
  }
  if (!test_close(what, an, fd, cnt, tol) && cnt < n) {
    /* test_close named a sample; name the array index it stands for. */
    size_t wj = 0;
    for (size_t j = 1; j < cnt; j++)
      if (fabs((double)an[j] - fd[j]) > fabs((double)an[wj] - fd[wj])) wj = j;
    fprintf(stderr, "  (sampled: sample %zu is index %zu of %zu)\n", wj, idx[wj], n);
  }
  free(idx);
  free(fd);
  free(an);
}

#endif
