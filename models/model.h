/* model.h: the inside of a sequential model (its layers, models/layer.h, in order, with their
 * place in the flat parameter vector) and of one device's replica of the training state. */
#ifndef PMAP_MODELS_MODEL_H
#define PMAP_MODELS_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "layer.h"
#include "ops/ops.h"
#include "pmap.h"

#define MODEL_MAX_NESTING 16 /* residual blocks open at once */
/* Output gradient buffers live at once in the backward pass: dy, dx, a scratch, one held for
 * each open block's start. */
#define MODEL_POOL_MAX (MODEL_MAX_NESTING + 3)

struct pmap_model {
  int in_rank;
  int64_t in_shape[3];
  int64_t in_size;
  layer *layers;
  int n_layers, cap;
  pmap_loss loss;
  pmap_dtype in_dtype; /* PMAP_I32: token ids in [0, in_vocab) (a first layer embedding) */
  int64_t in_vocab;
  size_t n_params;             /* the flat vector: trained parameters and the layers' state */
  size_t n_state;              /* floats of it that are state (layer.s_size summed) */
  int open[MODEL_MAX_NESTING]; /* the start layer of each open residual block */
  int n_open;
  int bf16; /* the params' copy: its policy is bf16 (models/precision.c); 0 in a user's model */
  int recompute; /* the params' copy: PMAP_RECOMPUTE_FULL or _SELECTIVE (model_set_recompute) where
                    a block is recomputed; 0 (none) */
};

/* The current output shape: that of the last layer, or the input (models/layer.c). */
void model_current_shape(const pmap_model *m, int *rank, int64_t shape[3], int64_t *size);
/* Appends l (begun by layer_start; its class, output shape, parameter, state and scratch sizes
 * and settings set); fills in the input side and the offsets. PMAP_ERR_INVALID_ARGUMENT /
 * PMAP_ERR_OUT_OF_MEMORY naming call. */
pmap_status model_push(pmap_model *m, layer l, const char *call);

/* A deep copy (params keep their own); PMAP_ERR_INVALID_ARGUMENT while a residual block is
 * open. */
pmap_status model_clone(const pmap_model *m, const char *call, pmap_model **out);
/* 1 when the model's forward and backward call collectives (a layer class with collectives set,
 * e.g. batch norm: every device must run the same number of forward and backward passes per
 * step, even over zero rows). */
int model_has_collectives(const pmap_model *m);
/* The largest layer.col_size of the model, in floats (0 without conv layers). */
size_t model_col_size(const pmap_model *m);
/* Fills w (n_params) with the initial parameters drawn from seed (layer_init per layer, in
 * order, from one random stream). */
void model_init_params(const pmap_model *m, uint64_t seed, float *w);

/* The block of m named `name` ("3.dense.w", models/param_blocks.c) into *out; else
 * PMAP_ERR_INVALID_ARGUMENT naming call, the name and what the model holds near it. */
pmap_status model_find_block(const pmap_model *m, const char *call, const char *name,
                             pmap_param_block *out);

/* b's shape as text, "(64, 192)". */
void model_block_shape(const pmap_param_block *b, char *text, size_t cap);

/* A range [off, off + len) of the flat parameter vector. */
typedef struct model_span {
  size_t off, len;
} model_span;
/* The trained ranges of the flat vector (everything but the layers' state), in order and
 * merged, into spans (room for n_layers + 1); returns their count (0 for a model without
 * parameters). */
int model_trained_spans(const pmap_model *m, model_span *spans);

/* One device's training state. w, g, opt: device memory; g holds n_params gradients then the
 * loss, so one all-reduce averages both. */
