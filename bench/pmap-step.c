/* pmap-step: the ways one CUDA step can run, against each other: plain, the whole step as a
 * replayed CUDA graph, the gradient all-reduce overlapped with backward in buckets, both, and
 * the sharded optimizer (reduce-scatter, each device's part, all-gather; the others replicate
 * the optimizer, which the fast paths need), and the plain and captured steps under bf16;
 * on each device count, from the same initial parameters on the same batches. For each it
 * reports the step time (wall time of the timed steps over their count, the work drained at
 * the end), the host time of a step (the median time a pmap_update call takes to return: with
 * the numeric guard off and no loss asked for, a step's launch only; it includes waiting for
 * NCCL, whose non-blocking communicators launch each collective from a thread of their own),
 * the CPU time per step of the calling thread (device 0's work, without NCCL's threads or the
 * other devices'), the process CPU time per step (every thread, NCCL's and spinning waits
 * included), and the agreement of the parameters with the plain run's after the same steps
 * (max |w - w_plain| and the relative L2 difference).
 *
 *   pmap-step [--backend cuda] [--model mlp] [--devices 1,2,4] [--batch B] [--steps 50]
 *             [--warmup 5] [--variants plain,graph,overlap,graph+overlap,sharded,bf16,
 *             graph-bf16]
 *             [--bucket-mb 25]
 *             [--numeric-guard] [--loss] [--json]
 *
 * Every variant runs with the numeric guard off and no loss read back unless --numeric-guard or
 * --loss say otherwise (then each step waits for its read-back, and the host time includes the
 * GPU's). With --json, every row is followed at once by one line of JSON holding every row so
 * far, {"model": ..., "complete": false, "rows": [...]}, and the run ends with the same holding
 * them all, "complete": true: a run killed part way keeps what it measured in its last line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "pmap.h"
#include "pmap_examples.h"

#define PROG "pmap-step"
#define MAX_STEPS 100000

typedef struct variant {
  const char *name;
  int graphs, overlap, shard;
  pmap_precision precision;
} variant;

/* bf16 and graph-bf16: the plain and captured steps under the bf16 policy (docs/precision.md),
 * whose agreement with plain (fp32) is that of the two policies. */
#define N_VARIANTS 7
static const variant all_variants[N_VARIANTS] = {
    {"plain", -1, -1, PMAP_SHARD_OFF, PMAP_PRECISION_FP32},
    {"graph", 1, -1, PMAP_SHARD_OFF, PMAP_PRECISION_FP32},
    {"overlap", -1, 1, PMAP_SHARD_OFF, PMAP_PRECISION_FP32},
    {"graph+overlap", 1, 1, PMAP_SHARD_OFF, PMAP_PRECISION_FP32},
    {"sharded", -1, -1, PMAP_SHARD_ON, PMAP_PRECISION_FP32},
    {"bf16", -1, -1, PMAP_SHARD_OFF, PMAP_PRECISION_BF16},
    {"graph-bf16", 1, -1, PMAP_SHARD_OFF, PMAP_PRECISION_BF16}};

typedef struct opts {
  pmap_backend backend;
  const char *model;
  int64_t devices[CLI_MAX_LIST];
  int n_devices;
  int64_t batch, steps, warmup, bucket_mb;
  int guard, loss, json;
  int use[N_VARIANTS];
} opts;

typedef struct result {
  double step_ms, host_us, thread_us, cpu_us, max_abs, rel_l2;
  float final_loss;
  int ok;
} result;

