/* pmap-train: the main job. Trains one of the example models data-parallel on N devices and
 * prints progress, a summary, and with --json a last line of JSON; --plot draws the loss curve. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "pmap.h"
#include "pmap_examples.h"

static const char *prog = "pmap-train";

static void usage(FILE *f) {
  fprintf(f,
          "usage: pmap-train [--model linear|mlp|convnet|mlp-1024|cifar-cnn] [--devices N]\n"
          "                  [--backend auto|cpu|cuda] [--steps S] [--batch B] [--lr LR]\n"
          "                  [--seed K] [--samples S] [--log-every E] [--plot FILE] [--json]\n"
          "  --model      example model (default linear)\n"
          "  --devices    device count (default: CPU: $PMAP_CPU_DEVICES or 4)\n"
          "  --backend    auto picks CUDA where a GPU is usable, else the CPU (default auto)\n"
          "  --steps      training steps (default: the model's)\n"
          "  --batch      GLOBAL batch, a multiple of the device count (default: the model's)\n"
          "  --lr         learning rate (default: the model's)\n"
          "  --seed       seed of the parameters and the data (default 0)\n"
          "  --samples    data set rows, rounded up to a multiple of the batch (default: the model's)\n"
          "  --log-every  progress line every E steps, 0 for none (default steps/10)\n"
          "  --plot       draw the loss curve into the PNG file FILE with gnuplot ($PMAP_GNUPLOT\n"
          "               or gnuplot on the PATH); without gnuplot a note says so and training\n"
          "               is unaffected\n"
          "  --json       end with one line of JSON\n");
}

typedef struct opts {
  const char *model, *backend, *plot;
  int64_t devices, steps, batch, samples, log_every;
  float lr;
  int have_lr, json;
  uint64_t seed;
} opts;

static int parse(int argc, char **argv, opts *o) {
  static const char *const flags[] = {"--json", NULL};
  static const char *const value_opts[] = {"--model", "--backend", "--devices", "--steps", "--batch", "--samples", "--log-every", "--seed", "--lr", "--plot", NULL};
  *o = (opts){"linear", "auto", NULL, PMAP_DEVICES_DEFAULT, -1, -1, -1, -1, 0.0f, 0, 0, 0};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = NULL;
    int kind = cli_next(prog, argc, argv, &i, flags, value_opts, &v);
    if (kind == CLI_ERROR) return -1;
    if (kind == CLI_HELP) {
      usage(stdout);
      exit(0);
    }
    if (!strcmp(a, "--json")) {
      o->json = 1;
    } else if (!strcmp(a, "--model")) {
      o->model = v;
    } else if (!strcmp(a, "--backend")) {
      o->backend = v;
    } else if (!strcmp(a, "--plot")) {
      o->plot = v;
    } else if (!strcmp(a, "--devices")) {
      if (cli_int(prog, a, v, 1, PMAP_MAX_DEVICES, &o->devices)) return -1;
    } else if (!strcmp(a, "--steps")) {
      if (cli_int(prog, a, v, 1, INT64_C(1) << 40, &o->steps)) return -1;
    } else if (!strcmp(a, "--batch")) {
      if (cli_int(prog, a, v, 1, INT64_C(1) << 24, &o->batch)) return -1;
    } else if (!strcmp(a, "--samples")) {
      if (cli_int(prog, a, v, 1, INT64_C(1) << 24, &o->samples)) return -1;
    } else if (!strcmp(a, "--log-every")) {
      if (cli_int(prog, a, v, 0, INT64_C(1) << 40, &o->log_every)) return -1;
    } else if (!strcmp(a, "--seed")) {
      if (cli_u64(prog, a, v, &o->seed)) return -1;
    } else if (!strcmp(a, "--lr")) {
      if (cli_float(prog, a, v, &o->lr)) return -1;
      o->have_lr = 1;
    }
  }
  return 0;
}

static int fail(const char *what) {
  fprintf(stderr, "%s: %s: %s\n", prog, what, pmap_last_error());
  return 1;
}

/* The gnuplot to run: $PMAP_GNUPLOT, else "gnuplot"; a bare name is looked up on the PATH.
 * Writes the path into buf; 0 when there is none. */
static int find_gnuplot(char *buf, size_t size) {
  const char *name = getenv("PMAP_GNUPLOT");
  if (!name || !*name) name = "gnuplot";
  if (strchr(name, '/')) {
    snprintf(buf, size, "%s", name);
    return access(buf, X_OK) == 0;
  }
  const char *path = getenv("PATH");
  while (path && *path) {
    size_t len = strcspn(path, ":");
    if (len && (size_t)snprintf(buf, size, "%.*s/%s", (int)len, path, name) < size &&
        access(buf, X_OK) == 0)
      return 1;
    path += len + (path[len] == ':');
  }
  return 0;
}

