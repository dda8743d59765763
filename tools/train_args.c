/* train_args.c: pmap-train's command line: its option table (tools/cli.h: each option's kind,
 * range and help) and the checks of options that go together. */
#include "train_args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pmap.h"

static const char *prog = "pmap-train";

static int fraction_check(const char *p, const cli_option *o, const char *v) {
  double f = *(const double *)o->dest;
  if (!(f >= 0.0 && f < 1.0)) return cli_error(p, "--eval-fraction \"%s\" is outside [0, 1)", v);
  return 0;
}

static int temperature_check(const char *p, const cli_option *o, const char *v) {
  float t = *(const float *)o->dest;
  if (!(t >= 0.0f) || !isfinite(t))
    return cli_error(p, "--temperature \"%s\" must be a finite number >= 0 (0: greedy)", v);
  return 0;
}

static int clip_check(const char *p, const cli_option *o, const char *v) {
  float c = *(const float *)o->dest;
  if (!(c >= 0.0f) || !isfinite(c))
    return cli_error(p, "--clip-norm \"%s\" must be a finite number >= 0 (0: no clipping)", v);
  return 0;
}

static const char *const progress_choices[] = {"auto", "bar", "lines", NULL};
static const char *const precision_choices[] = {"fp32", "bf16", NULL}; /* pmap_precision's order */
static const char *const recompute_choices[] = {"none", "full", "auto", "selective",
                                                NULL}; /* PMAP_RECOMPUTE_*'s order */
/* --shard's rungs (ZeRO stages 0 to 3, and the library's choice); grads and params are refused
 * by name until they exist. */
static const char *const shard_choices[] = {"none", "optimizer", "grads", "params", "auto", NULL};

#define STEPS_MAX (INT64_C(1) << 40)
#define ROWS_MAX (INT64_C(1) << 24)

