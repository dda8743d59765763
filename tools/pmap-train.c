/* pmap-train: the main job. Trains one of the example models, or an MLP on .npy data
 * (--data/--labels), data-parallel on N devices and prints progress, a summary, and with --json a
 * last line of JSON; --plot draws the loss curve. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "pmap.h"
#include "pmap_examples.h"
#include "train_data.h"
#include "train_plot.h"
#include "train_state.h"

static const char *prog = "pmap-train";

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: pmap-train [--model linear|mlp|convnet|mlp-1024|cifar-cnn|res-mlp|cifar-bn]\n"
      "                  [--devices N]\n"
      "                  [--backend auto|cpu|cuda] [--steps S] [--batch B] [--lr LR]\n"
      "                  [--seed K] [--samples S] [--log-every E] [--plot FILE] [--json]\n"
      "                  [--save FILE [--save-every K]] [--resume FILE] [--verify-every K]\n"
      "                  [--clip-norm X] [--no-numeric-guard] [--micro-batches K]\n"
      "                  [--shard-optimizer | --no-shard-optimizer]\n"
      "                  [--data X.npy --labels Y.npy [--hidden 128,64] [--eval-fraction F]]\n"
      "  --model      example model (default linear)\n"
      "  --data       train on the features in X.npy (f4 or f8, (rows, features) or\n"
      "               (rows, C, H, W)) instead of an example model: an MLP sized from the data\n"
      "  --labels     Y.npy: integer labels (i4 or i8, (rows) or (rows, 1): softmax\n"
      "               cross-entropy) or float targets (f4 or f8, (rows, K): MSE)\n"
      "  --hidden     hidden widths of the MLP, ReLU after each (default 128,64)\n"
      "  --eval-fraction  rows held out (after a shuffle from --seed) and evaluated at each\n"
      "               progress line and at the end: loss, and accuracy for labels (default 0)\n"
      "               With --data: Adam lr 0.001, batch 64 and 1000 steps unless given; each\n"
      "               epoch takes the training rows in an order drawn from --seed and the\n"
      "               epoch number, the same for any device count\n"
      "  --micro-batches  split each device's rows into K pieces (gradient accumulation)\n"
      "  --devices    device count, per process under mpirun (default: CPU:\n"
      "               $PMAP_CPU_DEVICES or 4)\n"
      "  --backend    auto picks CUDA where a GPU is usable, else the CPU (default auto)\n"
      "  --steps      training steps in all, resumed ones included (default: the model's)\n"
      "  --batch      GLOBAL batch, a multiple of the device count (under mpirun: of every\n"
      "               process's devices; each process trains on its rows) (default: the model's)\n"
      "  --lr         learning rate (default: the model's)\n"
      "  --seed       seed of the parameters and the data (default 0)\n"
      "  --samples    data set rows, rounded up to a multiple of the batch (default: the model's)\n"
      "  --log-every  progress line every E steps, 0 for none (default steps/10)\n"
      "  --plot       draw the loss curve into the PNG file FILE with gnuplot ($PMAP_GNUPLOT\n"
      "               or gnuplot on the PATH); without gnuplot a note says so and training\n"
      "               is unaffected\n"
      "  --json       end with one line of JSON (also when the run fails: then with \"error\")\n"
      "  --save       write a checkpoint to FILE at the end (atomically: a crash keeps the\n"
      "               previous one)\n"
      "  --save-every also every K steps (needs --save)\n"
      "  --resume     continue the run saved in FILE up to --steps steps in all; --model,\n"
      "               --seed, --batch and --samples must be those of the saved run; --lr,\n"
      "               --devices, --backend and the rest may change\n"
      "  --verify-every  check every K steps that all replicas are bitwise identical\n"
      "  --clip-norm  scale the averaged gradient to global L2 norm <= X (default 0: off)\n"
      "  --no-numeric-guard  let non-finite loss or gradients through (default: the step is\n"
      "               skipped and pmap-train stops with exit status 1)\n"
      "  --shard-optimizer     each device keeps the optimizer state of its 1/N of the\n"
      "               parameters and steps only those (ZeRO-1; the same results)\n"
      "  --no-shard-optimizer  every device keeps all of it (default: the library's,\n"
      "               PMAP_SHARD_OPTIMIZER when set, else sharded from 65536 parameters)\n");
}

typedef struct opts {
  const char *model, *backend, *plot, *save, *resume, *data, *labels;
  int64_t devices, steps, batch, samples, log_every, save_every, verify_every, micro;
  int64_t hidden[CLI_MAX_LIST];
  int n_hidden, have_model;
  double eval_fraction;
  float lr, clip_norm;
  int have_lr, json, no_guard, shard;
  uint64_t seed;
} opts;

static int parse(int argc, char **argv, opts *o) {
  static const char *const flags[] = {"--json", "--no-numeric-guard", "--shard-optimizer",
                                      "--no-shard-optimizer", NULL};
  static const char *const value_opts[] = {
      "--model",     "--backend",       "--devices",   "--steps",         "--batch", "--samples",
      "--log-every", "--seed",          "--lr",        "--plot",          "--save",  "--save-every",
      "--resume",    "--verify-every",  "--clip-norm", "--micro-batches", "--data",  "--labels",
      "--hidden",    "--eval-fraction", NULL};
  *o = (opts){.model = "linear",
              .backend = "auto",
              .devices = PMAP_DEVICES_DEFAULT,
              .steps = -1,
              .batch = -1,
              .samples = -1,
              .log_every = -1,
              .micro = 1,
              .hidden = {128, 64},
              .n_hidden = 2};
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
    } else if (!strcmp(a, "--no-numeric-guard")) {
      o->no_guard = 1;
    } else if (!strcmp(a, "--shard-optimizer")) {
      o->shard = PMAP_SHARD_ON;
    } else if (!strcmp(a, "--no-shard-optimizer")) {
      o->shard = PMAP_SHARD_OFF;
    } else if (!strcmp(a, "--model")) {
      o->model = v;
      o->have_model = 1;
    } else if (!strcmp(a, "--data")) {
      o->data = v;
    } else if (!strcmp(a, "--labels")) {
      o->labels = v;
    } else if (!strcmp(a, "--hidden")) {
      if (cli_int_list(prog, a, v, 1, 1 << 20, o->hidden, &o->n_hidden)) return -1;
    } else if (!strcmp(a, "--eval-fraction")) {
      float f = 0.0f;
      if (cli_float(prog, a, v, &f)) return -1;
      if (!(f >= 0.0f && f < 1.0f)) {
        return cli_error(prog, "--eval-fraction \"%s\" is outside [0, 1)", v);
      }
      o->eval_fraction = f;
    } else if (!strcmp(a, "--micro-batches")) {
      if (cli_int(prog, a, v, 1, 65536, &o->micro)) return -1;
    } else if (!strcmp(a, "--backend")) {
      o->backend = v;
    } else if (!strcmp(a, "--plot")) {
      o->plot = v;
    } else if (!strcmp(a, "--save")) {
      o->save = v;
    } else if (!strcmp(a, "--resume")) {
      o->resume = v;
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
    } else if (!strcmp(a, "--save-every")) {
      if (cli_int(prog, a, v, 1, INT64_C(1) << 40, &o->save_every)) return -1;
    } else if (!strcmp(a, "--verify-every")) {
      if (cli_int(prog, a, v, 1, INT64_C(1) << 40, &o->verify_every)) return -1;
    } else if (!strcmp(a, "--seed")) {
      if (cli_u64(prog, a, v, &o->seed)) return -1;
    } else if (!strcmp(a, "--lr")) {
      if (cli_float(prog, a, v, &o->lr)) return -1;
      o->have_lr = 1;
    } else if (!strcmp(a, "--clip-norm")) {
      if (cli_float(prog, a, v, &o->clip_norm)) return -1;
      if (!(o->clip_norm >= 0.0f) || !isfinite(o->clip_norm)) {
        return cli_error(prog, "--clip-norm \"%s\" must be a finite number >= 0 (0: no clipping)",
                         v);
      }
    }
  }
  if (!o->data != !o->labels) {
    cli_error(prog, "--data and --labels go together");
    return -1;
  }
  if (o->data && o->have_model) {
    cli_error(prog, "--data trains an MLP sized from the data; it does not take --model");
    return -1;
  }
  if (o->data) o->model = "npy";
  if (o->save_every && !o->save) {
    cli_error(prog, "--save-every needs --save FILE");
    return -1;
  }
  return 0;
}

/* What the summary reports, filled in as the run goes; err is "" while it succeeds. */
typedef struct result {
  char err[2048];
  const char *backend;
  int devices;
  int64_t steps, start;
  float lr, loss;
  double sps;
  int identical; /* 1, 0, or -1 when not checked */
  int sharded;   /* pmap_params_sharded, -1 before the params exist */
  size_t state_bytes;
  int have_wb, procs, me;
  float w, b;
  double eval_loss, eval_accuracy; /* NaN without held-out rows (or labels, for accuracy) */
} result;