typedef struct replica replica;
struct replica {
  /* Where this replica's ops run: its device's op table and queue (made with the params), and
   * the op backend they are of (NULL for a host replica: its bf16 GEMMs then get no workspace
   * from the arena). */
  const pmap_ops *ops;
  op_queue *q;
  const op_backend *ob;
  float *w;   /* (P) */
  float *g;   /* the gradient buffer (models/params.h, grad_layout) */
  float *opt; /* (P) per optimizer slot: momentum; Adam m then v */
  /* Where the gradient buffer's offsets lie (replica_g): the flat vector's elements
   * [gp_lo, gp_lo + gp_len) at gp, and the tail [gt_lo, ...) (the loss, the guard's slots) at
   * gt. Replicated, and with the optimizer alone sharded, gp is g, gp_lo 0 and gt g + P: g holds
   * everything. With sharded gradients (models/grad_window.c) gp holds only the device's part of
   * the averaged gradient, and the layers add theirs into a window (layer_grad): gwin, holding
   * [gwin_lo, gwin_lo + gwin_cap) of the flat vector, and gpin, holding [gpin_lo, gpin_lo +
   * gpin_len) for the whole backward pass (a tied table, which two layers add into). */
  float *gp, *gt;
  size_t gp_lo, gp_len, gt_lo;
  float *gwin, *gpin;
  size_t gwin_lo, gwin_cap, gpin_lo, gpin_len;
  int gpin_done; /* the pinned range was reduced in this backward pass */
  int gsq_on;    /* gsq sums the squares of what this device adds up (grad_window_begin) */
  double gsq;
  /* (model.n_state) the state a training step computes (batch norm's running statistics after
   * this step's batches), laid out by layer.st_off: copied from w when the step starts, written
   * by the forward passes, copied back into w only once the step is taken (state_begin,
   * state_commit), so a failed or skipped step leaves w's state as it was. NULL: a forward
   * pass in training mode leaves the state alone. */
  float *pending;
  /* Activation arena for up to `rows` examples: per layer its output and output gradient. */
  float *arena;
  int64_t rows;
  /* The rows the arena was last sized for, kept when it is released (a change of precision,
   * pmap_params_shrink): pmap_predict runs in pieces of at most these. */
  int64_t sized_rows;
  float **act, **dact; /* (n_layers) */
  /* NULL, or the pool the output gradients take theirs from during the backward pass (exec.c):
   * dpool_n buffers (dslot[k], each of its own size), the first the loss's gradient; dplan[3 i
   * + 0, 1, 2], for layer i, the buffers of its output gradient, its input's and its scratch
   * (-1: none), planned once for the model's shape. */
  float *dpool;
  float *dslot[MODEL_POOL_MAX];
  int *dplan; /* (3 n_layers) */
  int dpool_n;
  float *col, *dcol; /* conv scratch (model_col_size) */
  /* The bf16 policy (NULL under fp32): w16 (P) the bfloat16 copy of w made before each step's
   * first forward pass (model_weights16); in16[i] layer i's input in bfloat16 (layer.in16), and
   * the scratch all layers share (model_tmp_rows floats per example: transient outputs, rounded
   * output gradients, attention's intermediates). */
  pmap_bf16 *w16;
  /* 1: w16 already holds w's trained parameters rounded (the optimizer wrote it in its pass),
   * so the next model_weights16 has nothing to do (and clears it); anything else that writes w
   * clears it (replica_w_changed). */
  int w16_fresh;
  pmap_bf16 **in16; /* (n_layers) */
  float *tmp;
  float **aux; /* (n_layers) each layer's scratch (layer.aux_rows, aux_fixed) */
  /* Per call: the input and output of each layer (flatten aliases its input), and in backward
   * the gradient of each layer's output. */
  const float **in, **out; /* (n_layers) */
  const float **dout;      /* (n_layers) */
  /* Per call, set by the caller before model_forward; a zeroed replica means training mode,
   * step 0 and the call's rows at dev->index * rows of the global batch. */
  int inference; /* 1 (predict): batch norm uses its running statistics, dropout passes x */
  int64_t step;  /* keys dropout's masks (pmap_params_step of the step being taken) */
  int has_row0;  /* 1: row0 is the global row of the call's first example (micro-batches,
                    uneven batches) */
  int64_t row0;
  /* Optional, NULL for none: called by model_backward right after layer i's backward, when the
   * gradients of layer i's parameters are complete (layers L-1 down to 0, once each), e.g. to
   * start reducing them while the layers below still run (models/step_fast.c). */
  pmap_status (*layer_grads_done)(pmap_device *dev, replica *r, int i, void *user);
  void *layer_grads_user;
  /* The numeric guard's search for the devices whose own values were not finite (models/step.c,
   * after a skipped step): while `watch` is set, model_exchange reads what it sends and gets
   * back, until an exchange gets back a value that is not finite (`seen`), and keeps whether
   * this device had sent one into that exchange (`sent`). `injected`: the step `injected` is
   * the one whose gradients PMAP_FAULT's nan fault made NaN on this device (0: none), so that
   * the search's second computation of them is made NaN too. */
  struct {
    int watch, seen, sent;
    int64_t injected;
  } source;
};

