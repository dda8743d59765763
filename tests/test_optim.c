/* test_optim.c: the optimizers (SGD with L2 weight decay and Nesterov, Adam, AdamW) and the
 * learning-rate schedules step by step against a float64 reference through pmap_update; the
 * validation of their settings; micro-batches and uneven global batches on the example models
 * against the unsplit step and one device. CPU backend. Prints what it measures beside the
 * bounds argued from the arithmetic (tests/bounds.h). */
#include <unistd.h>

#include "bounds.h"
#include "pmap_examples.h"
#include "testutil.h"

enum { P = 37 };

/* A quadratic loss 0.5 |w - c|^2 whose gradient is w - c, as a custom gradient function: the
 * reference then needs only the optimizer's formulas. */
static float target(size_t i) { return (float)((int)(i % 7) - 3) * 0.25f; }

static pmap_status quad_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  double loss = 0.0;
  for (size_t i = 0; i < a->num_params; i++) {
    float e = a->params[i] - target(i);
    a->grads[i] += a->scale * e;
    loss += 0.5 * (double)e * e;
  }
  *a->loss = (float)loss;
  return PMAP_SUCCESS;
}

/* The optimizer in double: one step t >= 1 of o on w with gradient w - c. */
static void ref_step(const pmap_optimizer *o, int64_t t, double *w, double *v, double *m) {
  double lr = pmap_optimizer_lr(o, t);
  for (size_t i = 0; i < P; i++) {
    double g = w[i] - target(i);
    if (o->kind == PMAP_OPT_SGD) {
      g += o->weight_decay * w[i];
      if (o->momentum != 0.0f) {
        v[i] = o->momentum * v[i] + g;
        g = o->nesterov ? g + o->momentum * v[i] : v[i];
      }
      w[i] -= lr * g;
    } else {
      double decay = o->kind == PMAP_OPT_ADAMW ? lr * o->weight_decay * w[i] : 0.0;
      m[i] = o->beta1 * m[i] + (1.0 - o->beta1) * g;
      v[i] = o->beta2 * v[i] + (1.0 - o->beta2) * g * g;
      double mh = m[i] / (1.0 - pow(o->beta1, (double)t));
      double vh = v[i] / (1.0 - pow(o->beta2, (double)t));
      w[i] -= lr * mh / (sqrt(vh) + o->eps) + decay;
    }
  }
}

static void run_reference(const char *name, const pmap_optimizer *o, int n) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  float init[P], w[P], dummy[12] = {0};
  double wd[P], vd[P] = {0}, md[P] = {0};
  uint64_t s = 17;
  test_fill(init, P, &s, -2.0f, 2.0f);
  for (size_t i = 0; i < P; i++) wd[i] = init[i];
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_params_create_custom(ctx, P, init, quad_grad, NULL, o, &p));
  if (!p) return;
  int64_t shape[1] = {12};
  pmap_array xs = pmap_array_f32(dummy, 1, shape);
  /* Every operation is element by element; each step rounds an element's path R times: the
   * gradient w - c, its share and the all-reduce's n - 1 additions and mean (n + 2); SGD's
   * decay, velocity, Nesterov term, lr g and the subtraction (8) and lr (1); Adam's moments (7),
   * bias corrections, sqrt, eps, quotient, lr, decay and subtractions (10) and its float lr, bc1
   * and bc2 (3). Each rounding errs by at most u of a value no larger than the element's scale
   * (the quadratic contracts; Adam's step is lr-sized), of random sign: after t steps the
   * parameters stand within lambda u sqrt(R t) of float64 (tests/bounds.h's random walk). */
  double R = (double)(n + 2) + (o->kind == PMAP_OPT_SGD ? 9.0 : 20.0), worst = 0, at[2] = {0, 1};
  char what[128];
  for (int64_t t = 1; t <= 12; t++) {
    CHECK_OK(pmap_update(p, &xs, &xs, NULL));
    ref_step(o, t, wd, vd, md);
    CHECK_OK(pmap_params_read(p, n - 1, w, P));
    double bound = BOUND_LAMBDA * BOUND_U32 * sqrt(R * (double)t), num = 0, den = 0;
    snprintf(what, sizeof what, "%s on %d devices, step %lld", name, n, (long long)t);
    test_close(what, w, wd, P, bound);
    for (size_t i = 0; i < P; i++) num += (w[i] - wd[i]) * (w[i] - wd[i]), den += wd[i] * wd[i];
    double e = sqrt(num / den);
    if (e / bound > worst) worst = e / bound, at[0] = e, at[1] = bound;
  }
  printf("%-31s on %d devices vs float64, 12 steps: %.2e (bound %.2e)\n", name, n, at[0], at[1]);
  pmap_params_destroy(p);
  pmap_ctx_destroy(ctx);
}

