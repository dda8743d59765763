/* conv_im2col.c: the CPU convolutions' path that every build has (conv.h): im2col + the GEMM in
 * use, one example at a time so the column scratch stays (C*KH*KW, OH*OW), with the bias and the
 * ReLU (forward) or its gradient and the bias's (backward) taken on each example's rows while
 * they are in cache. */
#include <string.h>

#include "base/error.h"
#include "conv.h"
#include "cpu_cache.h"
#include "ops/op_math.h"

/* The output columns oj whose input column oj * stride - pad + kj lies inside [0, w). */
static void valid_cols(const pmap_conv_shape *s, int kj, int64_t *lo, int64_t *hi) {
  int64_t first = s->pad - kj; /* oj * stride >= first */
  int64_t last = s->w - 1 + s->pad - kj;
  *lo = first > 0 ? (first + s->stride - 1) / s->stride : 0;
  *hi = last < 0 ? 0 : last / s->stride + 1;
  if (*hi > s->ow) *hi = s->ow;
  if (*lo > *hi) *lo = *hi;
}

/* col (c*kh*kw, oh*ow) from x (c, h, w); zero where the window hangs over the padding. */
CPU_KERNEL_VOID(static, im2col, (const pmap_conv_shape *s, const float *x, float *col),
                (s, x, col)) {
  int64_t ohw = s->oh * s->ow;
  for (int64_t c = 0; c < s->c; c++)
    for (int ki = 0; ki < s->kh; ki++)
      for (int kj = 0; kj < s->kw; kj++) {
        float *row = col + ((c * s->kh + ki) * s->kw + kj) * ohw;
        int64_t lo, hi;
        valid_cols(s, kj, &lo, &hi);
        for (int64_t oi = 0; oi < s->oh; oi++) {
          int64_t ii = oi * s->stride - s->pad + ki;
          float *out = row + oi * s->ow;
          if (ii < 0 || ii >= s->h) {
            memset(out, 0, (size_t)s->ow * sizeof *out);
            continue;
          }
          for (int64_t oj = 0; oj < lo; oj++) out[oj] = 0.0f;
          for (int64_t oj = hi; oj < s->ow; oj++) out[oj] = 0.0f;
          if (lo == hi) continue;
          /* the input row from the column of oj = lo on */
          const float *xr = x + (c * s->h + ii) * s->w + (lo * s->stride - s->pad + kj);
          if (s->stride == 1)
            memcpy(out + lo, xr, (size_t)(hi - lo) * sizeof *out);
          else
            for (int64_t oj = lo; oj < hi; oj++) out[oj] = xr[(oj - lo) * s->stride];
        }
      }
}

/* dx (c, h, w) = the sum of col's entries back onto the pixels they were taken from, in the
 * order (c, ki, kj, oi, oj). */
CPU_KERNEL_VOID(static, col2im, (const pmap_conv_shape *s, const float *col, float *dx),
                (s, col, dx)) {
  int64_t ohw = s->oh * s->ow;
  memset(dx, 0, (size_t)(s->c * s->h * s->w) * sizeof *dx);
  for (int64_t c = 0; c < s->c; c++)
    for (int ki = 0; ki < s->kh; ki++)
      for (int kj = 0; kj < s->kw; kj++) {
        const float *row = col + ((c * s->kh + ki) * s->kw + kj) * ohw;
        int64_t lo, hi;
        valid_cols(s, kj, &lo, &hi);
        for (int64_t oi = 0; oi < s->oh; oi++) {
          int64_t ii = oi * s->stride - s->pad + ki;
          if (ii < 0 || ii >= s->h || lo == hi) continue;
          float *xr = dx + (c * s->h + ii) * s->w + (lo * s->stride - s->pad + kj);
          const float *in = row + oi * s->ow;
          if (s->stride == 1) {
            CPU_IVDEP for (int64_t oj = lo; oj < hi; oj++) xr[oj - lo] += in[oj];
          } else {
            for (int64_t oj = lo; oj < hi; oj++) xr[(oj - lo) * s->stride] += in[oj];
          }
        }
      }
}

/* A 1x1 window at stride 1 without padding: the columns are x itself. */
static int is_pointwise(const pmap_conv_shape *s) {
  return s->kh == 1 && s->kw == 1 && s->stride == 1 && s->pad == 0;
}

