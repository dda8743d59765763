/* train_args.c: pmap-train's command line: the help text and the strict reader of every option
 * (numbers in range, options that go together). */
#include "train_args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pmap.h"

static const char *prog = "pmap-train";

void train_usage(FILE *f) {
  fprintf(
      f,
      "usage: pmap-train [--model linear|mlp|convnet|mlp-1024|cifar-cnn|res-mlp|cifar-bn]\n"
      "                  [--devices N]\n"
      "                  [--backend auto|cpu|cuda] [--steps S] [--batch B] [--lr LR]\n"
      "                  [--seed K] [--samples S] [--log-every E] [--plot FILE] [--json]\n"
      "                  [--save FILE [--save-every K]] [--resume FILE] [--verify-every K]\n"
      "                  [--clip-norm X] [--no-numeric-guard] [--micro-batches K]\n"
      "                  [--shard-optimizer | --no-shard-optimizer] [--timeout S]\n"
      "                  [--inspect FILE]\n"
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
      "               epoch number, the same for any device count\n");
  fprintf(
      f,
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
      "  --verify-every  check every K steps that all replicas are bitwise identical (every\n"
      "               process's under mpirun)\n"
      "  --timeout    seconds a device or process may keep the others waiting in a collective\n"
      "               (or at the start) before the run fails naming it (default\n"
      "               $PMAP_TIMEOUT, else 300; inf: never)\n"
      "  --inspect    check that the checkpoint FILE loads in full into this run's model (the\n"
      "               same --model or --data) and print its step and settings, then exit: 0\n"
      "               when it loads, 1 when not (with --json: one line of JSON); pmap-launch\n"
      "               uses it to pick the checkpoint a restart resumes from\n"
      "  --clip-norm  scale the averaged gradient to global L2 norm <= X (default 0: off)\n"
      "  --no-numeric-guard  let non-finite loss or gradients through (default: the step is\n"
      "               skipped and pmap-train stops with exit status 1)\n"
      "  --shard-optimizer     each device keeps the optimizer state of its 1/N of the\n"
      "               parameters and steps only those (ZeRO-1; the same results)\n"
      "  --no-shard-optimizer  every device keeps all of it (default: the library's,\n"
      "               PMAP_SHARD_OPTIMIZER when set, else sharded from 65536 parameters)\n");
}

int train_parse(int argc, char **argv, opts *o) {
  static const char *const flags[] = {"--json", "--no-numeric-guard", "--shard-optimizer",
                                      "--no-shard-optimizer", NULL};
  static const char *const value_opts[] = {
      "--model",     "--backend",       "--devices",   "--steps",         "--batch", "--samples",
      "--log-every", "--seed",          "--lr",        "--plot",          "--save",  "--save-every",
      "--resume",    "--verify-every",  "--clip-norm", "--micro-batches", "--data",  "--labels",
      "--hidden",    "--eval-fraction", "--timeout",   "--inspect",       NULL};
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
      train_usage(stdout);
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
    } else if (!strcmp(a, "--inspect")) {
      o->inspect = v;
    } else if (!strcmp(a, "--timeout")) {
      if (cli_timeout(prog, a, v, &o->timeout_s)) return -1;
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