static double cpu_seconds(clockid_t which) {
  struct timespec t;
  clock_gettime(which, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* One variant on n devices: w_out (P) receives device 0's parameters after every step. */
static int run_variant(const opts *o, const variant *v, int n, const pmap_array *xs,
                       const pmap_array *ys, float *w_out, size_t P, result *r) {
  pmap_example_info info;
  pmap_model *m = NULL;
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  double *host = calloc((size_t)o->steps, sizeof *host);
  int rc = -1;
  pmap_config cfg = {.backend = o->backend,
                     .num_devices = n,
                     .numeric_guard = o->guard ? PMAP_GUARD_ON : PMAP_GUARD_OFF,
                     .cuda_graphs = v->graphs,
                     .cuda_overlap = v->overlap,
                     .cuda_bucket_mb = (int)o->bucket_mb,
                     .shard_optimizer = v->shard};
  if (!host || pmap_example_info_get(o->model, &info) || pmap_example_model(o->model, &m) ||
      pmap_ctx_create(&cfg, &ctx) || pmap_params_create(ctx, m, &info.opt, 0, &p) ||
      pmap_params_set_precision(p, v->precision)) {
    fprintf(stderr, PROG ": %s on %d devices: %s\n", v->name, n, pmap_last_error());
    goto out;
  }
  float loss = NAN;
  for (int64_t s = 0; s < o->warmup; s++)
    if (pmap_update(p, xs, ys, o->loss ? &loss : NULL)) goto fail;
  double t0 = cli_now(), c0 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  double h0 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  for (int64_t s = 0; s < o->steps; s++) {
    double a = cli_now();
    if (pmap_update(p, xs, ys, o->loss ? &loss : NULL)) goto fail;
    host[s] = cli_now() - a;
  }
  /* Reading the parameters waits for every queued step. */
  if (pmap_params_read(p, 0, w_out, P)) goto fail;
  double t1 = cli_now(), c1 = cpu_seconds(CLOCK_PROCESS_CPUTIME_ID);
  double h1 = cpu_seconds(CLOCK_THREAD_CPUTIME_ID);
  qsort(host, (size_t)o->steps, sizeof *host, cmp_double);
  r->step_ms = 1e3 * (t1 - t0) / (double)o->steps;
  r->host_us = 1e6 * host[o->steps / 2];
  r->cpu_us = 1e6 * (c1 - c0) / (double)o->steps;
  r->thread_us = 1e6 * (h1 - h0) / (double)o->steps;
  r->final_loss = loss;
  r->ok = 1;
  rc = 0;
  goto out;
fail:
  fprintf(stderr, PROG ": %s on %d devices: %s\n", v->name, n, pmap_last_error());
out:
  pmap_params_destroy(p);
  pmap_ctx_destroy(ctx);
  pmap_model_destroy(m);
  free(host);
  return rc;
}

static void agreement(const float *w, const float *base, size_t P, result *r) {
  double worst = 0.0, num = 0.0, den = 0.0;
  for (size_t i = 0; i < P; i++) {
    double d = (double)w[i] - (double)base[i];
    if (!(fabs(d) <= worst)) worst = fabs(d); /* NaN sticks */
    num += d * d;
    den += (double)base[i] * base[i];
  }
  r->max_abs = worst;
  r->rel_l2 = sqrt(num) / (den > 0.0 ? sqrt(den) : 1.0);
}

/* --backend's names, in the order of pmap_backend's values they stand for. */
static const char *const backend_names[] = {"auto", "cpu", "cuda", NULL};

static int backend_check(const char *prog, const cli_option *o, const char *v) {
  (void)o;
  for (int k = 0; backend_names[k]; k++)
    if (!strcmp(v, backend_names[k])) return 0;
  return cli_error(prog, "--backend %s: cuda, cpu or auto", v);
}

/* Each name of the comma-separated list is a variant's. */
static int variants_check(const char *prog, const cli_option *o, const char *v) {
  (void)o;
  for (const char *t = v; *t;) {
    size_t len = strcspn(t, ",");
    int k = 0;
    while (k < N_VARIANTS &&
           (strlen(all_variants[k].name) != len || strncmp(t, all_variants[k].name, len)))
      k++;
    if (len && k == N_VARIANTS)
      return cli_error(
          prog,
          "--variants: unknown %.*s (plain, graph, overlap, graph+overlap, sharded, bf16, "
          "graph-bf16)",
          (int)len, t);
    t += len + (t[len] == ',');
  }
  return 0;
}

/* The options (tools/cli.h), read into *o after its defaults: 0, 1 after --help, -1 on an
 * error (printed). */
static int parse(int argc, char **argv, opts *o) {
  const char *backend = "cuda", *variants = NULL;
  *o = (opts){.model = "mlp", .devices = {1, 2, 4}, .n_devices = 3, .steps = 50, .warmup = 5};
  const cli_option table[] = {
      {.name = "--backend",
       .kind = CLI_STRING,
       .dest = &backend,
       .arg = "cuda|cpu|auto",
       .help = "the backend (default cuda)",
       .check = backend_check},
      {.name = "--model",
       .kind = CLI_STRING,
       .dest = &o->model,
       .arg = "NAME",
       .help = "example model (default mlp)"},
      {.name = "--devices",
       .kind = CLI_LIST,
       .dest = o->devices,
       .count = &o->n_devices,
       .lo = 1,
       .hi = PMAP_MAX_DEVICES,
       .arg = "1,2,4",
       .help = "device counts, one table row per variant each (default 1,2,4)"},
      {.name = "--batch",
       .kind = CLI_INT,
       .dest = &o->batch,
       .lo = 1,
       .hi = INT32_MAX,
       .arg = "B",
       .help = "global batch (default: the model's)"},
      {.name = "--steps",
       .kind = CLI_INT,
       .dest = &o->steps,
       .lo = 1,
       .hi = MAX_STEPS,
       .arg = "N",
       .help = "timed steps per variant (default 50)"},
      {.name = "--warmup",
       .kind = CLI_INT,
       .dest = &o->warmup,
       .lo = 0,
       .hi = MAX_STEPS,
       .arg = "W",
       .help = "steps before the timed ones (default 5)"},
      {.name = "--variants",
       .kind = CLI_STRING,
       .dest = &variants,
       .arg = "plain,graph,overlap,graph+overlap,sharded,bf16,graph-bf16",
       .help = "the variants to time (default all); plain always runs, as the reference of the "
               "agreement",
       .check = variants_check},
      {.name = "--bucket-mb",
       .kind = CLI_INT,
       .dest = &o->bucket_mb,
       .lo = 1,
       .hi = 4096,
       .arg = "MB",
       .help = "gradient bucket size of the overlap variants (default: the library's, "
               "PMAP_CUDA_BUCKET_MB or 25)"},
      {.name = "--numeric-guard",
       .kind = CLI_FLAG,
       .dest = &o->guard,
       .flag = 1,
       .help = "keep the numeric guard on (default off; then each step waits for its read-back)"},
      {.name = "--loss",
       .kind = CLI_FLAG,
       .dest = &o->loss,
       .flag = 1,
       .help = "read the loss back after every step (default not)"},
      {.name = "--json",
       .kind = CLI_FLAG,
       .dest = &o->json,
       .flag = 1,
       .help = "end with one line of JSON: {\"rows\": [...]}"},
  };
  const cli_spec spec = {
      PROG, table, (int)(sizeof table / sizeof table[0]),
      "The ways one CUDA step can run, against each other on each device count: plain, the "
      "whole step as a replayed CUDA graph, the gradient all-reduce overlapped with backward in "
      "buckets, both, and the sharded optimizer; step time, host and CPU time per step, and the "
      "agreement of the parameters with the plain run's.",
      NULL};
  int r = cli_parse(&spec, argc, argv);
  if (r) return r;
  for (int k = 0; backend_names[k]; k++)
    if (!strcmp(backend, backend_names[k])) o->backend = (pmap_backend)k;
  for (int k = 0; k < N_VARIANTS; k++) {
    const char *t = variants;
    size_t len = strlen(all_variants[k].name);
    int named = !variants;
    while (t && *t && !named) {
      size_t n = strcspn(t, ",");
      named = n == len && !strncmp(t, all_variants[k].name, len);
      t += n + (t[n] == ',');
    }
    o->use[k] = named;
  }
  o->use[0] = 1; /* the reference of the agreement */
  return 0;
}

int main(int argc, char **argv) {
  /* Line by line into a log too: a run killed at its time limit keeps every row it printed. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  opts o;
  int pr = parse(argc, argv, &o);
  if (pr) return pr < 0;
  pmap_example_info info;
  pmap_model *m = NULL;
  if (pmap_example_info_get(o.model, &info) || pmap_example_model(o.model, &m)) {
    fprintf(stderr, PROG ": --model %s: %s\n", o.model, pmap_last_error());
    return 1;
  }
  size_t P = pmap_model_num_params(m);
  pmap_model_destroy(m);
  float *base = calloc(P ? P : 1, sizeof *base), *w = calloc(P ? P : 1, sizeof *w);
  int failed = 0, first = 1;
  char json[16384];
  size_t jl = 0; /* the rows' JSON so far */
  json[0] = '\0';
  printf(
      "# host_us: a pmap_update call's wall time, waiting for NCCL's launch threads included;\n"
      "# thread_us: CPU time of the calling thread (device 0); cpu_us: CPU time of the whole\n"
      "# process (every device's thread and NCCL's), each per step\n");
  printf("%-10s %7s %6s %-14s %10s %10s %10s %10s %12s %12s\n", "model", "devices", "batch",
         "variant", "step_ms", "host_us", "thread_us", "cpu_us", "max_abs_diff", "rel_l2_diff");
  for (int di = 0; di < o.n_devices && base && w; di++) {
    int n = (int)o.devices[di];
    int64_t b = o.batch ? o.batch : info.batch;
    b = b >= n ? b / n * n : n;
    pmap_array xs = {0}, ys = {0};
    if (pmap_example_data(o.model, 1, b, &xs, &ys)) {
      fprintf(stderr, PROG ": data: %s\n", pmap_last_error());
      failed = 1;
      break;
    }
    for (int k = 0; k < N_VARIANTS; k++) {
      if (!o.use[k]) continue;
      result r = {0};
      if (run_variant(&o, &all_variants[k], n, &xs, &ys, k == 0 ? base : w, P, &r)) {
        failed = 1;
        continue;
      }
      if (k == 0)
        agreement(base, base, P, &r);
      else
        agreement(w, base, P, &r);
      printf("%-10s %7d %6lld %-14s %10.4f %10.2f %10.2f %10.2f %12.3g %12.3g\n", o.model, n,
             (long long)b, all_variants[k].name, r.step_ms, r.host_us, r.thread_us, r.cpu_us,
             r.max_abs, r.rel_l2);
      if (jl < sizeof json)
        jl += (size_t)snprintf(json + jl, sizeof json - jl,
                               "%s{\"model\": \"%s\", \"devices\": %d, \"global_batch\": %lld, "
                               "\"variant\": \"%s\", \"step_ms\": %.6g, \"host_us\": %.6g, "
                               "\"thread_cpu_us\": %.6g, \"cpu_us\": %.6g, \"max_abs_diff\": %.6g, "
                               "\"rel_l2_diff\": %.6g}",
                               first ? "" : ", ", o.model, n, (long long)b, all_variants[k].name,
                               r.step_ms, r.host_us, r.thread_us, r.cpu_us,
                               isfinite(r.max_abs) ? r.max_abs : -1.0,
                               isfinite(r.rel_l2) ? r.rel_l2 : -1.0);
      first = 0;
      if (o.json && jl < sizeof json)
        printf("{\"model\": \"%s\", \"complete\": false, \"rows\": [%s]}\n", o.model, json);
    }
    pmap_example_data_free(&xs, &ys);
  }
  if (o.json && jl < sizeof json)
    printf("{\"model\": \"%s\", \"complete\": true, \"rows\": [%s]}\n", o.model, json);
  free(base);
  free(w);
  return failed;
}
