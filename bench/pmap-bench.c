/* pmap-bench: how pmap_update scales from 1 to N devices, strong (fixed global batch) and weak
 * (fixed per-device batch), beside the step's GEMMs alone, its all-reduce alone and a hand-written
 * single-device loop; checks the results while timing; prints tables, CSV and JSON. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../examples/tanh_net.h"
#include "../tests/bounds.h"
#include "bench.h"
#include "cpu_peak.h"
#include "models/params.h"
#include "ops/cpu/conv.h"
#include "pmap_examples.h"

static const char *prog = "pmap-bench";

/* The strong-scaling rows' check: each row trains the first row of its precision's steps (the
 * same global batch, the same initial parameters) with its float sums in another order, so the
 * losses of its first CHECKED_STEPS steps, early in training where the bounds' premises hold (a
 * loss near its start, gradients far above their rounding), stay within the bound of
 * tests/bounds.h for that many passes, on the model's counts and the global batch
 * (docs/tolerances.md): bound_order32 under fp32, bound_order16 under bf16, and bound_prec16
 * where the device counts are not a power of two apart (the loss's gradient, scaled by
 * 1 / (rows on the device), then rounds to other bfloat16 values on every row:
 * docs/precision.md, "Reproducibility"). The final loss is reported (loss_rel_diff), not held to
 * a bound: a row trains hundreds of steps on one batch, which drives its loss toward zero, where
 * the loss's condition grows without limit (the bounds' kappa holds while logits stay below
 * twice the loss and targets above their noise), and Adam's normalised step turns rounding
 * differences of the vanishing gradients into whole steps: the rows part faster than the
 * bounds' random walk (mlp on 4 devices against 1: 1e-7 over the first steps, 2.7e-4 after 556,
 * 6.5e-4 after 1000). */
#define CHECKED_STEPS 10

/* what: an option ("--backend": the library's message without its call) or a step. */
static int fail(const char *what) {
  const char *msg = pmap_last_error();
  fprintf(stderr, "%s: %s: %s\n", prog, what,
          strncmp(what, "--", 2) == 0 ? cli_lib_reason(msg) : msg);
  return -1;
}

/* One device count of one table: its context, training state, data, probes and times. */
typedef struct setup {
  pmap_ctx *ctx;
  pmap_params *params;
  pmap_array xs, ys;
  bench_probe *probe;
  double *t, *tg, *ta, *to; /* step, GEMM-, collective- and optimizer-probe times (s) */
  int nt, ntg, nta, nto;
  double gemm_flops; /* of one step on all devices */
  bench_row *row;
  int tracing;                /* --trace: a recording is on */
  float early[CHECKED_STEPS]; /* the losses of the first steps */
} setup;

/* Each strong row's first steps against its first row's: the largest of their relative
 * differences over the bound, and that difference and bound (printed after the report). */
typedef struct early_check {
  int checked; /* compared (not a first row) */
  double ratio, diff, bound;
  int step;
} early_check;
static early_check checks[CLI_MAX_LIST];

static void setup_close(setup *s) {
  if (s->tracing && pmap_trace_stop(s->ctx)) fail("--trace");
  bench_probe_close(s->probe);
  free(s->t);
  free(s->tg);
  free(s->ta);
  free(s->to);
  pmap_example_data_free(&s->xs, &s->ys);
  pmap_params_destroy(s->params);
  pmap_ctx_destroy(s->ctx);
  memset(s, 0, sizeof *s);
}

static int step(setup *s, float *loss) {
  if (pmap_update(s->params, &s->xs, &s->ys, loss)) return fail("pmap_update");
  if (s->row->total_steps < CHECKED_STEPS) s->early[s->row->total_steps] = *loss;
  s->row->total_steps++;
  return 0;
}

/* Creates everything for one row, times step 0 and runs the warm-up. */
/* "tanh-custom": the hand-written two-layer tanh network of examples/tanh_net.h trained through
 * pmap_params_create_custom on mlp's data, so that the runtime around a user's gradient function
 * is timed like the built-in models. Its builder twin (dense 64, tanh, dense 1) gives the
 * parameter count, the FLOPs and the initial parameters (drawn from the seed as for the others). */
