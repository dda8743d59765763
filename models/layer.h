/* layer.h: what every layer is (its shapes, its place in the flat parameter vector, its scratch)
 * and its class: the table of what its kind does. Each kind is one file under models/layers/
 * that defines its class and its public builder; no other file names a kind, so adding one
 * touches no shared struct, enum or switch (docs/models.md, "How a layer is put together"). */
#ifndef PMAP_MODELS_LAYER_H
#define PMAP_MODELS_LAYER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pmap.h"

typedef struct layer layer;
typedef struct layer_class layer_class;
typedef struct replica replica; /* models/model.h */
struct pmap_rng;
struct ops_gemm16; /* ops/ops.h */

/* Room for a kind's own settings (conv geometry, dropout's rate, ...) inside every layer. */
#define LAYER_SETTINGS_BYTES 96

struct layer {
  const layer_class *cls;
  int in_rank, out_rank;
  int64_t in_shape[3], out_shape[3]; /* one example; unused axes 0 */
  int64_t in_size, out_size;         /* elements of one example */
  size_t w_off, w_size;              /* weights (norms: the scale gamma) in the parameter vector */
  size_t b_off, b_size;              /* bias (norms: the shift beta) */
  size_t s_off, s_size;              /* state that is not trained, after the bias: batch norm's
                                        running mean (C) then running var (C). The optimizer,
                                        weight decay, clipping and the guard never see it; a
                                        training step writes its new value to the replica's
                                        pending state, committed once the step's verdict is in */
  size_t st_off;                     /* its place in the model's pending state (model.n_state) */
  /* Parameters of another layer whose gradients this layer's backward adds into too (a tied
   * head: the token embedding's table), [gshare_off, gshare_off + gshare_len); 0 long: none. */
  size_t gshare_off, gshare_len;
  /* Scratch in the activation arena: aux_rows floats per example plus aux_fixed floats of its
   * own (replica.aux[i]), and col_size floats in each of the two buffers all layers share
   * (replica.col, replica.dcol: conv's columns). */
  size_t aux_rows, aux_fixed, col_size;
  /* Element-wise fusion, decided by model_push from the two classes: epilogue (PMAP_ACT_* + 1;
   * 0: none) is the activation of the next layer, which this layer applies in its own pass
   * (forward: into the next layer's output; backward: from the next layer's output gradient,
   * into its own); folded: 1 when the layer before does this layer's work, so that layer.c
   * skips its forward and passes its output gradient through. */
  int epilogue, folded;
  /* The bf16 policy (model.c's model_set_precision sets these on the params' copy; 0 under
   * fp32): in16, its input's bfloat16 copy is kept (replica.in16[i]: its class reads its input
   * as GEMM operands only, gemm_in); transient, its float output lives in the shared scratch
   * (replica.tmp) until the next layer, which reads it only through its bfloat16 copy, has made
   * that copy; tmp_rows, floats per example it needs of the shared scratch. */
  int in16, transient;
  /* bf16: out16_at, the gemm_in layer its output feeds (0: none, or a class that cannot), whose
   * bfloat16 input copy (replica.in16[out16_at]) this layer writes in its own pass: the next
   * layer, or the one past a folded activation, whose output is this layer's epilogue's;
   * in16_made, a layer before wrote this layer's in16 so, and layer.c does not. */
  int out16_at, in16_made;
  size_t tmp_rows;
  /* Recomputation (model.c's model_set_recompute sets these on the params' copy; 0 without):
   * shared, 1 for the layers a recomputed block computes again (PMAP_RECOMPUTE_FULL: from its
   * start up to its end, not the end; PMAP_RECOMPUTE_SELECTIVE: those of its layers whose class
   * is redo_cheap): their activations, output gradients and scratch lie in one region of the
   * arena that every recomputed block uses in turn, from the block's region_start layer (its
   * first shared one) on, with the bfloat16 input copy that a shared layer writes for a layer
   * after it (models/exec.c); epilogue_redone, 1 on a redo_epilogue layer whose folded
   * activation is shared (SELECTIVE); recompute_from, on such a block's end, its start + 1:
   * before the end's backward, model_backward computes the block's shared layers forward again
   * from their inputs, which are kept (docs/tracing.md, "When a model does not fit"). */
  int shared, region_start, epilogue_redone, recompute_from;
  /* The kind's settings: a struct of its own file's, read with LAYER_SETTINGS. */
  _Alignas(max_align_t) unsigned char settings[LAYER_SETTINGS_BYTES];
};

/* A layer file's settings type T: LAYER_SETTINGS_FIT(T) checks at compile time that it fits the
 * area; LAYER_SETTINGS(T, l) is l's settings as a T (const or not as l is). */
