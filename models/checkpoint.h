/* checkpoint.h: the checkpoint file format (checkpoint_format.c) as save and load use it
 * (checkpoint.c). */
#ifndef PMAP_MODELS_CHECKPOINT_H
#define PMAP_MODELS_CHECKPOINT_H

#include "params.h"

/* Host copies of the whole state: parameters (P) and optimizer state (slots x P, slot s at
 * opt + s * P), device 0's and each device's part of a sharded state put together. */
typedef struct ckpt_host {
  float *w;
  float *opt; /* NULL without optimizer state */
} ckpt_host;

/* The bytes of a checkpoint of p's state h and the user section (user_bytes at user) into
 * *out (malloc'ed, *n bytes). */
pmap_status ckpt_encode(const pmap_params *p, const ckpt_host *h, const void *user,
                        size_t user_bytes, unsigned char **out, size_t *n, const char *call);

/* A checkpoint file read whole and validated for p: only a regular file (a FIFO is refused at
 * once), every frame and checksum, the model against p's, the optimizer's kind and state
 * layout, the sizes; errors name call, the path and what differs. */
typedef struct ckpt_file {
  unsigned char *bytes;        /* the file */
  int64_t step;                /* its step count */
  pmap_precision precision;    /* the policy it was saved under (version 1: fp32) */
  const unsigned char *params; /* P little-endian floats */
  const unsigned char *state;  /* slots x P */
  const unsigned char *user;
  size_t user_bytes;
} ckpt_file;
pmap_status ckpt_read(const pmap_params *p, const char *path, const char *call, ckpt_file *out);
/* f's parameters and optimizer state into h (sized for p). */
void ckpt_decode(const pmap_params *p, const ckpt_file *f, ckpt_host *h);
void ckpt_file_free(ckpt_file *f);

#endif