#define CUSTOM_MODEL "tanh-custom"
static const tanh_net custom_net = {10, 64, 1};

static int is_custom(const char *name) { return !strcmp(name, CUSTOM_MODEL); }
static const char *data_name(const char *name) { return is_custom(name) ? "mlp" : name; }

static pmap_status model_info(const char *name, pmap_example_info *info) {
  if (!is_custom(name)) return pmap_example_info_get(name, info);
  pmap_status st = pmap_example_info_get("mlp", info);
  if (!st) info->name = CUSTOM_MODEL;
  return st;
}

/* The model's path for the bounds: tests/bounds.h's, or tanh-custom's, counted as there (dense
 * 10 -> 64, tanh, dense 64 -> 1, MSE on mlp's data; it trains under fp32 alone). */
static const bound_model *model_bound(const char *name) {
  static const bound_model custom = {CUSTOM_MODEL, (10 + 64) + (64 + 1), 2, 6, 3, 64, 10, 1};
  return is_custom(name) ? &custom : bound_model_of(name);
}

static pmap_status model_build(const char *name, pmap_model **out) {
  if (!is_custom(name)) return pmap_example_model(name, out);
  int64_t in[1] = {custom_net.f};
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(1, in, &m);
  if (!st) st = pmap_model_add_dense(m, custom_net.h);
  if (!st) st = pmap_model_add_tanh(m);
  if (!st) st = pmap_model_add_dense(m, custom_net.k);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}

/* Params of model on ctx: the built-in path, or for tanh-custom the user-function path started
 * from the builder twin's initial parameters. */
static pmap_status params_make(pmap_ctx *ctx, const char *name, const pmap_model *model,
                               const pmap_optimizer *opt, uint64_t seed, pmap_params **out) {
  if (!is_custom(name)) return pmap_params_create(ctx, model, opt, seed, out);
  pmap_params *twin = NULL;
  size_t P = pmap_model_num_params(model);
  float *init = malloc(P * sizeof *init);
  pmap_status st = init ? pmap_params_create(ctx, model, opt, seed, &twin) : PMAP_ERR_OUT_OF_MEMORY;
  if (!st)
    st = pmap_params_read(twin, pmap_ctx_process_index(ctx) * pmap_ctx_num_devices(ctx), init, P);
  pmap_params_destroy(twin);
  if (!st)
    st = pmap_params_create_custom(ctx, P, init, tanh_net_grad, (void *)&custom_net, opt, out);
  free(init);
  return st;
}

static int setup_open(setup *s, const char *name, const pmap_model *model,
                      const pmap_optimizer *opt, const bench_opts *o, pmap_backend backend,
                      int devices, int shard, int precision, int64_t bd, int64_t warmup, int cap,
                      bench_row *r) {
  pmap_config cfg = {.backend = backend,
                     .num_devices = devices,
                     .timeout_s = o->timeout_s,
                     .numeric_guard = o->guard,
                     .shard_optimizer = shard};
  memset(s, 0, sizeof *s);
  s->row = r;
  r->devices = devices;
  r->per_device_batch = bd;
  r->global_batch = bd * devices;
  s->t = malloc(sizeof *s->t * (size_t)cap);
  s->tg = malloc(sizeof *s->tg * (size_t)cap);
  s->ta = malloc(sizeof *s->ta * (size_t)cap);
  s->to = malloc(sizeof *s->to * (size_t)cap);
  if (!s->t || !s->tg || !s->ta || !s->to) {
    fprintf(stderr, "%s: out of memory\n", prog);
    return -1;
  }
  if (pmap_ctx_create(&cfg, &s->ctx)) return fail("cannot create the context");
  /* Under mpirun the device count is per process and each process passes its bd * devices
   * rows: the row reports the global devices and batch. */
  int procs = pmap_ctx_num_processes(s->ctx);
  r->devices = devices * procs;
  r->global_batch = bd * devices * procs;
  if (params_make(s->ctx, name, model, opt, o->seed, &s->params))
    return fail("cannot create the parameters");
  r->precision = precision;
  if (pmap_params_set_precision(s->params, (pmap_precision)precision)) return fail("--precision");
  r->sharded = s->params->shard;
  r->state_bytes = pmap_params_optimizer_bytes(s->params);
  if (pmap_example_data(data_name(name), o->seed + 1, bd * devices, &s->xs, &s->ys))
    return fail("cannot make the data");
  double t0 = cli_now();
  if (step(s, &r->loss0)) return -1;
  r->step0_ms = 1e3 * (cli_now() - t0);
  for (int64_t i = 0; i < warmup; i++)
    if (step(s, &r->loss)) return -1;
  if (o->trace) { /* the timed steps, each row into a file of its own */
    char path[4096];
    size_t len = strlen(o->trace);
    int cut = len >= 5 && !strcmp(o->trace + len - 5, ".json") ? (int)len - 5 : (int)len;
    snprintf(path, sizeof path, "%.*s.%s-%dd%s%s.json", cut, o->trace, name, r->devices,
             r->sharded ? "-sharded" : "", precision == PMAP_PRECISION_BF16 ? "-bf16" : "");
    if (pmap_trace_start(s->ctx, path, NULL)) return fail("--trace");
    s->tracing = 1;
  }
  if (o->ref) {
    bench_gemm g[BENCH_MAX_GEMMS];
    int ng = bench_step_gemms(model, bd, g, BENCH_MAX_GEMMS);
    if (ng < 0) return -1;
    s->gemm_flops = bench_gemm_flops(g, ng) * devices;
    if (bench_probe_open(s->ctx, g, ng, s->params, &s->probe)) return -1;
  }
  return 0;
}

