/* test_equiv.c: N devices against 1 device on every example model, with each model's own
 * optimizer and learning rate: the README's table ("N devices and 1 device"), model by model.
 * The runs differ only in the order of their float sums (each device sums its shard, the
 * all-reduce sums the devices); the bounds follow from each model's path (tests/bounds.h,
 * docs/tolerances.md), below. Prints the measured errors beside their bounds; fails when one
 * exceeds its bound. */
#include <time.h>

#include "bounds.h"
#include "pmap_examples.h"
#include "testutil.h"

#define STEPS 20

/* Global batch divisible by 2, 3 and 4; step s takes batch s % 2 of two. */
static const struct {
  const char *model;
  int64_t batch;
} table[] = {
    {"linear", 24},    {"mlp", 24},     {"convnet", 24},  {"mlp-1024", 12},
    {"cifar-cnn", 12}, {"res-mlp", 24}, {"cifar-bn", 12}, {"gpt-mini", 12},
};

/* One training run: the parameters before the first step (w0), after it (w1) and after the last
 * (w), every step's loss, and, when asked for, every step's output size (below). */
typedef struct run {
  float *w0, *w1, *w, loss[STEPS];
  double size[STEPS];
  int labels; /* the targets are class labels (cross-entropy) */
  size_t n;
} run;

static void run_free(run *r) { free(r->w0), free(r->w1), free(r->w); }

static double norm2(const float *a, const float *b, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    double e = (double)a[i] - (b ? (double)b[i] : 0.0);
    s += e * e;
  }
  return sqrt(s);
}

static double rel_err(const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
  double den = norm2(b, NULL, n);
  return norm2(a, b, n) / (den > 1e-30 ? den : 1e-30);
}

/* Losses compare relative to bound_loss_scale (tests/bounds.h): the outputs' size bounds how
 * much a loss near 0 moves. */

/* Trains `model` STEPS steps on `devices` devices (global batch `batch`) into r; with `sizes`
 * also every step's output size. */
static int train(const char *model, int64_t batch, int devices, int sizes, run *r) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *params = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  memset(r, 0, sizeof *r);
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  if (!st) st = pmap_example_info_get(model, &info);
  if (!st) st = pmap_example_model(model, &m);
  if (!st) st = pmap_params_create(ctx, m, &info.opt, 0, &params);
  if (!st) st = pmap_example_data(model, 1, 2 * batch, &xs, &ys);
  r->labels = !st && ys.dtype != PMAP_F32;
  size_t n = st ? 0 : pmap_params_count(params);
  if (!st && (!(r->w0 = malloc(n * sizeof *r->w0)) || !(r->w1 = malloc(n * sizeof *r->w1)) ||
              !(r->w = malloc(n * sizeof *r->w))))
    st = PMAP_ERR_OUT_OF_MEMORY;
  if (!st) st = pmap_params_read(params, devices - 1, r->w0, n);
  for (int s = 0; s < STEPS && !st; s++) {
    pmap_array x = xs, y = ys;
    int64_t xrow = pmap_array_numel(&xs) / xs.shape[0], yrow = pmap_array_numel(&ys) / ys.shape[0];
    x.data = (char *)xs.data + (size_t)((s % 2) * batch * xrow) * 4;
    y.data = (char *)ys.data + (size_t)((s % 2) * batch * yrow) * 4;
    x.shape[0] = y.shape[0] = batch;
    if (sizes) r->size[s] = test_output_size(params, m, &x, &y);
    st = pmap_update(params, &x, &y, &r->loss[s]);
    if (!st && s == 0) st = pmap_params_read(params, devices - 1, r->w1, n);
  }
  if (!st) st = pmap_params_read(params, devices - 1, r->w, n);
  if (st) {
    fprintf(stderr, "FAIL %s on %d devices: %s: %s\n", model, devices, pmap_status_string(st),
            pmap_last_error());
    test_failures++;
  }
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(params);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  r->n = st ? 0 : n;
  return st ? -1 : 0;
}

