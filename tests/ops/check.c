/* check.c: the op harness's comparisons (harness.h): relative error with NaN and infinities
 * checked apart and the first mismatch printed with both values, the gain of an accumulated
 * buffer, bitwise equality, and central finite differences of a float64 loss. */
#include <stdlib.h>

#include "harness.h"

static void *dalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "test_ops: out of memory for %zu bytes\n", bytes);
    exit(2);
  }
  return p;
}

static int same_class(double a, double b) {
  if (isnan(b)) return isnan(a);
  if (isinf(b)) return a == b;
  return isfinite(a);
}

/* Keeps the largest ratio of a measured error to its tolerance, per kind of comparison in the
 * case and over the run. */
static void note(hx *h, const char *what, double ratio) {
  int w = 0;
  while (w < h->nworst && strcmp(h->worst[w].what, what) != 0) w++;
  if (w == h->nworst && w < (int)(sizeof h->worst / sizeof h->worst[0])) {
    snprintf(h->worst[w].what, sizeof h->worst[w].what, "%s", what);
    h->worst[w].ratio = 0.0;
    h->nworst++;
  }
  if (w < h->nworst && ratio > h->worst[w].ratio) h->worst[w].ratio = ratio;
  if (ratio > h->worst_ratio) {
    h->worst_ratio = ratio;
    snprintf(h->worst_at, sizeof h->worst_at, "%.40s: %.50s%s%.60s%s", h->op, what,
             h->trial[0] ? " (" : "", h->trial, h->trial[0] ? ")" : "");
  }
}

/* got against want (n) relative to max(||want||, scale sqrt(n)), element i of the report being
 * idx[i] when idx is not NULL. */
static int close_core(hx *h, const char *what, const double *got, const double *want, size_t n,
                      double tol, const size_t *idx, double scale) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    if (!same_class(got[i], want[i])) {
      hx_check(h, 0, "%s: non-finite mismatch at %zu of %zu: got %.9g, want %.9g", what,
               idx ? idx[i] : i, n, got[i], want[i]);
      return 0;
    }
    if (!isfinite(want[i])) continue;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  double rms = fmax(n ? sqrt(den / (double)n) : 0.0, scale);
  double norm = fmax(sqrt(den), scale * sqrt((double)n));
  double rel = sqrt(num) / (norm > 1e-30 ? norm : 1e-30);
  note(h, what, rel / tol);
  if (rel <= tol) {
    hx_check(h, 1, "%s", what);
    return 1;
  }
  size_t first = n, worst = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(want[i])) continue;
    double d = fabs(got[i] - want[i]);
    if (first == n && d > tol * fmax(fabs(want[i]), rms)) first = i;
    if (d > fabs(got[worst] - want[worst]) || !isfinite(want[worst])) worst = i;
  }
  if (first == n) first = worst;
  hx_check(h, 0,
           "%s: relative error %.3g > %.3g over %zu; first off at %zu: got %.9g, want %.9g; worst "
           "at %zu: got %.9g, want %.9g",
           what, rel, tol, n, idx ? idx[first] : first, got[first], want[first],
           idx ? idx[worst] : worst, got[worst], want[worst]);
  return 0;
}

int hx_close_scale(hx *h, const char *what, const float *got, const double *want, size_t n,
                   double tol, double scale) {
  double *g = dalloc(n * sizeof *g);
  for (size_t i = 0; i < n; i++) g[i] = got[i];
  int ok = close_core(h, what, g, want, n, tol, NULL, scale);
  free(g);
  return ok;
}

int hx_close(hx *h, const char *what, const float *got, const double *want, size_t n, double tol) {
  return hx_close_scale(h, what, got, want, n, tol, 0.0);
}

int hx_close_f(hx *h, const char *what, const float *got, const float *want, size_t n, double tol) {
  double *w = dalloc(n * sizeof *w);
  for (size_t i = 0; i < n; i++) w[i] = want[i];
  int ok = hx_close(h, what, got, w, n, tol);
  free(w);
  return ok;
}

/* What an accumulated (+=) value can be held to: a few ulps of what it started from, whatever
 * it gained (rounding got = base + gain costs up to half an ulp of base). */
double hx_base_scale(const float *base, size_t n, double tol) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)base[i] * base[i];
  return n ? 4.0 * 0x1p-24 * sqrt(s / (double)n) / tol : 0.0;
}

int hx_gain_scale(hx *h, const char *what, const float *got, const float *base, const double *want,
                  size_t n, double tol, double scale) {
  scale = fmax(scale, hx_base_scale(base, n, tol));
  double *g = dalloc(n * sizeof *g);
  for (size_t i = 0; i < n; i++) g[i] = (double)got[i] - (double)base[i];
  int ok = close_core(h, what, g, want, n, tol, NULL, scale);
  free(g);
  return ok;
}

int hx_gain(hx *h, const char *what, const float *got, const float *base, const double *want,
            size_t n, double tol) {
  return hx_gain_scale(h, what, got, base, want, n, tol, 0.0);
}

int hx_same(hx *h, const char *what, const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (isnan(got[i]) && isnan(want[i])) continue;
    if (memcmp(&got[i], &want[i], sizeof got[i]) != 0) {
      hx_check(h, 0, "%s: differs at %zu of %zu: got %.9g, want %.9g", what, i, n, (double)got[i],
               (double)want[i]);
      return 0;
    }
  }
  hx_check(h, 1, "%s", what);
  return 1;
}

int hx_same16(hx *h, const char *what, const pmap_bf16 *got, const pmap_bf16 *want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      hx_check(h, 0, "%s: differs at %zu of %zu: got bfloat16 0x%04x, want 0x%04x", what, i, n,
               (unsigned)got[i], (unsigned)want[i]);
      return 0;
    }
  hx_check(h, 1, "%s", what);
  return 1;
}

void hx_fd_scale(hx *h, const char *what, hx_loss f, const void *ctx, double *x, size_t n,
                 const float *got, const float *base, double step, double tol, double scale) {
  size_t cnt = n <= h->fd_samples ? n : h->fd_samples;
  size_t *idx = dalloc(cnt * sizeof *idx);
  double *fd = dalloc(cnt * sizeof *fd), *an = dalloc(cnt * sizeof *an);
  for (size_t j = 0; j < cnt; j++) {
    size_t i = cnt == n ? j : (size_t)(hx_u64(h) % n);
    double x0 = x[i];
    x[i] = x0 + step;
    double lp = f(ctx, i);
    x[i] = x0 - step;
    double lm = f(ctx, i);
    x[i] = x0;
    idx[j] = i;
    fd[j] = (lp - lm) / (2.0 * step);
    an[j] = base ? (double)got[i] - (double)base[i] : (double)got[i];
  }
  if (base) scale = fmax(scale, hx_base_scale(base, n, tol));
  char label[160];
  snprintf(label, sizeof label, "%s against finite differences%s", what,
           cnt < n ? " (sampled)" : "");
  close_core(h, label, an, fd, cnt, tol, idx, scale);
  free(idx), free(fd), free(an);
}

void hx_fd(hx *h, const char *what, hx_loss f, const void *ctx, double *x, size_t n,
           const float *got, const float *base, double step, double tol) {
  hx_fd_scale(h, what, f, ctx, x, n, got, base, step, tol, 0.0);
}