static void test_optimizers(void) {
  pmap_optimizer sgd_wd = pmap_sgd(0.1f, 0.0f), nesterov = pmap_sgd(0.05f, 0.9f);
  sgd_wd.weight_decay = 0.01f;
  nesterov.nesterov = 1;
  nesterov.weight_decay = 0.001f;
  pmap_optimizer adam = pmap_adam(0.05f), adamw = pmap_adamw(0.05f, 0.1f);
  pmap_optimizer cosine = pmap_adamw(0.1f, 0.01f), linear = pmap_sgd(0.2f, 0.5f);
  cosine.schedule = PMAP_SCHEDULE_WARMUP_COSINE;
  cosine.warmup_steps = 3;
  cosine.decay_steps = 6;
  cosine.final_lr = 0.01f;
  linear.schedule = PMAP_SCHEDULE_WARMUP_LINEAR;
  linear.warmup_steps = 2;
  linear.decay_steps = 5;
  for (int n = 1; n <= 3; n += 2) {
    run_reference("SGD + weight decay", &sgd_wd, n);
    run_reference("SGD Nesterov + weight decay", &nesterov, n);
    run_reference("Adam", &adam, n);
    run_reference("AdamW", &adamw, n);
    run_reference("AdamW, warm-up + cosine", &cosine, n);
    run_reference("SGD momentum, warm-up + linear", &linear, n);
  }
}

static void test_schedule_values(void) {
  pmap_optimizer o = pmap_sgd(1.0f, 0.0f);
  o.schedule = PMAP_SCHEDULE_WARMUP_COSINE;
  o.warmup_steps = 4;
  o.decay_steps = 10;
  o.final_lr = 0.1f;
  const struct {
    int64_t t;
    double want;
  } cos_cases[] = {{1, 0.25}, {4, 1.0}, {9, 0.55}, {14, 0.1f}, {100, 0.1f}};
  for (size_t i = 0; i < sizeof cos_cases / sizeof *cos_cases; i++)
    CHECK(fabs(pmap_optimizer_lr(&o, cos_cases[i].t) - cos_cases[i].want) < 1e-6,
          "cosine lr at %lld: %g, want %g", (long long)cos_cases[i].t,
          pmap_optimizer_lr(&o, cos_cases[i].t), cos_cases[i].want);
  o.schedule = PMAP_SCHEDULE_WARMUP_LINEAR;
  CHECK(fabs(pmap_optimizer_lr(&o, 9) - (1.0 - 0.9 * 0.5)) < 1e-6, "linear lr at 9: %g",
        pmap_optimizer_lr(&o, 9));
  o.schedule = PMAP_SCHEDULE_CONSTANT;
  CHECK(pmap_optimizer_lr(&o, 9) == 1.0, "constant lr %g", pmap_optimizer_lr(&o, 9));
}

static void test_validation(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_example_model("linear", &m));
  pmap_optimizer o = pmap_adam(0.1f);
  o.weight_decay = 0.1f;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "ADAMW");
  o = pmap_sgd(0.1f, 0.0f);
  o.nesterov = 1;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "nesterov 1");
  o = pmap_sgd(0.1f, 0.5f);
  o.schedule = PMAP_SCHEDULE_WARMUP_COSINE;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "decay 0 steps");
  o.decay_steps = 10;
  o.final_lr = 0.5f;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "final lr 0.5");
  o = pmap_sgd(0.1f, 0.0f); /* a negative warm-up, whatever the schedule */
  o.warmup_steps = -1;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "warmup_steps -1");
  o.schedule = PMAP_SCHEDULE_WARMUP_LINEAR;
  o.decay_steps = 10;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "warmup_steps -1");
  o = pmap_sgd(0.1f, 0.0f);
  o.weight_decay = -1.0f;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "weight_decay -1");
  o = pmap_sgd(0.1f, 0.0f);
  o.clip_norm = NAN;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "clip_norm nan");
  o.clip_norm = 0.0f;
  o.kind = (pmap_optimizer_kind)9;
  CHECK_FAILS(pmap_params_create(ctx, m, &o, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "kind 9");
  o = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_params_create(ctx, m, &o, 1, &p));
  CHECK_FAILS(pmap_params_set_micro_batches(p, 0), PMAP_ERR_INVALID_ARGUMENT, "0 micro-batches");
  CHECK_FAILS(pmap_params_set_micro_batches(NULL, 2), PMAP_ERR_INVALID_ARGUMENT, "NULL");
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  pmap_config bad = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .uneven_batches = 2};
  CHECK_FAILS(pmap_ctx_create(&bad, &ctx), PMAP_ERR_INVALID_ARGUMENT, "uneven_batches 2");
}