/* The bf16 policy. model_set_precision (model.c) lays m out for it (bf16 1) or for fp32:
 * layer.in16, transient and tmp_rows; model_tmp_rows is the most tmp_rows of any layer. */
void model_set_precision(pmap_model *m, int bf16);
/* Recomputation (pmap_config.recompute): under PMAP_RECOMPUTE_FULL marks each outermost block
 * (a class's block_end) without layers of state or collectives as recomputed (layer.shared,
 * region_start, recompute_from), under PMAP_RECOMPUTE_SELECTIVE only the element-wise layers
 * of those blocks (redo_cheap, and epilogue_redone on the layer an activation is folded into)
 * where two blocks or more hold such layers, else none. */
void model_set_recompute(pmap_model *m, int mode);
size_t model_tmp_rows(const pmap_model *m);
/* layer_gemm.c: r->w16 = r->w rounded (nothing under fp32): before the first forward pass of a
 * step or call. */
pmap_status model_weights16(const pmap_model *m, replica *r);
/* w was written by something other than the optimizer's pass (a load, a write, a gather): the
 * next model_weights16 rounds it again. */
static inline void replica_w_changed(replica *r) { r->w16_fresh = 0; }

/* The place of offset `off` of the gradient buffer's flat layout: the device's part of the
 * gradients or the tail (replica.gp, gt). */
static inline float *replica_g(const replica *r, size_t off) {
  return off >= r->gt_lo ? r->gt + (off - r->gt_lo) : r->gp + (off - r->gp_lo);
}
/* Where a layer's backward adds the gradients of the flat vector from offset `off` on: g + off,
 * or with sharded gradients the window or the pinned range that holds it. */
static inline float *layer_grad(const replica *r, size_t off) {
  if (!r->gwin) return r->g + off;
  if (off - r->gpin_lo < r->gpin_len) return r->gpin + (off - r->gpin_lo);
  return r->gwin + (off - r->gwin_lo);
}

/* A GEMM operand of a layer under either policy: f (float, fp32) or h (bfloat16, bf16). */
typedef struct layer_mat {
  const float *f;
  const pmap_bf16 *h;
} layer_mat;
/* Layer i's input (in under fp32, r->in16[i] under bf16) and its weights at off of the flat
 * vector (r->w or r->w16). */
layer_mat layer_input(const replica *r, int i, const float *in);
layer_mat layer_weights(const replica *r, size_t off);
/* x (n floats) as an operand: x itself under fp32, else rounded into at (n bfloat16s). */
pmap_status layer_operand(const replica *r, const float *x, size_t n, pmap_bf16 *at,
                          layer_mat *out);
/* c = op(a) op(b) + beta c: gemm (fp32) or gemm_bf16 (bf16: both operands bfloat16). */
pmap_status layer_gemm(const replica *r, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       layer_mat a, int64_t lda, layer_mat b, int64_t ldb, float beta, float *c,
                       int64_t ldc);
pmap_status layer_gemm_strided(const replica *r, int ta, int tb, int64_t m, int64_t n, int64_t k,
                               layer_mat a, int64_t lda, int64_t sa, layer_mat b, int64_t ldb,
                               int64_t sb, float beta, float *c, int64_t ldc, int64_t sc,
                               int64_t batch);
/* The shape of layer_gemm(r, ta, tb, m, n, k, a, lda, b, ldb, beta, c, ldc) under bf16, and
 * that of ops->gemm_strided_bf16 with these arguments and alpha 1 (a layer's gemms16). */
ops_gemm16 layer_gemm16(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                        float beta, int64_t ldc);
ops_gemm16 layer_gemm16_strided(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                                int64_t sa, int64_t ldb, int64_t sb, float beta, int64_t ldc,
                                int64_t sc, int64_t batch, int64_t groups, int64_t ga, int64_t gb,
                                int64_t gc);
