/* testutil.h: what every test shares: a failure counter, comparisons that print the first
 * mismatching index with both values, NaN/Inf checks, and deterministic random data. A test
 * returns test_exit() from main: non-zero when anything failed. */
#ifndef PMAP_TESTUTIL_H
#define PMAP_TESTUTIL_H

#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bounds.h"
#include "pmap.h"

/* ThreadSanitizer runs the suite 10 to 20 times slower. Tests whose grids repeat the same
 * threading paths over many models and device counts (test_shard, test_equiv, test_layers) take
 * a subset under it, chosen to keep every path (every device count, oversubscribed ones too, on
 * one model; every model on one device count); the whole grids run in the other builds. */
#if defined(__SANITIZE_THREAD__)
#define TEST_UNDER_TSAN 1
#else
#define TEST_UNDER_TSAN 0
#endif

static int test_failures = 0;
static int test_checks = 0;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    test_checks++;                                                    \
    if (!(cond)) {                                                    \
      test_failures++;                                                \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
    }                                                                 \
  } while (0)

/* A pmap call that must succeed; prints pmap_last_error() when it does not. */
#define CHECK_OK(call)                                                                         \
  do {                                                                                         \
    pmap_status check_ok_s_ = (call);                                                          \
    CHECK(check_ok_s_ == PMAP_SUCCESS, "%s -> %s: %s", #call, pmap_status_string(check_ok_s_), \
          pmap_last_error());                                                                  \
  } while (0)

/* Whether msg begins with the public function that `call_text` calls ("pmap_update(p, ..."
 * -> "pmap_update: "); 1 for a call that is not a pmap_ function (a test's own helper). */
static inline int test_msg_names_call(const char *call_text, const char *msg) {
  if (strncmp(call_text, "pmap_", 5) != 0) return 1;
  size_t len = strcspn(call_text, "( ");
  return strncmp(msg, call_text, len) == 0 && msg[len] == ':';
}

/* A pmap call that must fail with `want`, and whose message must contain `needle` and begin
 * with the function's name. */
#define CHECK_FAILS(call, want, needle)                                                            \
  do {                                                                                             \
    pmap_status check_f_s_ = (call);                                                               \
    CHECK(check_f_s_ == (want), "%s -> %s, want %s (%s)", #call, pmap_status_string(check_f_s_),   \
          pmap_status_string(want), pmap_last_error());                                            \
    CHECK(strstr(pmap_last_error(), (needle)) != NULL, "%s: message \"%s\" lacks \"%s\"", #call,   \
          pmap_last_error(), (needle));                                                            \
    CHECK(test_msg_names_call(#call, pmap_last_error()),                                           \
          "%s: message \"%s\" does not begin with the function called", #call, pmap_last_error()); \
  } while (0)

/* bound_output_size of params' outputs on x (a model of m's output shape; y's dtype says which
 * loss: labels or targets), from pmap_predict at the parameters it holds (batch norm's from its
 * running statistics, standing in for the training pass's); INFINITY after a failed check. */
static inline double test_output_size(pmap_params *params, const pmap_model *m, const pmap_array *x,
                                      const pmap_array *y) {
  int rank;
  int64_t shape[PMAP_MAX_RANK], osh[PMAP_MAX_RANK] = {x->shape[0]};
  pmap_model_output_shape(m, &rank, shape);
  size_t n = (size_t)x->shape[0];
  for (int i = 0; i < rank; i++) n *= (size_t)(osh[i + 1] = shape[i]);
  float *out = malloc(n * sizeof *out);
  pmap_array o = pmap_array_f32(out, rank + 1, osh);
  double size = INFINITY;
  if (out && pmap_predict(params, x, &o) == PMAP_SUCCESS)
    size = bound_output_size(out, n, y->dtype != PMAP_F32);
  test_checks++;
  if (!isfinite(size)) {
    test_failures++;
    fprintf(stderr, "FAIL the outputs' size: %s\n", pmap_last_error());
  }
  free(out);
  return size;
}

static inline int test_exit(const char *name) {
  printf("%s: %d checks, %d failed\n", name, test_checks, test_failures);
  return test_failures ? 1 : 0;
}

/* Relative error ||a - b|| / max(||b||, tiny) in double, after a separate NaN/Inf check.
 * Returns 1 when within tol; otherwise prints the worst index with both values. */
static inline int test_close(const char *what, const float *a, const double *b, size_t n,
                             double tol) {
  double num = 0.0, den = 0.0, worst = -1.0;
  size_t wi = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(a[i]) || !isfinite(b[i])) {
      fprintf(stderr, "FAIL %s: non-finite at %zu: got %g, want %g\n", what, i, (double)a[i], b[i]);
      test_failures++;
      return 0;
    }
    double d = (double)a[i] - b[i];
    num += d * d;
    den += b[i] * b[i];
    if (fabs(d) > worst) worst = fabs(d), wi = i;
  }
  double rel = sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
  test_checks++;
  if (!(rel <= tol)) {
    test_failures++;
    fprintf(stderr, "FAIL %s: relative error %.3g > %.3g; worst at %zu: got %.9g, want %.9g\n",
            what, rel, tol, wi, n ? (double)a[wi] : 0.0, n ? b[wi] : 0.0);
    return 0;
  }
  return 1;
}

/* Same for two float arrays. */
static inline int test_close_f(const char *what, const float *a, const float *b, size_t n,
                               double tol) {
  double *bd = malloc((n ? n : 1) * sizeof *bd);
  if (!bd) return 0;
  for (size_t i = 0; i < n; i++) bd[i] = b[i];
  int ok = test_close(what, a, bd, n, tol);
  free(bd);
  return ok;
}

/* ||a - b|| / max(||b||, tiny) in double; infinity when a sum is not finite. */
static inline double test_rel_err(const float *a, const float *b, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double e = (double)a[i] - (double)b[i];
    num += e * e;
    den += (double)b[i] * b[i];
  }
  return isfinite(num) ? sqrt(num / (den > 1e-30 ? den : 1e-30)) : INFINITY;
}

/* Bitwise equality; prints the first differing index. */
static inline int test_same_bits(const char *what, const float *a, const float *b, size_t n) {
  test_checks++;
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof a[i]) != 0) {
      test_failures++;
      fprintf(stderr, "FAIL %s: differs at %zu: %.9g vs %.9g\n", what, i, (double)a[i],
              (double)b[i]);
      return 0;
    }
  return 1;
}

/* Deterministic uniform floats in [lo, hi) from a 64-bit state. */
static inline uint64_t test_rand_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static inline float test_rand_uniform(uint64_t *s, float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(test_rand_u64(s) >> 40) / (double)(1 << 24));
}

static inline void test_fill(float *x, size_t n, uint64_t *s, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = test_rand_uniform(s, lo, hi);
}

#endif
