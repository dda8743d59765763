/* conv2d.cu: 2-D convolution over NCHW examples (ops/ops.h conv2d_*) as im2col + cuBLAS, one
 * GEMM per chunk of cb examples: columns (C*KH*KW, cb, OH*OW), outputs (OC, cb, OH*OW), and a
 * swap of the two outer axes to and from the (cb, OC, OH*OW) layout of y and dy; the bias and
 * the ReLU (and their gradients) by the bias and ReLU kernels. */
#include "cuda_common.cuh"

/* A chunk's workspace stays under this many floats (256 MiB) unless one example needs more. */
#define CONV_WORK_FLOATS ((size_t)1 << 26)

/* col (ckk, cb, ohw) from x (cb, c, h, w); zero where the window hangs over the padding. */
static __global__ void im2col_kernel(pmap_conv_shape s, const float *x, int64_t cb, float *col) {
  int64_t ohw = s.oh * s.ow;
  size_t n = (size_t)(s.c * s.kh * s.kw * cb * ohw);
  for (size_t idx = cuda_thread_index(); idx < n; idx += cuda_grid_stride()) {
    int64_t t = (int64_t)idx;
    int64_t p = t % ohw;
    t /= ohw;
    int64_t b = t % cb;
    int64_t q = t / cb;
    int64_t kj = q % s.kw, ki = (q / s.kw) % s.kh, c = q / (s.kw * s.kh);
    int64_t ii = (p / s.ow) * s.stride - s.pad + ki;
    int64_t jj = (p % s.ow) * s.stride - s.pad + kj;
    col[idx] = (ii >= 0 && ii < s.h && jj >= 0 && jj < s.w)
                   ? x[((b * s.c + c) * s.h + ii) * s.w + jj]
                   : 0.0f;
  }
}

/* dx (cb, c, h, w) = the sum of dcol (ckk, cb, ohw) back onto the pixels the columns were taken
 * from; a thread per pixel gathers its windows, so nothing is added concurrently. */
static __global__ void col2im_kernel(pmap_conv_shape s, const float *dcol, int64_t cb, float *dx) {
  int64_t ohw = s.oh * s.ow;
  size_t n = (size_t)(cb * s.c * s.h * s.w);
  for (size_t idx = cuda_thread_index(); idx < n; idx += cuda_grid_stride()) {
    int64_t t = (int64_t)idx;
    int64_t jj = t % s.w;
    t /= s.w;
    int64_t ii = t % s.h;
    t /= s.h;
    int64_t c = t % s.c, b = t / s.c;
    float sum = 0.0f;
    for (int ki = 0; ki < s.kh; ki++) {
      int64_t ti = ii + s.pad - ki;
      if (ti < 0 || ti % s.stride) continue;
      int64_t oi = ti / s.stride;
      if (oi >= s.oh) continue;
      for (int kj = 0; kj < s.kw; kj++) {
        int64_t tj = jj + s.pad - kj;
        if (tj < 0 || tj % s.stride) continue;
        int64_t oj = tj / s.stride;
        if (oj >= s.ow) continue;
        int64_t q = (c * s.kh + ki) * s.kw + kj;
        sum += dcol[(q * cb + b) * ohw + oi * s.ow + oj];
      }
    }
    dx[idx] = sum;
  }
}

/* dst (a1, a0, inner) = src (a0, a1, inner) with the two outer axes swapped. */
static __global__ void swap_axes_kernel(const float *src, float *dst, int64_t a0, int64_t a1,
                                        int64_t inner) {
  size_t n = (size_t)(a0 * a1 * inner);
  for (size_t idx = cuda_thread_index(); idx < n; idx += cuda_grid_stride()) {
    int64_t t = (int64_t)idx;
    int64_t i = t % inner;
    t /= inner;
    int64_t j0 = t % a0, j1 = t / a0;
    dst[idx] = src[(j0 * a1 + j1) * inner + i];
  }
}

static void im2col_launch(cudaStream_t stream, const pmap_conv_shape *s, const float *x, int64_t cb,
                          float *col) {
  size_t n = (size_t)(s->c * s->kh * s->kw * cb * s->oh * s->ow);
  im2col_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(*s, x, cb, col);
}

static void col2im_launch(cudaStream_t stream, const pmap_conv_shape *s, const float *dcol,
                          int64_t cb, float *dx) {
  size_t n = (size_t)(cb * s->c * s->h * s->w);
  col2im_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(*s, dcol, cb, dx);
}

static void swap_axes_launch(cudaStream_t stream, const float *src, float *dst, int64_t a0,
                             int64_t a1, int64_t inner) {
  size_t n = (size_t)(a0 * a1 * inner);
  swap_axes_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(src, dst, a0, a1, inner);
}

/* Examples per chunk for a workspace of per_example floats each. */
static int64_t chunk_of(int64_t bd, size_t per_example) {
  size_t fit = CONV_WORK_FLOATS / (per_example ? per_example : 1);
  return fit >= (size_t)bd ? bd : fit > 0 ? (int64_t)fit : 1;
}

