/* bench.h: what the files of pmap-bench share: step-time statistics, the rows of the scaling
 * tables, and the reference measurements beside them (the step's GEMMs alone, the gradient
 * all-reduce alone, a hand-written single-device loop without the runtime). */
#ifndef PMAP_BENCH_H
#define PMAP_BENCH_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "ops/ops.h"
#include "pmap.h"

/* pmap-bench's options (bench_args.c). */
#define BENCH_ALL_MODELS \
  "linear,mlp,convnet,mlp-1024,cifar-cnn,res-mlp,cifar-bn,gpt-mini,tanh-custom"
typedef struct bench_opts {
  const char *models, *backend, *csv, *dump, *trace;
  int64_t devs[CLI_MAX_LIST], batch, weak_batch, steps, warmup, rounds;
  int ndev, json, ref, modes[2], guard, shard, compare;
  const char *precision;    /* --precision: "fp32", "bf16" or both, comma-separated */
  int precisions[2], nprec; /* the pmap_precision of each, in order */
  uint64_t seed;
  double timeout_s; /* pmap_config.timeout_s (0: the library's default) */
} bench_opts;
/* Reads argv into *o (defaults first) with pmap-bench's option table: 0; 1 after printing the
 * help for --help; -1 after printing why (tools/cli.h). */
int bench_parse(int argc, char **argv, bench_opts *o);

/* Median and spread of a set of times, in milliseconds. */
typedef struct bench_stats {
  double med, p10, p90, mean;
  int n;
} bench_stats;

/* Sorts t (n, seconds) in place and summarises it in milliseconds; all zero for n == 0. */
bench_stats bench_summarise(double *t, int n);

/* Sleeps long enough for the idle workers of the contexts just used to stop spinning (they spin
 * up to 200 us after a job), so that they do not take a core from the next measurement. */
void bench_settle(void);

/* What a convolution of a training step is, for the probe. */
typedef enum bench_conv {
  BENCH_GEMM = 0,         /* not a convolution: a GEMM */
  BENCH_CONV_FORWARD,     /* conv2d_forward (with the bias, and the ReLU where relu) */
  BENCH_CONV_BACKWARD,    /* conv2d_backward with the input gradient */
  BENCH_CONV_BACKWARD_DW, /* conv2d_backward without it (a first layer) */
} bench_conv;

/* One GEMM of a training step: c (m, n) = op(a) op(b), `repeat` times per step, accumulating
 * into c when beta1 is set; or one convolution op over bd examples of shape cs, run as the
 * step runs it (oneDNN's primitives, or im2col with its GEMMs). */
typedef struct bench_gemm {
  int ta, tb, beta1;
  int64_t m, n, k;
  int64_t repeat;
  bench_conv conv;
  int relu; /* the convolution applies the ReLU (forward) or its gradient (backward) */
  pmap_conv_shape cs;
  int64_t bd;
} bench_gemm;

#define BENCH_MAX_GEMMS 64

/* The GEMMs and convolutions of one forward + backward of `model` over bd examples on one
 * device, in the order and with the shapes and transposes models/exec.c runs them (recorded
 * from a run of it on a CPU device of its own). Returns their count (<= max), or -1 after
 * printing why. */
int bench_step_gemms(const pmap_model *model, int64_t bd, bench_gemm *out, int max);
/* Floating-point operations of those: 2 m n k each GEMM, times repeat; a convolution pass 2
 * bd oc oh ow c kh kw (the backward with the input gradient twice that). */
double bench_gemm_flops(const bench_gemm *g, int n);

/* Per-device buffers of the GEMM probe and the all-reduce probe of one context. */
typedef struct bench_probe bench_probe;

/* Allocates, on every device of ctx, operands for the GEMMs g (n), a gradient buffer for the
 * step's collectives and parameters and optimizer state as params has them (replicated or
 * sharded). Returns 0, or -1 after printing why. */
int bench_probe_open(pmap_ctx *ctx, const bench_gemm *g, int n, const pmap_params *params,
                     bench_probe **out);
void bench_probe_close(bench_probe *p); /* accepts NULL */
/* Times `reps` runs of the step's GEMMs and convolutions on every device at once (the devices start together
 * and a rep ends when the last one is done); appends the times (s) to t[*nt]. */
int bench_probe_gemms(bench_probe *p, int reps, double *t, int *nt);
/* Times `reps` runs of the step's collectives alone (the in-place pmean of [gradients | loss],
 * or sharded the reduce-scatter, the exchange of norms and the all-gather of the parameters);
 * appends to t[*nt]. */
int bench_probe_allreduce(bench_probe *p, int reps, double *t, int *nt);
/* Times `reps` runs of the step's optimizer alone, every device at once (over all parameters,
 * or sharded over the device's part); appends to t[*nt]. */
int bench_probe_optimizer(bench_probe *p, int reps, double *t, int *nt);

/* The hand-written single-device training loop: the models' own forward, loss, backward and
 * optimizer (models/exec.c, models/optimizer.c) over a host replica on the CPU op table (no
 * context, no workers, no collectives): the runtime-free baseline of a 1-device pmap_update. */
typedef struct bench_loop bench_loop;

/* 1 when the loop can run model: no layer of it calls collectives (batch norm); pmap-bench
 * leaves the loop out for the others. */