/* One round of one row: a re-warming step (the workers slept while others ran), n timed steps,
 * then the probes. */
static int setup_round(setup *s, int n, int reps) {
  bench_settle();
  if (step(s, &s->row->loss)) return -1;
  for (int i = 0; i < n; i++) {
    double t0 = cli_now();
    if (step(s, &s->row->loss)) return -1;
    s->t[s->nt++] = cli_now() - t0;
  }
  if (!s->probe) return 0;
  bench_settle();
  if (bench_probe_gemms(s->probe, reps, s->tg, &s->ntg)) return -1;
  if (bench_probe_allreduce(s->probe, reps, s->ta, &s->nta)) return -1;
  if (bench_probe_optimizer(s->probe, reps, s->to, &s->nto)) return -1;
  return 0;
}

/* Replicas compared bitwise, not assumed equal. */
/* The replicas of this process's devices (global indices first..first + n - 1). */
static int replicas_identical(pmap_params *p, int first, int n, int *identical) {
  size_t P = pmap_params_count(p);
  float *w0 = malloc(P * sizeof *w0), *wd = malloc(P * sizeof *wd);
  int rc = 0;
  *identical = 1;
  if (!w0 || !wd) {
    fprintf(stderr, "%s: out of memory\n", prog);
    rc = -1;
  } else if (pmap_params_read(p, first, w0, P)) {
    rc = fail("pmap_params_read");
  }
  for (int d = 1; !rc && d < n && *identical; d++) {
    if (pmap_params_read(p, first + d, wd, P))
      rc = fail("pmap_params_read");
    else
      *identical = memcmp(w0, wd, P * sizeof *w0) == 0;
  }
  free(w0);
  free(wd);
  return rc;
}

/* |a - b| relative to |b|, or to 1e-3 for smaller losses (the final losses' report): a loss
 * near zero differs by rounding alone, which a purely relative measure would blow up. */
static double rel_diff(float a, float b) {
  double d = fabs((double)a - (double)b), s = fabs((double)b);
  return d / (s > 1e-3 ? s : 1e-3);
}

/* The first row of the table under precision p: the one a row's speedup and loss answer to (a
 * bf16 row's loss differs from fp32's by more than summation order). */
static const bench_row *first_of(const bench_row *rows, int n, int p) {
  for (int i = 0; i < n; i++)
    if (rows[i].precision == p) return &rows[i];
  return &rows[0];
}

/* The peak of a CPU row's cores for the precision its GEMMs run in (cpu_peak.h), measured once
 * per device count and precision; 0 on other backends and where it is not known. */
