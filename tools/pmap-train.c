/* pmap-train: the main job. Trains one of the example models, or an MLP on .npy data
 * (--data/--labels), data-parallel on N devices and prints progress, a summary, and with --json a
 * last line of JSON; --plot draws the loss curve. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cpu_peak.h"
#include "train_args.h"
#include "pmap.h"
#include "pmap_examples.h"
#include "train_data.h"
#include "train_plot.h"
#include "train_state.h"
#include "train_watch.h"
#include "train_text.h"

static const char *prog = "pmap-train";

/* Exit statuses: a failure of the run itself (a step, a process or device lost, a timeout) is
 * EXIT_FAILED, after which a restart may get past it; one of what the run was given (its
 * arguments, data, model, devices, --save path: found before its first step) is EXIT_AS_GIVEN, and
 * a restart would fail alike (pmap-launch stops there). */
enum { EXIT_FAILED = 1, EXIT_AS_GIVEN = 2 };
/* Written to stderr by every process that fails as given, at once: under mpirun the status of
 * the job is the first process's to fail, which may be another that failed only because this one
 * did, and a process may be ended before its exit; pmap-launch looks for this line. */
#define AS_GIVEN_LINE \
  "pmap-train: exit status 2: the run cannot start as given (a restart would fail alike)\n"

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
  int have_plan;
  pmap_memory_plan plan;
  watch_waits waits;     /* dev NULL until read */
  double mfu;            /* NaN when not known */
  double mfu_peak;       /* its denominator, FLOP/s (0: none) */
  cpu_peak peak;         /* on CPU devices, what the denominator is */
  double tps, gflops;    /* language models: tokens/s; model FLOP/s / 1e9 */
  watch_progress *bar;   /* ended before any message, so that each starts a line (NULL: none) */
  const char *precision; /* the params' policy once known (a resume may restore bf16) */
  int as_given;          /* the failure is in what the run was given: EXIT_AS_GIVEN */
  pmap_status
      load_status; /* of the last checkpoint load (0 also where the file is another run's) */
} result;