/* The GEMM layer both dense layers share (models/layers/dense.c), over `rows` rows of f inputs
 * and u outputs (dense: a row an example; token_dense: a token): y = x W + b and the activation
 * folded after it; its backward, with dW += and db +=. */
pmap_status dense_rows_forward(const layer *l, replica *r, int i, const float *in, float *y,
                               int64_t rows, int64_t f, int64_t u);
pmap_status dense_rows_backward(const layer *l, replica *r, int i, const float *dy, float *dx,
                                int64_t rows, int64_t f, int64_t u);
/* Their bf16 GEMMs (a class's gemms16): y = x W, dW += x^T dy, dx = dy W^T. */
int dense_rows_gemms16(int64_t rows, int64_t f, int64_t u, ops_gemm16 *g);

/* A layer's exchange of values between the devices: an all-reduce (sum) of x (n) in place.
 * Every layer that exchanges values goes through it, so that the numeric guard can tell the
 * devices whose own values were not finite from those that only got them from another
 * (replica.source). dev NULL (a host replica alone): PMAP_ERR_INVALID_ARGUMENT naming what. */
pmap_status model_exchange(pmap_device *dev, replica *r, const char *what, float *x, size_t n);

/* Floats of the activation arena for bd rows into *out; -1 when the count overflows. */
int model_arena_floats(const pmap_model *m, int64_t bd, size_t *out);
/* The bytes of workspace m's bf16 GEMMs take over bd examples on ob's devices (the most any
 * one takes, with room to align it to 64 bytes; 0 under fp32 or where ob's GEMMs need none): the
 * arena's share after the activations (replica_reserve), and so the memory plan's. */
pmap_status model_gemm16_workspace(const pmap_model *m, const op_backend *ob, int64_t bd,
                                   size_t *bytes);
/* Sizes the arena for bd rows (allocates only when bd exceeds what it holds). */
pmap_status replica_reserve(pmap_device *dev, const pmap_model *m, replica *r, int64_t bd);
void replica_release(pmap_device *dev, replica *r);
/* A replica on memory of the caller's (a host replica over the CPU op table, e.g. pmap-bench's
 * single-device loop): points r's per-layer buffers into arena (model_arena_floats(m, bd)
 * floats) for up to bd rows; replica_unplace frees the pointer arrays (not the arena).
 * PMAP_ERR_OUT_OF_MEMORY. */
pmap_status replica_place(const pmap_model *m, replica *r, float *arena, int64_t bd);
void replica_unplace(replica *r);
/* Forward over bd examples x (bd, input...): fills r->in, r->out; the output is r->out[L-1].
 * dev may be NULL for a host replica alone, with has_row0 set; a layer that needs collectives
 * then fails with PMAP_ERR_INVALID_ARGUMENT. */
pmap_status model_forward(pmap_device *dev, const pmap_model *m, replica *r, const float *x,
                          int64_t bd);
/* Loss of the last forward against y into *loss (device memory) and its gradient into
 * r->dact[L-1]. */
pmap_status model_loss(const pmap_model *m, replica *r, const void *y, int64_t bd, float *loss);
/* r->pending = the state in r->w (before a step's first forward pass); r->w's state =
 * r->pending (once the step is taken). No-ops for a model without state. */
pmap_status model_state_begin(const pmap_model *m, replica *r);
pmap_status model_state_commit(const pmap_model *m, replica *r);
/* Backward right after model_forward and model_loss of the same rows (recomputed blocks but the
 * last are run forward again; the last still holds the forward's values): parameter gradients
 * accumulate into r->g. */
pmap_status model_backward(pmap_device *dev, const pmap_model *m, replica *r, int64_t bd);

/* Layer i's forward over bd examples from in (its class's forward): sets r->out[i] (r->act[i]
 * or a view of in). */
pmap_status layer_forward(pmap_device *dev, const pmap_model *m, replica *r, int i, const float *in,
                          int64_t bd);
/* Layer i's backward from dy (its output gradient) into dx (NULL: not needed, the model's
 * input); *dx_out is where the input gradient lies (dx, or a view of dy). */
pmap_status layer_backward(pmap_device *dev, const pmap_model *m, replica *r, int i,
                           const float *dy, float *dx, const float **dx_out, int64_t bd);

#endif