static double row_peak(const setup *s, const bench_row *w) {
  static double known[2][PMAP_MAX_DEVICES + 1];
  if (pmap_ctx_backend(s->ctx) != PMAP_BACKEND_CPU || w->devices < 1 ||
      w->devices > PMAP_MAX_DEVICES)
    return 0.0;
  int bf16 = w->precision == PMAP_PRECISION_BF16 && !strcmp(pmap_bf16_provider(), "onednn");
  if (known[bf16][w->devices] == 0.0) {
    cpu_peak peak;
    char why[256];
    known[bf16][w->devices] =
        cpu_peak_get(w->devices, bf16, &peak, why, sizeof why) ? -1.0 : peak.gflops;
  }
  return known[bf16][w->devices] > 0.0 ? known[bf16][w->devices] : 0.0;
}

/* The bound of row w's first `steps` steps against row `first`'s (see CHECKED_STEPS). */
static double early_bound(const bound_model *m, const bench_row *w, const bench_row *first,
                          double rows, double steps) {
  if (w->precision != PMAP_PRECISION_BF16) return bound_order32(m, rows, steps);
  int a = w->devices > first->devices ? w->devices : first->devices;
  int b = w->devices > first->devices ? first->devices : w->devices;
  int pow2 = a % b == 0 && ((a / b) & (a / b - 1)) == 0;
  return pow2 ? bound_order16(m, rows, steps) : bound_prec16(m, rows, steps);
}

/* Row i's first steps against its first row's; 0, or -1 after printing the first excess. */
static int check_early(const bench_result *res, const setup *su, int i, const bound_model *m) {
  const bench_row *rows = res->rows[BENCH_STRONG], *w = &rows[i];
  const bench_row *first = first_of(rows, res->nrows[BENCH_STRONG], w->precision);
  int f = (int)(first - rows);
  early_check *c = &checks[i];
  memset(c, 0, sizeof *c);
  if (f == i) return 0;
  c->checked = 1;
  c->ratio = -1.0;
  int64_t n = w->total_steps < CHECKED_STEPS ? w->total_steps : CHECKED_STEPS;
  for (int k = 0; k < n; k++) {
    double a = su[i].early[k], b = su[f].early[k];
    double bound = early_bound(m, w, first, (double)res->batch, k + 1);
    double diff = a == b ? 0.0 : fabs(a - b) / fabs(b);
    if (!(diff / bound <= c->ratio)) {
      c->ratio = diff / bound, c->diff = diff, c->bound = bound, c->step = k;
      if (!(diff <= bound)) {
        fprintf(stderr,
                "%s: %s: step %d's loss on %d devices, %.9g, differs from %.9g on %d by %.3g "
                "(relative; bound %.3g)\n",
                prog, res->model, k, w->devices, a, b, first->devices, diff, bound);
        return -1;
      }
    }
  }
  return 0;
}

/* The check's line under the model's report. */
static void report_early(const bench_result *res) {
  int any = 0;
  for (int i = 0; i < res->nrows[BENCH_STRONG]; i++) {
    const early_check *c = &checks[i];
    const bench_row *w = &res->rows[BENCH_STRONG][i];
    if (!c->checked) continue;
    printf("%s %d dev%s%s %.2g (bound %.2g, step %d)",
           any ? ","
               : "the first steps' losses against the first row's (largest relative to its "
                 "bound):",
           w->devices, w->sharded ? " sharded" : "",
           w->precision == PMAP_PRECISION_BF16 ? " bf16" : "", c->diff, c->bound, c->step);
    any = 1;
  }
  if (any) printf("\n");
}