/* Records the run's failure (the first one) and prints it; returns 1, the exit status. */
static int failf(result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failf(result *r, const char *fmt, ...) {
  char msg[sizeof r->err];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s\n", prog, msg);
  if (!r->err[0]) snprintf(r->err, sizeof r->err, "%s", msg);
  return 1;
}

static int fail(result *r, const char *what) { return failf(r, "%s: %s", what, pmap_last_error()); }

/* A count, or null when it is not known (negative). */
static void json_count(int64_t v) {
  if (v >= 0)
    printf("%lld", (long long)v);
  else
    printf("null");
}

/* The last line with --json: valid JSON whatever happened (null for numbers that are not
 * finite or not known, "error" when the run failed). */
static void print_json(const opts *o, const result *r) {
  printf("{\"model\": ");
  json_string(stdout, o->model);
  printf(", \"backend\": ");
  json_string(stdout, r->backend);
  printf(", \"gemm\": ");
  json_string(stdout, pmap_gemm_provider());
  printf(", \"gemm_reason\": ");
  json_string(stdout, pmap_gemm_reason());
  printf(", \"devices\": ");
  json_count(r->devices);
  printf(", \"processes\": ");
  json_count(r->procs);
  printf(", \"steps\": ");
  json_count(r->steps);
  printf(", \"start_step\": ");
  json_count(r->start);
  printf(", \"global_batch\": ");
  json_count(o->batch);
  printf(", \"lr\": ");
  if (isfinite(r->lr))
    printf("%g", (double)r->lr); /* as given: 0.005, not 0.00499999989 */
  else
    printf("null");
  printf(", \"seed\": %llu, \"final_loss\": ", (unsigned long long)o->seed);
  json_number(stdout, (double)r->loss);
  printf(", \"samples_per_sec\": ");
  json_number(stdout, r->sps);
  if (r->sharded >= 0)
    printf(", \"sharded_optimizer\": %s, \"optimizer_state_bytes\": %zu",
           r->sharded ? "true" : "false", r->state_bytes);
  printf(", \"replicas_identical\": %s", r->identical < 0 ? "null"
                                         : r->identical   ? "true"
                                                          : "false");
  if (r->have_wb) {
    printf(", \"w\": ");
    json_number(stdout, (double)r->w);
    printf(", \"b\": ");
    json_number(stdout, (double)r->b);
  }
  if (o->data) {
    printf(", \"eval_loss\": ");
    json_number(stdout, r->eval_loss);
    printf(", \"eval_accuracy\": ");
    json_number(stdout, r->eval_accuracy);
  }
  if (r->err[0]) {
    printf(", \"error\": ");
    json_string(stdout, r->err);
  }
  printf("}\n");
}

/* Saves params with pmap-train's section: the run's settings and its data position. */
static int save(result *r, const opts *o, pmap_params *params, int64_t batches, float loss) {
  if (r->me != 0) return 0; /* under mpirun every process holds the same state: one writes it */
  int64_t step = pmap_params_step(params);
  train_state ts = {.seed = o->seed,
                    .batch = o->batch,
                    .samples = batches * o->batch,
                    .next_step = step,
                    .next_batch = step % batches,
                    .last_loss = loss};
  snprintf(ts.model, sizeof ts.model, "%s", o->model);
  unsigned char buf[TRAIN_STATE_BYTES];
  if (train_state_encode(&ts, buf)) return failf(r, "--save: model name too long");
  if (pmap_params_save_user(params, o->save, buf, sizeof buf))
    return failf(r, "step %lld: --save: %s", (long long)step, pmap_last_error());
  return 0;
}

/* Loads --resume into params after checking that the file's run is this run; sets *loss to the
 * loss of its last step. */
static int resume(result *r, const opts *o, pmap_params *params, int64_t batches, float *loss) {
  unsigned char buf[TRAIN_STATE_BYTES];
  size_t got = 0;
  if (pmap_params_load_user(params, o->resume, buf, sizeof buf, &got))
    return failf(r, "--resume: %s", pmap_last_error());
  /* From here on params hold the file's state; every failure below ends the run. */
  train_state ts;
  char why[256];
  if (train_state_decode(buf, got, &ts, why, sizeof why))
    return failf(r, "--resume: \"%s\": %s", o->resume, why);
  const char *flag = strcmp(ts.model, o->model)         ? "--model"
                     : ts.seed != o->seed               ? "--seed"
                     : ts.batch != o->batch             ? "--batch"
                     : ts.samples != batches * o->batch ? "--samples"
                                                        : NULL;
  if (flag)
    return failf(r,
                 "--resume: \"%s\" was saved by a run with --model %s --seed %llu --batch %lld "
                 "--samples %lld; this run differs in %s (give the saved run's values)",
                 o->resume, ts.model, (unsigned long long)ts.seed, (long long)ts.batch,
                 (long long)ts.samples, flag);
  if (ts.next_step != pmap_params_step(params))
    return failf(r, "--resume: \"%s\": its section says step %lld, its state step %lld", o->resume,
                 (long long)ts.next_step, (long long)pmap_params_step(params));
  if (ts.next_step > o->steps)
    return failf(r,
                 "--resume: \"%s\" is at step %lld, beyond --steps %lld (the total, resumed "
                 "steps included)",
                 o->resume, (long long)ts.next_step, (long long)o->steps);
  *loss = ts.last_loss;
  return 0;
}

/* Every replica's parameters equal device 0's: the end-of-run check. w0 receives device 0's. */
static int replicas_identical(result *r, pmap_params *params, int first, int n, float *w0,
                              float *wd, size_t P) {
  if (pmap_params_read(params, first, w0, P)) return fail(r, "pmap_params_read");
  int identical = 1;
  for (int d = 1; d < n && identical; d++) {
    if (pmap_params_read(params, first + d, wd, P)) return fail(r, "pmap_params_read");
    identical = memcmp(w0, wd, P * sizeof *w0) == 0;
  }
  r->identical = identical;
  return 0;
}

int main(int argc, char **argv) {
  opts o;
  if (parse(argc, argv, &o)) {
    /* --json promises a last line of JSON also when the arguments are wrong (it may not have
     * been parsed yet: look for it). What is not known is null. */
    if (cli_has_flag(argc, argv, "--json")) {
      result r = {.backend = o.backend,
                  .devices = -1,
                  .steps = -1,
                  .loss = NAN,
                  .sps = NAN,
                  .lr = NAN,
                  .identical = -1,
                  .sharded = -1,
                  .eval_loss = NAN,
                  .eval_accuracy = NAN,
                  .procs = -1,
                  .start = -1};
      snprintf(r.err, sizeof r.err, "%s", cli_last_error());
      o.batch = -1;
      print_json(&o, &r);
    }
    return 1;
  }
  result r = {.backend = o.backend,
              .devices = (int)o.devices,
              .steps = -1,
              .start = -1,
              .lr = NAN,
              .loss = NAN,
              .sps = NAN,
              .identical = -1,
              .sharded = -1,
              .eval_loss = NAN,
              .eval_accuracy = NAN,
              .procs = 1};
  train_data data = {0};
  char why[1024];
  pmap_example_info info;
  pmap_backend backend;
  int code = 1;
  pmap_ctx *ctx = NULL;
  pmap_model *model = NULL;
  pmap_params *params = NULL;
  pmap_array xs = {0}, ys = {0};
  float *w0 = NULL, *wd = NULL, *curve = NULL;
  int64_t *curve_step = NULL;
  size_t ncurve = 0;
  if (o.data) {
    if (train_data_load(o.data, o.labels, o.eval_fraction, o.seed, &data, why, sizeof why)) {
      failf(&r, "%s", why);
      goto out;
    }
    info = (pmap_example_info){"npy", 1000, 64, data.train_rows, pmap_adam(0.001f)};
    if (o.batch < 0 && info.batch > data.train_rows) info.batch = data.train_rows;
  } else if (pmap_example_info_get(o.model, &info)) {
    fail(&r, "--model");
    goto out;
  }
  if (pmap_backend_parse(o.backend, &backend)) {
    fail(&r, "--backend");
    goto out;
  }
  if (o.steps < 0) o.steps = info.steps;
  if (o.batch < 0) o.batch = info.batch;
  if (o.samples < 0 || o.data) o.samples = info.samples;
  if (o.have_lr) info.opt.lr = o.lr;
  info.opt.clip_norm = o.clip_norm;
  r.steps = o.steps;
  r.lr = info.opt.lr;
  if (o.log_every < 0) o.log_every = o.steps >= 10 ? o.steps / 10 : 1;
  int64_t rows = (o.samples + o.batch - 1) / o.batch * o.batch;
  int64_t batches = rows / o.batch;

  pmap_config cfg = {.backend = backend,
                     .num_devices = (int)o.devices,
                     .numeric_guard = o.no_guard ? PMAP_GUARD_OFF : PMAP_GUARD_ON,
                     .shard_optimizer = o.shard};
  if (pmap_ctx_create(&cfg, &ctx)) {
    fail(&r, "cannot create the context");
    goto out;
  }
  int n = pmap_ctx_num_devices(ctx);
  /* Under mpirun: --devices is per process, --batch is global and each process trains on its
   * rows of it; process 0 alone reports and writes checkpoints. */
  int procs = pmap_ctx_num_processes(ctx), me = pmap_ctx_process_index(ctx);
  r.procs = procs;
  r.me = me;
  if (me != 0 && !freopen("/dev/null", "w", stdout)) {
    failf(&r, "cannot silence the output of process %d", me);
    goto out;
  }
  const char *bname = pmap_backend_name(pmap_ctx_backend(ctx));
  r.devices = n;
  r.backend = bname;
  if (backend == PMAP_BACKEND_AUTO && me == 0)
    fprintf(stderr, "%s: backend auto chose %s\n", prog, bname);
  if (o.batch % (n * procs)) {
    failf(&r, "global batch %lld is not divisible by %d devices", (long long)o.batch, n * procs);
    goto out;
  }
  if (o.data) {
    if (train_data_model(&data, o.hidden, o.n_hidden, &model, why, sizeof why)) {
      failf(&r, "%s", why);
      goto out;
    }
  } else if (pmap_example_model(o.model, &model)) {
    fail(&r, "cannot build the model");
    goto out;
  }
  if (pmap_params_create(ctx, model, &info.opt, o.seed, &params)) {
    fail(&r, "cannot create the parameters");
    goto out;
  }
  if (pmap_params_set_micro_batches(params, (int)o.micro)) {
    fail(&r, "--micro-batches");
    goto out;
  }
  if (!o.data && pmap_example_data(o.model, o.seed + 1, rows, &xs, &ys)) {
    fail(&r, "cannot make the data");
    goto out;
  }
  float loss = NAN;
  if (o.resume && resume(&r, &o, params, batches, &loss)) goto out;
  int64_t start = pmap_params_step(params);
  r.start = start;
  r.loss = loss;
  if (procs > 1)
    printf("pmap-train: %d processes x %d devices = %d global devices\n", procs, n, procs * n);
  printf(
      "pmap-train: model %s (%zu parameters), backend %s (gemm %s, %s), %d devices, global batch "
      "%lld (%lld per device), %lld steps, %s lr %g, seed %llu\n",
      o.model, pmap_params_count(params), bname, pmap_gemm_provider(), pmap_gemm_reason(), n,
      (long long)o.batch, (long long)(o.batch / n / procs), (long long)o.steps,
      info.opt.kind == PMAP_OPT_SGD    ? "SGD"
      : info.opt.kind == PMAP_OPT_ADAM ? "Adam"
                                       : "AdamW",
      (double)info.opt.lr, (unsigned long long)o.seed);
  r.sharded = pmap_params_sharded(params);
  r.state_bytes = pmap_params_optimizer_bytes(params);
  printf("pmap-train: optimizer state %.4g MB per device (%s)\n",
         (double)pmap_params_optimizer_bytes(params) / 1e6,
         pmap_params_sharded(params) ? "sharded over the devices" : "replicated");
  if (o.resume) printf("resumed from %s at step %lld\n", o.resume, (long long)start);
  if (o.data)
    printf("data: %s %s, %lld rows (%lld for training, %lld held out), %lld %s\n", o.data, o.labels,
           (long long)data.rows, (long long)data.train_rows, (long long)data.eval_rows,
           (long long)data.outputs, data.classify ? "classes" : "targets");

  size_t xrow = rows ? (size_t)(pmap_array_numel(&xs) / rows) : 0;
  size_t yrow = rows ? (size_t)(pmap_array_numel(&ys) / rows) : 0;
  /* The loss curve keeps at most 100000 points: every stride-th step, and the last. */
  int64_t stride = o.steps / 100000 + 1;
  if (o.plot) {
    size_t cap = (size_t)(o.steps / stride + 2);
    curve = malloc(cap * sizeof *curve);
    curve_step = malloc(cap * sizeof *curve_step);
    if (!curve || !curve_step) {
      failf(&r, "out of memory");
      goto out;
    }
  }
  double busy = 0.0, last_busy = 0.0;
  int64_t last_step = start;
  for (int64_t s = start; s < o.steps; s++) {
    /* The data position is the step: step s takes batch s % batches, resumed or not. */
    int64_t first = (s % batches) * o.batch;
    pmap_array xb = xs, yb = ys;
    int64_t mine = o.batch / procs; /* this process's rows of the global batch */
    if (o.data) {
      if (train_data_batch(&data, s, o.batch, &xb, &yb, why, sizeof why)) {
        failf(&r, "%s", why);
        goto out;
      }
      xb.data = (float *)xb.data + (size_t)(me * mine) * (size_t)data.x_row;
      yb.data = (char *)yb.data + (size_t)(me * mine) * (size_t)data.y_row * 4;
    } else {
      xb.data = (float *)xs.data + (size_t)(first + me * mine) * xrow;
      yb.data = (char *)ys.data + (size_t)(first + me * mine) * yrow * 4;
    }
    xb.shape[0] = yb.shape[0] = mine;
    double t0 = cli_now();
    pmap_status st = pmap_update(params, &xb, &yb, &loss);
    if (st == PMAP_ERR_NUMERIC) {
      r.loss = NAN; /* the step's loss was not finite, whatever the last finite one was */
      failf(&r,
            "step %lld: the loss or the gradients are not finite; the step was skipped and "
            "training stops (lower --lr or set --clip-norm): %s",
            (long long)s, pmap_last_error());
      goto out;
    }
    if (st) {
      failf(&r, "step %lld: pmap_update: %s", (long long)s, pmap_last_error());
      goto out;
    }
    busy += cli_now() - t0;
    r.loss = loss;
    if (curve && (s % stride == 0 || s == o.steps - 1)) {
      curve_step[ncurve] = s;
      curve[ncurve++] = loss;
    }
    if (o.log_every && (s % o.log_every == 0 || s == o.steps - 1)) {
      /* Throughput over the steps since the previous line. */
      printf("step %6lld  loss %.6f  samples/s %.0f", (long long)s, (double)loss,
             (double)(s + 1 - last_step) * (double)o.batch / (busy - last_busy));
      if (data.eval_rows) {
        if (train_data_eval(&data, params, n, &r.eval_loss, &r.eval_accuracy, why, sizeof why)) {
          printf("\n");
          failf(&r, "step %lld: evaluation: %s", (long long)s, why);
          goto out;
        }
        printf("  eval loss %.6f", r.eval_loss);
        if (data.classify) printf("  eval accuracy %.4f", r.eval_accuracy);
      }
      printf("\n");
      last_step = s + 1;
      last_busy = busy;
    }
    if (o.verify_every && (s + 1) % o.verify_every == 0 && pmap_params_verify(params)) {
      failf(&r, "step %lld: --verify-every: %s", (long long)s, pmap_last_error());
      goto out;
    }
    if (o.save_every && (s + 1) % o.save_every == 0 && s + 1 < o.steps &&
        save(&r, &o, params, batches, loss))
      goto out;
  }
  if (o.save && save(&r, &o, params, batches, loss)) goto out;
  double sps = o.steps > start ? (double)(o.steps - start) * (double)o.batch / busy : NAN;
  r.sps = sps;
  if (curve) {
    char title[256], mom[32] = "";
    if (info.opt.kind == PMAP_OPT_SGD && info.opt.momentum != 0.0f)
      snprintf(mom, sizeof mom, " momentum %g", (double)info.opt.momentum);
    snprintf(title, sizeof title, "pmap-train: %s, %d %s devices, global batch %lld, %s lr %g%s",
             o.model, n, bname, (long long)o.batch,
             info.opt.kind == PMAP_OPT_SGD    ? "SGD"
             : info.opt.kind == PMAP_OPT_ADAM ? "Adam"
                                              : "AdamW",
             (double)info.opt.lr, mom);
    train_plot_loss(prog, o.plot, title, curve_step, curve, ncurve);
  }

  /* Check, do not assume, that every replica holds the same parameters. */
  size_t P = pmap_params_count(params);
  w0 = malloc(P * sizeof *w0);
  wd = malloc(P * sizeof *wd);
  if (!w0 || !wd) {
    failf(&r, "out of memory");
    goto out;
  }
  if (replicas_identical(&r, params, me * n, n, w0, wd, P)) goto out;
  printf("final loss %.6f after %lld steps, %.0f samples/s, replicas identical: %s\n", (double)loss,
         (long long)o.steps, sps, r.identical ? "yes" : "NO");
  if (!strcmp(o.model, "linear")) {
    printf("w = %.4f, b = %.4f\n", (double)w0[0], (double)w0[1]);
    r.have_wb = 1;
    r.w = w0[0];
    r.b = w0[1];
  }
  if (data.eval_rows) {
    if (train_data_eval(&data, params, n, &r.eval_loss, &r.eval_accuracy, why, sizeof why)) {
      failf(&r, "evaluation: %s", why);
      goto out;
    }
    printf("held out: loss %.6f", r.eval_loss);
    if (data.classify)
      printf(", accuracy %.4f (%lld rows)", r.eval_accuracy, (long long)data.eval_rows);
    printf("\n");
  }
  if (r.identical)
    code = 0;
  else
    failf(&r, "replicas differ after training");
out:
  if (o.json) print_json(&o, &r);
  free(curve);
  free(curve_step);
  free(w0);
  free(wd);
  pmap_example_data_free(&xs, &ys);
  train_data_free(&data);
  pmap_params_destroy(params);
  pmap_model_destroy(model);
  pmap_ctx_destroy(ctx);
  return code;
}
