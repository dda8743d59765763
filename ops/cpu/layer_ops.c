/* layer_ops.c: CPU kernels of the layers beyond dense and conv (activations, residual add,
 * layer norm, pooling, dropout, batch norm), with the math of ops/op_math.h. Sums over rows or
 * channels are taken in double in a fixed order, so the CPU result is the reference. */
#include <math.h>

#include "cpu_ops.h"
#include "ops/op_math.h"

/* One loop per function, so each is a vector loop of its own. */
CPU_INLINE void act_rows(pmap_act act, const float *x, float *y, size_t n) {
  if (act == PMAP_ACT_TANH) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) y[i] = pmap_tanh(x[i]);
  } else if (act == PMAP_ACT_SIGMOID) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) y[i] = pmap_sigmoid(x[i]);
  } else if (act == PMAP_ACT_RELU) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) y[i] = pmap_relu(x[i]);
  } else {
    CPU_IVDEP for (size_t i = 0; i < n; i++) y[i] = pmap_gelu(x[i]);
  }
}

CPU_INLINE void act_grad_rows(pmap_act act, const float *x, const float *y, const float *dy,
                              float *dx, size_t n) {
  if (act == PMAP_ACT_TANH) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) dx[i] = pmap_tanh_grad(y[i], dy[i]);
  } else if (act == PMAP_ACT_SIGMOID) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) dx[i] = pmap_sigmoid_grad(y[i], dy[i]);
  } else if (act == PMAP_ACT_RELU) {
    CPU_IVDEP for (size_t i = 0; i < n; i++) dx[i] = pmap_relu_grad(y[i], dy[i]);
  } else {
    CPU_IVDEP for (size_t i = 0; i < n; i++) dx[i] = pmap_gelu_grad(x[i], dy[i]);
  }
}

CPU_KERNEL(extern, pmap_status, cpu_act_forward,
           (op_queue *q, pmap_act act, const float *x, float *y, size_t n), (q, act, x, y, n)) {
  (void)q;
  act_rows(act, x, y, n);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_act_backward,
           (op_queue *q, pmap_act act, const float *x, const float *y, const float *dy, float *dx,
            size_t n),
           (q, act, x, y, dy, dx, n)) {
  (void)q;
  act_grad_rows(act, x, y, dy, dx, n);
  return PMAP_SUCCESS;
}

/* Row by row, so a row is still in the first-level cache when the activation (or the bias sum)
 * reads it; each element sees the operations of the unfused ops in their order. ReLU, whose
 * math is a compare, takes one loop per row for both (on narrow rows, a small MLP's 32 units,
 * the loops' own setup is most of a row's time). */
/* One row's bfloat16 copy (round_bf16's bits), while the row is in the first-level cache. */
CPU_INLINE void round_row(const float *x, pmap_bf16 *y16, int64_t n) {
  CPU_IVDEP for (int64_t c = 0; c < n; c++) y16[c] = pmap_bf16_round(x[c]);
}

/* GELU's value and slope of v = y + b (y alone: b NULL) for one row; the two share clamp and
 * exponential. y keeps v unless the slope goes there (s == y). */
CPU_INLINE void gelu_slope_row(float *y, const float *b, float *z, float *s, int64_t n) {
  if (b) {
    CPU_IVDEP for (int64_t c = 0; c < n; c++) {
      float v = y[c] + b[c];
      z[c] = pmap_gelu(v);
      s[c] = pmap_gelu_slope(v);
      if (s != y) y[c] = v;
    }
  } else {
    CPU_IVDEP for (int64_t c = 0; c < n; c++) {
      float v = y[c];
      z[c] = pmap_gelu(v);
      s[c] = pmap_gelu_slope(v);
    }
  }
}