/* Statistics, derived columns and checks of one table. */
static void finish_table(bench_result *res, int mode, setup *su, double flops_per_example) {
  bench_row *rows = res->rows[mode];
  for (int i = 0; i < res->nrows[mode]; i++) {
    bench_row *w = &rows[i];
    setup *s = &su[i];
    w->step = bench_summarise(s->t, s->nt);
  }
  for (int i = 0; i < res->nrows[mode]; i++) {
    bench_row *w = &rows[i];
    setup *s = &su[i];
    const bench_row *first = first_of(rows, res->nrows[mode], w->precision);
    w->sps = (double)w->global_batch / (w->step.med * 1e-3);
    w->gflops = flops_per_example * (double)w->global_batch / (w->step.med * 1e-3) / 1e9;
    w->gemm = bench_summarise(s->tg, s->ntg);
    w->allreduce = bench_summarise(s->ta, s->nta);
    w->opt = bench_summarise(s->to, s->nto);
    w->opt_share = w->opt.n ? w->opt.med / w->step.med : 0.0;
    w->coll_share = w->allreduce.n ? w->allreduce.med / w->step.med : 0.0;
    w->gemm_gflops = w->gemm.n ? s->gemm_flops / (w->gemm.med * 1e-3) / 1e9 : 0.0;
    w->gemm_share = w->gemm.n ? w->gemm.med / w->step.med : 0.0;
    w->tps = w->sps * (double)res->tokens;
    w->peak_gflops = row_peak(s, w);
    w->mfu = w->peak_gflops > 0.0 ? w->gflops / w->peak_gflops : 0.0;
    if (mode == BENCH_STRONG) {
      w->speedup = first->step.med / w->step.med;
      w->eff = w->speedup / ((double)w->devices / first->devices);
    } else { /* the work grows with the devices: ideal is a constant step time */
      w->speedup = w->sps / first->sps;
      w->eff = first->step.med / w->step.med;
    }
    w->vs_fp32 = 0.0;
    for (int j = 0; w->precision == PMAP_PRECISION_BF16 && j < res->nrows[mode]; j++)
      if (rows[j].precision == PMAP_PRECISION_FP32 && rows[j].devices == w->devices &&
          rows[j].sharded == w->sharded)
        w->vs_fp32 = rows[j].step.med / w->step.med;
    int local = pmap_ctx_num_devices(s->ctx);
    if (replicas_identical(s->params, pmap_ctx_process_index(s->ctx) * local, local,
                           &w->identical) ||
        !w->identical) {
      fprintf(stderr, "%s: %s, %d devices: the replicas differ after the run\n", prog, res->model,
              w->devices);
      res->failed = 1;
    }
    if (!isfinite(w->loss)) {
      fprintf(stderr, "%s: %s, %d devices: the loss is %g\n", prog, res->model, w->devices,
              (double)w->loss);
      res->failed = 1;
    }
    w->loss_rel_diff = rel_diff(w->loss, first->loss);
    if (mode == BENCH_STRONG) {
      const bound_model *m = model_bound(res->model);
      if (!m) {
        fprintf(stderr, "%s: %s: no bound for the model's losses\n", prog, res->model);
        res->failed = 1;
      } else if (check_early(res, su, i, m)) {
        res->failed = 1;
      }
    }
  }
}

