/* op_math.h: the per-element math of every op, written once and shared by the CPU kernels and
 * the CUDA kernels (PMAP_HD makes each function callable from both host and device code). */
#ifndef PMAP_OP_MATH_H
#define PMAP_OP_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define PMAP_HD __host__ __device__
#else
#define PMAP_HD
#endif

/* NaN propagates (as in JAX): x < 0 is false for NaN, so NaN passes through. */
PMAP_HD static inline float pmap_relu(float x) { return x < 0.0f ? 0.0f : x; }

/* dx from the forward output y (y > 0 exactly where x > 0) and the incoming gradient dy; a NaN
 * output passes NaN back. */
PMAP_HD static inline float pmap_relu_grad(float y, float dy) {
  return y > 0.0f ? dy : y != y ? y : 0.0f;
}

/* MSE over n outputs: loss = 1/n sum (p - t)^2; its gradient is 2/n (p - t), scale = 2/n. */
PMAP_HD static inline float pmap_mse_term(float p, float t) { return (p - t) * (p - t); }
PMAP_HD static inline float pmap_mse_grad(float p, float t, float scale) { return scale * (p - t); }

/* SGD with optional L2 weight decay (g += wd w), momentum (momentum == 0: plain SGD, v
 * untouched) and Nesterov's form (the step uses g + momentum v instead of v). */
PMAP_HD static inline void pmap_sgd_update(float *w, float g, float *v, float lr, float momentum,
                                           int nesterov, float wd) {
  if (wd != 0.0f) g += wd * *w;
  if (momentum != 0.0f) {
    *v = momentum * *v + g;
    g = nesterov ? g + momentum * *v : *v;
  }
  *w -= lr * g;
}

/* Adam with bias correction: bc1 = 1 - beta1^t, bc2 = 1 - beta2^t for step t >= 1; wd != 0 is
 * AdamW's decoupled weight decay, w -= lr wd w, from the weight before the step. */
PMAP_HD static inline void pmap_adam_update(float *w, float g, float *m, float *v, float lr,
                                            float beta1, float beta2, float eps, float bc1,
                                            float bc2, float wd) {
  float decay = wd != 0.0f ? lr * wd * *w : 0.0f;
  *m = beta1 * *m + (1.0f - beta1) * g;
  *v = beta2 * *v + (1.0f - beta2) * g * g;
  float mhat = *m / bc1;
  float vhat = *v / bc2;
  *w -= lr * mhat / (sqrtf(vhat) + eps);
  if (wd != 0.0f) *w -= decay;
}

/* The largest global gradient L2 norm an Adam or AdamW step takes with the numeric guard on:
 * below it every g^2, the second moment and its bias-corrected value stay inside float (their
 * bound is the largest g^2 seen); above it the second moment could overflow to infinity, which
 * would freeze its parameter for good (m / inf is 0), so the guard skips the step instead. */
#define PMAP_ADAM_NORM_MAX 1e19f
/* Whether the guard skips a step whose values are finite for the size of its gradient: the
 * norm the optimizer would take (clip when clipping scales the gradient down to it) exceeds
 * norm_max (0: no limit, as for SGD). */
PMAP_HD static inline int pmap_guard_norm_over(float norm, float clip, float norm_max) {
  float taken = clip > 0.0f && !(norm <= clip) ? clip : norm;
  return norm_max > 0.0f && taken > norm_max;
}

/* Vectorizable transcendentals. On the CPU each is straight-line float code (no libm call, no
 * branch: selects), so a loop over an array becomes SIMD code, and the same operations in the
 * same order give the same bits on every machine and every SIMD width (no FMA contraction in
 * C11 mode). Maximum errors against float64 over the float range, as tests/test_vmath.c holds
 * them (measured in brackets): pmap_exp 1.5 ulps (1.16), pmap_tanh 2 (1.31), pmap_sigmoid 3
 * (2.68), pmap_gelu 4 (2.84; its argument is formed in double: float would lose up to ~100 ulps
 * in the tail, where GELU's condition number is large), pmap_gelu_grad 3 ulps (2.34) or 2^-23
 * absolute (it crosses zero). On CUDA they use the fast intrinsics
 * (__expf, __fdividef), held by the op harness's CPU/CUDA tolerances instead. */