CPU_KERNEL(extern, pmap_status, cpu_bias_act_forward,
           (op_queue *q, pmap_act act, float *y, const float *b, int64_t outer, int64_t ch,
            float *z, pmap_bf16 *z16, float *slope),
           (q, act, y, b, outer, ch, z, z16, slope)) {
  (void)q;
  for (int64_t o = 0; o < outer; o++) {
    float *yr = y + o * ch, *zr = z + o * ch;
    if (slope && act == PMAP_ACT_GELU) {
      gelu_slope_row(yr, b, zr, slope + o * ch, ch);
    } else if (act == PMAP_ACT_RELU) {
      if (b) CPU_IVDEP for (int64_t c = 0; c < ch; c++) {
          float v = yr[c] + b[c];
          yr[c] = v;
          zr[c] = pmap_relu(v);
        }
      else
        CPU_IVDEP for (int64_t c = 0; c < ch; c++) zr[c] = pmap_relu(yr[c]);
    } else {
      if (b) CPU_IVDEP for (int64_t c = 0; c < ch; c++) yr[c] += b[c];
      act_rows(act, yr, zr, (size_t)ch);
    }
    if (z16) round_row(zr, z16 + o * ch, ch);
  }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_act_bias_backward,
           (op_queue *q, pmap_act act, const float *x, const float *z, const float *dz, float *dx,
            float *db, int64_t outer, int64_t ch, pmap_bf16 *dx16, const float *slope),
           (q, act, x, z, dz, dx, db, outer, ch, dx16, slope)) {
  (void)q;
  for (int64_t o = 0; o < outer; o++) {
    int64_t k = o * ch;
    if (slope && act == PMAP_ACT_GELU) {
      CPU_IVDEP for (int64_t c = 0; c < ch; c++) {
        float g = slope[k + c] * dz[k + c];
        dx[k + c] = g;
        db[c] += g;
      }
    } else if (act == PMAP_ACT_RELU) {
      CPU_IVDEP for (int64_t c = 0; c < ch; c++) {
        float g = pmap_relu_grad(z[k + c], dz[k + c]);
        dx[k + c] = g;
        db[c] += g;
      }
    } else {
      act_grad_rows(act, x + k, z + k, dz + k, dx + k, (size_t)ch);
      CPU_IVDEP for (int64_t c = 0; c < ch; c++) db[c] += dx[k + c];
    }
    if (dx16) round_row(dx + k, dx16 + k, ch);
  }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_add,
           (op_queue *q, const float *a, const float *b, float *y, size_t n), (q, a, b, y, n)) {
  (void)q;
  for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
  return PMAP_SUCCESS;
}

/* Row sums in CPU_LANES partial sums (cpu_ops.h). sum x and sum x^2 of one row x (f). */
CPU_INLINE void row_moments(const float *x, int64_t f, double *sum, double *sumsq) {
  cpu_lanes s = {{0}, {0}}, ss = {{0}, {0}};
  int64_t j = 0;
  for (; j + CPU_LANES <= f; j += CPU_LANES) {
    cpu_d4 a = CPU_WIDEN4(CPU_F4(x + j)), b = CPU_WIDEN4(CPU_F4(x + j + 4));
    s.lo += a, s.hi += b;
    ss.lo += a * a, ss.hi += b * b;
  }
  double sa = cpu_lanes_total(&s), sb = cpu_lanes_total(&ss);
  for (; j < f; j++) {
    double v = x[j];
    sa += v;
    sb += v * v;
  }
  *sum = sa, *sumsq = sb;
}