#define LAYER_SETTINGS_FIT(T)                                                               \
  _Static_assert(sizeof(T) <= LAYER_SETTINGS_BYTES && _Alignof(T) <= _Alignof(max_align_t), \
                 #T " does not fit layer.settings")
#define LAYER_SETTINGS(T, l) ((T *)(void *)(l)->settings)
#define LAYER_SETTINGS_CONST(T, l) ((const T *)(const void *)(l)->settings)

/* Where a block of a layer's parameters lies: in its weights (layer.w_off, w_size), its bias
 * (b_off, b_size) or its state that is not trained (s_off, s_size). */
typedef enum layer_region { LAYER_WEIGHTS, LAYER_BIAS, LAYER_STATE } layer_region;

/* One named array of a layer's parameters, as its class declares it (its blocks member): the
 * block's own name ("w", "gamma", "running_mean"), its region and its row-major shape. A
 * region's blocks lie in it one after the other in the declared order and fill it exactly
 * (tests/test_blocks.c checks every class); layer_blocks sets off and count. */
typedef struct layer_block {
  const char *name;
  layer_region region;
  int rank;
  int64_t shape[PMAP_MAX_RANK];
  size_t off, count; /* its first element in the flat vector, its elements */
} layer_block;

#define LAYER_MAX_BLOCKS 8
#define LAYER_MAX_GEMMS16 32
/* A block of the given extents: LAYER_BLOCK("w", LAYER_WEIGHTS, F, units); of a shape the layer
 * holds: layer_block_shaped("gamma", LAYER_WEIGHTS, l->in_rank, l->in_shape). */
#define LAYER_BLOCK(block_name, block_region, ...)                                  \
  ((layer_block){.name = (block_name),                                              \
                 .region = (block_region),                                          \
                 .rank = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), \
                 .shape = {__VA_ARGS__}})

/* What a kind does. Members marked (optional) may be NULL or 0; layer.c supplies the default in
 * each case, and the rest of the models call them only through layer.c. Write contract as the
 * ops' (ops/op_list.h): outputs and input gradients overwritten, parameter gradients (r->g)
 * accumulated. */
struct layer_class {
  const char *name; /* as pmap-bench --dump names it: "dense", "conv2d", ... */
  /* Its number in checkpoints (docs/reliability.md): fixed by the file format, never reused. */
  uint32_t code;
  int is_view;     /* 1: its output is its input (no activation buffer of its own) */
  int collectives; /* 1: forward or backward call collectives, so every device must run as
                      many passes per step (models/model.h model_has_collectives) */
  /* (optional, 0: none) The element-wise activation this kind is, PMAP_ACT_* + 1, for a layer
   * before it whose class takes_act to apply in its own pass (its forward and backward are
   * then skipped). */
  int act_epilogue;
  /* (optional, 0: no) 1: forward and backward apply layer.epilogue when it is set. */
  int takes_act;
  /* (optional, 0: no) Selective recomputation (PMAP_RECOMPUTE_SELECTIVE). redo_cheap: 1 when its
   * forward is element-wise work (a norm, an activation function) that reads only its input
   * and its parameters, so that its output (and scratch) can be made again from its kept input
   * at little cost; an activation folded into the layer before is made again only where that
   * layer's class is redo_epilogue: 1 when the layer keeps the sum before its epilogue in its
   * own output (r->out[i]), from which act_forward gives the activation's output again (dense:
   * it then keeps no GELU slope there). */
  int redo_cheap, redo_epilogue;
  /* (optional, 0: no) The bf16 policy (docs/precision.md). gemm_in: 1 when forward and backward
   * read the input only as GEMM operands; under bf16 they then read replica.in16[i] (layer.c
   * rounds the input there before forward) and never `in` or r->in[i]. out_unused: 1 when no
   * backward reads this layer's output (r->out[i], its own or, for an activation folded into
   * the layer before, that layer's), so that it need not be kept in float. */
  int gemm_in, out_unused;
  /* (optional, 0: no) 1: under bf16 its forward can write its output's bfloat16 copy for the
   * gemm_in layer after it (layer.out16_at: replica.in16 of that layer), in its own pass (a
   * class that takes_act: in its epilogue's pass, so only with an activation folded in). */
  int writes16;
  /* (optional, NULL: aux_rows and aux_fixed, and no shared scratch) Under bf16: its own scratch
   * (r->aux[i]: floats per example and of its own) and floats per example of the shared scratch
   * (r->tmp), which model.c sizes for the bfloat16 output gradient of a gemm_in layer. */
  void (*bf16_rows)(const layer *l, size_t *aux_rows, size_t *aux_fixed, size_t *tmp_rows);
  /* (optional, NULL: none) Under bf16: the shapes of the bfloat16 GEMMs (gemm_bf16 and
   * gemm_strided_bf16, through layer_gemm or not) its forward and backward run over bd examples,
   * into g (room for LAYER_MAX_GEMMS16), returning their count. The memory plan sizes the GEMMs'
   * workspace by them (model_gemm16_workspace); tests check that every GEMM of a step fits it. */
  int (*gemms16)(const layer *l, int64_t bd, struct ops_gemm16 *g);
  /* (optional, NULL: none) For a layer that starts a block (a residual block's start): the
   * index of the layer that ends it, whose output depends on the block's layers only through
   * the start's input, so that the layers in between can be computed again from it. */
  int (*block_end)(const layer *l);
  /* (optional, NULL: none) For the layer that ends such a block: the index of its start. */
  int (*block_start)(const layer *l);
  /* (optional, NULL: never) 1 when its backward passes dy on unchanged (sets *dx_out = dy), as
   * the pool of output gradients plans (models/exec.c); that pass checks it. */
  int (*passes_dy)(const layer *l);
  /* (optional, 0: 1) The gain the layer before it draws its weights with, std = sqrt(gain /
   * fan_in): 2 behind a ReLU (He), 1 elsewhere (LeCun). */
  double init_gain;
  /* Forward over bd examples of in (r->in[i]) into y (r->act[i]; NULL for a view). A layer
   * whose output is (this time) its input sets *out = in instead; *out starts as y. dev: NULL
   * for a host replica alone (no collectives then). */
  pmap_status (*forward)(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                         float *y, const float **out, int64_t bd);
  /* Backward from dy (the gradient of r->out[i]) into dx (NULL: the model's input, none needed),
   * adding its parameter gradients into r->g. A layer that passes dy on unchanged sets *dx_out
   * = dy instead (only when dx is not NULL); *dx_out starts as dx. */
  pmap_status (*backward)(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                          float *dx, const float **dx_out, int64_t bd);
  /* (optional, NULL: nothing to set) Its parameters and state in w (the flat vector at w_off,
   * b_off, s_off), drawn from rng; gain: the next layer's init_gain. */
  void (*init)(const layer *l, double gain, struct pmap_rng *rng, float *w);
  /* (optional, NULL: all 0) The four geometry words of its checkpoint record. */
  void (*geometry)(const layer *l, uint32_t g[4]);
  /* (optional, NULL: 0) Multiply-adds of its forward pass over one example (the GEMM-shaped
   * work; element-wise layers count none). */
  double (*macs)(const layer *l);
  /* (optional, NULL: none) Its settings as JSON members after its "kind", each with a leading
   * ", " (pmap-bench --dump, read by bench/jax_compare.py). */
  void (*describe)(const layer *l, FILE *f);
  /* (optional, NULL: none; required of a kind with parameters or state) Its parameter blocks
   * into b (at most LAYER_MAX_BLOCKS, each made with LAYER_BLOCK), in order; returns their
   * count. They name the flat vector for pmap_model_param_block and pmap_params_read_named. */
  int (*blocks)(const layer *l, layer_block *b);
};

