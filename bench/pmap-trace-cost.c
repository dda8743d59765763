/* pmap-trace-cost: what recording a timeline costs a step. One context and one model; rounds of
 * S steps with the recording off, then S with it on (pmap_trace_start before, pmap_trace_stop
 * after, outside the timed steps), interleaved so that the machine's drift hits both alike; the
 * medians and their ratio. Also the cost of one span alone (trace_span with its two clock reads).
 *   pmap-trace-cost [MODEL [DEVICES [ROUNDS [STEPS]]]]   (default mlp-1024 4 10 5) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/trace.h"
#include "cli.h"
#include "pmap.h"
#include "pmap_examples.h"
#include "runtime/runtime.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ns per span: trace_span with the clock reads a recorded span pays, into a ring of 10 steps. */
static double span_ns(void) {
  trace_rec *t = NULL;
  trace_window w = {10, 0, 0};
  if (trace_create(1, w, pmap_now_ns(), &t)) return -1;
  enum { N = 1000000 };
  int64_t t0 = pmap_now_ns();
  for (int i = 0; i < N; i++) {
    if (i % 1000 == 0) trace_set_step(t, i / 1000);
    int64_t a = pmap_now_ns();
    trace_span(t, 0, "forward", "dense", i % 7, "layer", a, pmap_now_ns(), -1);
  }
  double ns = (double)(pmap_now_ns() - t0) / N;
  trace_destroy(t);
  return ns;
}

int main(int argc, char **argv) {
  const char *model = argc > 1 ? argv[1] : "mlp-1024";
  int devices = argc > 2 ? atoi(argv[2]) : 4, rounds = argc > 3 ? atoi(argv[3]) : 10;
  int steps = argc > 4 ? atoi(argv[4]) : 5;
  if (devices < 1 || rounds < 1 || steps < 1) {
    fprintf(stderr, "usage: pmap-trace-cost [MODEL [DEVICES [ROUNDS [STEPS]]]]\n");
    return 1;
  }
  pmap_example_info info;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_array xs = {0}, ys = {0};
  if (pmap_example_info_get(model, &info) || pmap_ctx_create(&cfg, &ctx) ||
      pmap_example_model(model, &m) || pmap_params_create(ctx, m, &info.opt, 1, &p) ||
      pmap_example_data(model, 2, info.batch, &xs, &ys)) {
    fprintf(stderr, "pmap-trace-cost: %s\n", pmap_last_error());
    return 1;
  }
  double *off = malloc(sizeof *off * (size_t)(rounds * steps));
  double *on = malloc(sizeof *on * (size_t)(rounds * steps));
  int no = 0, nn = 0;
  const char *path = "/tmp/pmap-trace-cost.json";
  for (int i = 0; i < 2; i++) pmap_update(p, &xs, &ys, NULL); /* warm-up */
  for (int r = 0; r < rounds; r++) {
    for (int mode = 0; mode < 2; mode++) {
      if (mode && pmap_trace_start(ctx, path, NULL)) {
        fprintf(stderr, "pmap-trace-cost: %s\n", pmap_last_error());
        return 1;
      }
      for (int s = 0; s < steps; s++) {
        double t0 = cli_now();
        if (pmap_update(p, &xs, &ys, NULL)) {
          fprintf(stderr, "pmap-trace-cost: %s\n", pmap_last_error());
          return 1;
        }
        double t = cli_now() - t0;
        if (mode)
          on[nn++] = t;
        else
          off[no++] = t;
      }
      if (mode) pmap_trace_stop(ctx);
    }
  }
  remove(path);
  double moff = median(off, no), mon = median(on, nn);
  printf(
      "%s on %d CPU devices, batch %lld: median step %.3f ms off, %.3f ms on (%+.2f%%), "
      "%d steps each in %d interleaved rounds\n",
      model, devices, (long long)info.batch, 1e3 * moff, 1e3 * mon, 100 * (mon / moff - 1), no,
      rounds);
  printf("one span: %.1f ns (trace_span and its two clock reads)\n", span_ns());
  free(off);
  free(on);
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return 0;
}