extern "C" pmap_status cuda_conv2d_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd,
                                           const float *x, const float *w, const float *b, int relu,
                                           float *y, float *col) {
  (void)col;
  int64_t ckk = s->c * s->kh * s->kw, ohw = s->oh * s->ow, chw = s->c * s->h * s->w;
  if (bd <= 0) return PMAP_SUCCESS;
  int64_t chunk = chunk_of(bd, (size_t)((ckk + s->oc) * ohw));
  PMAP_TRY(cuda_work_reserve(q, (size_t)(chunk * (ckk + s->oc) * ohw)));
  float *colp = q->work, *yp = q->work + chunk * ckk * ohw;
  for (int64_t b0 = 0; b0 < bd; b0 += chunk) {
    int64_t cb = bd - b0 < chunk ? bd - b0 : chunk;
    float *yb = y + b0 * s->oc * ohw;
    /* With one example or one output channel the two layouts coincide: no swap needed. */
    int direct = cb == 1 || s->oc == 1;
    im2col_launch(q->stream, s, x + b0 * chw, cb, colp);
    CUDA_CHECK_LAUNCH(q, "im2col_kernel");
    /* (oc, cb*ohw) = w (oc, ckk) col (ckk, cb*ohw) */
    PMAP_TRY(cuda_gemm(q, 0, 0, s->oc, cb * ohw, ckk, 1.0f, w, ckk, colp, cb * ohw, 0.0f,
                       direct ? yb : yp, cb * ohw));
    if (!direct) {
      swap_axes_launch(q->stream, yp, yb, s->oc, cb, ohw);
      CUDA_CHECK_LAUNCH(q, "swap_axes_kernel");
    }
  }
  /* The epilogue as the bias and ReLU ops give it. */
  if (b) PMAP_TRY(cuda_bias_forward(q, y, b, bd, s->oc, ohw));
  if (relu) PMAP_TRY(cuda_relu_forward(q, y, y, (size_t)(bd * s->oc * ohw)));
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_conv2d_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd,
                                            const float *x, const float *w, const float *y,
                                            const float *dy, float *dx, float *dw, float *db,
                                            float *col, float *dcol) {
  (void)col;
  (void)dcol;
  int64_t ckk = s->c * s->kh * s->kw, ohw = s->oh * s->ow, chw = s->c * s->h * s->w;
  if (bd <= 0) return PMAP_SUCCESS;
  size_t per = (size_t)((ckk + s->oc + (dx ? ckk : 0) + (y ? s->oc : 0)) * ohw);
  int64_t chunk = chunk_of(bd, per);
  PMAP_TRY(cuda_work_reserve(q, (size_t)chunk * per));
  float *colp = q->work;
  float *dyp = colp + chunk * ckk * ohw;
  float *dcolp = dyp + chunk * s->oc * ohw;
  float *gp = dcolp + (dx ? chunk * ckk * ohw : 0); /* a chunk's gradient through the ReLU */
  if (!y && db) PMAP_TRY(cuda_bias_backward(q, dy, db, bd, s->oc, ohw));
  for (int64_t b0 = 0; b0 < bd; b0 += chunk) {
    int64_t cb = bd - b0 < chunk ? bd - b0 : chunk, cols = cb * ohw;
    const float *dyb = dy + b0 * s->oc * ohw, *dyc = dyb;
    if (y) { /* the ReLU's backward, then the bias gradient, as those ops give them */
      PMAP_TRY(cuda_relu_backward(q, y + b0 * s->oc * ohw, dyb, gp, (size_t)(cb * s->oc * ohw)));
      if (db) PMAP_TRY(cuda_bias_backward(q, gp, db, cb, s->oc, ohw));
      dyb = dyc = gp;
    }
    im2col_launch(q->stream, s, x + b0 * chw, cb, colp);
    CUDA_CHECK_LAUNCH(q, "im2col_kernel");
    if (cb > 1 && s->oc > 1) {
      swap_axes_launch(q->stream, dyb, dyp, cb, s->oc, ohw);
      CUDA_CHECK_LAUNCH(q, "swap_axes_kernel");
      dyc = dyp;
    }
    /* dw (oc, ckk) += dy (oc, cb*ohw) col^T (cb*ohw, ckk) */
    PMAP_TRY(cuda_gemm(q, 0, 1, s->oc, ckk, cols, 1.0f, dyc, cols, colp, cols, 1.0f, dw, ckk));
    if (!dx) continue;
    /* dcol (ckk, cb*ohw) = w^T (ckk, oc) dy (oc, cb*ohw) */
    PMAP_TRY(cuda_gemm(q, 1, 0, ckk, cols, s->oc, 1.0f, w, ckk, dyc, cols, 0.0f, dcolp, cols));
    col2im_launch(q->stream, s, dcolp, cb, dx + b0 * chw);
    CUDA_CHECK_LAUNCH(q, "col2im_kernel");
  }
  return PMAP_SUCCESS;
}
