/* test_pmap.c: pmap end to end on CPU virtual devices: N devices equal 1 device on the same
 * global batch (within the bound of sums in another order, tests/bounds.h), replicas stay
 * bitwise identical, runs reproduce, the first steps match a float64 host reference (loss, SGD
 * and Adam with their state kept), and pmap_predict gathers in order. */
#include "bounds.h"
#include "pmap_examples.h"
#include "testutil.h"

typedef struct run {
  pmap_ctx *ctx;
  pmap_params *params;
  pmap_array xs, ys;
  int out_rank; /* the model's output shape per row */
  int64_t out_shape[PMAP_MAX_RANK];
} run;

static int run_open(run *r, const char *model, int devices, int64_t rows, uint64_t seed,
                    const pmap_optimizer *opt_override) {
  memset(r, 0, sizeof *r);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  pmap_example_info info;
  pmap_model *m = NULL;
  if (pmap_ctx_create(&cfg, &r->ctx) || pmap_example_info_get(model, &info) ||
      pmap_example_model(model, &m) ||
      pmap_params_create(r->ctx, m, opt_override ? opt_override : &info.opt, seed, &r->params) ||
      pmap_example_data(model, seed + 1, rows, &r->xs, &r->ys)) {
    fprintf(stderr, "FAIL setting up %s on %d devices: %s\n", model, devices, pmap_last_error());
    test_failures++;
    pmap_model_destroy(m);
    return 0;
  }
  pmap_model_output_shape(m, &r->out_rank, r->out_shape);
  pmap_model_destroy(m); /* params keep their own copy */
  return 1;
}

static void run_close(run *r) {
  pmap_example_data_free(&r->xs, &r->ys);
  pmap_params_destroy(r->params);
  pmap_ctx_destroy(r->ctx);
}

/* Rows [first, first + n) of a, as a view. */
static pmap_array rows_of(const pmap_array *a, int64_t first, int64_t n) {
  pmap_array v = *a;
  int64_t row = pmap_array_numel(a) / a->shape[0];
  v.data = (char *)a->data + (size_t)(first * row) * 4;
  v.shape[0] = n;
  return v;
}

static float *read_params(run *r, int device) {
  size_t p = pmap_params_count(r->params);
  float *w = malloc(p * sizeof *w);
  CHECK_OK(pmap_params_read(r->params, device, w, p));
  return w;
}

/* bound_output_size (tests/bounds.h, bound_loss_scale) of the outputs from pmap_predict on
 * the batch at the parameters r holds. */
static double output_size(run *r, const pmap_array *x, const pmap_array *y) {
  int64_t osh[PMAP_MAX_RANK] = {x->shape[0]};
  size_t n = (size_t)x->shape[0];
  for (int i = 0; i < r->out_rank; i++) n *= (size_t)(osh[i + 1] = r->out_shape[i]);
  float *out = malloc(n * sizeof *out);
  pmap_array o = pmap_array_f32(out, r->out_rank + 1, osh);
  double size = INFINITY;
  if (out && pmap_predict(r->params, x, &o) == PMAP_SUCCESS)
    size = bound_output_size(out, n, y->dtype != PMAP_F32);
  CHECK(isfinite(size), "the outputs' size: %s", pmap_last_error());
  free(out);
  return size;
}

/* N devices against 1 on the same batches; they differ in the order of their float sums only:
 * every step's loss within bound_order32(model, batch, s + 1) of 1 device's (relative to
 * max(L, S / kappa)), the parameters after `steps` steps within bound_order32(model, batch,
 * steps). */