/* sum g and sum g xhat of one row, g = dy gamma and xhat = (x - mean) rstd (as floats). */
CPU_INLINE void row_grad_sums(const float *x, const float *dy, const float *gamma, float mean,
                              float rstd, int64_t f, double *sum_g, double *sum_gx) {
  cpu_lanes s = {{0}, {0}}, sx = {{0}, {0}};
  int64_t j = 0;
  for (; j + CPU_LANES <= f; j += CPU_LANES) {
    cpu_f4 g0 = CPU_F4(dy + j) * CPU_F4(gamma + j), g1 = CPU_F4(dy + j + 4) * CPU_F4(gamma + j + 4);
    cpu_f4 h0 = (CPU_F4(x + j) - mean) * rstd, h1 = (CPU_F4(x + j + 4) - mean) * rstd;
    cpu_d4 a = CPU_WIDEN4(g0), b = CPU_WIDEN4(g1);
    s.lo += a, s.hi += b;
    sx.lo += a * CPU_WIDEN4(h0), sx.hi += b * CPU_WIDEN4(h1);
  }
  double sa = cpu_lanes_total(&s), sb = cpu_lanes_total(&sx);
  for (; j < f; j++) {
    float g = dy[j] * gamma[j], xhat = (x[j] - mean) * rstd;
    sa += g;
    sb += (double)g * xhat;
  }
  *sum_g = sa, *sum_gx = sb;
}

CPU_KERNEL(extern, pmap_status, cpu_layernorm_forward,
           (op_queue *q, const float *x, const float *gamma, const float *beta, int64_t rows,
            int64_t f, float eps, float *y, float *stats, pmap_bf16 *y16),
           (q, x, gamma, beta, rows, f, eps, y, stats, y16)) {
  (void)q;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * f;
    double s, ss;
    row_moments(xr, f, &s, &ss);
    float mean, rstd;
    pmap_ln_moments(s, ss, (double)f, eps, &mean, &rstd);
    for (int64_t j = 0; j < f; j++) y[r * f + j] = (xr[j] - mean) * rstd * gamma[j] + beta[j];
    if (y16) round_row(y + r * f, y16 + r * f, f);
    stats[2 * r] = mean;
    stats[2 * r + 1] = rstd;
  }
  return PMAP_SUCCESS;
}

/* dgamma and dbeta by columns in the order of the plain loop (rows ascending), taken in the
 * same row-major pass as dx where the column sums fit a stack array: one pass over x and dy,
 * the same bits. */
#define LN_STACK_COLS 1024
CPU_KERNEL(extern, pmap_status, cpu_layernorm_backward,
           (op_queue *q, const float *x, const float *gamma, const float *stats, const float *dy,
            int64_t rows, int64_t f, float *dx, float *dgamma, float *dbeta),
           (q, x, gamma, stats, dy, rows, f, dx, dgamma, dbeta)) {
  (void)q;
  double colg[LN_STACK_COLS], colb[LN_STACK_COLS];
  int fused = f <= LN_STACK_COLS;
  for (int64_t j = 0; fused && j < f; j++) colg[j] = colb[j] = 0.0;
  for (int64_t r = 0; (dx || fused) && r < rows; r++) {
    const float *xr = x + r * f, *dyr = dy + r * f;
    float mean = stats[2 * r], rstd = stats[2 * r + 1];
    if (fused)
      for (int64_t j = 0; j < f; j++) {
        float xhat = (xr[j] - mean) * rstd;
        colg[j] += (double)dyr[j] * xhat;
        colb[j] += dyr[j];
      }
    if (!dx) continue;
    double sg, sgx; /* sums of g = dy gamma and g xhat */
    row_grad_sums(xr, dyr, gamma, mean, rstd, f, &sg, &sgx);
    float mg = (float)(sg / (double)f), mgx = (float)(sgx / (double)f);
    for (int64_t j = 0; j < f; j++)
      dx[r * f + j] = pmap_norm_dx(dyr[j] * gamma[j], (xr[j] - mean) * rstd, rstd, mg, mgx);
  }
  if (fused) {
    for (int64_t j = 0; j < f; j++) {
      dgamma[j] += (float)colg[j];
      dbeta[j] += (float)colb[j];
    }
    return PMAP_SUCCESS;
  }
  for (int64_t j = 0; j < f; j++) {
    double sg = 0.0, sb = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      float xhat = (x[r * f + j] - stats[2 * r]) * stats[2 * r + 1];
      sg += (double)dy[r * f + j] * xhat;
      sb += dy[r * f + j];
    }
    dgamma[j] += (float)sg;
    dbeta[j] += (float)sb;
  }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_pool2d_forward,
           (op_queue *q, int is_max, const pmap_pool_shape *s, int64_t bd, const float *x,
            float *y),
           (q, is_max, s, bd, x, y)) {
  (void)q;
  for (int64_t p = 0; p < bd * s->c; p++)
    for (int64_t oy = 0; oy < s->oh; oy++)
      for (int64_t ox = 0; ox < s->ow; ox++)
        y[(p * s->oh + oy) * s->ow + ox] =
            pmap_pool_window(is_max, x + p * s->h * s->w, s->w, oy, ox, s->kh, s->kw, s->stride);
  return PMAP_SUCCESS;
}