PMAP_HD static inline float pmap_float_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
PMAP_HD static inline uint32_t pmap_bits_of_float(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
/* bfloat16 (the bf16 policy): x rounded to its top 16 bits, to nearest with ties to even; a NaN
 * stays a NaN of the same sign, made quiet (its top fraction bit set), so it never rounds to an
 * infinity. Branch-free integer code: a loop over it vectorizes, and every backend and SIMD
 * width gives the same bits. */
PMAP_HD static inline uint16_t pmap_bf16_round(float x) {
  uint32_t u = pmap_bits_of_float(x);
  uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u;
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet = (u >> 16) | 0x40u;
  uint32_t m = 0u - nan;
  return (uint16_t)((quiet & m) | (rounded & ~m));
}
PMAP_HD static inline float pmap_bf16_widen(uint16_t h) {
  return pmap_float_of_bits((uint32_t)h << 16);
}
/* c ? a : b as a bit mask: both arms are then computed unconditionally, so the compiler neither
 * sinks one into a branch nor, under trapping maths, refuses to vectorize the loop. */
PMAP_HD static inline float pmap_sel(int c, float a, float b) {
  uint32_t m = 0u - (uint32_t)(c != 0);
  return pmap_float_of_bits((pmap_bits_of_float(a) & m) | (pmap_bits_of_float(b) & ~m));
}
PMAP_HD static inline double pmap_sel_d(int c, double a, double b) {
  uint64_t m = 0u - (uint64_t)(c != 0), ua, ub;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  ua = (ua & m) | (ub & ~m);
  memcpy(&a, &ua, sizeof a);
  return a;
}
/* exp(r) for |r| <= ln2 / 2: Taylor to degree 7 (truncation below 2^-30 relative). */
PMAP_HD static inline float pmap_exp_poly(float r) {
  float p = 1.0f / 5040.0f;
  p = 1.0f / 720.0f + r * p;
  p = 1.0f / 120.0f + r * p;
  p = 1.0f / 24.0f + r * p;
  p = 1.0f / 6.0f + r * p;
  p = 0.5f + r * p;
  p = 1.0f + r * p;
  return 1.0f + r * p;
}
/* p 2^n 2^k for integer n in [-217, 128] and k in [0, 64] with n + k <= 128: two exact
 * power-of-two factors, each a normal float, so the only rounding is the last product's (into a
 * denormal or to infinity where the result lands there). */
PMAP_HD static inline float pmap_ldexp2(float p, int32_t n, int32_t k) {
  int32_t n1 = n / 2, n2 = n - n1 + k;
  return p * pmap_float_of_bits((uint32_t)(n1 + 127) << 23) *
         pmap_float_of_bits((uint32_t)(n2 + 127) << 23);
}
/* exp(x) 2^k (k in [0, 64]; k > 0 only for x <= 0): x = n ln2 + r, n rounded to nearest with
 * the 1.5 2^23 trick (valid: x is clamped first), ln2 in two parts so n ln2_hi is exact. */
PMAP_HD static inline float pmap_exp_scaled(float x, int32_t k) {
  /* Every comparison unconditional (no nested ?:), so the vectorizer may evaluate all of them. */
  float xc = pmap_sel(x < -104.0f, -104.0f, x);
  xc = pmap_sel(x > 89.0f, 89.0f, xc);
  xc = pmap_sel(x == x, xc, 0.0f); /* NaN: any finite value, replaced at the end */
  float nf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = (xc - nf * 0.693145751953125f) - nf * 1.428606765330187045e-06f;
  float y = pmap_ldexp2(pmap_exp_poly(r), (int32_t)nf, k);
  return pmap_sel(x == x, y, x);
}
PMAP_HD static inline float pmap_exp(float x) {
#ifdef __CUDA_ARCH__
  return __expf(x);
#else
  return pmap_exp_scaled(x, 0);
#endif
}
PMAP_HD static inline float pmap_fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdividef(a, b);
#else
  return a / b;
#endif
}

/* tanh: its Taylor series (terms to x^21) below 0.625, 1 - 2 / (exp(2|x|) + 1) above, the
 * sign put back (tanh(-0) = -0; +-inf: +-1). */