/* Records the run's failure (the first one) and prints it; returns EXIT_FAILED. */
static int failf(result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failf(result *r, const char *fmt, ...) {
  char msg[sizeof r->err];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (r->bar) watch_progress_break(r->bar);
  fprintf(stderr, "%s: %s\n", prog, msg);
  if (!r->err[0]) snprintf(r->err, sizeof r->err, "%s", msg);
  return EXIT_FAILED;
}

/* what: an option ("--model": the library's message without its call) or a step of the run. */
static int fail(result *r, const char *what) {
  const char *msg = pmap_last_error();
  return failf(r, "%s: %s", what, strncmp(what, "--", 2) == 0 ? cli_lib_reason(msg) : msg);
}

/* A failure before the first step: of what the run was given (a restart would fail alike) when
 * the library refused it as an argument or found what it needs missing (PMAP_ERR_UNAVAILABLE);
 * a timeout, a process gone, a device failing, memory are the run's own (a late process at the
 * start is a slow machine, not a wrong argument). st 0: not the library's (a bad option, a data
 * file, a batch the devices do not divide): of what was given. */
static int setup_failed(result *r, pmap_status st) {
  r->as_given = st == PMAP_SUCCESS || st == PMAP_ERR_INVALID_ARGUMENT || st == PMAP_ERR_UNAVAILABLE;
  if (r->as_given) fputs(AS_GIVEN_LINE, stderr);
  return 1;
}

/* A setup step refused for memory (`what`: the parameters' creation or the precision's bfloat16
 * copy, with status st; *drop: the params made so far, freed first). Where the CPU backend holds
 * its devices to --max-memory, the plan comes from a context of this process alone without the
 * limit (a limit none reaches, so that the library lays the parameters out as under one; under
 * --recompute auto: recomputed, the least it could take); when that plan is over
 * the limit, the limit refused it, before any activation: printed and refused as given (exit
 * status 2: a restart would fail alike). Any other failure stays the run's own. */
static void refused_for_memory(result *r, const opts *o, pmap_config cfg, pmap_backend backend,
                               const pmap_model *model, const pmap_optimizer *opt, int64_t batch,
                               pmap_params **drop, const char *what, pmap_status st) {
  char msg[sizeof r->err], why[1024];
  const char *err = pmap_last_error();
  snprintf(msg, sizeof msg, "%s", strncmp(what, "--", 2) == 0 ? cli_lib_reason(err) : err);
  int fit = -1;
  if (st == PMAP_ERR_OUT_OF_MEMORY && o->max_memory > 0 && backend == PMAP_BACKEND_CPU) {
    if (drop && *drop) pmap_params_destroy(*drop), *drop = NULL;
    cfg.backend = PMAP_BACKEND_CPU;
    cfg.dist = PMAP_DIST_NONE;
    /* A limit no plan reaches: the layout is the one the library chose under the real one
     * (pmap_config.shard_optimizer's AUTO shards the optimizer under a limit). */
    cfg.max_memory = (size_t)INT64_MAX;
    if (r->procs > 1) cfg.shard_optimizer = PMAP_SHARD_OFF; /* never across processes */
    if (cfg.recompute == PMAP_RECOMPUTE_AUTO) cfg.recompute = PMAP_RECOMPUTE_FULL;
    pmap_ctx *ctx = NULL;
    pmap_params *p = NULL;
    if (!pmap_ctx_create(&cfg, &ctx) && !pmap_params_create(ctx, model, opt, o->seed, &p) &&
        !pmap_params_set_micro_batches(p, (int)o->micro) &&
        ((o->resume && !o->have_precision) ||
         !pmap_params_set_precision(p, (pmap_precision)o->precision)))
      fit = watch_memory(p, batch, o->max_memory, cfg.recompute, &r->plan, why, sizeof why);
    pmap_params_destroy(p);
    if (ctx) pmap_ctx_destroy(ctx);
  }
  r->have_plan = fit >= 0;
  if (r->have_plan) { /* the layout the plan was made in */
    r->sharded = r->plan.optimizer_sharded;
    r->state_bytes = r->plan.optimizer;
  }
  if (fit <= 0) { /* not the limit's doing, or not known to be */
    failf(r, "%s: %s", what, msg);
    setup_failed(r, st);
    return;
  }
  const pmap_memory_plan *m = &r->plan;
  size_t fixed = m->total - m->activations;
  if (fixed > (uint64_t)o->max_memory)
    failf(r,
          "--max-memory %lld: the parameters, gradients, optimizer state and staging alone need "
          "%zu bytes per device (%.4g MB; the plan in all: %zu), over the limit by %zu bytes; "
          "nothing was run (%s: %s)",
          (long long)o->max_memory, fixed, (double)fixed / 1e6, m->total,
          fixed - (size_t)o->max_memory, what, msg);
  else
    failf(r, "%s (%s: %s)", why, what, msg);
  r->as_given = 1;
  fputs(AS_GIVEN_LINE, stderr);
}

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
  printf(", \"precision\": ");
  json_string(stdout,
              r->precision ? r->precision : pmap_precision_name((pmap_precision)o->precision));
  printf(", \"cpu_isa\": ");
  json_string(stdout, pmap_cpu_isa());
  printf(", \"cpu_bf16\": ");
  json_string(stdout, pmap_cpu_bf16());
  printf(", \"bf16_gemm\": ");
  json_string(stdout, pmap_bf16_provider());
  printf(", \"bf16_gemm_reason\": ");
  json_string(stdout, pmap_bf16_reason());
  /* The CPU convolutions' path per shape: how many shapes took each, per pass. */
  printf(
      ", \"conv_choices\": {\"forward\": {\"onednn\": %d, \"im2col\": %d}, "
      "\"backward\": {\"onednn\": %d, \"im2col\": %d}}",
      pmap_conv_choices("forward", "onednn"), pmap_conv_choices("forward", "im2col"),
      pmap_conv_choices("backward", "onednn"), pmap_conv_choices("backward", "im2col"));
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
  else /* no params, and no plan made for them */
    printf(", \"sharded_optimizer\": null, \"optimizer_state_bytes\": null");
  printf(", \"replicas_identical\": %s", r->identical < 0 ? "null"
                                         : r->identical   ? "true"
                                                          : "false");
  if (r->have_wb) {
    printf(", \"w\": ");
    json_number(stdout, (double)r->w);
    printf(", \"b\": ");
    json_number(stdout, (double)r->b);
  }
  if (r->have_plan) {
    printf(", \"memory\": ");
    watch_memory_json(stdout, &r->plan);
  }
  if (r->waits.dev) {
    printf(", \"waits\": ");
    watch_waits_json(stdout, &r->waits);
  }
  printf(", \"mfu\": ");
  json_number(stdout, r->mfu);
  printf(", \"mfu_peak_gflops\": ");
  json_number(stdout, r->mfu_peak > 0 ? r->mfu_peak / 1e9 : NAN);
  printf(", \"mfu_peak\": ");
  json_string(stdout, r->peak.cores     ? r->peak.what
                      : r->mfu_peak > 0 ? "the devices' measured GEMM rate"
                                        : "");
  if (isfinite(r->tps)) {
    printf(", \"tokens_per_sec\": ");
    json_number(stdout, r->tps);
    printf(", \"model_gflops\": ");
    json_number(stdout, r->gflops);
  }
  if (o->text) {
    printf(", \"eval_loss\": ");
    json_number(stdout, r->eval_loss);
    printf(", \"eval_perplexity\": ");
    json_number(stdout, exp(r->eval_loss));
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

/* What MFU is measured against, once: on CPU devices the peak of their cores for the precision
 * the GEMMs run in (cpu_peak.h: MFU <= 1 by construction), on GPUs the devices' measured GEMM
 * rate; one that cannot be had says why on stderr (MFU is then not reported). */
static void gemm_probe(watch_progress *bar, pmap_ctx *ctx, pmap_params *params, cpu_peak *peak) {
  char why[1024];
  bar->probed = 1;
  if (pmap_ctx_backend(ctx) == PMAP_BACKEND_CPU) {
    if (pmap_ctx_num_processes(ctx) > 1) return; /* one process's cores: not the job's */
    int bf16 = pmap_params_precision(params) == PMAP_PRECISION_BF16 &&
               !strcmp(pmap_bf16_provider(), "onednn");
    if (cpu_peak_get(pmap_ctx_num_devices(ctx), bf16, peak, why, sizeof why) == 0)
      bar->peak_flops = peak->gflops * 1e9;
    else
      fprintf(stderr, "%s: note: MFU not measured: %s\n", prog, why);
    return;
  }
  bar->peak_flops = watch_gemm_rate(ctx, why, sizeof why);
  if (why[0]) fprintf(stderr, "%s: note: MFU not measured: the GEMM probe: %s\n", prog, why);
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

/* Loads the checkpoint at path (named by option `flag` in messages) into params after checking
 * that the file's run is this run; sets *loss to the loss of its last step. */
static int load(result *r, const opts *o, const char *path, const char *flag_name,
                pmap_params *params, int64_t batches, float *loss) {
  unsigned char buf[TRAIN_STATE_BYTES];
  size_t got = 0;
  r->load_status = pmap_params_load_user(params, path, buf, sizeof buf, &got);
  if (r->load_status) return failf(r, "%s: %s", flag_name, pmap_last_error());
  /* From here on params hold the file's state; every failure below ends the run. */
  train_state ts;
  char why[256];
  if (train_state_decode(buf, got, &ts, why, sizeof why))
    return failf(r, "%s: \"%s\": %s", flag_name, path, why);
  const char *flag = strcmp(ts.model, o->model)         ? "--model"
                     : ts.seed != o->seed               ? "--seed"
                     : ts.batch != o->batch             ? "--batch"
                     : ts.samples != batches * o->batch ? "--samples"
                                                        : NULL;
  if (flag)
    return failf(r,
                 "%s: \"%s\" was saved by a run with --model %s --seed %llu --batch %lld "
                 "--samples %lld; this run differs in %s (give the saved run's values)",
                 flag_name, path, ts.model, (unsigned long long)ts.seed, (long long)ts.batch,
                 (long long)ts.samples, flag);
  if (ts.next_step != pmap_params_step(params))
    return failf(r, "%s: \"%s\": its section says step %lld, its state step %lld", flag_name, path,
                 (long long)ts.next_step, (long long)pmap_params_step(params));
  if (ts.next_step > o->steps)
    return failf(r,
                 "%s: \"%s\" is at step %lld, beyond --steps %lld (the total, resumed "
                 "steps included)",
                 flag_name, path, (long long)ts.next_step, (long long)o->steps);
  *loss = ts.last_loss;
  return 0;
}

/* Every replica of every process equals global device 0's, parameters and optimizer state
 * (pmap_params_verify, across processes too): the end-of-run check. w0 receives the parameters
 * of this process's first device. */
static int replicas_identical(result *r, pmap_params *params, int first, float *w0, size_t P,
                              char *why, size_t why_size) {
  pmap_status st = pmap_params_verify(params);
  if (st && st != PMAP_ERR_DEVICE) return fail(r, "checking the replicas");
  r->identical = st == PMAP_SUCCESS;
  snprintf(why, why_size, "%s", st ? pmap_last_error() : "");
  if (pmap_params_read(params, first, w0, P)) return fail(r, "pmap_params_read");
  return 0;
}

/* --inspect: loads the checkpoint into this run's model on one CPU device of this process
 * alone and says what it holds. Returns the exit status. */
static int inspect(result *r, const opts *o, pmap_model *model, const pmap_optimizer *opt,
                   int64_t batches) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1, .dist = PMAP_DIST_NONE};
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  float loss = NAN;
  int bad = 0;
  if (pmap_ctx_create(&cfg, &ctx))
    bad = fail(r, "--inspect: cannot create a context");
  else if (pmap_params_create(ctx, model, opt, o->seed, &params))
    bad = fail(r, "--inspect: cannot create the parameters");
  else
    bad = load(r, o, o->inspect, "--inspect", params, batches, &loss);
  int64_t step = bad ? -1 : pmap_params_step(params);
  if (!bad)
    printf(
        "checkpoint %s: step %lld of %lld, model %s, seed %llu, global batch %lld, last loss "
        "%g\n",
        o->inspect, (long long)step, (long long)o->steps, o->model, (unsigned long long)o->seed,
        (long long)o->batch, (double)loss);
  if (o->json) {
    printf("{\"checkpoint\": ");
    json_string(stdout, o->inspect);
    printf(", \"valid\": %s, \"step\": %lld, \"steps\": %lld, \"model\": ", bad ? "false" : "true",
           (long long)step, (long long)o->steps);
    json_string(stdout, o->model);
    printf(", \"last_loss\": ");
    json_number(stdout, (double)loss);
    if (bad) {
      printf(", \"error\": ");
      json_string(stdout, r->err);
    }
    printf("}\n");
  }
  pmap_params_destroy(params);
  pmap_ctx_destroy(ctx);
  return bad ? 1 : 0;
}

/* The run's model: the MLP of --data, the transformer of gpt-mini or --text (sized by the
 * options), or the example. */
static int make_model(const opts *o, const train_data *data, pmap_model **m, char *why,
                      size_t size) {
  if (o->data) return train_data_model(data, o->hidden, o->n_hidden, m, why, size);
  pmap_status st;
  if (o->text || !strcmp(o->model, "gpt-mini")) {
    pmap_gpt_config c = {256, o->context, o->width, (int)o->depth, (int)o->heads, !o->untied};
    st = pmap_gpt_model(&c, m);
  } else {
    st = pmap_example_model(o->model, m);
  }
  if (st) snprintf(why, size, "%s", pmap_last_error());
  return st ? -1 : 0;
}

/* A note on stderr when --trace-steps A..B misses some of this run's steps start + 1 to
 * o->steps (a resumed run): the trace holds only what both cover, maybe nothing. Not an error:
 * pmap-launch resumes a job from later checkpoints with the same arguments. */
static void trace_note(const opts *o, int64_t start) {
  long long a = 0, b = 0;
  char end = 0;
  const char *w = o->trace_steps;
  if (!w || sscanf(w, "%lld..%lld%c", &a, &b, &end) != 2 || a < 1 || b < a) return;
  long long lo = a > start + 1 ? a : start + 1, hi = b < o->steps ? b : o->steps;
  if (lo == a && hi == b) return;
  char took[96], resumed[48] = "";
  if (start) snprintf(resumed, sizeof resumed, " (resumed after step %lld)", (long long)start);
  if (start >= o->steps)
    snprintf(took, sizeof took, "takes no step%s", resumed);
  else
    snprintf(took, sizeof took, "takes steps %lld to %lld%s", (long long)start + 1,
             (long long)o->steps, resumed);
  if (lo > hi)
    fprintf(stderr, "%s: note: --trace-steps %s: this run %s; the trace will hold none of them\n",
            prog, w, took);
  else
    fprintf(stderr,
            "%s: note: --trace-steps %s: this run %s; the trace will hold steps %lld to "
            "%lld\n",
            prog, w, took, lo, hi);
}

/* --sample: n bytes after the prompt (--prompt, the held-out text's first context / 2 bytes, or
 * a copy-task sequence up to its separator). */
static int sample(result *r, const opts *o, pmap_params *params, int n, text_data *text) {
  char why[1024];
  const unsigned char *prompt = (const unsigned char *)o->prompt;
  int64_t plen = o->prompt ? (int64_t)strlen(o->prompt) : 0;
  pmap_array xs = {0}, ys = {0};
  if (!prompt && text->bytes) {
    prompt = text->bytes + text->train_n;
    plen = o->context / 2 > 0 ? o->context / 2 : 1;
  } else if (!prompt) {
    if (pmap_copy_task_data(o->seed + 2, 1, o->context, &xs, &ys)) return fail(r, "--sample");
    unsigned char *p = malloc((size_t)o->context);
    if (!p) return failf(r, "out of memory");
    plen = o->context / 2 + 1; /* the letters and '|' */
    for (int64_t j = 0; j < plen; j++) p[j] = (unsigned char)((int32_t *)xs.data)[j];
    prompt = p;
  }
  printf("sample (%s", o->temperature > 0.0f ? "temperature " : "greedy");
  if (o->temperature > 0.0f) printf("%g", (double)o->temperature);
  printf(", %lld bytes after the prompt):\n", (long long)o->sample);
  fwrite(prompt, 1, (size_t)plen, stdout);
  fflush(stdout);
  int rc = text_sample(params, n, o->context, prompt, plen, o->sample, o->temperature, o->seed,
                       stdout, why, sizeof why);
  printf("\n");
  if (xs.data) free((void *)prompt);
  pmap_example_data_free(&xs, &ys);
  return rc ? failf(r, "%s", why) : 0;
}

int main(int argc, char **argv) {
  opts o;
  if (train_parse(argc, argv, &o)) {
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
                  .mfu = NAN,
                  .tps = NAN,
                  .gflops = NAN,
                  .procs = -1,
                  .start = -1};
      snprintf(r.err, sizeof r.err, "%s", cli_last_error());
      o.batch = -1;
      print_json(&o, &r);
    }
    fputs(AS_GIVEN_LINE, stderr);
    return EXIT_AS_GIVEN;
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
              .mfu = NAN,
              .tps = NAN,
              .gflops = NAN,
              .procs = 1};
  text_data text = {0};
  train_data data = {0};
  char why[1024];
  pmap_example_info info;
  pmap_backend backend;
  int code = 1;
  pmap_ctx *ctx = NULL;
  pmap_model *model = NULL;
  pmap_params *params = NULL;
  pmap_array xs = {0}, ys = {0};
  float *w0 = NULL, *curve = NULL;
  int64_t *curve_step = NULL;
  watch_progress bar = {0};
  r.bar = &bar;
  int tracing = 0; /* a recording is on: it holds the steps alone */
  size_t ncurve = 0;
  pmap_status sst; /* of a library call before the first step */
  if (o.data) {
    if (train_data_load(o.data, o.labels, o.eval_fraction, o.seed, &data, why, sizeof why)) {
      failf(&r, "%s", why);
      setup_failed(&r, PMAP_SUCCESS);
      goto out;
    }
    info = (pmap_example_info){"npy", 1000, 64, data.train_rows, pmap_adam(0.001f)};
    if (o.batch < 0 && info.batch > data.train_rows) info.batch = data.train_rows;
  } else if (o.text) {
    if (text_load(o.text, o.context, o.have_eval ? o.eval_fraction : 0.1, o.seed + 1, &text, why,
                  sizeof why)) {
      failf(&r, "%s", why);
      setup_failed(&r, PMAP_SUCCESS);
      goto out;
    }
    info = (pmap_example_info){"text", 300, 32, 32, pmap_adam(0.003f)};
  } else if ((sst = pmap_example_info_get(o.model, &info))) {
    fail(&r, "--model");
    setup_failed(&r, sst);
    goto out;
  }
  if ((sst = pmap_backend_parse(o.backend, &backend))) {
    fail(&r, "--backend");
    setup_failed(&r, sst);
    goto out;
  }
  if (o.steps < 0) o.steps = info.steps;
  if (o.batch < 0) o.batch = info.batch;
  if (o.samples < 0 || o.data) o.samples = info.samples;
  if (o.text) o.samples = o.batch;           /* windows are drawn per step: one "batch" of data */
  if (o.data && o.batch > data.train_rows) { /* before the first step: what was given */
    failf(&r, "--batch %lld is larger than the %lld training rows", (long long)o.batch,
          (long long)data.train_rows);
    setup_failed(&r, PMAP_SUCCESS);
    goto out;
  }
  if (o.have_lr) info.opt.lr = o.lr;
  info.opt.clip_norm = o.clip_norm;
  r.steps = o.steps;
  r.lr = info.opt.lr;
  if (o.log_every < 0) o.log_every = o.steps >= 10 ? o.steps / 10 : 1;
  int64_t rows = (o.samples + o.batch - 1) / o.batch * o.batch;
  int64_t batches = rows / o.batch;

  if (o.inspect) {
    if (make_model(&o, &data, &model, why, sizeof why)) {
      failf(&r, "--inspect: cannot build the model: %s", why);
      code = 1;
      if (o.json) print_json(&o, &r);
    } else {
      code = inspect(&r, &o, model, &info.opt, batches);
    }
    o.json = 0; /* inspect printed its own line */
    goto out;
  }
  pmap_config cfg = {.backend = backend,
                     .num_devices = (int)o.devices,
                     .timeout_s = o.timeout_s,
                     .numeric_guard = o.no_guard ? PMAP_GUARD_OFF : PMAP_GUARD_ON,
                     .shard_optimizer = o.shard,
                     .max_memory = (size_t)o.max_memory,
                     .recompute = o.recompute};
  if ((sst = pmap_ctx_create(&cfg, &ctx))) {
    fail(&r, "cannot create the context");
    setup_failed(&r, sst);
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
    setup_failed(&r, PMAP_SUCCESS);
    goto out;
  }
  /* A --save path the saves cannot write fails now, before the header (pmap-launch then knows
   * that a restart would fail alike), not after the steps before the first save; process 0
   * alone writes, so it alone checks. */
  if (o.save && me == 0 && (sst = pmap_params_save_check(o.save))) {
    failf(&r, "--save: %s; nothing was run", pmap_last_error());
    setup_failed(&r, sst);
    goto out;
  }
  if (make_model(&o, &data, &model, why, sizeof why)) {
    failf(&r, "cannot build the model: %s", why);
    setup_failed(&r, PMAP_SUCCESS);
    goto out;
  }
  int lm = o.text || !strcmp(o.model, "gpt-mini");
  double flops_per_sample = 6.0 * pmap_model_forward_macs(model);
  if ((sst = pmap_params_create(ctx, model, &info.opt, o.seed, &params))) {
    refused_for_memory(&r, &o, cfg, pmap_ctx_backend(ctx), model, &info.opt, o.batch / procs, NULL,
                       "cannot create the parameters", sst);
    goto out;
  }
  if ((sst = pmap_params_set_micro_batches(params, (int)o.micro))) {
    fail(&r, "--micro-batches");
    setup_failed(&r, sst);
    goto out;
  }
  if (lm && !o.text && (sst = pmap_copy_task_data(o.seed + 1, rows, o.context, &xs, &ys))) {
    fail(&r, "cannot make the data");
    setup_failed(&r, sst);
    goto out;
  }
  if (!o.data && !lm && (sst = pmap_example_data(o.model, o.seed + 1, rows, &xs, &ys))) {
    fail(&r, "cannot make the data");
    setup_failed(&r, sst);
    goto out;
  }
  float loss = NAN;
  /* A checkpoint that does not load, or is another run's: of what was given, unless the load
   * itself failed for another reason than the file (a process lost while the replicas load). */
  if (o.resume && load(&r, &o, o.resume, "--resume", params, batches, &loss)) {
    setup_failed(&r, r.load_status);
    goto out;
  }
  /* A resumed run keeps its checkpoint's policy unless --precision says otherwise. */
  if ((!o.resume || o.have_precision) &&
      (sst = pmap_params_set_precision(params, (pmap_precision)o.precision))) {
    refused_for_memory(&r, &o, cfg, pmap_ctx_backend(ctx), model, &info.opt, o.batch / procs,
                       &params, "--precision", sst);
    goto out;
  }
  r.precision = pmap_precision_name(pmap_params_precision(params));
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
  printf("pmap-train: precision %s (CPU bf16 instructions: %s; bf16 GEMM %s, %s)\n", r.precision,
         pmap_cpu_bf16(), pmap_bf16_provider(), pmap_bf16_reason());
  /* pmap-launch reads this line to know that the run got past its setup: out at once, also
   * where stdout is a pipe (block-buffered). */
  fflush(stdout);
  r.sharded = pmap_params_sharded(params);
  r.state_bytes = pmap_params_optimizer_bytes(params);
  printf("pmap-train: optimizer state %.4g MB per device (%s)\n",
         (double)pmap_params_optimizer_bytes(params) / 1e6,
         pmap_params_sharded(params) ? "sharded over the devices" : "replicated");
  int fit =
      watch_memory(params, o.batch / procs, o.max_memory, o.recompute, &r.plan, why, sizeof why);
  r.have_plan = fit >= 0; /* a plan refused is in the JSON too, to say what it needs */
  if (fit) {
    failf(&r, "%s", why);
    setup_failed(&r, fit > 0 ? PMAP_SUCCESS : PMAP_ERR_INTERNAL);
    goto out;
  }
  if (o.resume && start == o.steps)
    printf("resumed from %s after step %lld: no step follows (--steps %lld: the run is done)\n",
           o.resume, (long long)start, (long long)o.steps);
  else if (o.resume)
    printf("resumed from %s after step %lld: steps %lld to %lld follow\n", o.resume,
           (long long)start, (long long)start + 1, (long long)o.steps);
  if (o.trace) trace_note(&o, start);
  if (o.text)
    printf("text: %s, %lld bytes (%lld for training, %lld held out), context %lld\n", o.text,
           (long long)text.n, (long long)text.train_n, (long long)(text.n - text.train_n),
           (long long)o.context);
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
  /* Training FLOPs per example: forward 2 per multiply-add, backward twice that. MFU is against
   * the devices' measured GEMM rate, measured for a run of ten times the probe's FLOPs or more,
   * so that the probe adds at most about a tenth to it on any machine: before step 1 for the bar
   * to show it, else after the last step. */
  double flops = 6.0 * pmap_model_forward_macs(model);
  double run_flops = flops * (double)(o.steps - start) * (double)o.batch;
  /* The CPU's peak costs a few ms to measure; a GPU's GEMM probe a run of its own. */
  int measure = flops > 0 && (pmap_ctx_backend(ctx) == PMAP_BACKEND_CPU ||
                              run_flops >= 10.0 * watch_gemm_probe_flops(n));
  watch_progress_begin(&bar, o.progress, start, o.steps, o.batch, flops, 0.0);
  if (bar.bar && measure) gemm_probe(&bar, ctx, params, &r.peak);
  if (o.trace) {
    if ((sst = pmap_trace_start(ctx, o.trace, o.trace_steps))) {
      fail(&r, "--trace");
      setup_failed(&r, sst);
      goto out;
    }
    tracing = 1;
  }
  for (int64_t s = start; s < o.steps; s++) {
    /* Steps count from 1: this is step t, after which pmap_params_step is t (as in traces,
     * checkpoints and the library's messages). The data position is s = t - 1: step t takes
     * batch s % batches, resumed or not. */
    int64_t t = s + 1;
    int64_t first = (s % batches) * o.batch;
    pmap_array xb = xs, yb = ys;
    int64_t mine = o.batch / procs; /* this process's rows of the global batch */
    if (o.text) {
      if (text_batch(&text, s, o.batch, &xb, &yb, why, sizeof why)) {
        failf(&r, "%s", why);
        goto out;
      }
      xb.data = (int32_t *)xb.data + (size_t)(me * mine) * (size_t)o.context;
      yb.data = (int32_t *)yb.data + (size_t)(me * mine) * (size_t)o.context;
    } else if (o.data) {
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
            (long long)t, pmap_last_error());
      goto out;
    }
    if (st) {
      failf(&r, "step %lld: %s", (long long)t, pmap_last_error());
      goto out;
    }
    busy += cli_now() - t0;
    r.loss = loss;
    if (curve && (s % stride == 0 || t == o.steps)) {
      curve_step[ncurve] = t;
      curve[ncurve++] = loss;
    }
    watch_progress_step(&bar, s, loss, busy);
    /* A line after the run's first step, every log_every-th and the last. */
    if (o.log_every && (t == start + 1 || t % o.log_every == 0 || t == o.steps) &&
        (!bar.bar || data.eval_rows || o.text)) {
      /* Throughput over the steps since the previous line. */
      watch_progress_break(&bar);
      double rate = (double)(t - last_step) * (double)o.batch / (busy - last_busy);
      printf("step %6lld  loss %.6f  samples/s %.0f", (long long)t, (double)loss, rate);
      if (lm) printf("  tokens/s %.0f", rate * (double)o.context);
      if (o.text) {
        if (text_eval(&text, params, n, o.batch / procs, &r.eval_loss, why, sizeof why)) {
          printf("\n");
          failf(&r, "step %lld: held-out loss: %s", (long long)t, why);
          goto out;
        }
        printf("  eval loss %.4f  ppl %.3f", r.eval_loss, exp(r.eval_loss));
      }
      if (data.eval_rows) {
        if (train_data_eval(&data, params, n, o.batch / procs, &r.eval_loss, &r.eval_accuracy, why,
                            sizeof why)) {
          printf("\n");
          failf(&r, "step %lld: evaluation: %s", (long long)t, why);
          goto out;
        }
        printf("  eval loss %.6f", r.eval_loss);
        if (data.classify) printf("  eval accuracy %.4f", r.eval_accuracy);
      }
      printf("\n");
      last_step = t;
      last_busy = busy;
    }
    if (o.verify_every && t % o.verify_every == 0 && pmap_params_verify(params)) {
      failf(&r, "step %lld: --verify-every: %s", (long long)t, pmap_last_error());
      goto out;
    }
    if (o.save_every && t % o.save_every == 0 && t < o.steps && save(&r, &o, params, batches, loss))
      goto out;
  }
  watch_progress_break(&bar);
  if (o.save && save(&r, &o, params, batches, loss)) goto out;
  tracing = 0;
  if (o.trace && pmap_trace_stop(ctx)) {
    fail(&r, "--trace");
    goto out;
  }
  double sps = o.steps > start ? (double)(o.steps - start) * (double)o.batch / busy : NAN;
  r.sps = sps;
  if (!bar.probed && measure) gemm_probe(&bar, ctx, params, &r.peak);
  r.mfu = watch_mfu(&bar, sps);
  if (watch_waits_read(ctx, &r.waits)) {
    fail(&r, "pmap_ctx_waits");
    goto out;
  }
  watch_waits_print(&r.waits);
  r.mfu_peak = bar.peak_flops;
  if (isfinite(r.mfu) && r.peak.cores)
    printf(
        "model FLOPs utilisation %.1f%% (%.3g GFLOP/s of a peak of %.3g: %d cores at %.2f GHz, "
        "%s)\n",
        100 * r.mfu, sps * flops / 1e9, bar.peak_flops / 1e9, r.peak.cores, r.peak.ghz,
        r.peak.what);
  else if (isfinite(r.mfu))
    printf("model FLOPs utilisation %.1f%% (%.3g GFLOP/s of %.3g measured GEMM GFLOP/s)\n",
           100 * r.mfu, sps * flops / 1e9, bar.peak_flops / 1e9);
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
  if (!w0) {
    failf(&r, "out of memory");
    goto out;
  }
  if (replicas_identical(&r, params, me * n, w0, P, why, sizeof why)) goto out;
  if (isfinite(sps))
    printf("final loss %.6f after %lld steps, %.0f samples/s, replicas identical: %s\n",
           (double)loss, (long long)o.steps, sps, r.identical ? "yes" : "NO");
  else /* resumed at its last step: no step, no rate */
    printf("final loss %.6f after %lld steps (none in this run), replicas identical: %s\n",
           (double)loss, (long long)o.steps, r.identical ? "yes" : "NO");
  if (lm && isfinite(sps)) {
    r.tps = sps * (double)o.context;
    r.gflops = sps * flops_per_sample / 1e9;
    printf("tokens/s %.0f, model %.3g GFLOP/s (6 x %.4g M forward multiply-adds per window)\n",
           r.tps, r.gflops, flops_per_sample / 6e6);
  }
  if (o.text) {
    if (text_eval(&text, params, n, o.batch / procs, &r.eval_loss, why, sizeof why)) {
      failf(&r, "held-out loss: %s", why);
      goto out;
    }
    printf("held out: loss %.6f nats per byte, perplexity %.4f\n", r.eval_loss, exp(r.eval_loss));
  }
  if (o.sample && sample(&r, &o, params, n, &text)) goto out;
  if (!strcmp(o.model, "linear")) {
    printf("w = %.4f, b = %.4f\n", (double)w0[0], (double)w0[1]);
    r.have_wb = 1;
    r.w = w0[0];
    r.b = w0[1];
  }
  if (data.eval_rows) {
    if (train_data_eval(&data, params, n, o.batch / procs, &r.eval_loss, &r.eval_accuracy, why,
                        sizeof why)) {
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
    failf(&r, "replicas differ after training: %s", why);
out:
  if (tracing) pmap_trace_stop(ctx); /* the run failed: what was recorded, for its reader */
  watch_progress_break(&bar);        /* the JSON line starts a line of its own */
  pmap_params_destroy(params);
  /* Under mpirun the processes end together: one that does not destroy its context within the
   * timeout (stopped, say) is named, and the run fails (its work and saves are done). */
  if (pmap_ctx_destroy(ctx) && code == 0) code = fail(&r, "at the end");
  if (o.json) print_json(&o, &r);
  watch_waits_free(&r.waits);
  free(curve);
  free(curve_step);
  free(w0);
  pmap_example_data_free(&xs, &ys);
  train_data_free(&data);
  text_free(&text);
  pmap_model_destroy(model);
  return code == EXIT_FAILED && r.as_given ? EXIT_AS_GIVEN : code;
}