/* Windows that tile without overlap (stride = kernel, the usual pooling): each window hands its
 * gradient to its own elements once, instead of every element searching the windows that hold
 * it. The values are pmap_pool_dx's: 0 + the one term (0 + -0 is +0, as there). */
CPU_INLINE void pool2d_backward_tiled(int is_max, const pmap_pool_shape *s, int64_t bd,
                                      const float *x, const float *dy, float *dx) {
  const int64_t hw = s->h * s->w;
  const float area = (float)(s->kh * s->kw);
  for (int64_t p = 0; p < bd * s->c; p++) {
    const float *xp = x + p * hw, *dyp = dy + p * s->oh * s->ow;
    float *dxp = dx + p * hw;
    for (int64_t k = 0; k < hw; k++) dxp[k] = 0.0f;
    for (int64_t oy = 0; oy < s->oh; oy++)
      for (int64_t ox = 0; ox < s->ow; ox++) {
        float d = dyp[oy * s->ow + ox];
        float *win = dxp + oy * s->stride * s->w + ox * s->stride;
        if (!is_max) {
          for (int i = 0; i < s->kh; i++)
            for (int j = 0; j < s->kw; j++) win[i * s->w + j] = 0.0f + d / area;
          continue;
        }
        int64_t by, bx;
        pmap_pool_argmax(xp, s->w, oy, ox, s->kh, s->kw, s->stride, &by, &bx);
        win[by * s->w + bx] = 0.0f + d;
      }
  }
}