int bench_loop_supports(const pmap_model *model);
/* Builds the loop for model with its optimizer, parameters drawn from seed as
 * pmap_params_create draws them, on the data xs, ys (whole arrays, one device). */
int bench_loop_open(const pmap_model *model, const pmap_optimizer *opt, uint64_t seed,
                    const pmap_array *xs, const pmap_array *ys, bench_loop **out);
void bench_loop_close(bench_loop *l); /* accepts NULL */
/* One training step: zero gradients, forward, loss, backward, optimizer. *loss gets the loss;
 * t_opt (may be NULL) gets the seconds of the optimizer step alone. */
int bench_loop_step(bench_loop *l, float *loss, double *t_opt);

/* Writes DIR/<name>.json (architecture, loss, optimizer, shapes), DIR/<name>.params.f32 (the
 * initial parameters drawn from seed), DIR/<name>.x.f32 and DIR/<name>.y.bin (xs, ys), all
 * little-endian. Returns 0, or -1 after printing why. */
int bench_dump(const char *dir, const char *name, const pmap_model *model,
               const pmap_optimizer *opt, uint64_t seed, const pmap_array *xs,
               const pmap_array *ys);

/* ------------------------------------------------------------------------------------------ */
/* Results                                                                                    */

typedef enum bench_scaling { BENCH_STRONG = 0, BENCH_WEAK = 1 } bench_scaling;

typedef struct bench_row {
  int devices;
  int64_t global_batch, per_device_batch;
  int64_t total_steps;   /* steps taken before the final loss, step 0 and warm-up included */
  double step0_ms;       /* the first pmap_update: sizing, first touches, library start-up */
  bench_stats step;      /* steady-state step time */
  double sps, gflops;    /* samples/s and model GFLOP/s at the median */
  double tps;            /* tokens/s (sps x tokens per example; a language model's) */
  double mfu;            /* model FLOPs utilisation: gflops / peak_gflops (0: not known) */
  double peak_gflops;    /* the peak of the row's CPU cores for its precision (tools/cpu_peak.h) */
  double speedup, eff;   /* against the first row of the same table */
  bench_stats gemm;      /* the step's GEMMs alone, every device at once (n == 0: not measured) */
  double gemm_gflops;    /* executed GEMM FLOPs of all devices / gemm.med */
  double gemm_share;     /* gemm.med / step.med: the share of the raw GEMM rate the step keeps */
  bench_stats allreduce; /* the step's collectives alone (the pmean, or sharded all three) */
  bench_stats opt;       /* the step's optimizer alone, every device at once */
  double opt_share, coll_share; /* opt.med / step.med, allreduce.med / step.med */
  int sharded;                  /* the optimizer sharded (pmap_config.shard_optimizer) */
  int precision;                /* the row's pmap_precision */
  double vs_fp32;               /* a bf16 row: the fp32 row's step time (same devices and
                                   optimizer) over this row's; 0 where there is none */
  size_t state_bytes;           /* optimizer state per device (pmap_params_optimizer_bytes) */
  float loss0, loss;            /* loss of step 0 (the initial parameters) and the final loss */
  int identical;                /* every replica bitwise equal after the run */
  double loss_rel_diff;         /* |loss - first row's loss| / |first row's|, strong scaling only */
} bench_row;

typedef struct bench_result {
  const char *model;
  size_t params;
  double fwd_macs;           /* multiply-adds of one example's forward pass */
  int64_t tokens;            /* tokens per example of a language model ((T, V) output), else 0 */
  char optimizer[64];        /* e.g. "SGD lr 0.01 momentum 0.9" */
  int64_t batch, weak_batch; /* strong global batch; weak per-device batch */
  int64_t steps, warmup, rounds;
  int nrows[2];
  bench_row rows[2][CLI_MAX_LIST]; /* [BENCH_STRONG or BENCH_WEAK][device count] */
  /* The hand-written loop at the strong global batch on one thread (hand.n == 0: not run). */
  bench_stats hand;
  double hand_opt_ms; /* its optimizer step alone */
  float hand_loss;
  int64_t hand_steps;
  double hand_rel_diff; /* against the 1-device pmap row of the same batch, -1 when none */
  int failed;           /* a correctness check failed */
} bench_result;

/* Link parameters of the ring all-reduce model (see bench/README.md). */
typedef struct bench_link {
  const char *name;
  double alpha_us;  /* per-hop latency */
  double busbw_gbs; /* bus bandwidth, GB/s */
} bench_link;

/* Predicted step time on n devices from the measured 1-device step t1 (s), of which t_opt (s) is
 * the optimizer step every replica repeats, for a gradient of `bytes`: compute split n ways plus
 * a ring all-reduce of 2(n-1) hops of latency alpha and 2(n-1)/n bytes/busbw. */
double bench_predict_step(double t1, double t_opt, double bytes, int n, const bench_link *link);

/* Prints r's tables (strong, weak), the reference lines and the prediction to f. */
void bench_report_text(FILE *f, const bench_result *r, const char *backend, int cores);
/* The CSV header and r's rows (one line per row). */
void bench_report_csv_header(FILE *f);
void bench_report_csv(FILE *f, const bench_result *r, const char *backend);
/* One JSON object per result: fields and "rows"; the caller writes the enclosing object. */
void bench_report_json_rows(FILE *f, const bench_result *r, int *first_row);
void bench_report_json_model(FILE *f, const bench_result *r);

#endif