/* Every class is listed by its file: LAYER_FILE_CLASSES(dense, &dense_class) at the end of
 * models/layers/dense.c, named after the file as meson.build's list of layer files names it
 * (the list that models/layer_table.c's table of every class is made from). */
#define LAYER_FILE_CLASSES(file, ...) \
  const layer_class *const layer_file_##file[] = {__VA_ARGS__, NULL}

/* layer.c: the class's members with their defaults, and what the builders share. */
int layer_is_view(const layer *l);
/* l's own scratch (r->aux[i]) under the policy (bf16: 1): floats per example, and of its own. */
size_t layer_aux_rows(const layer *l, int bf16);
size_t layer_aux_fixed(const layer *l, int bf16);
/* l's parameters and state in w; next: the layer after it (NULL for the last). */
void layer_init(const layer *l, const layer *next, struct pmap_rng *rng, float *w);
void layer_geometry(const layer *l, uint32_t g[4]);
double layer_macs(const layer *l);
/* {"kind": "<name>", <its settings>} */
void layer_describe(const layer *l, FILE *f);
/* l's blocks into b (LAYER_MAX_BLOCKS) with their places in the flat vector; returns their
 * count (0 for a layer without parameters). */
int layer_blocks(const layer *l, layer_block *b);
layer_block layer_block_shaped(const char *name, layer_region region, int rank,
                               const int64_t *shape);

/* models/layer_table.c: the table of every layer class (tests check their codes and blocks):
 * the count, class i (NULL outside [0, count)). */
int layer_class_count(void);
const layer_class *layer_class_at(int i);

/* Starts *l as a layer of class cls on m's current output, with its output shape the same as
 * its input's (the builder changes what differs, then model_push). PMAP_ERR_INVALID_ARGUMENT
 * naming call when m is NULL. */
pmap_status layer_start(pmap_model *m, const layer_class *cls, const char *call, layer *l);
/* Weights ~ N(0, gain / fan_in) from rng, bias 0 (dense, conv2d). */
void layer_init_fan_in(const layer *l, int64_t fan_in, double gain, struct pmap_rng *rng, float *w);
/* Scale 1, shift 0 (the norms). */
void layer_init_affine(const layer *l, float *w);

#endif
