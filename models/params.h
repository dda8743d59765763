/* params.h: the inside of a pmap_params (the replicated training state) for the files of models/
 * that work on it: the step (params.c), checkpoints (checkpoint.c). */
#ifndef PMAP_MODELS_PARAMS_H
#define PMAP_MODELS_PARAMS_H

#include "model.h"

struct pmap_params {
  pmap_ctx *ctx;
  pmap_model *model;
  pmap_optimizer opt;
  size_t n_params;
  int opt_slots; /* optimizer state buffers of n_params each */
  int64_t step;
  replica *rep; /* (N) */
  /* The gradient buffer of a replica is [gradients (P) | loss | guard flags (N) | norm]: the
   * all-reduce covers the first P + 1 (+ N with the numeric guard) floats. */
  int guard;          /* the numeric guard is on (pmap_config.numeric_guard) */
  float *guard_host;  /* (N, N + 2) each device's host copy of [loss | flags | norm] */
  int numeric_bad;    /* the last step was skipped: non-finite values */
  /* The current job's arguments. */
  const float *host_w;
  const pmap_array *xs, *ys;
  pmap_array *out;
  int64_t bd;
  int64_t dist_bd; /* across processes: the rows per device every process last agreed on */
  float rows[2];   /* the exchange of that agreement: max and -min over the processes */
  int read_device;
  float *read_dst;
  float loss;
  float bc1, bc2;
};

#endif
