/* pmap-bench: times pmap_update for one example model over a list of device counts (strong
 * scaling: the global batch stays fixed) and prints, per count, the median step time with its
 * spread, samples/s, speedup and efficiency; --json ends with the same as one JSON object. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "pmap.h"
#include "pmap_examples.h"

static const char *prog = "pmap-bench";

typedef struct row {
  int devices;
  double first_ms, med_ms, p10_ms, p90_ms, sps, speedup, eff;
  float loss;
} row;

static void usage(FILE *f) {
  fprintf(f,
          "usage: pmap-bench [--model linear|mlp|convnet|mlp-1024] [--devices 1,2,4]\n"
          "                  [--batch B] [--steps S] [--warmup W] [--backend auto|cpu|cuda]\n"
          "                  [--seed K] [--json]\n"
          "  times S steps of pmap_update after W warm-up steps at each device count, with the\n"
          "  same global batch B (default: the model's); speedup and efficiency are relative to\n"
          "  the first count of the list.\n");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The q-quantile (0..1) of sorted t (n) by nearest rank. */
static double quantile(const double *t, int n, double q) {
  int i = (int)floor(q * (n - 1) + 0.5);
  return t[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static int fail(const char *what) {
  fprintf(stderr, "%s: %s: %s\n", prog, what, pmap_last_error());
  return -1;
}

/* One device count under test: its context, training state, data and step times. */
typedef struct setup {
  pmap_ctx *ctx;
  pmap_model *model;
  pmap_params *params;
  pmap_array xs, ys;
  double *t; /* (steps) */
  int nt;
} setup;

static void setup_free(setup *s) {
  free(s->t);
  pmap_example_data_free(&s->xs, &s->ys);
  pmap_params_destroy(s->params);
  pmap_model_destroy(s->model);
  pmap_ctx_destroy(s->ctx);
}

/* Creates everything for `devices`, times the first step (latency) and runs the warm-up. */
static int setup_open(setup *s, const char *model_name, pmap_backend backend, int devices,
                      int64_t batch, int steps, int warmup, uint64_t seed, row *r) {
  pmap_example_info info;
  pmap_config cfg = {backend, devices, NULL, 0.0};
  memset(s, 0, sizeof *s);
  s->t = malloc(sizeof *s->t * (size_t)steps);
  if (!s->t) { fprintf(stderr, "%s: out of memory\n", prog); return -1; }
  if (pmap_example_info_get(model_name, &info)) return fail("--model");
  if (pmap_ctx_create(&cfg, &s->ctx)) return fail("cannot create the context");
  if (pmap_example_model(model_name, &s->model)) return fail("cannot build the model");
  if (pmap_params_create(s->ctx, s->model, &info.opt, seed, &s->params))
    return fail("cannot create the parameters");
  if (pmap_example_data(model_name, seed + 1, batch, &s->xs, &s->ys))
    return fail("cannot make the data");
  r->devices = devices;
  double t0 = cli_now();
  if (pmap_update(s->params, &s->xs, &s->ys, &r->loss)) return fail("pmap_update");
  r->first_ms = 1e3 * (cli_now() - t0);
  for (int i = 0; i < warmup; i++)
    if (pmap_update(s->params, &s->xs, &s->ys, &r->loss)) return fail("pmap_update");
  return 0;
}

/* Times n more steps of s. */
static int timed_steps(setup *s, int n, row *r) {
  for (int i = 0; i < n; i++) {
    double t0 = cli_now();
    if (pmap_update(s->params, &s->xs, &s->ys, &r->loss)) return fail("pmap_update");
    s->t[s->nt++] = cli_now() - t0;
  }
  return 0;
}

static void summarise(setup *s, int64_t batch, row *r) {
  qsort(s->t, (size_t)s->nt, sizeof *s->t, cmp_double);
  r->med_ms = 1e3 * quantile(s->t, s->nt, 0.5);
  r->p10_ms = 1e3 * quantile(s->t, s->nt, 0.1);
  r->p90_ms = 1e3 * quantile(s->t, s->nt, 0.9);
  r->sps = (double)batch / (r->med_ms * 1e-3);
}

int main(int argc, char **argv) {
  static const char *const value_opts[] = {"--model", "--backend", "--devices", "--batch", "--steps", "--warmup", "--seed", NULL};
  const char *model = "mlp-1024", *backend_s = "auto";
  int64_t devs[CLI_MAX_LIST] = {1, 2, 4}, batch = -1, steps = -1, warmup = -1;
  int ndev = 3, json = 0;
  uint64_t seed = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--json")) {
      json = 1;
    } else if (!cli_is_option(a, value_opts)) {
      fprintf(stderr, "%s: unknown option %s (see --help)\n", prog, a);
      return 1;
    } else if (!(v = cli_value(prog, argc, argv, &i))) {
      return 1;
    } else if (!strcmp(a, "--model")) {
      model = v;
    } else if (!strcmp(a, "--backend")) {
      backend_s = v;
    } else if (!strcmp(a, "--devices")) {
      if (cli_int_list(prog, a, v, 1, PMAP_MAX_DEVICES, devs, &ndev)) return 1;
    } else if (!strcmp(a, "--batch")) {
      if (cli_int(prog, a, v, 1, INT64_C(1) << 24, &batch)) return 1;
    } else if (!strcmp(a, "--steps")) {
      if (cli_int(prog, a, v, 1, 1000000, &steps)) return 1;
    } else if (!strcmp(a, "--warmup")) {
      if (cli_int(prog, a, v, 0, 1000000, &warmup)) return 1;
    } else if (!strcmp(a, "--seed")) {
      if (cli_u64(prog, a, v, &seed)) return 1;
    }
  }
  pmap_example_info info;
  pmap_backend backend;
  if (pmap_example_info_get(model, &info)) { fail("--model"); return 1; }
  if (pmap_backend_parse(backend_s, &backend)) { fail("--backend"); return 1; }
  if (batch < 0) batch = info.batch;
  int heavy = !strcmp(model, "mlp-1024");
  if (steps < 0) steps = heavy ? 20 : 500;
  if (warmup < 0) warmup = heavy ? 3 : 50;
  for (int i = 0; i < ndev; i++)
    if (batch % devs[i]) {
      fprintf(stderr, "%s: global batch %lld is not divisible by %lld devices\n", prog,
              (long long)batch, (long long)devs[i]);
      return 1;
    }

  /* Every count is set up first, then timed in interleaved rounds, so that a slow spell of
   * the machine spreads over all counts instead of skewing one. */
  row rows[CLI_MAX_LIST];
  setup su[CLI_MAX_LIST];
  int opened = 0, code = 0;
  const char *bname = "?";
  for (; opened < ndev; opened++)
    if (setup_open(&su[opened], model, backend, (int)devs[opened], batch, (int)steps,
                   (int)warmup, seed, &rows[opened])) {
      opened++;
      code = 1;
      break;
    }
  if (!code) bname = pmap_backend_name(pmap_ctx_backend(su[0].ctx));
  int rounds = steps < 5 ? (int)steps : 5;
  for (int round = 0; !code && round < rounds; round++)
    for (int i = 0; i < ndev && !code; i++) {
      int n = (int)(steps * (round + 1) / rounds - steps * round / rounds);
      if (timed_steps(&su[i], n, &rows[i])) code = 1;
    }
  for (int i = 0; i < ndev && !code; i++) summarise(&su[i], batch, &rows[i]);
  for (int i = 0; i < opened; i++) setup_free(&su[i]);
  if (code) return code;
  printf("pmap-bench: model %s, backend %s (gemm %s), global batch %lld, median of %lld steps "
         "(5 interleaved rounds) after %lld warm-up\n",
         model, bname, pmap_gemm_provider(), (long long)batch, (long long)steps,
         (long long)warmup);
  printf("%7s %12s %12s %12s %12s %12s %13s %8s %10s\n", "devices", "global_batch", "step0_ms",
         "median_ms", "p10_ms", "p90_ms", "samples/s", "speedup", "efficiency");
  for (int i = 0; i < ndev; i++) {
    row *r = &rows[i];
    r->speedup = rows[0].med_ms / r->med_ms;
    r->eff = r->speedup / ((double)r->devices / (double)rows[0].devices);
    printf("%7d %12lld %12.4f %12.4f %12.4f %12.4f %13.1f %8.3f %10.3f\n", r->devices,
           (long long)batch, r->first_ms, r->med_ms, r->p10_ms, r->p90_ms, r->sps, r->speedup,
           r->eff);
  }
  if (json) {
    printf("{\"model\": \"%s\", \"backend\": \"%s\", \"gemm\": \"%s\", \"global_batch\": %lld, "
           "\"steps\": %lld, \"warmup\": %lld, \"rows\": [",
           model, bname, pmap_gemm_provider(), (long long)batch, (long long)steps,
           (long long)warmup);
    for (int i = 0; i < ndev; i++) {
      row *r = &rows[i];
      printf("%s{\"devices\": %d, \"step0_ms\": %.6g, \"median_ms\": %.6g, \"p10_ms\": %.6g, "
             "\"p90_ms\": %.6g, \"samples_per_sec\": %.6g, \"speedup\": %.6g, "
             "\"efficiency\": %.6g, \"loss\": %.9g}",
             i ? ", " : "", r->devices, r->first_ms, r->med_ms, r->p10_ms, r->p90_ms, r->sps,
             r->speedup, r->eff, (double)r->loss);
    }
    printf("]}\n");
  }
  return 0;
}