/* ------------------------------------------------------------------------------------------ */
/* Micro-batches and uneven batches on the example models                                     */

typedef struct result {
  float *w, loss, *pred;
  size_t P;
  double size; /* 2 max|z| or 2 rms(y) of the outputs of the last loss (loss_scale) */
  int labels;
} result;

/* Losses compare relative to bound_loss_scale (tests/bounds.h): the outputs' size bounds how
 * much a loss near 0 moves. */

static result train_example(const char *name, int n, int64_t rows, int micro, int uneven) {
  result out = {NULL, 0.0f, NULL, 0, 0.0, 0};
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n, .uneven_batches = uneven};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_array xs = {0}, ys = {0};
  pmap_example_info info;
  CHECK_OK(pmap_example_info_get(name, &info));
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_example_model(name, &m));
  CHECK_OK(pmap_params_create(ctx, m, &info.opt, 5, &p));
  CHECK_OK(pmap_example_data(name, 6, rows, &xs, &ys));
  int rank;
  int64_t shape[PMAP_MAX_RANK];
  if (m) pmap_model_output_shape(m, &rank, shape);
  int64_t oshape[2] = {rows, m ? shape[0] : 0};
  size_t k = (size_t)(rows * oshape[1]);
  out.pred = malloc((k ? k : 1) * sizeof *out.pred);
  pmap_array o = pmap_array_f32(out.pred, 2, oshape);
  out.labels = ys.dtype != PMAP_F32;
  if (p && xs.data && out.pred) {
    CHECK_OK(pmap_params_set_micro_batches(p, micro));
    for (int s = 0; s < 20; s++) {
      if (s == 19) { /* the outputs at the last loss's parameters */
        CHECK_OK(pmap_predict(p, &xs, &o));
        out.size = bound_output_size(out.pred, k, out.labels);
      }
      CHECK_OK(pmap_update(p, &xs, &ys, &out.loss));
    }
    out.P = pmap_params_count(p);
    out.w = malloc(out.P * sizeof *out.w);
    if (out.w) CHECK_OK(pmap_params_read(p, n - 1, out.w, out.P));
    CHECK_OK(pmap_predict(p, &xs, &o));
  }
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return out;
}

/* Micro-batches and device counts sum the same rows' gradients in other orders (each
 * micro-batch's share scaled, the pieces accumulated, the devices all-reduced): the parameters,
 * the predictions at them and the last loss (relative to max(L, S / kappa)) within
 * bound_order32(model, rows, 20) of the unsplit run on 1 device (tests/bounds.h). */
static void compare(const char *name, const char *what, result *got, const result *want,
                    int64_t rows, int64_t k) {
  char buf[160];
  const bound_model *bm = bound_model_of(name);
  double bound = bm ? bound_order32(bm, (double)rows, 20) : 0.0;
  CHECK(bm != NULL, "%s: no bound", name);
  if (got->w && want->w && got->pred && want->pred) {
    double ew = test_rel_err(got->w, want->w, want->P);
    double el = fabs((double)got->loss - want->loss) /
                bound_loss_scale(want->loss, want->size, want->labels, bm ? bm->kappa : 1.0);
    double ep = test_rel_err(got->pred, want->pred, (size_t)(rows * k));
    printf("%-54s parameters %.2e, loss %.2e, predictions %.2e (bound %.2e)\n", what, ew, el, ep,
           bound);
    snprintf(buf, sizeof buf, "%s: parameters", what);
    test_close_f(buf, got->w, want->w, want->P, bound);
    CHECK(el <= bound, "%s: loss %.9g vs %.9g: %.3g > %.3g", what, (double)got->loss,
          (double)want->loss, el, bound);
    snprintf(buf, sizeof buf, "%s: predictions", what);
    test_close_f(buf, got->pred, want->pred, (size_t)(rows * k), bound);
  } else {
    CHECK(0, "%s: a run failed", what);
  }
  free(got->w);
  free(got->pred);
}

