/* bench_report.c: the output of pmap-bench: per model a table per scaling mode, the reference
 * lines (hand-written loop, raw GEMM rate) and the 1 -> N prediction for a person; CSV rows and
 * JSON objects for a machine. */
#include <math.h>

#include "bench.h"

static const char *const scaling_name[2] = {"strong", "weak"};

/* Interconnects of the prediction: NVLink and PCIe, per-hop latency and all-reduce bus
 * bandwidth as nccl-tests reports them on such machines (see bench/README.md). */
static const bench_link links[] = {
    {"NVLink (alpha 5 us, 360 GB/s)", 5.0, 360.0},
    {"PCIe (alpha 8 us, 30 GB/s)", 8.0, 30.0},
};
#define NLINKS ((int)(sizeof links / sizeof *links))

/* The first row's policy: the prediction and its lines are of that policy's rows alone. */
static const bench_row *one_device_row(const bench_result *r) {
  for (int i = 0; i < r->nrows[BENCH_STRONG]; i++)
    if (r->rows[BENCH_STRONG][i].devices == 1 &&
        r->rows[BENCH_STRONG][i].precision == r->rows[BENCH_STRONG][0].precision)
      return &r->rows[BENCH_STRONG][i];
  return NULL;
}

static double grad_bytes(const bench_result *r) { return 4.0 * (double)(r->params + 1); }

static void table(FILE *f, const bench_result *r, int mode) {
  const bench_row *rows = r->rows[mode];
  if (!r->nrows[mode]) return;
  if (mode == BENCH_STRONG)
    fprintf(f, "strong scaling: global batch %lld", (long long)r->batch);
  else
    fprintf(f, "weak scaling: %lld per device", (long long)r->weak_batch);
  fprintf(f, "; median of %lld steps in interleaved rounds after %lld warm-up\n",
          (long long)r->steps, (long long)r->warmup);
  fprintf(f,
          "%7s %5s %4s %7s %7s %9s %10s %10s %10s %11s %8s %7s %6s %9s %6s %9s %6s %9s %6s %9s "
          "%5s\n",
          "devices", "opt", "prec", "batch", "per_dev", "step0_ms", "median_ms", "p10_ms", "p90_ms",
          "samples/s", "GFLOP/s", "speedup", "eff", "gemm_ms", "gemm%", "coll_ms", "coll%",
          "opt_ms", "opt%", "state_MB", "same");
  for (int i = 0; i < r->nrows[mode]; i++) {
    const bench_row *w = &rows[i];
    char gemm_ms[16] = "-", share[16] = "-", coll_ms[16] = "-", coll[16] = "-", opt_ms[16] = "-",
         opt[16] = "-";
    if (w->gemm.n) {
      snprintf(gemm_ms, sizeof gemm_ms, "%.4g", w->gemm.med);
      snprintf(share, sizeof share, "%.0f%%", 100.0 * w->gemm_share);
    }
    if (w->allreduce.n) {
      snprintf(coll_ms, sizeof coll_ms, "%.4g", w->allreduce.med);
      snprintf(coll, sizeof coll, "%.1f%%", 100.0 * w->coll_share);
    }
    if (w->opt.n) {
      snprintf(opt_ms, sizeof opt_ms, "%.4g", w->opt.med);
      snprintf(opt, sizeof opt, "%.1f%%", 100.0 * w->opt_share);
    }
    fprintf(f,
            "%7d %5s %4s %7lld %7lld %9.4g %10.4g %10.4g %10.4g %11.5g %8.4g %7.3f %6.3f %9s %6s "
            "%9s %6s %9s %6s %9.4g %5s\n",
            w->devices, w->sharded ? "shard" : "repl",
            pmap_precision_name((pmap_precision)w->precision), (long long)w->global_batch,
            (long long)w->per_device_batch, w->step0_ms, w->step.med, w->step.p10, w->step.p90,
            w->sps, w->gflops, w->speedup, w->eff, gemm_ms, share, coll_ms, coll, opt_ms, opt,
            (double)w->state_bytes / 1e6, w->identical ? "yes" : "NO");
  }
  /* bf16 beside fp32: each bf16 row against the fp32 row of its device count. */
  int any = 0;
  for (int i = 0; i < r->nrows[mode]; i++) {
    const bench_row *w = &rows[i];
    if (!(w->vs_fp32 > 0.0)) continue;
    fprintf(f, "%s %d dev%s %.4g ms, %.3fx the fp32 step",
            any ? "," : "bf16 against fp32:", w->devices, w->sharded ? " (sharded)" : "",
            w->step.med, w->vs_fp32);
    any = 1;
  }
  if (any) fprintf(f, "\n");
}

