/* train_watch.c: pmap-train's view of a run besides the loss: the memory plan, the progress
 * display with throughput, time left and MFU, and the straggler report (train_watch.h). */
#include "train_watch.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "train_state.h"

static double mb(size_t b) { return (double)b / 1e6; }

/* --recompute's word for a PMAP_RECOMPUTE_* rung. */
static const char *rung_name(int recompute) {
  return recompute == PMAP_RECOMPUTE_FULL        ? "full"
         : recompute == PMAP_RECOMPUTE_SELECTIVE ? "selective"
                                                 : "none";
}

int watch_memory(pmap_params *params, int64_t batch, int64_t max_bytes, int recompute,
                 pmap_memory_plan *plan, char *why, size_t why_size) {
  if (pmap_params_memory(params, batch, plan)) {
    snprintf(why, why_size, "the memory plan: %s", pmap_last_error());
    return -1;
  }
  const pmap_memory_plan *m = plan;
  printf(
      "pmap-train: memory per device: parameters %.4g MB, gradients %.4g MB%s, optimizer %.4g "
      "MB (%s), state %.4g MB, activations %.4g MB%s, staging %.4g MB: total %.4g MB",
      mb(m->params), mb(m->grads), m->grads_sharded ? " (sharded)" : "", mb(m->optimizer),
      m->optimizer_sharded ? "sharded" : "replicated", mb(m->state), mb(m->activations),
      m->recompute == PMAP_RECOMPUTE_FULL        ? " (blocks recomputed)"
      : m->recompute == PMAP_RECOMPUTE_SELECTIVE ? " (element-wise results recomputed)"
                                                 : "",
      mb(m->staging), mb(m->total));
  if (m->device_free != SIZE_MAX) printf(" (device free %.4g MB)", mb(m->device_free));
  printf("\n");
  if (recompute == PMAP_RECOMPUTE_AUTO) { /* which rung auto took, and why */
    size_t stored = m->total - m->activations + m->activations_stored;
    size_t selective = m->total - m->activations + m->activations_selective;
    if (m->recompute == PMAP_RECOMPUTE_SELECTIVE)
      printf(
          "pmap-train: --recompute auto chose selective: stored activations (%.4g MB) would "
          "take the plan to %.4g MB, over the limit; with the element-wise results recomputed "
          "they take %.4g MB\n",
          mb(m->activations_stored), mb(stored), mb(m->activations));
    else if (m->recompute)
      printf(
          "pmap-train: --recompute auto chose full: stored activations (%.4g MB) would take "
          "the plan to %.4g MB, and selective (%.4g MB) to %.4g MB, over the limit; recomputed "
          "they take %.4g MB\n",
          mb(m->activations_stored), mb(stored), mb(m->activations_selective), mb(selective),
          mb(m->activations));
    else if (m->activations_recomputed == m->activations_stored)
      printf("pmap-train: --recompute auto chose none: the model has no block to recompute\n");
    else
      printf("pmap-train: --recompute auto chose none: the stored plan fits %s\n",
             max_bytes > 0 || m->device_free != SIZE_MAX ? "the limit" : "(no --max-memory)");
  }
  if (max_bytes > 0 && m->total > (uint64_t)max_bytes) {
    snprintf(why, why_size,
             "--max-memory %lld: the plan needs %zu bytes per device (%.4g MB), over the limit "
             "by %zu bytes; nothing was run (lower --batch, %s%s)",
             (long long)max_bytes, m->total, mb(m->total), m->total - (size_t)max_bytes,
             !m->optimizer_sharded ? "raise --micro-batches, shard the optimizer"
             : !m->grads_sharded   ? "raise --micro-batches, --shard grads (one micro-batch)"
                                   : "run on more devices (sharded gradients take one micro-batch)",
             m->recompute != PMAP_RECOMPUTE_FULL && m->activations_recomputed < m->activations
                 ? ", or --recompute full"
                 : "");
    return 1;
  }
  if (m->device_free != SIZE_MAX && m->total > m->device_free) {
    snprintf(why, why_size,
             "the plan needs %.4g MB per device and device 0 has %.4g MB free; nothing was run",
             mb(m->total), mb(m->device_free));
    return 1;
  }
  return 0;
}

