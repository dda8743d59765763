/* conv.c: 2-D convolution (NCHW) on the CPU: the ops, which run each call on its shape's path
 * (conv_choice.c): oneDNN's primitives (conv_dnnl.c) or im2col + the GEMM in use
 * (conv_im2col.c). */
#include "base/error.h"
#include "conv.h"

/* Runs c on its path and records the path that ran. */
static pmap_status run(op_queue *q, const conv_call *c) {
  conv_path path = CONV_IM2COL, ran = CONV_IM2COL;
  conv_choice *entry = NULL;
  PMAP_TRY(conv_choose(q, c, &path, &entry));
  PMAP_TRY(conv_run(q, c, path, &ran));
  conv_choice_ran(entry, ran);
  return PMAP_SUCCESS;
}

pmap_status cpu_conv2d_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                               const float *w, const float *b, int relu, float *y, float *col) {
  if (bd <= 0) return PMAP_SUCCESS;
  conv_call c = {.s = s, .bd = bd, .x = x, .w = w, .b = b, .relu = relu, .y = y, .col = col};
  return run(q, &c);
}

pmap_status cpu_conv2d_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                const float *w, const float *y, const float *dy, float *dx,
                                float *dw, float *db, float *col, float *dcol) {
  if (bd <= 0) return PMAP_SUCCESS;
  conv_call c = {.s = s,
                 .bd = bd,
                 .backward = 1,
                 .x = x,
                 .w = w,
                 .ry = y,
                 .dy = dy,
                 .dx = dx,
                 .dw = dw,
                 .db = db,
                 .col = col,
                 .dcol = dcol};
  return run(q, &c);
}