static void check_equivalence(const char *model, int64_t batch, int steps) {
  const int counts[] = {1, 2, 3, 4, 8};
  const bound_model *bm = bound_model_of(model);
  float *ref_w = NULL, ref_loss[64];
  double size[64];
  size_t p = 0;
  CHECK(bm != NULL, "%s: no bound", model);
  for (size_t c = 0; bm && c < sizeof counts / sizeof *counts; c++) {
    run r;
    if (!run_open(&r, model, counts[c], 2 * batch, 7, NULL)) return;
    float loss[64];
    for (int s = 0; s < steps; s++) {
      pmap_array xb = rows_of(&r.xs, (s % 2) * batch, batch),
                 yb = rows_of(&r.ys, (s % 2) * batch, batch);
      if (!ref_w) size[s] = output_size(&r, &xb, &yb);
      CHECK_OK(pmap_update(r.params, &xb, &yb, &loss[s]));
    }
    float *w = read_params(&r, counts[c] - 1);
    p = pmap_params_count(r.params);
    if (!ref_w) {
      ref_w = w;
      memcpy(ref_loss, loss, sizeof loss);
    } else {
      double el = 0, bl = 1, worst = 0; /* the step whose loss is nearest its bound */
      for (int s = 0; s < steps; s++) {
        double den = bound_loss_scale(ref_loss[s], size[s], r.ys.dtype != PMAP_F32, bm->kappa);
        double e = fabs((double)loss[s] - ref_loss[s]) / den;
        double b = bound_order32(bm, (double)batch, s + 1);
        if (!(e / b <= worst) && !isnan(worst)) worst = e / b, el = e, bl = b; /* NaN stays */
      }
      double ew = test_rel_err(w, ref_w, p), bw = bound_order32(bm, (double)batch, steps);
      printf("%-8s %d devices vs 1: losses %.2e (bound %.2e), parameters %.2e (bound %.2e)\n",
             model, counts[c], el, bl, ew, bw);
      CHECK(worst <= 1.0, "%s: a loss on %d devices vs 1: %.3g > %.3g", model, counts[c], el, bl);
      CHECK(ew <= bw, "%s: parameters after %d steps on %d devices vs 1: %.3g > %.3g", model, steps,
            counts[c], ew, bw);
      free(w);
    }
    run_close(&r);
  }
  free(ref_w);
}

/* Every replica bitwise equal after many steps; two runs of one seed bitwise equal. */
static void check_identical(const char *model, int devices, int64_t batch, int steps) {
  float *first = NULL;
  for (int rep = 0; rep < 2; rep++) {
    run r;
    if (!run_open(&r, model, devices, batch, 11, NULL)) return;
    for (int s = 0; s < steps; s++) CHECK_OK(pmap_update(r.params, &r.xs, &r.ys, NULL));
    CHECK(pmap_params_step(r.params) == steps, "step counter %lld, want %d",
          (long long)pmap_params_step(r.params), steps);
    float *w0 = read_params(&r, 0);
    size_t p = pmap_params_count(r.params);
    char what[128];
    for (int d = 1; d < devices; d++) {
      float *wd = read_params(&r, d);
      snprintf(what, sizeof what, "%s: replica %d vs 0 after %d steps", model, d, steps);
      test_same_bits(what, wd, w0, p);
      free(wd);
    }
    if (rep == 0) {
      first = w0;
    } else {
      snprintf(what, sizeof what, "%s: two runs of one seed", model);
      test_same_bits(what, w0, first, p);
      free(w0);
    }
    run_close(&r);
  }
  free(first);
}

/* linear: the loss and the parameters of the first steps against float64 on the host, for SGD
 * and for Adam (whose moments must persist across steps). A float sum errs from the exact one by
 * about u sqrt(k / 2), less than two float orders differ (u sqrt(k)): the loss and the parameters
 * of step s within bound_order32(linear, 48, s) of float64 (its forward pass and the s - 1
 * steps before it; rows of 1 product and 1 bias each, sums over 48 rows in 4 shards). */
static void check_linear_reference(const pmap_optimizer *opt, const char *name) {
  const int64_t b = 48;
  const int steps = 5;
  run r;
  if (!run_open(&r, "linear", 4, b, 3, opt)) return;
  float w0[2];
  CHECK_OK(pmap_params_read(r.params, 0, w0, 2));
  double w = w0[0], bias = w0[1], m[2] = {0, 0}, v[2] = {0, 0};
  const float *x = r.xs.data, *y = r.ys.data;
  double worst[2] = {0, 0}, at[2][2] = {{0, 1}, {0, 1}}; /* the loss's and (w, b)'s nearest */
  for (int s = 1; s <= steps; s++) {
    double loss = 0, gw = 0, gb = 0;
    for (int64_t i = 0; i < b; i++) {
      double e = w * x[i] + bias - y[i];
      loss += e * e / (double)b;
      gw += 2 * e * x[i] / (double)b;
      gb += 2 * e / (double)b;
    }
    double g[2] = {gw, gb}, *pw[2] = {&w, &bias};
    for (int k = 0; k < 2; k++) {
      if (opt->kind == PMAP_OPT_SGD) {
        m[k] = opt->momentum * m[k] + g[k]; /* the velocity; plain SGD when momentum is 0 */
        *pw[k] -= opt->lr * m[k];
      } else {
        m[k] = opt->beta1 * m[k] + (1 - opt->beta1) * g[k];
        v[k] = opt->beta2 * v[k] + (1 - opt->beta2) * g[k] * g[k];
        double mh = m[k] / (1 - pow(opt->beta1, s)), vh = v[k] / (1 - pow(opt->beta2, s));
        *pw[k] -= opt->lr * mh / (sqrt(vh) + opt->eps);
      }
    }
    float got;
    CHECK_OK(pmap_update(r.params, &r.xs, &r.ys, &got));
    char what[96];
    double bound = bound_order32(bound_model_of("linear"), (double)b, s);
    snprintf(what, sizeof what, "linear %s: loss of step %d", name, s);
    test_close(what, &got, &loss, 1, bound);
    float now[2];
    double want[2] = {w, bias};
    CHECK_OK(pmap_params_read(r.params, 2, now, 2));
    snprintf(what, sizeof what, "linear %s: w, b after step %d", name, s);
    test_close(what, now, want, 2, bound);
    double e[2] = {fabs(got - loss) / fabs(loss),
                   hypot(now[0] - want[0], now[1] - want[1]) / hypot(want[0], want[1])};
    for (int k = 0; k < 2; k++)
      if (e[k] / bound > worst[k]) worst[k] = e[k] / bound, at[k][0] = e[k], at[k][1] = bound;
  }
  printf("linear %-12s vs float64, %d steps: losses %.2e (bound %.2e), w, b %.2e (bound %.2e)\n",
         name, steps, at[0][0], at[0][1], at[1][0], at[1][1]);
  run_close(&r);
}