static void test_micro_and_uneven(void) {
  const char *models[] = {"mlp", "convnet"};
  const int64_t k[] = {1, 2};
  char what[128];
  for (int mi = 0; mi < 2; mi++) {
    const char *name = models[mi];
    result one = train_example(name, 1, 24, 1, 0);
    const struct { int n, micro; } even[] = {{1, 3}, {1, 24}, {2, 4}, {3, 2}, {4, 7}};
    for (size_t c = 0; c < sizeof even / sizeof *even; c++) {
      result got = train_example(name, even[c].n, 24, even[c].micro, 0);
      snprintf(what, sizeof what, "%s, %d devices, %d micro-batches vs 1 device", name, even[c].n,
               even[c].micro);
      compare(name, what, &got, &one, 24, k[mi]);
    }
    free(one.w);
    free(one.pred);
    result ref = train_example(name, 1, 22, 1, 0);
    for (int n = 2; n <= 4; n++)
      for (int micro = 1; micro <= 2; micro++) {
        result got = train_example(name, n, 22, micro, 1);
        snprintf(what, sizeof what, "%s, 22 rows on %d devices (uneven), %d micro vs 1 device",
                 name, n, micro);
        compare(name, what, &got, &ref, 22, k[mi]);
      }
    free(ref.w);
    free(ref.pred);
  }
  /* Without the opt-in, the clear error stays. */
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 4};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_array xs = {0}, ys = {0};
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_example_model("mlp", &m));
  CHECK_OK(pmap_params_create(ctx, m, &sgd, 5, &p));
  CHECK_OK(pmap_example_data("mlp", 6, 22, &xs, &ys));
  CHECK_FAILS(pmap_update(p, &xs, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT, "uneven_batches");
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  cfg.uneven_batches = 1;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_example_model("mlp", &m));
  CHECK_OK(pmap_params_create(ctx, m, &sgd, 5, &p));
  CHECK_OK(pmap_example_data("mlp", 6, 3, &xs, &ys));
  CHECK_FAILS(pmap_update(p, &xs, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT, "smaller than the 4");
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

/* AdamW state round-trips through a checkpoint, and is not taken for Adam's or SGD's. */
static void test_adamw_checkpoint(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  pmap_params *a = NULL, *b = NULL, *c = NULL;
  float init[P], wa[P], wb[P], dummy[12] = {0};
  uint64_t s = 5;
  test_fill(init, P, &s, -1.0f, 1.0f);
  pmap_optimizer adamw = pmap_adamw(0.05f, 0.1f), adam = pmap_adam(0.05f);
  char path[] = "/tmp/pmap-test-adamw-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  if (fd >= 0) close(fd);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_params_create_custom(ctx, P, init, quad_grad, NULL, &adamw, &a));
  CHECK_OK(pmap_params_create_custom(ctx, P, init, quad_grad, NULL, &adamw, &b));
  CHECK_OK(pmap_params_create_custom(ctx, P, init, quad_grad, NULL, &adam, &c));
  int64_t shape[1] = {12};
  pmap_array xs = pmap_array_f32(dummy, 1, shape);
  for (int i = 0; i < 3; i++) CHECK_OK(pmap_update(a, &xs, &xs, NULL));
  CHECK_OK(pmap_params_save(a, path));
  CHECK_FAILS(pmap_params_load(c, path), PMAP_ERR_INVALID_ARGUMENT, "AdamW");
  CHECK_OK(pmap_params_load(b, path));
  CHECK_OK(pmap_update(a, &xs, &xs, NULL));
  CHECK_OK(pmap_update(b, &xs, &xs, NULL));
  CHECK_OK(pmap_params_read(a, 1, wa, P));
  CHECK_OK(pmap_params_read(b, 1, wb, P));
  test_same_bits("AdamW: step 4 after a checkpoint at 3", wb, wa, P);
  remove(path);
  pmap_params_destroy(a);
  pmap_params_destroy(b);
  pmap_params_destroy(c);
  pmap_ctx_destroy(ctx);
}

int main(void) {
  test_adamw_checkpoint();
  test_optimizers();
  test_schedule_values();
  test_validation();
  test_micro_and_uneven();
  return test_exit("optim");
}