/* Each device count of the strong table after the first, predicted for every link, then
 * with this machine's measured all-reduce, then measured. */
static void prediction(FILE *f, const bench_result *r) {
  const bench_row *one = one_device_row(r);
  const bench_row *rows = r->rows[BENCH_STRONG];
  int n = r->nrows[BENCH_STRONG], more = 0;
  for (int i = 0; one && i < n; i++)
    more |= rows[i].devices > 1 && rows[i].precision == one->precision;
  if (!one || !more) return;
  double t1 = one->step.med * 1e-3, t_opt = r->hand.n ? r->hand_opt_ms * 1e-3 : 0.0;
  fprintf(f,
          "prediction of the strong-scaling efficiency E(N) = T1 / (N T(N)) with a ring "
          "all-reduce of\n%.4g MB: T(N) = (T1 - Topt)/N + Topt + 2(N-1) alpha + 2(N-1)/N "
          "bytes/busbw, T1 %.4g ms, Topt %.3g ms\n",
          grad_bytes(r) / 1e6, one->step.med, t_opt * 1e3);
  fprintf(f, "%-36s", "link");
  for (int i = 0; i < n; i++)
    if (rows[i].devices > 1 && rows[i].precision == one->precision)
      fprintf(f, "   E(%d)", rows[i].devices);
  fprintf(f, "\n");
  for (int k = 0; k < NLINKS; k++) {
    fprintf(f, "%-36s", links[k].name);
    for (int i = 0; i < n; i++) {
      int d = rows[i].devices;
      if (d > 1 && rows[i].precision == one->precision)
        fprintf(f, " %6.3f", t1 / (d * bench_predict_step(t1, t_opt, grad_bytes(r), d, &links[k])));
    }
    fprintf(f, "\n");
  }
  if (rows[0].gemm.n && one->gemm.n) {
    /* The step's GEMMs alone on N devices at once, against 1 device: the most that this
     * machine's cores allow the step, whatever the runtime does. */
    fprintf(f, "%-36s", "this machine's GEMMs alone (ceiling)");
    for (int i = 0; i < n; i++) {
      int d = rows[i].devices;
      if (d > 1 && rows[i].precision == one->precision)
        fprintf(f, " %6.3f", one->gemm.med / (d * rows[i].gemm.med));
    }
    fprintf(f, "\n");
  }
  if (rows[0].allreduce.n) {
    fprintf(f, "%-36s", "this machine's measured all-reduce");
    for (int i = 0; i < n; i++) {
      int d = rows[i].devices;
      if (d > 1 && rows[i].precision == one->precision)
        fprintf(f, " %6.3f", t1 / (d * ((t1 - t_opt) / d + t_opt + rows[i].allreduce.med * 1e-3)));
    }
    fprintf(f, "\n");
  }
  fprintf(f, "%-36s", "measured");
  for (int i = 0; i < n; i++) {
    int d = rows[i].devices;
    if (d > 1 && rows[i].precision == one->precision)
      fprintf(f, " %6.3f", one->step.med / (d * rows[i].step.med));
  }
  fprintf(f, "\n");
}

