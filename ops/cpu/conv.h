/* conv.h: the CPU convolutions' two paths, chosen once per process: oneDNN's convolution
 * primitives where the build has them (conv_dnnl.c), else im2col + the GEMM in use
 * (conv_im2col.c);
 * PMAP_CONV=onednn|im2col forces one (docs/cpu-gemm.md). And the loops that carry activations
 * between NCHW and the channel-blocked layouts oneDNN's primitives read and write
 * (conv_layout.c). */
#ifndef PMAP_CPU_CONV_H
#define PMAP_CPU_CONV_H

#include "cpu_ops.h"

/* Reads PMAP_CONV once: PMAP_SUCCESS, or its error with a message starting with `call`
 * (PMAP_ERR_INVALID_ARGUMENT for a value that names no path, PMAP_ERR_UNAVAILABLE for onednn in
 * a build without it). */
pmap_status cpu_conv_ready(const char *call);
/* "onednn" or "im2col": the path the convolutions take from now on (for tests that compare
 * them in one process). PMAP_ERR_INVALID_ARGUMENT / PMAP_ERR_UNAVAILABLE as PMAP_CONV's. */
pmap_status cpu_conv_force(const char *name);
/* The path in use: "onednn" or "im2col" ("none" while PMAP_CONV is invalid). */
const char *cpu_conv_path(void);
/* The paths of this build, comma-separated: "onednn,im2col" or "im2col". */
const char *cpu_conv_paths(void);

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
