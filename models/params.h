/* params.h: the inside of a pmap_params (the replicated training state) for the files of models/
 * that work on it: the step (params.c), checkpoints (checkpoint.c), replica checks (verify.c). */
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
  /* The current job's arguments. */
  const float *host_w;
  const pmap_array *xs, *ys;
  pmap_array *out;
  int64_t bd;
  int read_device;
  float *read_dst;
  float loss;
  float bc1, bc2;
  /* Checkpoint and verify jobs (checkpoint.c, verify.c); host memory, set only during a call. */
  float *ckpt_w;             /* (P) parameters downloaded from device 0 or to upload */
  float *ckpt_opt;           /* (opt_slots * P) optimizer state, likewise */
  uint32_t *verify_sums;     /* (N) each device's checksum of its replica */
  unsigned char *verify_buf; /* (N, verify_chunk) one bounded download buffer per device */
  size_t verify_chunk;       /* bytes of each device's buffer */
};

#endif
