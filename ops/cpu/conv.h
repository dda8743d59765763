/* conv.h: the CPU convolutions' two paths: oneDNN's convolution primitives where the build has
 * them (conv_dnnl.c) and im2col + the GEMM in use (conv_im2col.c), chosen per shape and pass at
 * the shape's first call (conv_choice.c: PMAP_CONV, else a cached or short measurement of both,
 * conv_measure.c, its cache in conv_cache.c; docs/cpu-gemm.md). And the loops that carry
 * activations between NCHW and the channel-blocked layouts oneDNN's primitives read and write
 * (conv_layout.c). */
#ifndef PMAP_CPU_CONV_H
#define PMAP_CPU_CONV_H

#include "cpu_ops.h"

/* Reads PMAP_CONV once: PMAP_SUCCESS, or its error with a message starting with `call`
 * (PMAP_ERR_INVALID_ARGUMENT for a value that names no path, PMAP_ERR_UNAVAILABLE for onednn in
 * a build without it). */
pmap_status cpu_conv_ready(const char *call);
/* "onednn" or "im2col": the path every convolution takes from now on; "auto": each shape's
 * choice (for tests that compare them in one process). PMAP_ERR_INVALID_ARGUMENT /
 * PMAP_ERR_UNAVAILABLE as PMAP_CONV's. */
pmap_status cpu_conv_force(const char *name);
/* The mode in use: "auto" (chosen per shape; "im2col" in a build without oneDNN), "onednn" or
 * "im2col" (forced), "none" while PMAP_CONV is invalid. */
const char *cpu_conv_path(void);
/* The paths of this build, comma-separated: "onednn,im2col" or "im2col". */
const char *cpu_conv_paths(void);

/* The paths, as the choice and the measurement name them. */
typedef enum conv_path { CONV_ONEDNN, CONV_IM2COL } conv_path;

/* One call of the ops (ops/op_list.h, conv2d_forward or conv2d_backward), its operands as the op
 * has them: what the choice keys on and what the measurement times. */
typedef struct conv_call {
  const pmap_conv_shape *s;
  int64_t bd;          /* rows, >= 1 */
  int backward;        /* 0: conv2d_forward, 1: conv2d_backward */
  const float *x, *w;  /* (bd, C, H, W), (OC, C, KH, KW) */
  const float *b;      /* forward: (OC) or NULL */
  int relu;            /* forward: the ReLU after the bias */
  float *y;            /* forward: the output (bd, OC, OH, OW) */
  const float *ry;     /* backward: the ReLU's output (bd, OC, OH, OW), or NULL: no ReLU */
  const float *dy;     /* backward: (bd, OC, OH, OW) */
  float *dx, *dw, *db; /* backward: (bd, C, H, W) or NULL, (OC, C, KH, KW) +=, (OC) += or NULL */
  float *col, *dcol;   /* one example's columns (C*KH*KW, OH*OW); dcol backward only */
} conv_call;

/* One entry of the process's choices (conv_choice.c): a shape, pass and rows. */
typedef struct conv_choice conv_choice;
/* The path for call c and its entry (made now): the forced path, else the shape's choice,
 * made at its first call from any thread (the others wait): oneDNN's primitives, unless they do
 * not serve the shape or run its pass on their reference implementation (then im2col), unless
 * the cache says otherwise or a measurement of both (conv_measure) finds im2col faster. Errors
 * of the measurement's runs, or PMAP_ERR_OUT_OF_MEMORY. */
pmap_status conv_choose(op_queue *q, const conv_call *c, conv_path *path, conv_choice **entry);
/* Records the path the entry's last call ran on (oneDNN's falls back to im2col where it does
 * not serve the rows), which pmap_conv_choices counts. */
void conv_choice_ran(conv_choice *entry, conv_path ran);
/* For tests and the benchmark: the choice made for c's shape, pass and rows (CONV_ONEDNN or
 * CONV_IM2COL, *reason, and *spent_ms the CPU time its measurement took, 0 for none; spent_ms
 * may be NULL), or -1 while none was made; and the number of measurements this process made. */
int conv_choice_find(const conv_call *c, const char **reason, double *spent_ms);
int conv_choice_measurements(void);
/* For tests: every entry of the process, a line each (at most cap bytes, whole lines): the
 * shape as the cache writes it, the chosen path, its reason, the path of the last call ("-"
 * for none: a forced mode chooses nothing), tab-separated. Returns the number of entries. */
int conv_choice_report(char *out, size_t cap);

/* Runs call c on `path` (conv_measure.c): oneDNN's primitives where they serve c, else im2col;
 * *ran the path that ran. */
pmap_status conv_run(op_queue *q, const conv_call *c, conv_path path, conv_path *ran);
/* What a measurement found. */
typedef struct conv_timing {
  double ms[2];    /* per path: the best time of one call, in ms of the thread's CPU time */
  double spent_ms; /* the measurement's own CPU time, its warm-up (oneDNN's primitives) included */
} conv_timing;
/* Times both paths on the first `rows` rows of c, single-threaded, in up to three alternating
 * rounds after a warm-up (two past 5 ms; the calls repeated to take 0.1 ms at least), the
 * outputs in scratch of its own (c's are not written); a path more than 4 times slower than the
 * other after two rounds is not timed further. *measured 0 without memory for the scratch.
 * Errors of the runs. */