void watch_memory_json(FILE *f, const pmap_memory_plan *m) {
  fprintf(f,
          "{\"params\": %zu, \"grads\": %zu, \"optimizer\": %zu, \"optimizer_sharded\": %s, "
          "\"grads_sharded\": %s, \"state\": %zu, \"activations\": %zu, \"staging\": %zu, "
          "\"total\": %zu, \"shard\": \"%s\", \"recompute\": \"%s\", "
          "\"activations_stored\": %zu, \"activations_recomputed\": %zu, "
          "\"activations_selective\": %zu, \"device_free\": ",
          m->params, m->grads, m->optimizer, m->optimizer_sharded ? "true" : "false",
          m->grads_sharded ? "true" : "false", m->state, m->activations, m->staging, m->total,
          m->grads_sharded       ? "grads"
          : m->optimizer_sharded ? "optimizer"
                                 : "none",
          rung_name(m->recompute), m->activations_stored, m->activations_recomputed,
          m->activations_selective);
  if (m->device_free == SIZE_MAX)
    fprintf(f, "null}");
  else
    fprintf(f, "%zu}", m->device_free);
}

int watch_launched(void) {
  /* Open MPI (and PMIx), MPICH's Hydra and other PMI launchers, MVAPICH, Slurm's srun, Cray's
   * PALS: each sets one of these in every process it starts. */
  static const char *const vars[] = {
      "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",    "PMI_RANK",   "PMI_SIZE",
      "MPI_LOCALNRANKS",      "MV2_COMM_WORLD_RANK",  "SLURM_PROCID", "PALS_RANKID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v && *v) return 1;
  }
  return 0;
}

void watch_progress_begin(watch_progress *w, int mode, int64_t first, int64_t last, int64_t batch,
                          double flops_per_sample, double peak_flops) {
  /* A launcher's processes write to a pseudo-terminal of the launcher's (Open MPI's do), which
   * ends up in a log file: the bar only on the user's own terminal, unless asked for. */
  int terminal = isatty(STDOUT_FILENO) && !watch_launched();
  *w = (watch_progress){.bar = mode == 1 || (mode == 0 && terminal),
                        .first = first,
                        .last = last,
                        .batch = batch,
                        .t0 = cli_now(),
                        .flops_per_sample = flops_per_sample,
                        .peak_flops = peak_flops,
                        .last_draw = -1.0};
}

double watch_mfu(const watch_progress *w, double samples_per_s) {
  if (!(w->flops_per_sample > 0.0) || !(w->peak_flops > 0.0) || !isfinite(samples_per_s))
    return NAN;
  return samples_per_s * w->flops_per_sample / w->peak_flops;
}