void bench_report_text(FILE *f, const bench_result *r, const char *backend, int cores) {
  fprintf(f,
          "\n== %s: %zu parameters (%.4g MB of gradients), %.4g M multiply-adds per example, "
          "%s; backend %s (gemm %s, %s), %d cores\n",
          r->model, r->params, grad_bytes(r) / 1e6, r->fwd_macs / 1e6, r->optimizer, backend,
          pmap_gemm_provider(), pmap_gemm_reason(), cores);
  table(f, r, BENCH_STRONG);
  table(f, r, BENCH_WEAK);
  const bench_row *one = one_device_row(r);
  if (r->hand.n) {
    fprintf(f,
            "hand-written 1-device loop (CPU op table, no runtime), batch %lld: median %.4g ms "
            "(p10 %.4g, p90 %.4g), optimizer step %.3g ms",
            (long long)r->batch, r->hand.med, r->hand.p10, r->hand.p90, r->hand_opt_ms);
    if (one)
      fprintf(f, "; pmap on 1 device %.4g ms: runtime overhead %+.3g us (%+.1f%%)", one->step.med,
              1e3 * (one->step.med - r->hand.med), 100.0 * (one->step.med / r->hand.med - 1.0));
    if (r->hand_rel_diff >= 0.0)
      fprintf(f, "; loss after %lld steps equal to pmap's on 1 device: %s (rel diff %.2g)",
              (long long)r->hand_steps, r->hand_rel_diff == 0.0 ? "yes" : "NO", r->hand_rel_diff);
    fprintf(f, "\n");
  }
  if (r->nrows[BENCH_STRONG] && r->rows[BENCH_STRONG][0].gemm.n) {
    fprintf(f,
            "raw GEMM rate at the step's shapes, every device at once (gemm_ms; gemm%% = "
            "gemm_ms / median_ms):");
    for (int i = 0; i < r->nrows[BENCH_STRONG]; i++)
      fprintf(f, " %d dev%s%s %.4g GFLOP/s%s", r->rows[BENCH_STRONG][i].devices,
              r->rows[BENCH_STRONG][i].precision == PMAP_PRECISION_BF16 ? " " : "",
              r->rows[BENCH_STRONG][i].precision == PMAP_PRECISION_BF16 ? "bf16" : "",
              r->rows[BENCH_STRONG][i].gemm_gflops, i + 1 < r->nrows[BENCH_STRONG] ? "," : "\n");
  }
  if (r->tokens)
    for (int m = 0; m < 2; m++)
      for (int i = 0; i < r->nrows[m]; i++) {
        const bench_row *w = &r->rows[m][i];
        fprintf(f, "%s %d dev%s: %.5g tokens/s", m == BENCH_STRONG ? "strong" : "weak", w->devices,
                w->precision == PMAP_PRECISION_BF16 ? " bf16" : "", w->tps);
        if (w->mfu > 0.0)
          fprintf(f, ", model FLOPs utilisation %.1f%% of the cores' peak (%.4g of %.4g GFLOP/s)",
                  100.0 * w->mfu, w->gflops, w->peak_gflops);
        fprintf(f, "\n");
      }
  prediction(f, r);
  if (r->failed) fprintf(f, "CORRECTNESS CHECK FAILED for %s (see above)\n", r->model);
}

void bench_report_csv_header(FILE *f) {
  fprintf(f,
          "model,scaling,backend,gemm,devices,global_batch,per_device_batch,total_steps,"
          "step0_ms,median_ms,p10_ms,p90_ms,samples_per_sec,gflops,speedup,efficiency,gemm_ms,"
          "gemm_gflops,gemm_share,allreduce_ms,loss0,loss,replicas_identical,sharded,"
          "optimizer_ms,optimizer_share,collective_share,optimizer_state_bytes,precision,"
          "vs_fp32\n");
}

void bench_report_csv(FILE *f, const bench_result *r, const char *backend) {
  for (int mode = 0; mode < 2; mode++)
    for (int i = 0; i < r->nrows[mode]; i++) {
      const bench_row *w = &r->rows[mode][i];
      fprintf(f,
              "%s,%s,%s,%s,%d,%lld,%lld,%lld,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,%.6g,"
              "%.6g,%.6g,%.9g,%.9g,%d,%d,%.6g,%.6g,%.6g,%zu,%s,%.6g\n",
              r->model, scaling_name[mode], backend, pmap_gemm_provider(), w->devices,
              (long long)w->global_batch, (long long)w->per_device_batch, (long long)w->total_steps,
              w->step0_ms, w->step.med, w->step.p10, w->step.p90, w->sps, w->gflops, w->speedup,
              w->eff, w->gemm.n ? w->gemm.med : -1.0, w->gemm.n ? w->gemm_gflops : -1.0,
              w->gemm.n ? w->gemm_share : -1.0, w->allreduce.med, (double)w->loss0, (double)w->loss,
              w->identical, w->sharded, w->opt.n ? w->opt.med : -1.0,
              w->opt.n ? w->opt_share : -1.0, w->allreduce.n ? w->coll_share : -1.0, w->state_bytes,
              pmap_precision_name((pmap_precision)w->precision),
              w->vs_fp32 > 0.0 ? w->vs_fp32 : -1.0);
    }
}

/* JSON has no NaN or infinity: those become null. */
static void num(FILE *f, const char *key, double v) {
  if (isfinite(v))
    fprintf(f, "\"%s\": %.9g", key, v);
  else
    fprintf(f, "\"%s\": null", key);
}