/* All tables of one model, measured together in interleaved rounds. */
static int bench_model(const char *name, const bench_opts *o, pmap_backend backend,
                       const char **bname, bench_result *res) {
  pmap_example_info info;
  pmap_model *model = NULL;
  if (model_info(name, &info)) return fail("--model");
  int heavy = !strcmp(name, "mlp-1024") || !strcmp(name, "cifar-cnn") || !strcmp(name, "gpt-mini");
  memset(res, 0, sizeof *res);
  res->model = info.name;
  res->batch = o->batch > 0 ? o->batch : info.batch;
  res->weak_batch = o->weak_batch > 0 ? o->weak_batch : res->batch / o->devs[0];
  res->steps = o->steps > 0 ? o->steps : heavy ? 20 : 500;
  res->warmup = o->warmup >= 0 ? o->warmup : heavy ? 3 : 50;
  res->hand_rel_diff = -1.0;
  if (info.opt.kind == PMAP_OPT_ADAM)
    snprintf(res->optimizer, sizeof res->optimizer, "Adam lr %g", (double)info.opt.lr);
  else if (info.opt.momentum != 0.0f)
    snprintf(res->optimizer, sizeof res->optimizer, "SGD lr %g momentum %g", (double)info.opt.lr,
             (double)info.opt.momentum);
  else
    snprintf(res->optimizer, sizeof res->optimizer, "SGD lr %g", (double)info.opt.lr);
  if (res->batch % o->devs[0] || res->weak_batch < 1) {
    fprintf(stderr, "%s: %s: global batch %lld is not divisible by %lld devices\n", prog, name,
            (long long)res->batch, (long long)o->devs[0]);
    return -1;
  }
  for (int i = 0; i < o->ndev && o->modes[BENCH_STRONG]; i++)
    if (res->batch % o->devs[i]) {
      fprintf(stderr, "%s: %s: global batch %lld is not divisible by %lld devices\n", prog, name,
              (long long)res->batch, (long long)o->devs[i]);
      return -1;
    }
  if (model_build(name, &model)) return fail("cannot build the model");
  res->params = pmap_model_num_params(model);
  res->fwd_macs = pmap_model_forward_macs(model);
  int out_rank = 0;
  int64_t out_shape[PMAP_MAX_RANK];
  pmap_model_output_shape(model, &out_rank, out_shape);
  res->tokens = out_rank == 2 ? out_shape[0] : 0; /* (T, V): a language model */
  double flops_per_example = 6.0 * res->fwd_macs;
  if (o->dump) {
    pmap_array dx = {0}, dy = {0};
    int rc = pmap_example_data(data_name(name), o->seed + 1, res->batch, &dx, &dy)
                 ? fail("cannot make the data")
                 : bench_dump(o->dump, name, model, &info.opt, o->seed, &dx, &dy);
    pmap_example_data_free(&dx, &dy);
    if (rc) {
      pmap_model_destroy(model);
      return -1;
    }
  }

  int rounds = (int)(res->steps < o->rounds ? res->steps : o->rounds), code = 0;
  res->rounds = rounds;
  int reps = (int)(res->steps / rounds < 20 ? res->steps / rounds : 20);
  int cap = (int)res->steps + rounds * 20;
  setup su[2][CLI_MAX_LIST];
  memset(su, 0, sizeof su);
  bench_loop *hand = NULL;
  pmap_array hx = {0}, hy = {0};
  double *th = NULL, *topt = NULL;
  int nth = 0, ntopt = 0;
  /* The rows: each device count, under each --precision (a user's gradient function has no
   * bf16 policy: its fp32 rows alone), and with --compare-shard above one device a replicated
   * and a sharded row. */
  int row_dev[CLI_MAX_LIST], row_shard[CLI_MAX_LIST], row_prec[CLI_MAX_LIST], nrow = 0;
  for (int i = 0; i < o->ndev; i++)
    for (int p = 0; p < o->nprec; p++)
      for (int k = 0; k < (o->compare && o->devs[i] > 1 ? 2 : 1); k++) {
        if (is_custom(name) && o->precisions[p] != PMAP_PRECISION_FP32) continue;
        if (nrow == CLI_MAX_LIST) {
          fprintf(stderr, "%s: --compare-shard and --precision: at most %d rows\n", prog,
                  CLI_MAX_LIST);
          pmap_model_destroy(model);
          return -1;
        }
        row_dev[nrow] = (int)o->devs[i];
        row_prec[nrow] = o->precisions[p];
        row_shard[nrow++] = o->compare ? (k ? PMAP_SHARD_ON : PMAP_SHARD_OFF) : o->shard;
      }
  if (!nrow) {
    fprintf(stderr, "%s: %s: no row to run (a gradient function's model runs under fp32)\n", prog,
            name);
    pmap_model_destroy(model);
    return -1;
  }
  for (int mode = 0; mode < 2 && !code; mode++) {
    if (!o->modes[mode]) continue;
    for (int i = 0; i < nrow && !code; i++) {
      int64_t bd = mode == BENCH_STRONG ? res->batch / row_dev[i] : res->weak_batch;
      res->nrows[mode] = i + 1;
      code = setup_open(&su[mode][i], name, model, &info.opt, o, backend, row_dev[i], row_shard[i],
                        row_prec[i], bd, res->warmup, cap, &res->rows[mode][i]);
      if (!code) *bname = pmap_backend_name(pmap_ctx_backend(su[mode][i].ctx));
    }
  }
  /* The hand-written loop runs the CPU op table, so only beside the CPU backend; only for
   * models without collectives (it has no runtime), and not for a gradient function's (it would
   * run the builder twin, not the function). */
  if (!code && o->ref && !strcmp(*bname, "cpu") && !is_custom(name) && bench_loop_supports(model)) {
    th = malloc(sizeof *th * (size_t)cap);
    topt = malloc(sizeof *topt * (size_t)cap);
    if (!th || !topt)
      code = fail("out of memory");
    else if (pmap_example_data(data_name(name), o->seed + 1, res->batch, &hx, &hy))
      code = fail("cannot make the data");
    else if (bench_loop_open(model, &info.opt, o->seed, &hx, &hy, &hand))
      code = -1;
    for (int64_t i = 0; !code && i < 1 + res->warmup; i++, res->hand_steps++)
      code = bench_loop_step(hand, &res->hand_loss, NULL);
  }
  /* Interleaved rounds: a slow spell of the machine spreads over every row instead of skewing
   * one. */
  for (int round = 0; !code && round < rounds; round++) {
    int n = (int)(res->steps * (round + 1) / rounds - res->steps * round / rounds);
    for (int mode = 0; mode < 2 && !code; mode++)
      for (int i = 0; i < res->nrows[mode] && !code; i++) code = setup_round(&su[mode][i], n, reps);
    if (hand && !code) {
      bench_settle();
      code = bench_loop_step(hand, &res->hand_loss, &topt[ntopt++]);
      res->hand_steps++;
      for (int i = 0; i < n && !code; i++, res->hand_steps++) {
        double t0 = cli_now();
        code = bench_loop_step(hand, &res->hand_loss, NULL);
        th[nth++] = cli_now() - t0;
      }
    }
  }
  if (!code) {
    for (int mode = 0; mode < 2; mode++) finish_table(res, mode, su[mode], flops_per_example);
    if (hand) {
      res->hand = bench_summarise(th, nth);
      res->hand_opt_ms = bench_summarise(topt, ntopt).med;
      for (int i = 0; i < res->nrows[BENCH_STRONG]; i++) {
        const bench_row *w = &res->rows[BENCH_STRONG][i];
        if (w->devices == 1 && w->total_steps == res->hand_steps &&
            w->precision == PMAP_PRECISION_FP32) /* the loop's policy */
          res->hand_rel_diff = rel_diff(res->hand_loss, w->loss);
      }
      /* The same kernels on the same operands in the same order: the same bits. */
      if (res->hand_rel_diff != -1.0 && !(res->hand_rel_diff == 0.0)) {
        fprintf(stderr,
                "%s: %s: the hand-written loop's loss %.9g differs from pmap's on 1 "
                "device by %.3g (relative; the same computation, bitwise)\n",
                prog, name, (double)res->hand_loss, res->hand_rel_diff);
        res->failed = 1;
      }
    }
  }
  for (int mode = 0; mode < 2; mode++)
    for (int i = 0; i < res->nrows[mode]; i++) setup_close(&su[mode][i]);
  bench_loop_close(hand);
  pmap_example_data_free(&hx, &hy);
  free(th);
  free(topt);
  pmap_model_destroy(model);
  return code;
}

