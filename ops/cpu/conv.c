/* conv.c: 2-D convolution (NCHW) on the CPU as im2col + GEMM, one example at a time so the
 * column scratch stays (C*KH*KW, OH*OW). */
#include <string.h>

#include "cpu_ops.h"
#include "base/error.h"

/* col (c*kh*kw, oh*ow) from x (c, h, w); zero where the window hangs over the padding. */
static void im2col(const pmap_conv_shape *s, const float *x, float *col) {
  int64_t ohw = s->oh * s->ow;
  for (int64_t c = 0; c < s->c; c++)
    for (int ki = 0; ki < s->kh; ki++)
      for (int kj = 0; kj < s->kw; kj++) {
        float *row = col + ((c * s->kh + ki) * s->kw + kj) * ohw;
        for (int64_t oi = 0; oi < s->oh; oi++) {
          int64_t ii = oi * s->stride - s->pad + ki;
          float *out = row + oi * s->ow;
          if (ii < 0 || ii >= s->h) {
            memset(out, 0, (size_t)s->ow * sizeof *out);
            continue;
          }
          const float *xr = x + (c * s->h + ii) * s->w;
          for (int64_t oj = 0; oj < s->ow; oj++) {
            int64_t jj = oj * s->stride - s->pad + kj;
            out[oj] = (jj >= 0 && jj < s->w) ? xr[jj] : 0.0f;
          }
        }
      }
}

/* dx (c, h, w) = the sum of col's entries back onto the pixels they were taken from. */
static void col2im(const pmap_conv_shape *s, const float *col, float *dx) {
  int64_t ohw = s->oh * s->ow;
  memset(dx, 0, (size_t)(s->c * s->h * s->w) * sizeof *dx);
  for (int64_t c = 0; c < s->c; c++)
    for (int ki = 0; ki < s->kh; ki++)
      for (int kj = 0; kj < s->kw; kj++) {
        const float *row = col + ((c * s->kh + ki) * s->kw + kj) * ohw;
        for (int64_t oi = 0; oi < s->oh; oi++) {
          int64_t ii = oi * s->stride - s->pad + ki;
          if (ii < 0 || ii >= s->h) continue;
          float *xr = dx + (c * s->h + ii) * s->w;
          const float *in = row + oi * s->ow;
          for (int64_t oj = 0; oj < s->ow; oj++) {
            int64_t jj = oj * s->stride - s->pad + kj;
            if (jj >= 0 && jj < s->w) xr[jj] += in[oj];
          }
        }
      }
}

pmap_status cpu_conv2d_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                               const float *w, float *y, float *col) {
  int64_t ckk = s->c * s->kh * s->kw, ohw = s->oh * s->ow;
  for (int64_t b = 0; b < bd; b++) {
    im2col(s, x + b * s->c * s->h * s->w, col);
    /* y_b (oc, ohw) = w (oc, ckk) col (ckk, ohw) */
    PMAP_TRY(
        cpu_gemm(q, 0, 0, s->oc, ohw, ckk, 1.0f, w, ckk, col, ohw, 0.0f, y + b * s->oc * ohw, ohw));
  }
  return PMAP_SUCCESS;
}

pmap_status cpu_conv2d_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                const float *w, const float *dy, float *dx, float *dw, float *col,
                                float *dcol) {
  int64_t ckk = s->c * s->kh * s->kw, ohw = s->oh * s->ow;
  for (int64_t b = 0; b < bd; b++) {
    const float *dyb = dy + b * s->oc * ohw;
    im2col(s, x + b * s->c * s->h * s->w, col);
    /* dw (oc, ckk) += dy_b (oc, ohw) col^T (ohw, ckk) */
    PMAP_TRY(cpu_gemm(q, 0, 1, s->oc, ckk, ohw, 1.0f, dyb, ohw, col, ohw, 1.0f, dw, ckk));
    if (dx) {
      /* dcol (ckk, ohw) = w^T (ckk, oc) dy_b (oc, ohw) */
      PMAP_TRY(cpu_gemm(q, 1, 0, ckk, ohw, s->oc, 1.0f, w, ckk, dyb, ohw, 0.0f, dcol, ohw));
      col2im(s, dcol, dx + b * s->c * s->h * s->w);
    }
  }
  return PMAP_SUCCESS;
}