/* The bounds, for N = 2, 3, 4 devices against 1 on a global batch of `batch` rows:
 * - every step's loss: bound_order32(model, batch, s + 1) at step s (its s updates and its own
 *   forward pass), relative to max(L, S / kappa) (loss_scale);
 * - the parameters after STEPS steps: bound_order32(model, batch, STEPS), as docs/tolerances.md
 *   holds for the parameters of float runs, Adam's included;
 * - one step, from the same parameters w0 (bitwise the same on every device count): w1 =
 *   fl(w0 - d). SGD's d = lr g (the velocity starts at g) differs by lr dg, and the gradient is
 *   a value on the path: |dg| <= q |g|, q = bound_order32(model, batch, 1). Adam's first d is
 *   lr g / (|g| + eps), about lr sign(g) per element: it differs only where the order flips an
 *   element's sign, by 2 lr. An element flips where it lies within its rounding difference of
 *   0, a fraction below q of the elements (a sum of terms of random sign, over its spread, has a
 *   density below 1/2 at 0), so |dd| <= 2 lr sqrt(q P) = 2 sqrt(q) |d|. Each run rounds w1 once,
 *   by at most u |w1| per element. So |dw1| <= c |w1 - w0| + 2 u |w1|, c = q for SGD and
 *   2 sqrt(q) for Adam: a bound from the step's own size, far below the parameters' scale. */
int main(void) {
  printf("%-9s %7s  %-21s %-21s %-21s\n", "model", "devices", "1 step (bound)", "20 steps (bound)",
         "losses (bound)");
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    const char *model = table[i].model;
    int64_t batch = table[i].batch;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* Longer than the test's limit under the sanitizers (test_transformer covers its layers). */
    if (!strcmp(model, "gpt-mini")) {
      printf("equiv: gpt-mini runs in the builds without a sanitizer\n");
      continue;
    }
#endif
    const bound_model *bm = bound_model_of(model);
    pmap_example_info info;
    CHECK(bm && pmap_example_info_get(model, &info) == PMAP_SUCCESS, "%s: no bound", model);
    if (!bm) continue;
    clock_t t0 = clock();
    run ref;
    if (train(model, batch, 1, 1, &ref)) {
      run_free(&ref);
      continue;
    }
    size_t n = ref.n;
    double q = bound_order32(bm, (double)batch, 1);
    double c = info.opt.kind == PMAP_OPT_SGD ? q : 2.0 * sqrt(q);
    double w1 = norm2(ref.w1, NULL, n);
    double one = (c * norm2(ref.w1, ref.w0, n) + 2.0 * BOUND_U32 * w1) / w1;
    double params = bound_order32(bm, (double)batch, STEPS);
    for (int d = 2; d <= 4; d++) {
      /* Under TSan every model on 3 devices (testutil.h): 2 and 4 divide the batch evenly too. */
      if (TEST_UNDER_TSAN && d != 3) continue;
      run r;
      if (!train(model, batch, d, 0, &r) && r.n == n) {
        test_same_bits("the initial parameters, N devices vs 1", r.w0, ref.w0, n);
        double e1 = rel_err(r.w1, ref.w1, n), ew = rel_err(r.w, ref.w, n);
        double el = 0, bl = 0, worst = 0; /* the step whose loss is nearest its bound */
        for (int s = 0; s < STEPS; s++) {
          double den = bound_loss_scale(ref.loss[s], ref.size[s], ref.labels, bm->kappa);
          double e = fabs((double)r.loss[s] - ref.loss[s]) / den;
          double b = bound_order32(bm, (double)batch, s + 1);
          if (!(e / b <= worst) && !isnan(worst)) worst = e / b, el = e, bl = b; /* NaN stays */
        }
        printf("%-9s %7d  %-8.2e (%-8.2e)   %-8.2e (%-8.2e)   %-8.2e (%-8.2e)\n", model, d, e1, one,
               ew, params, el, bl);
        CHECK(e1 <= one, "%s: one step on %d devices vs 1: %.3g > %.3g", model, d, e1, one);
        CHECK(ew <= params, "%s: %d steps on %d devices vs 1: %.3g > %.3g", model, STEPS, d, ew,
              params);
        CHECK(worst <= 1.0, "%s: a loss on %d devices vs 1: %.3g > %.3g", model, d, el, bl);
      }
      run_free(&r);
    }
    run_free(&ref);
    printf("%-9s (%.1f s of CPU time)\n", model, (double)(clock() - t0) / CLOCKS_PER_SEC);
  }
  return test_exit("test_equiv");
}
