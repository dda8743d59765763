/* conv.c: 2-D convolution (NCHW) on the CPU: the ops, which take oneDNN's primitives where the
 * build has them (conv_dnnl.c) and PMAP_CONV does not say otherwise (conv.h), and the path
 * every build has: im2col + the GEMM in use, one example at a time so the column scratch stays
 * (C*KH*KW, OH*OW), with the bias and the ReLU (forward) or its gradient and the bias's
 * (backward) taken on each example's rows while they are in cache. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"
#include "conv.h"
#include "cpu_cache.h"
#include "ops/op_math.h"

/* ------------------------------------------------------------------------------------------ */
/* Which path                                                                                 */

enum { PATH_ONEDNN, PATH_IM2COL };
static const char *const path_names[] = {"onednn", "im2col"};

#if defined(PMAP_CONV_DNNL)
#define PATH_DEFAULT PATH_ONEDNN
#else
#define PATH_DEFAULT PATH_IM2COL
#endif

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static _Atomic int path = PATH_DEFAULT;
static pmap_status env_status;
static char env_msg[256];

/* The path `name` names into *out; a status and env_msg's text when it names none built. */
static pmap_status path_of(const char *name, const char *what, int *out) {
  if (!name || !*name || strcmp(name, "auto") == 0) {
    *out = PATH_DEFAULT;
    return PMAP_SUCCESS;
  }
  if (strcmp(name, "im2col") == 0) {
    *out = PATH_IM2COL;
    return PMAP_SUCCESS;
  }
  if (strcmp(name, "onednn") == 0) {
#if defined(PMAP_CONV_DNNL)
    *out = PATH_ONEDNN;
    return PMAP_SUCCESS;
#else
    snprintf(env_msg, sizeof env_msg,
             "%s\"%s\" asks for oneDNN's convolutions, which this build does not contain "
             "(built: %s; or auto)",
             what, name, cpu_conv_paths());
    return PMAP_ERR_UNAVAILABLE;
#endif
  }
  snprintf(env_msg, sizeof env_msg, "%s\"%s\" names no CPU convolution (built: %s; or auto)", what,
           name, cpu_conv_paths());
  return PMAP_ERR_INVALID_ARGUMENT;
}

static void read_env(void) {
  int p = PATH_DEFAULT;
  env_status = path_of(pmap_env_get("PMAP_CONV"), "environment variable PMAP_CONV=", &p);
  if (!env_status) atomic_store(&path, p);
}

pmap_status cpu_conv_ready(const char *call) {
  pthread_once(&env_once, read_env);
  if (env_status) return PMAP_ERR(env_status, "%s: %s", call, env_msg);
  return PMAP_SUCCESS;
}

pmap_status cpu_conv_force(const char *name) {
  pthread_once(&env_once, read_env);
  int p = PATH_DEFAULT;
  pmap_status st = path_of(name, "cpu_conv_force: ", &p);
  if (st) return PMAP_ERR(st, "%s", env_msg);
  env_status = PMAP_SUCCESS; /* a forced path overrides a bad PMAP_CONV */
  atomic_store(&path, p);
  return PMAP_SUCCESS;
}

const char *cpu_conv_path(void) {
  pthread_once(&env_once, read_env);
  return env_status ? "none" : path_names[atomic_load(&path)];
}

const char *cpu_conv_paths(void) {
#if defined(PMAP_CONV_DNNL)
  return "onednn,im2col";
#else
  return "im2col";
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* im2col + GEMM                                                                              */

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

static pmap_status im2col_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
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

static pmap_status im2col_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd,
                                   const float *x, const float *w, const float *y, const float *dy,
                                   float *dx, float *dw, float *db, float *col, float *dcol) {
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

/* ------------------------------------------------------------------------------------------ */
/* The ops                                                                                    */

/* Whether the convolutions take oneDNN's primitives; an invalid PMAP_CONV is an error. */
static pmap_status use_dnnl(int *yes) {
  PMAP_TRY(cpu_conv_ready("conv2d"));
  *yes = atomic_load(&path) == PATH_ONEDNN;
  return PMAP_SUCCESS;
}

pmap_status cpu_conv2d_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                               const float *w, const float *b, int relu, float *y, float *col) {
  if (bd <= 0) return PMAP_SUCCESS;
  int dnnl = 0, done = 0;
  PMAP_TRY(use_dnnl(&dnnl));
  if (dnnl) PMAP_TRY(conv_dnnl_forward(q, s, bd, x, w, b, relu, y, &done));
  if (done) return PMAP_SUCCESS;
  return im2col_forward(q, s, bd, x, w, b, relu, y, col);
}

pmap_status cpu_conv2d_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                                const float *w, const float *y, const float *dy, float *dx,
                                float *dw, float *db, float *col, float *dcol) {
  if (bd <= 0) return PMAP_SUCCESS;
  int dnnl = 0, done = 0;
  PMAP_TRY(use_dnnl(&dnnl));
  if (dnnl) PMAP_TRY(conv_dnnl_backward(q, s, bd, x, w, y, dy, dx, dw, db, &done));
  if (done) return PMAP_SUCCESS;
  return im2col_backward(q, s, bd, x, w, y, dy, dx, dw, db, col, dcol);
}