int main(int argc, char **argv) {
  bench_opts o;
  pmap_backend backend;
  int parsed = bench_parse(argc, argv, &o);
  if (parsed) return parsed < 0;
  if (pmap_backend_parse(o.backend, &backend)) {
    fail("--backend");
    return 1;
  }

  /* The model list, validated before anything runs. */
  char names[256];
  const char *model[CLI_MAX_LIST];
  int nmodels = 0;
  snprintf(names, sizeof names, "%s", o.models);
  char *save = NULL;
  for (char *tok = strtok_r(names, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    pmap_example_info info;
    if (nmodels == CLI_MAX_LIST) {
      fprintf(stderr, "%s: --model: at most %d models\n", prog, CLI_MAX_LIST);
      return 1;
    }
    if (model_info(tok, &info)) {
      /* The library knows its example models; tanh-custom is this program's own. */
      char known[2 * sizeof BENCH_ALL_MODELS];
      size_t k = 0;
      for (const char *c = BENCH_ALL_MODELS; *c; c++) {
        known[k++] = *c;
        if (*c == ',') known[k++] = ' ';
      }
      known[k] = '\0';
      fprintf(stderr, "%s: --model: unknown model \"%s\" (expected one of: %s, or all)\n", prog,
              tok, known);
      return 1;
    }
    model[nmodels++] = info.name;
  }
  if (!nmodels) {
    fprintf(stderr, "%s: --model: no model named\n", prog);
    return 1;
  }
  /* Under mpirun every process measures, process 0 alone reports and writes files. */
  pmap_config probe_cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  pmap_ctx *probe = NULL;
  if (pmap_ctx_create(&probe_cfg, &probe)) {
    fail("cannot create the context");
    return 1;
  }
  int me = pmap_ctx_process_index(probe);
  pmap_ctx_destroy(probe);
  if (me != 0) {
    o.csv = o.dump = NULL;
    if (!freopen("/dev/null", "w", stdout)) return 1;
  }
  FILE *csv = NULL;
  if (o.csv && !(csv = fopen(o.csv, "w"))) {
    fprintf(stderr, "%s: --csv: cannot write %s\n", prog, o.csv);
    return 1;
  }
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  bench_result *res = calloc((size_t)nmodels, sizeof *res);
  if (!res) {
    fprintf(stderr, "%s: out of memory\n", prog);
    return 1;
  }
  const char *bname = "?";
  int code = 0, failed = 0;
  printf("pmap-bench: models %s, devices", o.models);
  for (int i = 0; i < o.ndev; i++) printf("%s%lld", i ? "," : " ", (long long)o.devs[i]);
  printf(
      ", %ld cores; CPU GEMM %s (%s; built: %s), convolutions %s (built: %s); FLOPs = 6 x "
      "forward multiply-adds\n",
      cores, pmap_gemm_provider(), pmap_gemm_reason(), pmap_gemm_providers(), cpu_conv_path(),
      cpu_conv_paths());
  printf("pmap-bench: precision %s; CPU bf16 instructions %s, bf16 GEMM %s (%s)\n", o.precision,
         pmap_cpu_bf16(), pmap_bf16_provider(), pmap_bf16_reason());
  if (csv) bench_report_csv_header(csv);
  for (int m = 0; m < nmodels && !code; m++) {
    code = bench_model(model[m], &o, backend, &bname, &res[m]);
    if (code) break;
    bench_report_text(stdout, &res[m], bname, (int)cores);
    report_early(&res[m]);
    fflush(stdout);
    if (csv) bench_report_csv(csv, &res[m], bname);
    failed |= res[m].failed;
  }
  if (csv && fclose(csv)) {
    fprintf(stderr, "%s: --csv: cannot write %s\n", prog, o.csv);
    code = 1;
  }
  if (o.json && !code) {
    printf(
        "{\"model\": \"%s\", \"backend\": \"%s\", \"gemm\": \"%s\", \"gemm_reason\": \"%s\", "
        "\"gemm_providers\": \"%s\", \"conv\": \"%s\", \"conv_paths\": \"%s\", \"precision\": "
        "\"%s\", "
        "\"cpu_bf16\": \"%s\", \"bf16_gemm\": \"%s\", \"bf16_gemm_reason\": \"%s\", \"cores\": "
        "%ld, "
        "\"global_batch\": %lld, \"steps\": %lld, \"warmup\": %lld, "
        "\"flops_per_example\": \"6 x forward multiply-adds\", \"models\": [",
        o.models, bname, pmap_gemm_provider(), pmap_gemm_reason(), pmap_gemm_providers(),
        cpu_conv_path(), cpu_conv_paths(), o.precision, pmap_cpu_bf16(), pmap_bf16_provider(),
        pmap_bf16_reason(), cores, (long long)res[0].batch, (long long)res[0].steps,
        (long long)res[0].warmup);
    for (int m = 0; m < nmodels; m++) {
      if (m) printf(", ");
      bench_report_json_model(stdout, &res[m]);
    }
    printf("], \"rows\": [");
    int first = 1;
    for (int m = 0; m < nmodels; m++) bench_report_json_rows(stdout, &res[m], &first);
    printf("], \"ok\": %s}\n", failed ? "false" : "true");
  }
  free(res);
  return code || failed ? 1 : 0;
}