int train_parse(int argc, char **argv, opts *o) {
  *o = (opts){.model = "linear",
              .backend = "auto",
              .devices = PMAP_DEVICES_DEFAULT,
              .steps = -1,
              .batch = -1,
              .samples = -1,
              .log_every = -1,
              .micro = 1,
              .hidden = {128, 64},
              .n_hidden = 2,
              .context = 64,
              .depth = 4,
              .width = 128,
              .heads = 4};
  const cli_option table[] = {
      {.name = "--model",
       .kind = CLI_STRING,
       .dest = &o->model,
       .arg = "NAME",
       .help = "example model: linear, mlp, convnet, mlp-1024, cifar-cnn, res-mlp, cifar-bn or "
               "gpt-mini (default linear)",
       .given = &o->have_model},
      {.name = "--data",
       .kind = CLI_STRING,
       .dest = &o->data,
       .arg = "X.npy",
       .help =
           "train on the features in X.npy (f4 or f8, (rows, features) or (rows, C, H, W)) instead "
           "of an example model: an MLP sized from the data (needs --labels). With --data: Adam lr "
           "0.001, batch 64 and 1000 steps unless given; each epoch takes the training rows in an "
           "order drawn from --seed and the epoch number, the same for any device count"},
      {.name = "--labels",
       .kind = CLI_STRING,
       .dest = &o->labels,
       .arg = "Y.npy",
       .help =
           "integer labels (i4 or i8, (rows) or (rows, 1): softmax cross-entropy) or float targets "
           "(f4 or f8, (rows, K): MSE)"},
      {.name = "--hidden",
       .kind = CLI_LIST,
       .dest = o->hidden,
       .arg = "128,64",
       .help = "hidden widths of the MLP of --data, ReLU after each (default 128,64); only with "
               "--data",
       .lo = 1,
       .hi = 1 << 20,
       .count = &o->n_hidden,
       .given = &o->have_hidden},
      {.name = "--eval-fraction",
       .kind = CLI_REAL,
       .dest = &o->eval_fraction,
       .arg = "F",
       .help = "with --data: rows held out (after a shuffle from --seed) and evaluated at each "
               "progress line and at the end: loss, and accuracy for labels (default 0); with "
               "--text, the part of the file held out; refused with an example model",
       .check = fraction_check,
       .given = &o->have_eval},
      {.name = "--text",
       .kind = CLI_STRING,
       .dest = &o->text,
       .arg = "FILE",
       .help = "train a byte-level language model (gpt-mini's transformer, sized by --context, "
               "--depth, --width, --heads) on any file: each step takes --batch windows of "
               "--context + 1 bytes at places drawn from --seed and the step; the last "
               "--eval-fraction of the file (default 0.1) is held out for the loss and "
               "perplexity at each progress line. Adam lr 0.003, batch 32, 300 steps unless given"},
      {.name = "--context",
       .kind = CLI_INT,
       .dest = &o->context,
       .arg = "T",
       .help = "gpt-mini and --text: tokens per window (default 64)",
       .lo = 2,
       .hi = 4096,
       .given = &o->have_size},
      {.name = "--depth",
       .kind = CLI_INT,
       .dest = &o->depth,
       .arg = "L",
       .help = "gpt-mini and --text: transformer blocks (default 4)",
       .lo = 1,
       .hi = 64,
       .given = &o->have_size},
      {.name = "--width",
       .kind = CLI_INT,
       .dest = &o->width,
       .arg = "D",
       .help = "gpt-mini and --text: model width, a multiple of --heads (default 128)",
       .lo = 1,
       .hi = 65536,
       .given = &o->have_size},
      {.name = "--heads",
       .kind = CLI_INT,
       .dest = &o->heads,
       .arg = "H",
       .help = "gpt-mini and --text: attention heads, each of width / heads (default 4)",
       .lo = 1,
       .hi = 1024,
       .given = &o->have_size},
      {.name = "--untied-head",
       .kind = CLI_FLAG,
       .dest = &o->untied,
       .arg = NULL,
       .help = "gpt-mini and --text: the output layer has weights of its own (default: tied to "
               "the token embedding)",
       .flag = 1},
      {.name = "--sample",
       .kind = CLI_INT,
       .dest = &o->sample,
       .arg = "N",
       .help = "gpt-mini and --text: after training (or a --resume at its last step) print N bytes "
               "generated after --prompt (default: for --text the first context/2 bytes held "
               "out, for gpt-mini the first half of a copy-task sequence)",
       .lo = 1,
       .hi = 1 << 20},
      {.name = "--prompt",
       .kind = CLI_STRING,
       .dest = &o->prompt,
       .arg = "TEXT",
       .help = "with --sample: the bytes to continue"},
      {.name = "--temperature",
       .kind = CLI_FLOAT,
       .dest = &o->temperature,
       .arg = "X",
       .help = "with --sample: 0 picks the most likely byte (default), X > 0 draws from "
               "softmax(logits / X) with --seed",
       .check = temperature_check},
      {.name = "--devices",
       .kind = CLI_INT,
       .dest = &o->devices,
       .arg = "N",
       .help =
           "device count, per process under mpirun (default: CPU: $PMAP_CPU_DEVICES or 4; CUDA: "
           "every visible GPU)",
       .lo = 1,
       .hi = PMAP_MAX_DEVICES},
      {.name = "--backend",
       .kind = CLI_STRING,
       .dest = &o->backend,
       .arg = "auto|cpu|cuda",
       .help = "auto picks CUDA where a GPU is usable, else the CPU (default auto)"},
      {.name = "--steps",
       .kind = CLI_INT,
       .dest = &o->steps,
       .arg = "S",
       .help = "training steps in all, resumed ones included (default: the model's)",
       .lo = 1,
       .hi = STEPS_MAX},
      {.name = "--batch",
       .kind = CLI_INT,
       .dest = &o->batch,
       .arg = "B",
       .help = "GLOBAL batch, a multiple of the device count (under mpirun: of every process's "
               "devices; "
               "each process trains on its rows) (default: the model's)",
       .lo = 1,
       .hi = ROWS_MAX},
      {.name = "--lr",
       .kind = CLI_FLOAT,
       .dest = &o->lr,
       .arg = "LR",
       .help = "learning rate (default: the model's)",
       .given = &o->have_lr},
      {.name = "--seed",
       .kind = CLI_U64,
       .dest = &o->seed,
       .arg = "K",
       .help = "seed of the parameters and the data (default 0)"},
      {.name = "--samples",
       .kind = CLI_INT,
       .dest = &o->samples,
       .arg = "S",
       .help = "data set rows, rounded up to a multiple of the batch (default: the model's)",
       .lo = 1,
       .hi = ROWS_MAX},
      {.name = "--micro-batches",
       .kind = CLI_INT,
       .dest = &o->micro,
       .arg = "K",
       .help = "split each device's rows into K pieces (gradient accumulation)",
       .lo = 1,
       .hi = 65536},
      {.name = "--log-every",
       .kind = CLI_INT,
       .dest = &o->log_every,
       .arg = "E",
       .help = "a progress line after the first step, every E-th step and the last; 0 for none "
               "(default steps/10)",
       .lo = 0,
       .hi = STEPS_MAX},
      {.name = "--plot",
       .kind = CLI_STRING,
       .dest = &o->plot,
       .arg = "FILE",
       .help = "draw the loss curve into the PNG file FILE with gnuplot ($PMAP_GNUPLOT or gnuplot "
               "on the "
               "PATH); without gnuplot a note says so and training is unaffected"},
      {.name = "--json",
       .kind = CLI_FLAG,
       .dest = &o->json,
       .arg = NULL,
       .help = "end with one line of JSON (also when the run fails: then with \"error\")",
       .flag = 1},
      {.name = "--save",
       .kind = CLI_STRING,
       .dest = &o->save,
       .arg = "FILE",
       .help =
           "write a checkpoint to FILE at the end (atomically: a crash keeps the previous one); "
           "checked before step 1 as the saves write it (its folder exists and takes a new "
           "file; a symbolic link is written through, creating the file it names)"},
      {.name = "--save-every",
       .kind = CLI_INT,
       .dest = &o->save_every,
       .arg = "K",
       .help = "also every K steps (needs --save)",
       .lo = 1,
       .hi = STEPS_MAX},
      {.name = "--resume",
       .kind = CLI_STRING,
       .dest = &o->resume,
       .arg = "FILE",
       .help =
           "continue the run saved in FILE up to --steps steps in all; --model, --seed, --batch "
           "and "
           "--samples must be those of the saved run; --lr, --devices, --backend and the rest may "
           "change"},
      {.name = "--inspect",
       .kind = CLI_STRING,
       .dest = &o->inspect,
       .arg = "FILE",
       .help =
           "check that the checkpoint FILE loads in full into this run's model (the same --model "
           "or "
           "--data) and print its step and settings, then exit: 0 when it loads, 1 when not (with "
           "--json: one line of JSON); pmap-launch uses it to pick the checkpoint a restart "
           "resumes "
           "from"},
      {.name = "--verify-every",
       .kind = CLI_INT,
       .dest = &o->verify_every,
       .arg = "K",
       .help = "check every K steps that all replicas are bitwise identical (every process's under "
               "mpirun)",
       .lo = 1,
       .hi = STEPS_MAX},
      {.name = "--timeout",
       .kind = CLI_SECONDS,
       .dest = &o->timeout_s,
       .arg = "S",
       .help =
           "seconds a device or process may keep the others waiting in a collective (or at the "
           "start) before the run fails naming it (default $PMAP_TIMEOUT, else 300; inf: never)"},
      {.name = "--clip-norm",
       .kind = CLI_FLOAT,
       .dest = &o->clip_norm,
       .arg = "X",
       .help = "scale the averaged gradient to global L2 norm <= X (default 0: off)",
       .check = clip_check},
      {.name = "--no-numeric-guard",
       .kind = CLI_FLAG,
       .dest = &o->no_guard,
       .arg = NULL,
       .help =
           "let non-finite loss or gradients through (default: the step is skipped and pmap-train "
           "stops with exit status 1)",
       .flag = 1},
      {.name = "--shard",
       .kind = CLI_CHOICE,
       .dest = &o->shard_rung,
       .arg = NULL,
       .help = "what each device keeps of the training state: none (every device all of it), "
               "optimizer (its 1/N of the optimizer state, ZeRO-1; the same results), grads "
               "(its 1/N of the averaged gradient too, each layer's reduced as its backward "
               "ends, ZeRO-2; the same results; one micro-batch; a model of mostly one layer "
               "keeps its gradient whole), or auto (the default: the library's, "
               "PMAP_SHARD_OPTIMIZER when set, else the optimizer sharded from 65536 parameters "
               "or under --max-memory); params (ZeRO-3) is not there yet",
       .choices = shard_choices,
       .given = &o->have_shard_rung},
      {.name = "--shard-optimizer",
       .kind = CLI_FLAG,
       .dest = &o->shard,
       .arg = NULL,
       .help = "each device keeps the optimizer state of its 1/N of the parameters and steps only "
               "those "
               "(ZeRO-1; the same results): --shard optimizer",
       .flag = PMAP_SHARD_ON},
      {.name = "--no-shard-optimizer",
       .kind = CLI_FLAG,
       .dest = &o->shard,
       .arg = NULL,
       .help =
           "every device keeps all of it (default: the library's, PMAP_SHARD_OPTIMIZER when set, "
           "else sharded from 65536 parameters or under --max-memory): --shard none",
       .flag = PMAP_SHARD_OFF},
      {.name = "--trace",
       .kind = CLI_STRING,
       .dest = &o->trace,
       .arg = "FILE",
       .help = "record a timeline of the steps into FILE, a Chrome trace-event JSON file (open it "
               "in ui.perfetto.dev or chrome://tracing; bench/trace_plot.sh draws one step): a "
               "track per device and one for the caller (docs/tracing.md)"},
      {.name = "--trace-steps",
       .kind = CLI_STRING,
       .dest = &o->trace_steps,
       .arg = "K|A..B",
       .help = "with --trace: the steps kept, the last K or steps A to B, 1 the first (default "
               "the last 10)"},
      {.name = "--max-memory",
       .kind = CLI_BYTES,
       .dest = &o->max_memory,
       .arg = "BYTES",
       .help =
           "refuse to start when the memory plan of a device (printed before step 1) is over "
           "BYTES, before any step runs, and on CPU hold each device's allocations to BYTES "
           "the whole run long (pmap_config.max_memory): decimal digits with an optional K, M or G "
           "(K = 1024 bytes, M = 1024 K, G = 1024 M), a fraction only before one of them "
           "(e.g. 300000, 1.5M, 4G; not 1.5) (default: no limit)",
       .lo = 1,
       .hi = INT64_MAX},
      {.name = "--progress",
       .kind = CLI_CHOICE,
       .dest = &o->progress,
       .arg = NULL,
       .help = "how the run shows progress: auto (the default: a one-line bar on your "
               "terminal; plain lines into a file or a pipe, and under an MPI or batch launcher, "
               "whose terminal is the launcher's), bar or lines",
       .choices = progress_choices},
      {.name = "--precision",
       .kind = CLI_CHOICE,
       .dest = &o->precision,
       .arg = NULL,
       .help = "fp32 (the default) or bf16: the GEMMs' operands in bfloat16 with float master "
               "weights, sums, optimizer and all-reduce (docs/precision.md); with --resume, the "
               "checkpoint's policy unless given",
       .choices = precision_choices,
       .given = &o->have_precision},
      {.name = "--recompute",
       .kind = CLI_CHOICE,
       .dest = &o->recompute,
       .arg = NULL,
       .help = "none (the default): keep every layer's activations from forward to backward; "
               "full: keep only each residual block's input and compute the block again before "
               "its backward (about one block's activations, about one more forward pass, the "
               "same results: pmap_config.recompute, docs/tracing.md); selective: of those "
               "blocks keep the GEMMs' outputs and compute only the element-wise results (layer "
               "norms, activation functions) again, the same results; auto: the first of none, "
               "selective and full whose plan fits --max-memory (on CUDA the device's free "
               "memory)",
       .choices = recompute_choices},
  };
  const cli_spec spec = {prog, table, (int)(sizeof table / sizeof table[0]),
                         "Trains a model on N devices (threads on the CPU, GPUs) from one process, "
                         "or from each process under mpirun.",
                         NULL};
  int r = cli_parse(&spec, argc, argv);
  if (r > 0) exit(0);
  if (r < 0) return -1;
  if (o->have_shard_rung) {
    static const int shard_of[] = {PMAP_SHARD_OFF, PMAP_SHARD_ON, PMAP_SHARD_GRADS, -1,
                                   PMAP_SHARD_AUTO};
    if (o->shard != PMAP_SHARD_AUTO)
      return cli_error(prog,
                       "--shard and --%sshard-optimizer both say what is sharded; give one "
                       "(--shard-optimizer is --shard optimizer, --no-shard-optimizer --shard "
                       "none)",
                       o->shard == PMAP_SHARD_OFF ? "no-" : "");
    if (shard_of[o->shard_rung] < 0)
      return cli_error(prog,
                       "--shard %s: sharded parameters (ZeRO stage 3) are not there yet; "
                       "none, optimizer, grads or auto",
                       shard_choices[o->shard_rung]);
    o->shard = shard_of[o->shard_rung];
  }
  if (!o->data != !o->labels) return cli_error(prog, "--data and --labels go together");
  if (o->data && o->have_model)
    return cli_error(prog, "--data trains an MLP sized from the data; it does not take --model");
  /* What only --data (or --text) uses would otherwise be dropped without a word. */
  if (o->have_hidden && !o->data)
    return cli_error(prog,
                     "--hidden sizes the MLP of --data and needs --data (an example model and "
                     "--text have layers of their own)");
  if (o->have_eval && !o->data && !o->text)
    return cli_error(prog,
                     "--eval-fraction holds out rows of --data or bytes of --text and needs one "
                     "of them (an example model's data has nothing held out)");
  if (o->data) o->model = "npy";
  if (o->text && (o->data || o->have_model))
    return cli_error(prog,
                     "--text trains a language model on the file; it does not take --data "
                     "or --model");
  int lm = o->text || !strcmp(o->model, "gpt-mini");
  if (!lm && (o->have_size || o->untied || o->sample))
    return cli_error(prog,
                     "--context, --depth, --width, --heads, --untied-head and --sample "
                     "need --model gpt-mini or --text");
  if (lm && o->width % o->heads)
    return cli_error(prog, "--width %lld is not a multiple of --heads %lld", (long long)o->width,
                     (long long)o->heads);
  if ((o->prompt || o->temperature > 0.0f) && !o->sample)
    return cli_error(prog, "--prompt and --temperature go with --sample N");
  if (o->prompt && !*o->prompt) return cli_error(prog, "--prompt is empty");
  if (o->text) o->model = "text";
  if (o->save_every && !o->save) return cli_error(prog, "--save-every needs --save FILE");
  if (o->trace_steps && !o->trace) return cli_error(prog, "--trace-steps needs --trace FILE");
  /* The library records PMAP_TRACE's from pmap_ctx_create on, and a context holds one recording. */
  const char *env_trace = getenv("PMAP_TRACE");
  if (o->trace && env_trace && *env_trace)
    return cli_error(prog,
                     "--trace \"%s\" and the environment variable PMAP_TRACE=\"%s\" both ask for "
                     "a trace of this run; give one of them",
                     o->trace, env_trace);
  return 0;
}