PMAP_HD static inline float pmap_tanh(float x) {
  float ax = fabsf(x), x2 = x * x;
  float p = 9.691537956929451e-05f;
  p = -2.3912911424355248e-04f + x2 * p;
  p = 5.90027440945586e-04f + x2 * p;
  p = -1.4558343870513183e-03f + x2 * p;
  p = 3.592128036572481e-03f + x2 * p;
  p = -8.863235529902197e-03f + x2 * p;
  p = 2.1869488536155203e-02f + x2 * p;
  p = -5.396825396825397e-02f + x2 * p;
  p = 0.13333333333333333f + x2 * p;
  p = -0.3333333333333333f + x2 * p;
  float small = ax + ax * (x2 * p);
  float big = 1.0f - pmap_fdiv(2.0f, pmap_exp(2.0f * ax) + 1.0f);
  return copysignf(pmap_sel(ax < 0.625f, small, big), x);
}
PMAP_HD static inline float pmap_tanh_grad(float y, float dy) { return (1.0f - y * y) * dy; }
/* sigmoid from e = exp(-|x|) in (0, 1]: 1 / (1 + e) for x >= 0, e / (1 + e) below (no
 * overflow, no cancellation). */
PMAP_HD static inline float pmap_sigmoid(float x) {
  float e = pmap_exp(-fabsf(x));
  float s = pmap_fdiv(1.0f, 1.0f + e);
  return pmap_sel(x >= 0.0f, s, e * s);
}
PMAP_HD static inline float pmap_sigmoid_grad(float y, float dy) { return y * (1.0f - y) * dy; }

/* GELU, tanh form (as jax.nn.gelu(approximate=True)):
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) = x sigmoid(u), u = 2 sqrt(2/pi) (x + 0.044715
 * x^3); the second form has no cancellation for negative x. With e = exp(-|u|): x / (1 + e) for
 * u >= 0, x e / (1 + e) below, where e is taken scaled by 2^64 so that it stays normal in the
 * tail (the result is then rounded once). Below -12 the value is under half the least denormal:
 * -0 (also for -inf, where x e would be -inf 0). */
#define PMAP_GELU_C 0.7978845608028654
#define PMAP_GELU_A 0.044715
/* x clamped to [-12, 10.5] (NaN: 0) for u: beyond it GELU's value and gradient are already
 * their limits to the last bit (below -12: -0; above 10.5, x / (1 + e) = x and 1), and inside
 * it -|u| >= -142.6, which pmap_gelu_big_e reduces with no clamp of its own. */
PMAP_HD static inline float pmap_gelu_clamp(float x) {
  float xc = pmap_sel(x < -12.0f, -12.0f, x);
  xc = pmap_sel(x > 10.5f, 10.5f, xc);
  return pmap_sel(x == x, xc, 0.0f);
}
/* exp(-|u|) 2^64 for a clamped x. -|u| = s (-2c - 2ca s^2) with s = |x| (u has x's sign), formed
 * and reduced (-|u| = n ln2 + r) in double, where float would lose up to ~100 ulps in the tail
 * (GELU's condition number is large there), then the polynomial in float and one exact power of
 * two. Where 2^(n + 64) is below the least normal float (n < -190: exp(-|u|) < 2^-190, so GELU
 * and its gradient round to zero from any e below 2^-126) the power is held at 2^-126: the
 * results still round to the same zero. */
