/* bench_util.c: statistics of step times, the pause between measurements, and the ring
 * all-reduce model of the scaling prediction (see bench/README.md). */
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "bench.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The q-quantile (0..1) of sorted t (n) by nearest rank. */
static double quantile(const double *t, int n, double q) {
  int i = (int)floor(q * (n - 1) + 0.5);
  return t[i < 0 ? 0 : i >= n ? n - 1 : i];
}

bench_stats bench_summarise(double *t, int n) {
  bench_stats s = {0.0, 0.0, 0.0, 0.0, n};
  if (n <= 0) return s;
  qsort(t, (size_t)n, sizeof *t, cmp_double);
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += t[i];
  s.med = 1e3 * quantile(t, n, 0.5);
  s.p10 = 1e3 * quantile(t, n, 0.1);
  s.p90 = 1e3 * quantile(t, n, 0.9);
  s.mean = 1e3 * sum / n;
  return s;
}

void bench_settle(void) {
  struct timespec ts = {0, 2000000}; /* 2 ms: ten times the longest idle spin */
  nanosleep(&ts, NULL);
}

double bench_predict_step(double t1, double t_opt, double bytes, int n, const bench_link *link) {
  double compute = (t1 - t_opt) / n + t_opt;
  if (n <= 1) return t1;
  double hops = 2.0 * (n - 1);
  return compute + hops * link->alpha_us * 1e-6 + hops / n * bytes / (link->busbw_gbs * 1e9);
}
