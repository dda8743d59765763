/* model.h: the inside of a sequential model (layers with their shapes and their place in the flat
 * parameter vector) and of one device's replica of the training state. */
#ifndef PMAP_MODELS_MODEL_H
#define PMAP_MODELS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "ops/ops.h"
#include "pmap.h"

typedef enum layer_kind { LAYER_DENSE, LAYER_RELU, LAYER_CONV2D, LAYER_FLATTEN } layer_kind;

typedef struct layer {
  layer_kind kind;
  int in_rank, out_rank;
  int64_t in_shape[3], out_shape[3]; /* one example */
  int64_t in_size, out_size;         /* elements of one example */
  size_t w_off, w_size;              /* weights in the flat parameter vector */
  size_t b_off, b_size;              /* bias */
  int64_t fan_in;
  pmap_conv_shape conv; /* LAYER_CONV2D */
} layer;

struct pmap_model {
  int in_rank;
  int64_t in_shape[3];
  int64_t in_size;
  layer *layers;
  int n_layers, cap;
  pmap_loss loss;
  size_t n_params;
};

/* A deep copy (params keep their own). */
pmap_status model_clone(const pmap_model *m, pmap_model **out);
/* Largest conv column scratch of the model, in floats (0 without conv layers). */
size_t model_col_size(const pmap_model *m);
/* Fills w (n_params) with the initial parameters drawn from seed. */
void model_init_params(const pmap_model *m, uint64_t seed, float *w);

/* One device's training state. w, g, opt: device memory; g holds n_params gradients then the
 * loss, so one all-reduce averages both. */
typedef struct replica {
  float *w;   /* (P) */
  float *g;   /* (P + 1) */
  float *opt; /* (P) per optimizer slot: momentum; Adam m then v */
  /* Activation arena for up to `rows` examples: per layer its output and output gradient. */
  float *arena;
  int64_t rows;
  float **act, **dact; /* (n_layers) */
  float *col, *dcol;   /* conv scratch (model_col_size) */
  /* Per call: the input and output of each layer (flatten aliases its input). */
  const float **in, **out; /* (n_layers) */
} replica;

/* Floats of the activation arena for bd rows into *out; -1 when the count overflows. */
int model_arena_floats(const pmap_model *m, int64_t bd, size_t *out);
/* Sizes the arena for bd rows (allocates only when bd exceeds what it holds). */
pmap_status replica_reserve(pmap_device *dev, const pmap_model *m, replica *r, int64_t bd);
void replica_release(pmap_device *dev, replica *r);
/* Forward over bd examples x (bd, input...): fills r->in, r->out; the output is r->out[L-1]. */
pmap_status model_forward(pmap_device *dev, const pmap_model *m, replica *r, const float *x,
                          int64_t bd);
/* Loss of the last forward against y into *loss (device memory) and its gradient into
 * r->dact[L-1]. */
pmap_status model_loss(pmap_device *dev, const pmap_model *m, replica *r, const void *y,
                       int64_t bd, float *loss);
/* Backward after model_loss: parameter gradients accumulate into r->g. */
pmap_status model_backward(pmap_device *dev, const pmap_model *m, replica *r, int64_t bd);

#endif