/* One example's output rows y (oc, ohw) += b, then pmap_relu: the bits of bias_forward and
 * relu_forward after the convolution. */
CPU_KERNEL_VOID(static, rows_bias_relu,
                (float *y, const float *b, int relu, int64_t oc, int64_t ohw),
                (y, b, relu, oc, ohw)) {
  for (int64_t o = 0; o < oc; o++) {
    float *row = y + o * ohw;
    if (b) {
      float bo = b[o];
      for (int64_t i = 0; i < ohw; i++) row[i] += bo;
    }
    if (relu)
      for (int64_t i = 0; i < ohw; i++) row[i] = pmap_relu(row[i]);
  }
}

/* One example's g (oc, ohw) = pmap_relu_grad(y, dy), and db (oc) += each row's sum taken as
 * bias_backward takes it (a float sum per row, then added): the same bits as the unfused ops. */
CPU_KERNEL_VOID(static, rows_grad_bias,
                (const float *y, const float *dy, float *g, float *db, int64_t oc, int64_t ohw),
                (y, dy, g, db, oc, ohw)) {
  if (y) {
    int64_t n = oc * ohw;
    CPU_IVDEP for (int64_t i = 0; i < n; i++) g[i] = pmap_relu_grad(y[i], dy[i]);
  }
  const float *src = y ? g : dy;
  for (int64_t o = 0; db && o < oc; o++) {
    float sum = 0.0f;
    for (int64_t i = 0; i < ohw; i++) sum += src[o * ohw + i];
    db[o] += sum;
  }
}

pmap_status conv_im2col_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                const float *w, const float *b, int relu, float *y, float *col) {
  int64_t ckk = s->c * s->kh * s->kw, ohw = s->oh * s->ow, chw = s->c * s->h * s->w;
  for (int64_t i = 0; i < bd; i++) {
    const float *cols = x + i * chw;
    if (!is_pointwise(s)) {
      im2col(s, cols, col);
      cols = col;
    }
    float *yi = y + i * s->oc * ohw;
    /* y_i (oc, ohw) = w (oc, ckk) col (ckk, ohw) */
    PMAP_TRY(cpu_gemm(q, 0, 0, s->oc, ohw, ckk, 1.0f, w, ckk, cols, ohw, 0.0f, yi, ohw));
    if (b || relu) rows_bias_relu(yi, b, relu, s->oc, ohw);
  }
  return PMAP_SUCCESS;
}

pmap_status conv_im2col_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                 const float *w, const float *y, const float *dy, float *dx,
                                 float *dw, float *db, float *col, float *dcol) {
  int64_t ckk = s->c * s->kh * s->kw, ohw = s->oh * s->ow, chw = s->c * s->h * s->w;
  float *g = NULL; /* one example's gradient through the ReLU (oc, ohw) */
  if (y) {
    cpu_cache *c = cpu_cache_of(q);
    if (!c) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "conv2d_backward: out of memory");
    void *ws = NULL;
    PMAP_TRY(cpu_cache_workspace(c, (size_t)(s->oc * ohw) * sizeof(float), "conv2d_backward", &ws));
    g = ws;
  }
  for (int64_t i = 0; i < bd; i++) {
    const float *dyi = dy + i * s->oc * ohw, *cols = x + i * chw;
    if (y || db) rows_grad_bias(y ? y + i * s->oc * ohw : NULL, dyi, g, db, s->oc, ohw);
    if (y) dyi = g;
    if (!is_pointwise(s)) {
      im2col(s, cols, col);
      cols = col;
    }
    /* dw (oc, ckk) += dy_i (oc, ohw) col^T (ohw, ckk) */
    PMAP_TRY(cpu_gemm(q, 0, 1, s->oc, ckk, ohw, 1.0f, dyi, ohw, cols, ohw, 1.0f, dw, ckk));
    if (!dx) continue;
    /* dcol (ckk, ohw) = w^T (ckk, oc) dy_i (oc, ohw); pointwise, dcol is dx_i itself */
    float *dxi = dx + i * chw, *dcols = is_pointwise(s) ? dxi : dcol;
    PMAP_TRY(cpu_gemm(q, 1, 0, ckk, ohw, s->oc, 1.0f, w, ckk, dyi, ohw, 0.0f, dcols, ohw));
    if (!is_pointwise(s)) col2im(s, dcol, dxi);
  }
  return PMAP_SUCCESS;
}
