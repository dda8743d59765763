/* train_watch.h: what pmap-train shows about a run besides the loss (tools/train_watch.c): the
 * memory plan before step 1, the progress bar or lines while it trains with throughput, time
 * left and model FLOPs utilisation, and at the end the device that kept the others waiting. */
#ifndef PMAP_TOOLS_TRAIN_WATCH_H
#define PMAP_TOOLS_TRAIN_WATCH_H

#include <stdint.h>
#include <stdio.h>

#include "pmap.h"

/* The plan line ("memory per device: ..."), and the check against max_bytes (0: none) and the
 * device's free memory: returns 0; 1 with why filled when the plan (in *plan) does not fit; -1
 * with why filled when there is no plan. */
int watch_memory(pmap_params *params, int64_t batch, int64_t max_bytes, int recompute,
                 pmap_memory_plan *plan, char *why, size_t why_size);
/* The plan as a JSON object. */
void watch_memory_json(FILE *f, const pmap_memory_plan *plan);

/* The progress display: a bar redrawn in place on a terminal, else a plain line per log step. */
typedef struct watch_progress {
  int bar;             /* redraw one line in place */
  int64_t first, last; /* the run's steps [first, last) */
  int64_t batch;
  double t0, flops_per_sample, peak_flops; /* peak 0: MFU unknown */
  int probed;                              /* the GEMM rate was measured (or tried) */
  double last_draw;
} watch_progress;

/* Whether an MPI or batch launcher started this process (its variables are set). */
int watch_launched(void);
/* mode: 0 auto (a bar when stdout is a terminal and no launcher started the process), 1 bar,
 * 2 lines. */
void watch_progress_begin(watch_progress *w, int mode, int64_t first, int64_t last, int64_t batch,
                          double flops_per_sample, double peak_flops);
/* After step s (loss, busy seconds so far): redraws the bar (at most 10 times a second). */
void watch_progress_step(watch_progress *w, int64_t s, float loss, double busy);
/* Before any other line is printed, and at the end: ends the bar's line. */
void watch_progress_break(watch_progress *w);
/* Model FLOPs utilisation of samples_per_s, NaN when not known. */
double watch_mfu(const watch_progress *w, double samples_per_s);

/* Measures the GEMM rate of the context's devices together (FLOP/s): the forward pass of one
 * 1024 x 1024 dense layer over 1024 rows per device (pmap_predict), three times. 0 across
 * processes (where MFU is not reported, why left empty) and when it cannot (why says why). */
double watch_gemm_rate(pmap_ctx *ctx, char *why, size_t why_size);
/* What the probe computes on that many devices (FLOPs), to weigh it against a run. */
double watch_gemm_probe_flops(int devices);

/* The devices' waits at the collectives (every process's: a collective call), and the one that
 * held the others back most. */
typedef struct watch_waits {
  int n, worst;           /* n: every process's devices; worst: the straggler's index, -1: none */
  int procs, slow_proc;   /* across processes: the one whose devices waited least (-1: one) */
  double held_s;          /* its held_s: the others' waiting it caused */
  int64_t steps;          /* collectives met (per device) */
  pmap_device_waits *dev; /* (n) */
} watch_waits;
int watch_waits_read(pmap_ctx *ctx, watch_waits *w);
void watch_waits_print(const watch_waits *w);
void watch_waits_json(FILE *f, const watch_waits *w);
void watch_waits_free(watch_waits *w);

#endif