PMAP_HD static inline float pmap_gelu_big_e(float xc) {
  double s = (double)fabsf(xc);
  double v = s * (-2.0 * PMAP_GELU_C + (-2.0 * PMAP_GELU_C * PMAP_GELU_A) * (s * s));
  double nd = (v * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;
  float r = (float)(v - nd * 0.6931471805599453);
  int32_t e = (int32_t)nd + 64 + 127; /* the biased exponent of 2^(n + 64) */
  e = e < 1 ? 1 : e;
  return pmap_exp_poly(r) * pmap_float_of_bits((uint32_t)e << 23);
}
PMAP_HD static inline float pmap_gelu(float x) {
#ifdef __CUDA_ARCH__
  float u = 2.0f * (float)PMAP_GELU_C * (x + (float)PMAP_GELU_A * x * x * x);
  float y = pmap_fdiv(x, 1.0f + __expf(-u));
  return x < -12.0f ? -0.0f : y;
#else
  float xc = pmap_gelu_clamp(x), big_e = pmap_gelu_big_e(xc);
  float d = 1.0f + big_e * 0x1p-64f;
  int pos = xc >= 0.0f; /* u >= 0 */
  float y = (pmap_sel(pos, x, x * big_e) / d) * pmap_sel(pos, 1.0f, 0x1p-64f);
  return pmap_sel(x < -12.0f, -0.0f, y);
#endif
}
/* d/dx x sigmoid(u) = s + x u' s (1 - s), s (1 - s) = e / (1 + e)^2 with e = exp(-|u|), the
 * whole scaled by 2^64 as in pmap_gelu; saturated beyond +-16 (1 and -0). The slope alone:
 * pmap_gelu_grad(x, dy) is pmap_gelu_slope(x) dy, bit for bit, so a forward pass that keeps the
 * slope leaves its backward one multiplication. */
PMAP_HD static inline float pmap_gelu_slope(float x) {
#ifdef __CUDA_ARCH__
  float u = 2.0f * (float)PMAP_GELU_C * (x + (float)PMAP_GELU_A * x * x * x);
  float du = 2.0f * (float)PMAP_GELU_C * (1.0f + 3.0f * (float)PMAP_GELU_A * x * x);
  float s = pmap_fdiv(1.0f, 1.0f + __expf(-u));
  float g = s + x * du * s * (1.0f - s);
#else
  float xc = pmap_gelu_clamp(x), big_e = pmap_gelu_big_e(xc);
  /* u' from the clamped x: beyond the clamp the term it scales no longer counts. */
  double ax = (double)fabsf(xc);
  float du = (float)(2.0 * PMAP_GELU_C + (6.0 * PMAP_GELU_C * PMAP_GELU_A) * (ax * ax));
  float d = 1.0f + big_e * 0x1p-64f;
  float s = pmap_sel(xc >= 0.0f, 0x1p64f, big_e) / d;
  float g = (s + x * du * (big_e / (d * d))) * 0x1p-64f;
#endif
  g = pmap_sel(x < -16.0f, -0.0f, g);
  return pmap_sel(x > 16.0f, 1.0f, g);
}
PMAP_HD static inline float pmap_gelu_grad(float x, float dy) { return pmap_gelu_slope(x) * dy; }

/* Softmax cross-entropy of one row with logits z, its max zmax and sum_exp = sum exp(z - zmax):
 * loss = log(sum_exp) + zmax - z[label];  dz_k = (softmax_k - [k == label]) * scale. */
PMAP_HD static inline float pmap_xent_grad(float z, float zmax, float inv_sum_exp, int is_label,
                                           float scale) {
  return (pmap_exp(z - zmax) * inv_sum_exp - (is_label ? 1.0f : 0.0f)) * scale;
}

/* One row of softmax cross-entropy: z (k) logits, dz (k) = (softmax - onehot) * scale; returns
 * the row's loss, log(sum exp(z - zmax)) + zmax - z[label], in double for the caller's sum. */
PMAP_HD static inline double pmap_xent_row(const float *z, int label, int64_t k, float scale,
                                           float *dz) {
  float zmax = z[0];
  for (int64_t j = 1; j < k; j++) zmax = z[j] > zmax ? z[j] : zmax;
  float se = 0.0f;
  for (int64_t j = 0; j < k; j++) se += pmap_exp(z[j] - zmax);
  float inv = 1.0f / se;
  for (int64_t j = 0; j < k; j++) dz[j] = pmap_xent_grad(z[j], zmax, inv, j == label, scale);
  return (double)logf(se) + (double)zmax - (double)z[label];
}

/* act: a pmap_act value (0 tanh, 1 sigmoid, 2 gelu, 3 relu). */
PMAP_HD static inline float pmap_act_apply(int act, float x) {
  return act == 0   ? pmap_tanh(x)
         : act == 1 ? pmap_sigmoid(x)
         : act == 2 ? pmap_gelu(x)
                    : pmap_relu(x);
}
PMAP_HD static inline float pmap_act_grad(int act, float x, float y, float dy) {
  return act == 0   ? pmap_tanh_grad(y, dy)
         : act == 1 ? pmap_sigmoid_grad(y, dy)
         : act == 2 ? pmap_gelu_grad(x, dy)
                    : pmap_relu_grad(y, dy);
}

/* Counter-based hash (the splitmix64 finaliser): the dropout mask of element `index` under
 * `key` is a pure function of both, so it does not depend on which device holds the element. */
PMAP_HD static inline uint64_t pmap_mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* The inverse of pmap_mix64 (each of its steps is a bijection of 64-bit words). */
PMAP_HD static inline uint64_t pmap_unmix64(uint64_t z) {
  z ^= (z >> 31) ^ (z >> 62);
  z *= 0x319642b2d24d8ec3ull; /* the inverse of 0x94d049bb133111eb modulo 2^64 */
  z ^= (z >> 27) ^ (z >> 54);
  z *= 0x96de1b173f119089ull; /* the inverse of 0xbf58476d1ce4e5b9 */
  z ^= (z >> 30) ^ (z >> 60);
  return z - 0x9e3779b97f4a7c15ull;
}
/* Dropout's key for step `step` and a layer's salt. A captured CUDA step takes the salt back
 * from the key it was captured with (pmap_dropout_salt) and rebuilds each step's key on the
 * device from the step number there, so the masks still change from step to step. */
PMAP_HD static inline uint64_t pmap_dropout_key(uint64_t step, uint64_t salt) {
  return pmap_mix64(pmap_mix64(step) ^ salt);
}
PMAP_HD static inline uint64_t pmap_dropout_salt(uint64_t key, uint64_t step) {
  return pmap_unmix64(key) ^ pmap_mix64(step);
}
/* keep / (1 - rate): 0 for a dropped element, 1 / (1 - rate) for a kept one. */
PMAP_HD static inline float pmap_dropout_factor(uint64_t key, uint64_t index, float rate) {
  float u = (float)(pmap_mix64(key ^ pmap_mix64(index)) >> 40) * (1.0f / 16777216.0f);
  return u < rate ? 0.0f : 1.0f / (1.0f - rate);
}

/* Moments from (sum, sum of squares, count) of x - shift: mean and biased variance (clamped at
 * 0 against rounding). Summing around a shift near the mean keeps sumsq/count - m^2 from
 * cancelling. Sums that are not finite or overflowed float (the sums travel between devices as
 * floats, so a batch whose squares pass FLT_MAX overflows on any device count) give a NaN
 * variance, never a clamped 0 or an infinite one (whose 1/sqrt is a finite 0): the
 * normalisation, the loss and the running statistics all see a batch whose moments do not fit.
 * The mean is that of sum alone (a first pass's only use is the second pass's shift). */
PMAP_HD static inline void pmap_moments(float sum, float sumsq, float count, float shift,
                                        float *mean, float *var) {
  float m = sum / count, v = sumsq / count - m * m;
  *mean = shift + m;
  *var = v - v != 0.0f ? v - v : v > 0.0f ? v : 0.0f; /* v - v: 0, or NaN for inf and NaN */
}
/* Batch norm statistics of channel ch: stats (3c + 1) = sums (c), sums of squares (c), count,
 * shifts (c), the sums taken of x - shift. */
PMAP_HD static inline void pmap_bn_moments(const float *stats, int64_t c, int64_t ch, float *mean,
                                           float *var) {
  pmap_moments(stats[ch], stats[c + ch], stats[2 * c], stats[2 * c + 1 + ch], mean, var);
}
PMAP_HD static inline float pmap_rstd(float var, float eps) { return 1.0f / sqrtf(var + eps); }
/* Layer norm's row moments from sums held in double (the subtraction happens in double): the
 * mean and 1 / sqrt(var + eps). The variance is rounded to float and the reciprocal taken in
 * float, as batch norm's, where it fits; a row whose variance passes FLT_MAX (|x| beyond about
 * 1e19, whose squares the double sums still hold) takes it in double, so its rstd is the small
 * finite value it is and not 1 / sqrt(inf) = 0, which would make the row's output beta. */
PMAP_HD static inline void pmap_ln_moments(double sum, double sumsq, double count, float eps,
                                           float *mean, float *rstd) {
  double m = sum / count, v = sumsq / count - m * m;
  float var = v > 0.0 ? (float)v : 0.0f;
  *mean = (float)m;
  *rstd = isfinite(var) || !isfinite(v) ? pmap_rstd(var, eps) : (float)(1.0 / sqrt(v + eps));
}
/* The moments a training step normalises channel ch with: those of stats, with a NaN variance
 * when the moments of run_stats (the global batch's, which move the running statistics; NULL:
 * none) are not finite. Per-device statistics (batch norm without cross_replica) can fit while
 * the global batch's overflow: the step's loss is then not finite on any device count, as on
 * one device, and the numeric guard skips it. Finite moments come out bitwise as stats's. */
PMAP_HD static inline void pmap_bn_train_moments(const float *stats, const float *run_stats,
                                                 int64_t c, int64_t ch, float *mean, float *var) {
  pmap_bn_moments(stats, c, ch, mean, var);
  if (!run_stats) return;
  float gm, gv;
  pmap_bn_moments(run_stats, c, ch, &gm, &gv);
  *var += (gm - gm) + (gv - gv); /* + 0, or NaN */
}

/* Running statistics: r = momentum r + (1 - momentum) batch, for one channel. Non-finite batch
 * moments (a batch the numeric guard will skip) leave them as they were: every replica sees the
 * same moments, so all keep or all move alike. */
PMAP_HD static inline void pmap_running_update(float *mean, float *var, float batch_mean,
                                               float batch_var, float momentum) {
  if (!(batch_mean - batch_mean == 0.0f) || !(batch_var - batch_var == 0.0f)) return;
  *mean = momentum * *mean + (1.0f - momentum) * batch_mean;
  *var = momentum * *var + (1.0f - momentum) * batch_var;
}

/* Normalisation backward for one element: g = gamma rstd (dy - mean_dy - xhat mean_dyxhat). */
PMAP_HD static inline float pmap_norm_dx(float dy, float xhat, float grstd, float mean_dy,
                                         float mean_dyxhat) {
  return grstd * (dy - mean_dy - xhat * mean_dyxhat);
}

/* Pooling: the output of window (oy, ox) of one plane p (h, w). */
PMAP_HD static inline float pmap_pool_window(int is_max, const float *p, int64_t w, int64_t oy,
                                             int64_t ox, int kh, int kw, int stride) {
  const float *q = p + oy * stride * w + ox * stride;
  float best = q[0], sum = 0.0f;
  for (int i = 0; i < kh; i++)
    for (int j = 0; j < kw; j++) {
      float v = q[i * w + j];
      best = v > best || v != v ? v : best;
      sum += v;
    }
  return is_max ? best : sum / (float)(kh * kw);
}
/* The first maximum of window (oy, ox) of plane p (h, w), in the order pmap_pool_window scans
 * it (a NaN counts as the maximum): its row and column inside the window. */
PMAP_HD static inline void pmap_pool_argmax(const float *p, int64_t w, int64_t oy, int64_t ox,
                                            int kh, int kw, int stride, int64_t *by, int64_t *bx) {
  const float *q = p + oy * stride * w + ox * stride;
  float best = q[0];
  *by = *bx = 0;
  for (int i = 0; i < kh; i++)
    for (int j = 0; j < kw; j++)
      if (q[i * w + j] > best || (q[i * w + j] != q[i * w + j] && best == best))
        best = q[i * w + j], *by = i, *bx = j;
}
/* The gradient reaching element (iy, ix) of plane p from every window that holds it (dyp: the
 * plane's output gradient (oh, ow)); max pooling passes it to the first maximum of a window. */
PMAP_HD static inline float pmap_pool_dx(int is_max, const float *p, const float *dyp, int64_t w,
                                         int64_t oh, int64_t ow, int kh, int kw, int stride,
                                         int64_t iy, int64_t ix) {
  int64_t oy0 = iy - kh + 1 > 0 ? (iy - kh + 1 + stride - 1) / stride : 0;
  int64_t ox0 = ix - kw + 1 > 0 ? (ix - kw + 1 + stride - 1) / stride : 0;
  int64_t oy1 = iy / stride < oh - 1 ? iy / stride : oh - 1;
  int64_t ox1 = ix / stride < ow - 1 ? ix / stride : ow - 1;
  float g = 0.0f;
  for (int64_t oy = oy0; oy <= oy1; oy++)
    for (int64_t ox = ox0; ox <= ox1; ox++) {
      if (!is_max) {
        g += dyp[oy * ow + ox] / (float)(kh * kw);
        continue;
      }
      int64_t by, bx;
      pmap_pool_argmax(p, w, oy, ox, kh, kw, stride, &by, &bx);
      if (oy * stride + by == iy && ox * stride + bx == ix) g += dyp[oy * ow + ox];
    }
  return g;
}

#endif