pmap_status conv_measure(op_queue *q, const conv_call *c, int64_t rows, conv_timing *t,
                         int *measured);

/* The measured choices' cache (conv_cache.c): one line per CPU model, library version, context
 * and shape. A missing, unreadable or corrupt file reads as a miss; one that cannot be written
 * is left alone; neither is an error. */
typedef struct conv_cache conv_cache;
#define CONV_CHOICE_CAP 8
/* Opens the cache of this machine, creating its folder, takes its lock (waiting a few seconds
 * at most: a process measuring holds it) and looks `shape` up under `context`. NULL when there
 * is no usable folder. */
conv_cache *conv_cache_open(const char *context, const char *shape);
/* The cached choice, "onednn" or "im2col", or NULL. */
const char *conv_cache_lookup(const conv_cache *c);
/* Records the shape's choice with the measured times (text for a person); best effort. */
void conv_cache_store(conv_cache *c, const char *shape, const char *choice, const char *times);
/* Releases the lock and frees c. Accepts NULL. */
void conv_cache_close(conv_cache *c);

/* The im2col path (conv_im2col.c): the ops' contract (ops/op_list.h, conv2d_*) for every shape;
 * col and dcol hold one example's columns (C*KH*KW, OH*OW). */
pmap_status conv_im2col_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                const float *w, const float *b, int relu, float *y, float *col);
pmap_status conv_im2col_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                 const float *w, const float *y, const float *dy, float *dx,
                                 float *dw, float *db, float *col, float *dcol);

/* oneDNN's primitives (conv_dnnl.c): the ops' contract (ops/op_list.h, conv2d_*). *done = 0
 * where they do not serve this shape (no implementation, or a layout of theirs the loops here do
 * not read): the caller takes the im2col path, and so does every later call of the shape. */
pmap_status conv_dnnl_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                              const float *w, const float *b, int relu, float *y, int *done);
pmap_status conv_dnnl_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                               const float *w, const float *y, const float *dy, float *dx,
                               float *dw, float *db, int *done);
/* oneDNN's primitives run on pieces of a call's rows whose input and output (channels padded to
 * 16) take at most this many bytes (a row at least), so that the workspace stays within it plus
 * the weights' layouts and oneDNN's scratchpad, whatever the batch. */
#define CPU_CONV_PIECE_BYTES ((size_t)4 << 20)
/* Whether oneDNN's primitives serve (s, bd) with a bias in q's cache (made now if need be): 1,
 * or 0 where the im2col path runs it (or the build has no oneDNN), for tests. */
int conv_dnnl_serves(op_queue *q, const pmap_conv_shape *s, int64_t bd);
/* What oneDNN's primitives would run for (s, bd) with (bias 1) or without a bias, made now if
 * need be: *kinds 0 where they do not serve it (or the build has no oneDNN), else
 * CONV_DNNL_SERVED with a CONV_DNNL_REF_* bit for each pass that oneDNN runs on its reference
 * implementation (plain loops, for layouts its kernels do not take: the backward passes of a
 * layer with few input channels, whose input stays NCHW). Errors as conv_dnnl_forward's. */
enum {
  CONV_DNNL_SERVED = 1,
  CONV_DNNL_REF_FORWARD = 2,
  CONV_DNNL_REF_DATA = 4,   /* backward data: the input gradient */
  CONV_DNNL_REF_WEIGHTS = 8 /* backward weights: the weight and bias gradients */
};
pmap_status conv_dnnl_kinds(op_queue *q, const pmap_conv_shape *s, int64_t bd, int bias,
                            int *kinds);
/* The rows of the largest piece oneDNN's primitives run a call of bd rows in (bd >= 1; bd
 * without oneDNN). */
int64_t conv_dnnl_piece_rows(const pmap_conv_shape *s, int64_t bd);

/* A 4-D tensor (n, c, h, w) as oneDNN lays it out here: dense NCHW (block 1), or dense with its
 * channels in blocks of `block` (nChw8c, nChw16c: element (n, c, p) at ((n * cblocks + c /
 * block) * hw + p) * block + c % block), the channels of the last block padded with zeros. */
typedef struct conv_layout {
  int64_t n, c, hw;
  int block; /* 1, 4, 8 or 16 */
} conv_layout;
/* y (n, c, hw) NCHW = the blocked yb, through pmap_relu where relu; y may equal yb when the
 * block is 1. */
void conv_unblock(const conv_layout *l, const float *yb, int relu, float *y);
/* gb blocked (padding zeroed) = pmap_relu_grad(y, dy) where y is not NULL, else dy (NCHW both);
 * gb may equal dy when the block is 1. */
void conv_block_grad(const conv_layout *l, const float *y, const float *dy, float *gb);

#endif