/* pmap_predict on 4 devices returns w x + b in batch order. */
static void check_predict(void) {
  const int64_t b = 12;
  run r;
  if (!run_open(&r, "linear", 4, b, 5, NULL)) return;
  float w[2], out[12];
  double want[12];
  CHECK_OK(pmap_params_read(r.params, 0, w, 2));
  int64_t shape[2] = {b, 1};
  pmap_array o = pmap_array_f32(out, 2, shape);
  for (int i = 0; i < b; i++) out[i] = NAN;
  CHECK_OK(pmap_predict(r.params, &r.xs, &o));
  /* Each output is w x rounded, plus b rounded (or one fused rounding): within
   * u (2 |w x| + |b|) <= 2 u (|w x| + |b|) of the exact value. */
  double most = 0.0, norm = 0.0;
  for (int i = 0; i < b; i++) {
    double wx = (double)w[0] * ((float *)r.xs.data)[i];
    want[i] = wx + w[1];
    most += (fabs(wx) + fabs((double)w[1])) * (fabs(wx) + fabs((double)w[1]));
    norm += want[i] * want[i];
  }
  double bound = 2.0 * BOUND_U32 * sqrt(most / fmax(norm, 1e-300));
  if (test_close("predict: w x + b in batch order", out, want, (size_t)b, bound)) {
    double e = 0;
    for (int i = 0; i < b; i++) e += (out[i] - want[i]) * (out[i] - want[i]);
    printf("predict vs float64: %.2e (bound %.2e)\n", sqrt(e / fmax(norm, 1e-300)), bound);
  }
  run_close(&r);
}

/* A larger batch after a smaller one grows the arena; the result still equals 1 device, within
 * the bound of 4 steps summed in another order (bound_order32 at the largest batch, 96 rows). */
static void check_batch_sizes(void) {
  const int64_t sizes[] = {24, 96, 24, 48};
  float *w[2];
  for (int k = 0; k < 2; k++) {
    run r;
    if (!run_open(&r, "mlp", k ? 4 : 1, 96, 9, NULL)) return;
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
      pmap_array xb = rows_of(&r.xs, 0, sizes[i]), yb = rows_of(&r.ys, 0, sizes[i]);
      CHECK_OK(pmap_update(r.params, &xb, &yb, NULL));
    }
    w[k] = read_params(&r, 0);
    if (k) {
      size_t p = pmap_params_count(r.params);
      double bound = bound_order32(bound_model_of("mlp"), 96, 4);
      printf("mlp, changing batch sizes, 4 devices vs 1: %.2e (bound %.2e)\n",
             test_rel_err(w[1], w[0], p), bound);
      test_close_f("mlp: changing batch sizes, 4 devices vs 1", w[1], w[0], p, bound);
    }
    run_close(&r);
  }
  free(w[0]);
  free(w[1]);
}

int main(void) {
  check_equivalence("linear", 48, 20);
  check_equivalence("mlp", 48, 20);
  check_equivalence("convnet", 24, 20);
  check_identical("linear", 4, 128, 100);
  check_identical("mlp", 3, 96, 100);
  check_identical("convnet", 4, 16, 100);
  pmap_optimizer sgd = pmap_sgd(0.005f, 0.0f), mom = pmap_sgd(0.01f, 0.9f), adam = pmap_adam(0.05f);
  check_linear_reference(&sgd, "SGD");
  check_linear_reference(&mom, "SGD momentum");
  check_linear_reference(&adam, "Adam");
  check_predict();
  check_batch_sizes();
  return test_exit("pmap");
}