static void left(char *buf, size_t size, double s) {
  if (!isfinite(s) || s < 0)
    snprintf(buf, size, "?");
  else if (s >= 3600)
    snprintf(buf, size, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
  else
    snprintf(buf, size, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
}

void watch_progress_step(watch_progress *w, int64_t s, float loss, double busy) {
  if (!w->bar) return;
  double now = cli_now();
  if (s + 1 < w->last && w->last_draw >= 0 && now - w->last_draw < 0.1) return;
  w->last_draw = now;
  int64_t done = s + 1 - w->first;
  double sps = busy > 0 ? (double)done * (double)w->batch / busy : NAN;
  double rate = (now - w->t0) / (double)done;
  char eta[32], bar[24];
  left(eta, sizeof eta, rate * (double)(w->last - s - 1));
  /* Filled as its label reads, step s + 1 of the whole run (a resumed run starts part full);
   * the rate and the time left are this run's. */
  int fill = w->last > 0 ? (int)(20 * (s + 1) / w->last) : 20;
  for (int i = 0; i < 20; i++) bar[i] = i < fill ? '#' : '.';
  bar[20] = '\0';
  printf("\r[%s] step %lld/%lld  loss %.5f  %.0f samples/s", bar, (long long)(s + 1),
         (long long)w->last, (double)loss, sps);
  double mfu = watch_mfu(w, sps);
  if (isfinite(mfu)) printf("  MFU %.1f%%", 100 * mfu);
  printf("  left %s \033[K", eta);
  fflush(stdout);
}

void watch_progress_break(watch_progress *w) {
  if (w->bar && w->last_draw >= 0) printf("\n");
  w->last_draw = -1.0;
}

/* The probe: a predict of a dense GEMM_K -> GEMM_K layer over GEMM_K rows per device, run
 * GEMM_RUNS times (the first warms up; the best of the others counts). */
enum { GEMM_K = 1024, GEMM_RUNS = 3 };

double watch_gemm_probe_flops(int devices) {
  return GEMM_RUNS * 2.0 * (double)GEMM_K * GEMM_K * GEMM_K * (double)devices;
}

double watch_gemm_rate(pmap_ctx *ctx, char *why, size_t why_size) {
  why[0] = '\0';
  /* Its calls are collective across processes, and whether a process measures depends on its
   * own terminal and timing: one process alone. */
  if (pmap_ctx_num_processes(ctx) > 1) return 0.0;
  int n = pmap_ctx_num_devices(ctx);
  int64_t rows = (int64_t)GEMM_K * n, in_shape[1] = {GEMM_K};
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  float *x = calloc((size_t)rows * GEMM_K, sizeof *x);
  float *y = malloc((size_t)rows * GEMM_K * sizeof *y);
  double rate = 0.0, best = INFINITY;
  /* pmap_params_create wants a valid optimizer; predict never applies it. */
  pmap_optimizer opt = pmap_sgd(0.01f, 0.0f);
  if (!x || !y) {
    snprintf(why, why_size, "out of memory");
  } else if (pmap_model_create(1, in_shape, &m) || pmap_model_add_dense(m, GEMM_K) ||
             pmap_params_create(ctx, m, &opt, 1, &p)) {
    snprintf(why, why_size, "%s", pmap_last_error());
  } else {
    int64_t xs_shape[2] = {rows, GEMM_K};
    pmap_array xs = pmap_array_f32(x, 2, xs_shape), ys = pmap_array_f32(y, 2, xs_shape);
    for (int i = 0; i < GEMM_RUNS; i++) {
      double t0 = cli_now();
      if (pmap_predict(p, &xs, &ys)) {
        snprintf(why, why_size, "%s", pmap_last_error());
        best = INFINITY;
        break;
      }
      double t = cli_now() - t0;
      if (i > 0 && t < best) best = t;
    }
    if (isfinite(best) && best > 0)
      rate = 2.0 * (double)GEMM_K * GEMM_K * (double)rows / best;
    else if (!why[0])
      snprintf(why, why_size, "the probe took no measurable time");
  }
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  free(x);
  free(y);
  return rate;
}

int watch_waits_read(pmap_ctx *ctx, watch_waits *w) {
  int local = pmap_ctx_num_devices(ctx), procs = pmap_ctx_num_processes(ctx), n = local * procs;
  *w = (watch_waits){.n = n,
                     .worst = -1,
                     .procs = procs,
                     .slow_proc = -1,
                     .dev = calloc((size_t)n, sizeof *w->dev)};
  if (!w->dev || pmap_ctx_waits(ctx, w->dev, n)) return -1;
  /* Across processes: the process whose devices waited least is the one the others waited for. */
  double least = INFINITY;
  for (int p = 0; procs > 1 && p < procs; p++) {
    double sum = 0;
    for (int i = 0; i < local; i++) sum += w->dev[p * local + i].wait_s;
    if (sum < least) {
      least = sum;
      w->slow_proc = p;
    }
  }
  for (int i = 0; i < n; i++) {
    if (w->dev[i].held_s > w->held_s) {
      w->held_s = w->dev[i].held_s;
      w->worst = i;
    }
    if (w->dev[i].collectives > w->steps) w->steps = w->dev[i].collectives;
  }
  return 0;
}

void watch_waits_print(const watch_waits *w) {
  if (!w->dev || w->n < 2) return;
  printf("devices (busy before each collective / waiting in it, seconds in all):");
  for (int i = 0; i < w->n; i++)
    printf(" %d: %.3f/%.3f", w->dev[i].device, w->dev[i].busy_s, w->dev[i].wait_s);
  printf("\n");
  if (w->worst >= 0)
    printf(
        "straggler: device %d kept the others waiting %.3f s in all (%.3f ms per "
        "collective, %lld collectives)\n",
        w->dev[w->worst].device, w->held_s, w->steps ? 1e3 * w->held_s / (double)w->steps : 0.0,
        (long long)w->steps);
  if (w->slow_proc >= 0)
    printf(
        "slowest process: %d (its devices waited least in the collectives: the others waited "
        "for it)\n",
        w->slow_proc);
}

void watch_waits_json(FILE *f, const watch_waits *w) {
  fprintf(f, "{\"devices\": [");
  for (int i = 0; w->dev && i < w->n; i++) {
    fprintf(f, "%s{\"device\": %d, \"collectives\": %lld, \"busy_s\": ", i ? ", " : "",
            w->dev[i].device, (long long)w->dev[i].collectives);
    json_number(f, w->dev[i].busy_s);
    fprintf(f, ", \"wait_s\": ");
    json_number(f, w->dev[i].wait_s);
    fprintf(f, ", \"held_s\": ");
    json_number(f, w->dev[i].held_s);
    fprintf(f, "}");
  }
  fprintf(f, "], \"straggler\": ");
  if (w->dev && w->worst >= 0)
    fprintf(f, "%d", w->dev[w->worst].device);
  else
    fprintf(f, "null");
  fprintf(f, ", \"straggler_held_s\": ");
  json_number(f, w->held_s);
  if (w->slow_proc >= 0) fprintf(f, ", \"slowest_process\": %d", w->slow_proc);
  fprintf(f, "}");
}

void watch_waits_free(watch_waits *w) {
  free(w->dev);
  w->dev = NULL;
}