CPU_KERNEL(extern, pmap_status, cpu_pool2d_backward,
           (op_queue *q, int is_max, const pmap_pool_shape *s, int64_t bd, const float *x,
            const float *dy, float *dx),
           (q, is_max, s, bd, x, dy, dx)) {
  (void)q;
  if (s->stride == s->kh && s->stride == s->kw) {
    pool2d_backward_tiled(is_max, s, bd, x, dy, dx);
    return PMAP_SUCCESS;
  }
  for (int64_t p = 0; p < bd * s->c; p++)
    for (int64_t iy = 0; iy < s->h; iy++)
      for (int64_t ix = 0; ix < s->w; ix++)
        dx[(p * s->h + iy) * s->w + ix] =
            pmap_pool_dx(is_max, x + p * s->h * s->w, dy + p * s->oh * s->ow, s->w, s->oh, s->ow,
                         s->kh, s->kw, s->stride, iy, ix);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_dropout_forward,
           (op_queue *q, const float *x, float *y, size_t n, float rate, uint64_t key,
            uint64_t first),
           (q, x, y, n, rate, key, first)) {
  (void)q;
  for (size_t i = 0; i < n; i++) y[i] = x[i] * pmap_dropout_factor(key, first + i, rate);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_dropout_backward,
           (op_queue *q, const float *dy, float *dx, size_t n, float rate, uint64_t key,
            uint64_t first),
           (q, dy, dx, n, rate, key, first)) {
  (void)q;
  for (size_t i = 0; i < n; i++) dx[i] = dy[i] * pmap_dropout_factor(key, first + i, rate);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_bn_stats,
           (op_queue *q, const float *x, int64_t outer, int64_t c, int64_t inner,
            const float *prev, float *stats),
           (q, x, outer, c, inner, prev, stats)) {
  (void)q;
  for (int64_t ch = 0; ch < c; ch++) {
    float shift = 0.0f, var;
    if (prev) pmap_bn_moments(prev, c, ch, &shift, &var);
    double s = 0.0, ss = 0.0;
    for (int64_t o = 0; o < outer; o++) {
      const float *xc = x + (o * c + ch) * inner;
      for (int64_t i = 0; i < inner; i++) {
        float d = xc[i] - shift;
        s += d, ss += (double)d * d;
      }
    }
    stats[ch] = (float)s;
    stats[c + ch] = (float)ss;
    stats[2 * c + 1 + ch] = shift;
  }
  stats[2 * c] = (float)(outer * inner);
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_bn_forward,
           (op_queue *q, const float *x, const float *stats, const float *run_stats,
            float *running, const float *gamma, const float *beta, int64_t outer, int64_t c,
            int64_t inner, float eps, float momentum, int training, float *y),
           (q, x, stats, run_stats, running, gamma, beta, outer, c, inner, eps, momentum, training,
            y)) {
  (void)q;
  for (int64_t ch = 0; ch < c; ch++) {
    float mean, var;
    if (training)
      pmap_bn_train_moments(stats, run_stats, c, ch, &mean, &var);
    else
      mean = running[ch], var = running[c + ch];
    float rstd = pmap_rstd(var, eps);
    for (int64_t o = 0; o < outer; o++) {
      const float *xc = x + (o * c + ch) * inner;
      float *yq = y + (o * c + ch) * inner;
      for (int64_t i = 0; i < inner; i++) yq[i] = (xc[i] - mean) * rstd * gamma[ch] + beta[ch];
    }
  }
  if (training && running)
    for (int64_t ch = 0; ch < c; ch++) {
      float mean, var;
      pmap_bn_moments(run_stats, c, ch, &mean, &var);
      pmap_running_update(&running[ch], &running[c + ch], mean, var, momentum);
    }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_bn_backward_sums,
           (op_queue *q, const float *x, const float *dy, const float *stats, int64_t outer,
            int64_t c, int64_t inner, float eps, float *sums),
           (q, x, dy, stats, outer, c, inner, eps, sums)) {
  (void)q;
  for (int64_t ch = 0; ch < c; ch++) {
    float mean, var;
    pmap_bn_moments(stats, c, ch, &mean, &var);
    float rstd = pmap_rstd(var, eps);
    double s = 0.0, sx = 0.0;
    for (int64_t o = 0; o < outer; o++) {
      size_t base = (size_t)((o * c + ch) * inner);
      for (int64_t i = 0; i < inner; i++)
        s += dy[base + i], sx += (double)dy[base + i] * ((x[base + i] - mean) * rstd);
    }
    sums[ch] = (float)s;
    sums[c + ch] = (float)sx;
  }
  return PMAP_SUCCESS;
}

CPU_KERNEL(extern, pmap_status, cpu_bn_backward_dx,
           (op_queue *q, const float *x, const float *dy, const float *stats, const float *gamma,
            const float *sums, int64_t outer, int64_t c, int64_t inner, float eps, float *dx),
           (q, x, dy, stats, gamma, sums, outer, c, inner, eps, dx)) {
  (void)q;
  float count = stats[2 * c];
  for (int64_t ch = 0; ch < c; ch++) {
    float mean, var;
    pmap_bn_moments(stats, c, ch, &mean, &var);
    float rstd = pmap_rstd(var, eps);
    float md = sums[ch] / count, mdx = sums[c + ch] / count;
    for (int64_t o = 0; o < outer; o++) {
      size_t base = (size_t)((o * c + ch) * inner);
      for (int64_t i = 0; i < inner; i++)
        dx[base + i] =
            pmap_norm_dx(dy[base + i], (x[base + i] - mean) * rstd, gamma[ch] * rstd, md, mdx);
    }
  }
  return PMAP_SUCCESS;
}
