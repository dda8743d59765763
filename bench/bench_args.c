/* bench_args.c: pmap-bench's command line: its option table (tools/cli.h: each option's kind,
 * range and help) and what the options imply (the model list of "all", the tables to print). */
#include <stdio.h>
#include <string.h>

#include "bench.h"

int bench_parse(int argc, char **argv, bench_opts *o) {
  static const char *const scalings[] = {"strong", "weak", "both", NULL};
  int scaling = 2;
  *o = (bench_opts){.models = "mlp-1024",
                    .backend = "auto",
                    .devs = {1, 2, 4},
                    .batch = -1,
                    .weak_batch = -1,
                    .steps = -1,
                    .warmup = -1,
                    .rounds = 5,
                    .ndev = 3,
                    .ref = 1,
                    .guard = PMAP_GUARD_ON,
                    .shard = PMAP_SHARD_AUTO,
                    .precision = "fp32"};
  const cli_option table[] = {
      {.name = "--model",
       .kind = CLI_STRING,
       .dest = &o->models,
       .arg = "NAME[,NAME...]|all",
       .help = "example models, comma-separated; all: " BENCH_ALL_MODELS " (default mlp-1024)"},
      {.name = "--devices",
       .kind = CLI_LIST,
       .dest = o->devs,
       .count = &o->ndev,
       .lo = 1,
       .hi = PMAP_MAX_DEVICES,
       .arg = "1,2,4",
       .help = "device counts; speedup and efficiency are against the first (default 1,2,4)"},
      {.name = "--batch",
       .kind = CLI_INT,
       .dest = &o->batch,
       .lo = 1,
       .hi = INT64_C(1) << 24,
       .arg = "B",
       .help = "strong scaling: the global batch (default: each model's)"},
      {.name = "--weak-batch",
       .kind = CLI_INT,
       .dest = &o->weak_batch,
       .lo = 1,
       .hi = INT64_C(1) << 24,
       .arg = "BD",
       .help = "weak scaling: the batch per device (default: batch / first count)"},
      {.name = "--scaling",
       .kind = CLI_CHOICE,
       .dest = &scaling,
       .choices = scalings,
       .help = "which tables (default both)"},
      {.name = "--steps",
       .kind = CLI_INT,
       .dest = &o->steps,
       .lo = 1,
       .hi = 1000000,
       .arg = "S",
       .help = "timed steps per count (default 20 for mlp-1024, cifar-cnn and gpt-mini, else "
               "500), in R interleaved rounds after W warm-up steps; the first step is timed "
               "apart (step0_ms)"},
      {.name = "--warmup",
       .kind = CLI_INT,
       .dest = &o->warmup,
       .lo = 0,
       .hi = 1000000,
       .arg = "W",
       .help = "warm-up steps before the timed ones (default 3 for mlp-1024, cifar-cnn and "
               "gpt-mini, else "
               "50)"},
      {.name = "--rounds",
       .kind = CLI_INT,
       .dest = &o->rounds,
       .lo = 1,
       .hi = 100,
       .arg = "R",
       .help = "interleaved rounds the timed steps are split into (default 5)"},
      {.name = "--backend",
       .kind = CLI_STRING,
       .dest = &o->backend,
       .arg = "auto|cpu|cuda",
       .help = "the backend (default auto)"},
      {.name = "--seed",
       .kind = CLI_U64,
       .dest = &o->seed,
       .arg = "K",
       .help = "seed of the parameters and the data (default 0)"},
      {.name = "--no-ref",
       .kind = CLI_FLAG,
       .dest = &o->ref,
       .flag = 0,
       .help = "skip the reference measurements (GEMMs alone, all-reduce alone, the "
               "hand-written loop)"},
      {.name = "--no-numeric-guard",
       .kind = CLI_FLAG,
       .dest = &o->guard,
       .flag = PMAP_GUARD_OFF,
       .help = "time steps without the numeric guard (pmap_config)"},
      {.name = "--shard-optimizer",
       .kind = CLI_FLAG,
       .dest = &o->shard,
       .flag = PMAP_SHARD_ON,
       .help = "shard the optimizer over the devices (ZeRO-1: each device steps and keeps the "
               "state of its 1/N of the parameters)"},
      {.name = "--no-shard-optimizer",
       .kind = CLI_FLAG,
       .dest = &o->shard,
       .flag = PMAP_SHARD_OFF,
       .help = "replicate the optimizer on every device (default: PMAP_SHARD_OPTIMIZER when set, "
               "else sharded from 65536 parameters on)"},
      {.name = "--precision",
       .kind = CLI_STRING,
       .dest = &o->precision,
       .arg = "fp32,bf16",
       .help = "the numeric policies, comma-separated: a row of each for every device count, "
               "measured in the same interleaved rounds, bf16 against fp32 side by side "
               "(docs/precision.md; default fp32)"},
      {.name = "--compare-shard",
       .kind = CLI_FLAG,
       .dest = &o->compare,
       .flag = 1,
       .help = "a replicated and a sharded row for every device count above 1, measured in the "
               "same interleaved rounds"},
      {.name = "--csv",
       .kind = CLI_STRING,
       .dest = &o->csv,
       .arg = "FILE",
       .help = "also write the rows as CSV"},
      {.name = "--dump",
       .kind = CLI_STRING,
       .dest = &o->dump,
       .arg = "DIR",
       .help = "write each model's architecture, initial parameters and global batch into DIR "
               "(for bench/jax_compare.py)"},
      {.name = "--trace",
       .kind = CLI_STRING,
       .dest = &o->trace,
       .arg = "FILE",
       .help = "record a timeline of each row's last 10 timed steps (and its probes) into a file "
               "of its own: FILE without a final .json, then .<model>-<N>d[-sharded].json "
               "(--trace run.json: run.mlp-1024-4d.json, run.mlp-1024-4d-sharded.json; under "
               "mpirun .p<process> before .json), Chrome trace-event JSON (docs/tracing.md)"},
      {.name = "--timeout",
       .kind = CLI_SECONDS,
       .dest = &o->timeout_s,
       .arg = "S",
       .help = "seconds a device may keep the others waiting in a collective before the run "
               "fails naming it (default $PMAP_TIMEOUT, else 300; inf: never)"},
      {.name = "--json",
       .kind = CLI_FLAG,
       .dest = &o->json,
       .flag = 1,
       .help = "end with one line of JSON (\"rows\": one object per table row)"},
  };
  const cli_spec spec = {
      "pmap-bench", table, (int)(sizeof table / sizeof table[0]),
      "Step time of example models against the device count: strong scaling (one global batch) "
      "and weak scaling (one batch per device), with reference measurements.",
      "Model FLOPs are counted as 6 x the forward multiply-adds per example (forward 2, backward "
      "4). Exit status 1 when a correctness check fails."};
  int r = cli_parse(&spec, argc, argv);
  if (r) return r;
  if (!strcmp(o->models, "all")) o->models = BENCH_ALL_MODELS;
  /* --precision: fp32, bf16, or both once each, in the order given. */
  o->nprec = 0;
  for (const char *p = o->precision; *p;) {
    size_t len = strcspn(p, ",");
    char name[8] = "";
    pmap_precision pr = PMAP_PRECISION_FP32;
    if (len < sizeof name) memcpy(name, p, len);
    if (len >= sizeof name || pmap_precision_parse(name, &pr) || (p[len] == ',' && !p[len + 1]) ||
        (o->nprec == 1 && o->precisions[0] == (int)pr) || o->nprec == 2) {
      fprintf(stderr,
              "pmap-bench: --precision \"%s\": fp32, bf16 or both, each once, comma-separated\n",
              o->precision);
      return -1;
    }
    o->precisions[o->nprec++] = (int)pr;
    p += len + (p[len] == ',');
  }
  if (!o->nprec) {
    fprintf(stderr, "pmap-bench: --precision is empty (fp32, bf16 or fp32,bf16)\n");
    return -1;
  }
  o->modes[BENCH_STRONG] = scaling != 1;
  o->modes[BENCH_WEAK] = scaling != 0;
  return 0;
}
