/* test_vmath.c: the vectorizable transcendentals of ops/op_math.h against float64 over the whole
 * float range: a sweep of every 251st bit pattern (both signs: zeros, denormals, normals, the
 * infinities, NaNs), every float within 2^14 of each saturation point and threshold, and the
 * special values. Fails when an error passes the bound op_math.h states. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ops/op_math.h"

/* The float64 references, each written the plain way. */
static double ref_exp(double x) { return exp(x); }
static double ref_tanh(double x) { return tanh(x); }
static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double ref_u(double x) { return 2.0 * PMAP_GELU_C * (x + PMAP_GELU_A * x * x * x); }
static double ref_gelu(double x) {
  if (isinf(x)) return x > 0 ? x : -0.0;
  return x / (1.0 + exp(-ref_u(x)));
}
static double ref_gelu_grad(double x) {
  if (isinf(x)) return x > 0 ? 1.0 : 0.0;
  double u = ref_u(x), du = 2.0 * PMAP_GELU_C * (1.0 + 3.0 * PMAP_GELU_A * x * x);
  double s = 1.0 / (1.0 + exp(-u)), t = 1.0 / (1.0 + exp(u)); /* s, 1 - s */
  return s + x * du * s * t;
}
static float gelu_grad1(float x) { return pmap_gelu_grad(x, 1.0f); }

/* The spacing of floats at |v| (denormal spacing below FLT_MIN). */
static double ulp_at(double v) {
  double a = fabs(v);
  if (a < FLT_MIN) return 0x1p-149;
  int e;
  frexp(a, &e);
  return ldexp(1.0, e - 24);
}

typedef struct fn {
  const char *name;
  float (*got)(float);
  double (*want)(double);
  double max_ulp; /* the bound op_math.h states */
  double abs_tol; /* an absolute error also accepted (0: none): gradients that cross zero */
  double worst;   /* measured, in ulps */
  float worst_x;
  long bad;
} fn;

static void check(fn *f, float x) {
  float g = f->got(x);
  double w = f->want((double)x);
  if (isnan(w) || isnan(g)) {
    if (isnan(w) != isnan(g)) {
      if (f->bad++ < 5)
        printf("%s(%a): got %a, want %a (NaN mismatch)\n", f->name, (double)x, (double)g, w);
    }
    return;
  }
  float wf = (float)w; /* what a correctly rounded result would be: inf past FLT_MAX */
  double err;
  if (isinf(wf) || isinf(g))
    err = (double)g == (double)wf ? 0.0 : INFINITY;
  else
    err = fabs((double)g - w) / ulp_at(w);
  if (f->abs_tol > 0.0 && fabs((double)g - w) <= f->abs_tol) err = 0.0;
  if (err > f->worst) f->worst = err, f->worst_x = x;
  if (err > f->max_ulp && f->bad++ < 5)
    printf("%s(%a): got %a, want %a: %.2f ulps > %.1f\n", f->name, (double)x, (double)g, w, err,
           f->max_ulp);
}

static float of_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}
static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}

/* Every float within 2^14 bit patterns of x (on its side of zero). */
static void around(fn *f, float x) {
  uint32_t b = bits_of(x);
  for (int64_t d = -16384; d <= 16384; d++) {
    int64_t v = (int64_t)(b & 0x7fffffffu) + d;
    if (v < 0 || v > 0x7f800000) continue;
    check(f, of_bits((uint32_t)v | (b & 0x80000000u)));
  }
}

int main(void) {
  fn fns[] = {
      {"exp", pmap_exp, ref_exp, 1.5, 0.0, 0, 0, 0},
      {"tanh", pmap_tanh, ref_tanh, 2.0, 0.0, 0, 0, 0},
      {"sigmoid", pmap_sigmoid, ref_sigmoid, 3.0, 0.0, 0, 0, 0},
      {"gelu", pmap_gelu, ref_gelu, 4.0, 0.0, 0, 0, 0},
      {"gelu_grad", gelu_grad1, ref_gelu_grad, 3.0, 0x1p-23, 0, 0, 0},
  };
  /* Saturation points and thresholds: exp's overflow, denormal and underflow edges and its
   * clamps; tanh's switch and its saturation at 1; GELU's switch to -0 and the point where
   * exp(-|u|) leaves the normal range; gradients' saturation. */
  const float points[] = {0.0f,   1e-30f, FLT_MIN, 0x1p-149f, 0.625f,  1.0f,   9.0f,
                          88.72f, 89.0f,  87.34f,  103.97f,   104.0f,  10.3f,  10.7f,
                          12.0f,  16.0f,  0.75f,   8.7f,      FLT_MAX, 44.36f, 0.5f};
  const float specials[] = {0.0f,    -0.0f,    INFINITY, -INFINITY, NAN,       -NAN,
                            FLT_MAX, -FLT_MAX, FLT_MIN,  -FLT_MIN,  0x1p-149f, -0x1p-149f};
  int fails = 0;
  for (size_t k = 0; k < sizeof fns / sizeof fns[0]; k++) {
    fn *f = &fns[k];
    for (uint64_t u = 0; u <= 0xffffffffull; u += 251) check(f, of_bits((uint32_t)u));
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) check(f, specials[i]);
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
      around(f, points[i]);
      around(f, -points[i]);
    }
    printf("%-10s max error %.3f ulps at %a (bound %.1f%s)\n", f->name, f->worst,
           (double)f->worst_x, f->max_ulp, f->abs_tol > 0 ? ", or 2^-23 absolute" : "");
    if (f->bad) {
      printf("FAIL %s: %ld values over the bound\n", f->name, f->bad);
      fails++;
    }
  }
  /* The special values exactly: the sign of zero, the limits at infinity, NaN in, NaN out. */
  struct {
    const char *what;
    float got, want;
  } exact[] = {
      {"exp(-inf)", pmap_exp(-INFINITY), 0.0f},
      {"exp(inf)", pmap_exp(INFINITY), INFINITY},
      {"exp(-0)", pmap_exp(-0.0f), 1.0f},
      {"tanh(-0)", pmap_tanh(-0.0f), -0.0f},
      {"tanh(inf)", pmap_tanh(INFINITY), 1.0f},
      {"tanh(-inf)", pmap_tanh(-INFINITY), -1.0f},
      {"sigmoid(-inf)", pmap_sigmoid(-INFINITY), 0.0f},
      {"sigmoid(inf)", pmap_sigmoid(INFINITY), 1.0f},
      {"gelu(inf)", pmap_gelu(INFINITY), INFINITY},
      {"gelu(-inf)", pmap_gelu(-INFINITY), -0.0f},
      {"gelu(0)", pmap_gelu(0.0f), 0.0f},
  };
  for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++)
    if (bits_of(exact[i].got) != bits_of(exact[i].want)) {
      printf("FAIL %s = %a, want %a\n", exact[i].what, (double)exact[i].got, (double)exact[i].want);
      fails++;
    }
  if (!isnan(pmap_exp(NAN)) || !isnan(pmap_tanh(NAN)) || !isnan(pmap_sigmoid(NAN)) ||
      !isnan(pmap_gelu(NAN)) || !isnan(pmap_gelu_grad(NAN, 1.0f))) {
    printf("FAIL a NaN input gave a number\n");
    fails++;
  }
  return fails ? 1 : 0;
}