/* Draws loss (n) against step into the PNG `file` through gnuplot. Plotting is an extra:
 * every failure is a note on stderr, never a failed run. */
static void plot_loss(const char *file, const char *title, const int64_t *step, const float *loss,
                      size_t n) {
  char gp[4096];
  if (!find_gnuplot(gp, sizeof gp)) {
    fprintf(stderr, "%s: note: --plot: gnuplot not found (install it, e.g. apt-get install "
                    "gnuplot-nox, or set PMAP_GNUPLOT); no loss curve drawn\n", prog);
    return;
  }
  if (strchr(gp, '\'') || strchr(file, '\'') || strchr(file, '\n')) {
    fprintf(stderr, "%s: note: --plot: quotes in the file or gnuplot path are not supported; "
                    "no loss curve drawn\n", prog);
    return;
  }
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "'%s'", gp);
  remove(file);
  /* gnuplot exiting early must end the plot, not this process. */
  void (*old)(int) = signal(SIGPIPE, SIG_IGN);
  FILE *p = popen(cmd, "w");
  if (!p) {
    signal(SIGPIPE, old);
    fprintf(stderr, "%s: note: --plot: cannot run %s; no loss curve drawn\n", prog, gp);
    return;
  }
  int positive = 1;
  for (size_t i = 0; i < n; i++) positive &= loss[i] > 0.0f && isfinite(loss[i]);
  fprintf(p, "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) { set terminal pngcairo size 800,500 "
             "noenhanced } else { set terminal png size 800,500 noenhanced }\n"
             "set output '%s'\nset title '%s'\nset xlabel 'step'\nset ylabel 'loss'\n"
             "set grid\n%sset key off\nplot '-' using 1:2 with lines linewidth 2\n",
          file, title, positive ? "set logscale y\n" : "");
  for (size_t i = 0; i < n; i++) fprintf(p, "%lld %.9g\n", (long long)step[i], (double)loss[i]);
  fprintf(p, "e\n");
  int rc = pclose(p);
  signal(SIGPIPE, old);
  FILE *check = fopen(file, "rb");
  if (rc != 0 || !check)
    fprintf(stderr, "%s: note: --plot: gnuplot (%s) failed (exit status %d); no loss curve "
                    "drawn\n", prog, gp, rc != -1 && WIFEXITED(rc) ? WEXITSTATUS(rc) : -1);
  else
    printf("loss curve: %s\n", file);
  if (check) fclose(check);
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o)) return 1;
  pmap_example_info info;
  pmap_backend backend;
  if (pmap_example_info_get(o.model, &info)) return fail("--model");
  if (pmap_backend_parse(o.backend, &backend)) return fail("--backend");
  if (o.steps < 0) o.steps = info.steps;
  if (o.batch < 0) o.batch = info.batch;
  if (o.samples < 0) o.samples = info.samples;
  if (o.have_lr) info.opt.lr = o.lr;
  if (o.log_every < 0) o.log_every = o.steps >= 10 ? o.steps / 10 : 1;
  int64_t rows = (o.samples + o.batch - 1) / o.batch * o.batch;
  int64_t batches = rows / o.batch;

  int code = 1;
  pmap_ctx *ctx = NULL;
  pmap_model *model = NULL;
  pmap_params *params = NULL;
  pmap_array xs = {0}, ys = {0};
  float *w0 = NULL, *wd = NULL, *curve = NULL;
  int64_t *curve_step = NULL;
  size_t ncurve = 0;
  pmap_config cfg = {.backend = backend, .num_devices = (int)o.devices};
  if (pmap_ctx_create(&cfg, &ctx)) { fail("cannot create the context"); goto out; }
  int n = pmap_ctx_num_devices(ctx);
  const char *bname = pmap_backend_name(pmap_ctx_backend(ctx));
  if (backend == PMAP_BACKEND_AUTO)
    fprintf(stderr, "%s: backend auto chose %s\n", prog, bname);
  if (o.batch % n) {
    fprintf(stderr, "%s: global batch %lld is not divisible by %d devices\n", prog,
            (long long)o.batch, n);
    goto out;
  }
  if (pmap_example_model(o.model, &model)) { fail("cannot build the model"); goto out; }
  if (pmap_params_create(ctx, model, &info.opt, o.seed, &params)) { fail("cannot create the parameters"); goto out; }
  if (pmap_example_data(o.model, o.seed + 1, rows, &xs, &ys)) { fail("cannot make the data"); goto out; }
  printf("pmap-train: model %s (%zu parameters), backend %s (gemm %s), %d devices, global batch "
         "%lld (%lld per device), %lld steps, %s lr %g, seed %llu\n",
         o.model, pmap_params_count(params), bname, pmap_gemm_provider(), n, (long long)o.batch,
         (long long)(o.batch / n), (long long)o.steps,
         info.opt.kind == PMAP_OPT_ADAM ? "Adam" : "SGD", (double)info.opt.lr,
         (unsigned long long)o.seed);

  size_t xrow = (size_t)(pmap_array_numel(&xs) / rows), yrow = (size_t)(pmap_array_numel(&ys) / rows);
  /* The loss curve keeps at most 100000 points: every stride-th step, and the last. */
  int64_t stride = o.steps / 100000 + 1;
  if (o.plot) {
    size_t cap = (size_t)(o.steps / stride + 2);
    curve = malloc(cap * sizeof *curve);
    curve_step = malloc(cap * sizeof *curve_step);
    if (!curve || !curve_step) { fprintf(stderr, "%s: out of memory\n", prog); goto out; }
  }
  float loss = NAN;
  double busy = 0.0, last_busy = 0.0;
  int64_t last_step = 0;
  for (int64_t s = 0; s < o.steps; s++) {
    int64_t first = (s % batches) * o.batch;
    pmap_array xb = xs, yb = ys;
    xb.data = (float *)xs.data + (size_t)first * xrow;
    yb.data = (char *)ys.data + (size_t)first * yrow * 4;
    xb.shape[0] = yb.shape[0] = o.batch;
    double t0 = cli_now();
    if (pmap_update(params, &xb, &yb, &loss)) { fail("pmap_update"); goto out; }
    busy += cli_now() - t0;
    if (curve && (s % stride == 0 || s == o.steps - 1)) {
      curve_step[ncurve] = s;
      curve[ncurve++] = loss;
    }
    if (o.log_every && (s % o.log_every == 0 || s == o.steps - 1)) {
      /* Throughput over the steps since the previous line. */
      printf("step %6lld  loss %.6f  samples/s %.0f\n", (long long)s, (double)loss,
             (double)(s + 1 - last_step) * (double)o.batch / (busy - last_busy));
      last_step = s + 1;
      last_busy = busy;
    }
  }
  double sps = (double)o.steps * (double)o.batch / busy;
  if (curve) {
    char title[256], mom[32] = "";
    if (info.opt.kind == PMAP_OPT_SGD && info.opt.momentum != 0.0f)
      snprintf(mom, sizeof mom, " momentum %g", (double)info.opt.momentum);
    snprintf(title, sizeof title, "pmap-train: %s, %d %s devices, global batch %lld, %s lr %g%s",
             o.model, n, bname, (long long)o.batch,
             info.opt.kind == PMAP_OPT_ADAM ? "Adam" : "SGD", (double)info.opt.lr, mom);
    plot_loss(o.plot, title, curve_step, curve, ncurve);
  }

  /* Check, do not assume, that every replica holds the same parameters. */
  size_t P = pmap_params_count(params);
  w0 = malloc(P * sizeof *w0);
  wd = malloc(P * sizeof *wd);
  if (!w0 || !wd) { fprintf(stderr, "%s: out of memory\n", prog); goto out; }
  if (pmap_params_read(params, 0, w0, P)) { fail("pmap_params_read"); goto out; }
  int identical = 1;
  for (int d = 1; d < n && identical; d++) {
    if (pmap_params_read(params, d, wd, P)) { fail("pmap_params_read"); goto out; }
    identical = memcmp(w0, wd, P * sizeof *w0) == 0;
  }
  printf("final loss %.6f after %lld steps, %.0f samples/s, replicas identical: %s\n",
         (double)loss, (long long)o.steps, sps, identical ? "yes" : "NO");
  int linear = !strcmp(o.model, "linear");
  if (linear) printf("w = %.4f, b = %.4f\n", (double)w0[0], (double)w0[1]);
  if (o.json) {
    printf("{\"model\": \"%s\", \"backend\": \"%s\", \"gemm\": \"%s\", \"devices\": %d, "
           "\"steps\": %lld, \"global_batch\": %lld, \"lr\": %g, \"seed\": %llu, "
           "\"final_loss\": %.9g, \"samples_per_sec\": %.1f, \"replicas_identical\": %s",
           o.model, bname, pmap_gemm_provider(), n, (long long)o.steps, (long long)o.batch,
           (double)info.opt.lr, (unsigned long long)o.seed, (double)loss, sps,
           identical ? "true" : "false");
    if (linear) printf(", \"w\": %.9g, \"b\": %.9g", (double)w0[0], (double)w0[1]);
    printf("}\n");
  }
  code = identical ? 0 : 1;
  if (!identical) fprintf(stderr, "%s: replicas differ after training\n", prog);
out:
  free(curve);
  free(curve_step);
  free(w0);
  free(wd);
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(params);
  pmap_model_destroy(model);
  pmap_ctx_destroy(ctx);
  return code;
}