void bench_report_json_rows(FILE *f, const bench_result *r, int *first_row) {
  for (int mode = 0; mode < 2; mode++)
    for (int i = 0; i < r->nrows[mode]; i++) {
      const bench_row *w = &r->rows[mode][i];
      fprintf(f,
              "%s{\"model\": \"%s\", \"scaling\": \"%s\", \"devices\": %d, "
              "\"global_batch\": %lld, \"per_device_batch\": %lld, \"total_steps\": %lld, ",
              *first_row ? "" : ", ", r->model, scaling_name[mode], w->devices,
              (long long)w->global_batch, (long long)w->per_device_batch,
              (long long)w->total_steps);
      *first_row = 0;
      num(f, "step0_ms", w->step0_ms), fputs(", ", f);
      num(f, "median_ms", w->step.med), fputs(", ", f);
      num(f, "p10_ms", w->step.p10), fputs(", ", f);
      num(f, "p90_ms", w->step.p90), fputs(", ", f);
      num(f, "samples_per_sec", w->sps), fputs(", ", f);
      num(f, "gflops", w->gflops), fputs(", ", f);
      if (r->tokens) num(f, "tokens_per_sec", w->tps), fputs(", ", f);
      if (r->tokens) num(f, "mfu", w->mfu > 0.0 ? w->mfu : NAN), fputs(", ", f);
      num(f, "speedup", w->speedup), fputs(", ", f);
      num(f, "efficiency", w->eff), fputs(", ", f);
      num(f, "gemm_ms", w->gemm.n ? w->gemm.med : NAN), fputs(", ", f);
      num(f, "gemm_gflops", w->gemm.n ? w->gemm_gflops : NAN), fputs(", ", f);
      num(f, "gemm_share", w->gemm.n ? w->gemm_share : NAN), fputs(", ", f);
      num(f, "allreduce_ms", w->allreduce.n ? w->allreduce.med : NAN), fputs(", ", f);
      num(f, "collective_share", w->allreduce.n ? w->coll_share : NAN), fputs(", ", f);
      num(f, "optimizer_ms", w->opt.n ? w->opt.med : NAN), fputs(", ", f);
      num(f, "optimizer_share", w->opt.n ? w->opt_share : NAN), fputs(", ", f);
      fprintf(f, "\"sharded\": %s, \"optimizer_state_bytes\": %zu, ", w->sharded ? "true" : "false",
              w->state_bytes);
      num(f, "loss0", (double)w->loss0), fputs(", ", f);
      num(f, "loss", (double)w->loss), fputs(", ", f);
      num(f, "loss_rel_diff", mode == BENCH_STRONG ? w->loss_rel_diff : NAN);
      fprintf(f, ", \"precision\": \"%s\", ", pmap_precision_name((pmap_precision)w->precision));
      num(f, "vs_fp32", w->vs_fp32 > 0.0 ? w->vs_fp32 : NAN);
      fprintf(f, ", \"replicas_identical\": %s}", w->identical ? "true" : "false");
    }
}

void bench_report_json_model(FILE *f, const bench_result *r) {
  fprintf(f,
          "{\"model\": \"%s\", \"params\": %zu, \"gradient_bytes\": %.0f, "
          "\"forward_macs_per_example\": %.0f, \"optimizer\": \"%s\", \"batch\": %lld, "
          "\"weak_batch\": %lld, \"steps\": %lld, \"warmup\": %lld, \"rounds\": %lld, ",
          r->model, r->params, grad_bytes(r), r->fwd_macs, r->optimizer, (long long)r->batch,
          (long long)r->weak_batch, (long long)r->steps, (long long)r->warmup,
          (long long)r->rounds);
  if (r->hand.n) {
    fputs("\"hand_loop\": {", f);
    num(f, "median_ms", r->hand.med), fputs(", ", f);
    num(f, "p10_ms", r->hand.p10), fputs(", ", f);
    num(f, "p90_ms", r->hand.p90), fputs(", ", f);
    num(f, "optimizer_ms", r->hand_opt_ms), fputs(", ", f);
    num(f, "loss", (double)r->hand_loss), fputs(", ", f);
    num(f, "loss_rel_diff", r->hand_rel_diff >= 0 ? r->hand_rel_diff : NAN);
    fputs("}, ", f);
  }
  fputs("\"prediction\": [", f);
  const bench_row *one = one_device_row(r);
  for (int k = 0; one && k < NLINKS; k++) {
    double t1 = one->step.med * 1e-3, t_opt = r->hand.n ? r->hand_opt_ms * 1e-3 : 0.0;
    fprintf(f, "%s{\"link\": \"%s\", \"alpha_us\": %g, \"busbw_gbs\": %g, \"efficiency\": {",
            k ? ", " : "", links[k].name, links[k].alpha_us, links[k].busbw_gbs);
    for (int d = 2, first = 1; d <= 8; d *= 2, first = 0)
      fprintf(f, "%s\"%d\": %.4f", first ? "" : ", ", d,
              t1 / (d * bench_predict_step(t1, t_opt, grad_bytes(r), d, &links[k])));
    fputs("}}", f);
  }
  fprintf(f, "], \"failed\": %s}", r->failed ? "true" : "false");
}
