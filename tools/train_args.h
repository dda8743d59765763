/* train_args.h: pmap-train's options: what the command line says, and the reader that checks it
 * (tools/train_args.c). */
#ifndef PMAP_TOOLS_TRAIN_ARGS_H
#define PMAP_TOOLS_TRAIN_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "cli.h"

typedef struct opts {
  const char *model, *backend, *plot, *save, *resume, *data, *labels, *inspect;
  const char *trace, *trace_steps; /* --trace FILE, --trace-steps K or A..B */
  int64_t max_memory;              /* --max-memory BYTES, 0: no limit */
  int progress;                    /* --progress: 0 auto (a bar on a terminal), 1 bar, 2 lines */
  int precision, have_precision;   /* --precision: a pmap_precision (0 fp32, 1 bf16) */
  int recompute; /* --recompute: PMAP_RECOMPUTE_NONE (0), _FULL (1), _AUTO (2), _SELECTIVE (3) */
  int shard_rung, have_shard_rung; /* --shard: an index of shard_choices (train_args.c) */
  int64_t devices, steps, batch, samples, log_every, save_every, verify_every, micro;
  int64_t hidden[CLI_MAX_LIST];
  int n_hidden, have_model, have_hidden;
  double eval_fraction;
  double timeout_s; /* pmap_config.timeout_s: 0 means the library's ($PMAP_TIMEOUT, else 300 s) */
  float lr, clip_norm;
  int have_lr, json, no_guard, shard;
  uint64_t seed;
  /* language models (gpt-mini, --text): the transformer's size, sampling */
  const char *text, *prompt;
  int64_t context, depth, width, heads, sample;
  int untied, have_eval, have_size;
  float temperature;
} opts;

/* Reads argv into *o (defaults first) with the option table of train_args.c; prints the help
 * and exits 0 for --help. Returns 0, or -1 after printing why on stderr (cli_last_error). */
int train_parse(int argc, char **argv, opts *o);

#endif
