/* test_guard.c: the numeric guard (non-finite loss or gradients skip the step on every replica,
 * identically, naming the step and the devices), gradient clipping against a float64 reference,
 * NaN propagation, the fault hooks of PMAP_FAULT (each ends in its documented status with the
 * context still usable), and pmap_params_shrink. CPU backend. */
#include <time.h>

#include "pmap_examples.h"
#include "testutil.h"

typedef struct run {
  pmap_ctx *ctx;
  pmap_model *model;
  pmap_params *params;
  pmap_array xs, ys;
  size_t P;
} run;

static int run_open(run *r, const char *model, int n, double timeout, int guard,
                    const pmap_optimizer *opt, const char *fault) {
  memset(r, 0, sizeof *r);
  if (fault) setenv("PMAP_FAULT", fault, 1);
  pmap_config cfg = {
      .backend = PMAP_BACKEND_CPU, .num_devices = n, .timeout_s = timeout, .numeric_guard = guard};
  pmap_status st = pmap_ctx_create(&cfg, &r->ctx);
  unsetenv("PMAP_FAULT");
  CHECK(st == PMAP_SUCCESS, "ctx %s: %s", model, pmap_last_error());
  if (st) return -1;
  pmap_example_info info;
  CHECK_OK(pmap_example_info_get(model, &info));
  CHECK_OK(pmap_example_model(model, &r->model));
  CHECK_OK(pmap_example_data(model, 7, 96, &r->xs, &r->ys));
  st = pmap_params_create(r->ctx, r->model, opt ? opt : &info.opt, 3, &r->params);
  if (st) return -1;
  r->P = pmap_params_count(r->params);
  return 0;
}

static void run_close(run *r) {
  pmap_params_destroy(r->params);
  pmap_model_destroy(r->model);
  pmap_example_data_free(&r->xs, &r->ys);
  CHECK_OK(pmap_ctx_destroy(r->ctx));
}

/* Rows [b * 24, b * 24 + 24) of the data as a batch. */
static pmap_status step(run *r, int b, float *loss) {
  pmap_array x = r->xs, y = r->ys;
  size_t xrow = (size_t)(pmap_array_numel(&r->xs) / r->xs.shape[0]);
  size_t yrow = (size_t)(pmap_array_numel(&r->ys) / r->ys.shape[0]);
  x.data = (float *)r->xs.data + (size_t)b * 24 * xrow;
  y.data = (char *)r->ys.data + (size_t)b * 24 * yrow * 4;
  x.shape[0] = y.shape[0] = 24;
  return pmap_update(r->params, &x, &y, loss);
}

static float *replica(run *r, int d) {
  float *w = malloc(r->P * sizeof *w);
  if (w && pmap_params_read(r->params, d, w, r->P)) {
    free(w);
    return NULL;
  }
  return w;
}

/* Every replica bitwise equal to want (P). */
static void check_replicas(run *r, const float *want, const char *what) {
  for (int d = 0; d < pmap_ctx_num_devices(r->ctx); d++) {
    float *w = replica(r, d);
    if (w) test_same_bits(what, w, want, r->P);
    free(w);
  }
}

/* ------------------------------------------------------------------------------------------ */

static void test_nan_input(int n, int guard) {
  run r;
  if (run_open(&r, "mlp", n, 0.0, guard, NULL, NULL)) return;
  float loss = 0.0f;
  CHECK_OK(step(&r, 0, &loss));
  float *before = replica(&r, 0);
  /* A NaN in the last device's first row of batch 1. */
  int victim = n - 1;
  float *x = (float *)r.xs.data + (size_t)(24 + victim * (24 / n)) * 10;
  float saved = x[3];
  x[3] = NAN;
  float kept = 123.0f;
  pmap_status st = step(&r, 1, &kept);
  if (guard == PMAP_GUARD_ON) {
    char dev[32];
    snprintf(dev, sizeof dev, "device %d ", victim);
    CHECK(st == PMAP_ERR_NUMERIC, "N %d: NaN input -> %s", n, pmap_status_string(st));
    /* The second update is step 2 (steps count from 1, as pmap_params_step does). */
    CHECK(strstr(pmap_last_error(), "pmap_update: step 2: ") && strstr(pmap_last_error(), dev),
          "N %d: message \"%s\" lacks the step or %s", n, pmap_last_error(), dev);
    CHECK(kept == 123.0f, "N %d: the loss was written on a failed step", n);
    CHECK(pmap_params_step(r.params) == 1, "N %d: step count %lld", n,
          (long long)pmap_params_step(r.params));
    if (before) check_replicas(&r, before, "parameters after a skipped step");
    /* The optimizer state is unchanged too: batch 1 clean now equals a run that never saw the
     * NaN, bitwise. */
    x[3] = saved;
    CHECK_OK(step(&r, 1, &loss));
    run ref;
    if (!run_open(&ref, "mlp", n, 0.0, guard, NULL, NULL)) {
      CHECK_OK(step(&ref, 0, &loss));
      CHECK_OK(step(&ref, 1, &loss));
      float *want = replica(&ref, 0);
      if (want) check_replicas(&r, want, "skip then retry == never failed");
      free(want);
      run_close(&ref);
    }
  } else {
    CHECK_OK(st);
    CHECK(!isfinite(kept), "N %d: guard off, NaN input gave a finite loss %g", n, (double)kept);
    float *after = replica(&r, 0);
    size_t bad = 0;
    for (size_t i = 0; after && i < r.P; i++) bad += !isfinite(after[i]);
    CHECK(bad > 0, "N %d: guard off, no parameter became non-finite", n);
    free(after);
    x[3] = saved;
  }
  free(before);
  run_close(&r);
}

static void test_huge_lr(void) {
  pmap_optimizer sgd = pmap_sgd(1e30f, 0.0f);
  run r;
  if (run_open(&r, "linear", 2, 0.0, PMAP_GUARD_ON, &sgd, NULL)) return;
  pmap_status st = PMAP_SUCCESS;
  int s = 0;
  for (; s < 50 && st == PMAP_SUCCESS; s++) st = step(&r, s % 4, NULL);
  CHECK(st == PMAP_ERR_NUMERIC, "lr 1e30: %s after %d steps", pmap_status_string(st), s);
  float *w = replica(&r, 1);
  for (size_t i = 0; w && i < r.P; i++)
    CHECK(isfinite(w[i]), "lr 1e30: parameter %zu is %g after the guard stopped", i, (double)w[i]);
  free(w);
  run_close(&r);
}

/* y = w x + b, MSE, one step of SGD with clipping, against the gradient in double. */
static void test_clip_reference(int n) {
  const float lr = 0.1f, clip = 0.05f;
  pmap_optimizer sgd = pmap_sgd(lr, 0.0f);
  sgd.clip_norm = clip;
  run r;
  if (run_open(&r, "linear", n, 0.0, PMAP_GUARD_ON, &sgd, NULL)) return;
  float *w0 = replica(&r, 0);
  CHECK_OK(step(&r, 0, NULL));
  float *w1 = replica(&r, 0);
  if (w0 && w1) {
    const float *x = r.xs.data, *y = r.ys.data;
    double gw = 0.0, gb = 0.0;
    for (int i = 0; i < 24; i++) {
      double e = (double)w0[0] * x[i] + w0[1] - y[i];
      gw += 2.0 * e * x[i] / 24.0;
      gb += 2.0 * e / 24.0;
    }
    double norm = sqrt(gw * gw + gb * gb), s = norm > clip ? clip / norm : 1.0;
    double want[2] = {w0[0] - lr * s * gw, w0[1] - lr * s * gb};
    CHECK(norm > 2 * clip, "the test's gradient norm %g does not exceed the clip", norm);
    char what[64];
    snprintf(what, sizeof what, "clipped SGD step, N %d", n);
    double dw[2] = {w1[0] - (double)w0[0], w1[1] - (double)w0[1]};
    double dref[2] = {want[0] - w0[0], want[1] - w0[1]};
    float dwf[2] = {(float)dw[0], (float)dw[1]};
    test_close(what, dwf, dref, 2, 1e-4);
  }
  free(w0);
  free(w1);
  run_close(&r);
}

/* N devices with clipping and Adam equal 1 device. */
static void test_clip_devices(void) {
  pmap_example_info info;
  CHECK_OK(pmap_example_info_get("mlp", &info));
  pmap_optimizer adam = info.opt;
  adam.clip_norm = 0.5f;
  float *want = NULL;
  for (int n = 1; n <= 4; n *= 2) {
    run r;
    if (run_open(&r, "mlp", n, 0.0, PMAP_GUARD_ON, &adam, NULL)) return;
    for (int s = 0; s < 8; s++) CHECK_OK(step(&r, s % 4, NULL));
    float *w = replica(&r, n - 1);
    if (!want)
      want = w;
    else if (w) {
      test_close_f("clipped Adam, N devices vs 1", w, want, r.P, 1e-5);
      free(w);
    }
    run_close(&r);
  }
  free(want);
}

/* ------------------------------------------------------------------------------------------ */
/* Fault injection                                                                            */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_fault_alloc(void) {
  setenv("PMAP_FAULT", "alloc:device=1", 1);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 3};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  unsetenv("PMAP_FAULT");
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  CHECK_OK(pmap_example_model("mlp", &m));
  pmap_optimizer adam = pmap_adam(1e-3f);
  CHECK_FAILS(pmap_params_create(ctx, m, &adam, 1, &p), PMAP_ERR_OUT_OF_MEMORY, "device 1");
  CHECK(p == NULL, "params handed out after a failure");
  CHECK_OK(pmap_params_create(ctx, m, &adam, 1, &p)); /* fired once: usable again */
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  CHECK_OK(pmap_ctx_destroy(ctx));

  /* An allocation of the first step (the activations) fails: the step fails, nothing changes. */
  run r;
  if (run_open(&r, "convnet", 2, 0.0, PMAP_GUARD_ON, NULL, "alloc:device=1:after=3")) return;
  float *before = replica(&r, 1);
  CHECK_FAILS(step(&r, 0, NULL), PMAP_ERR_OUT_OF_MEMORY, "injected");
  CHECK(!strncmp(pmap_last_error(), "pmap_update: device 1: ", 23),
        "the message does not start with the call and the device: %s", pmap_last_error());
  if (before) check_replicas(&r, before, "after a failed allocation");
  CHECK_OK(step(&r, 0, NULL));
  free(before);
  run_close(&r);
}

static void test_fault_collective(void) {
  run r;
  if (run_open(&r, "mlp", 4, 0.0, PMAP_GUARD_ON, NULL, "collective:device=2:step=2")) return;
  CHECK_OK(step(&r, 0, NULL));
  float *before = replica(&r, 0);
  CHECK_FAILS(step(&r, 1, NULL), PMAP_ERR_DEVICE, "the gradient all-reduce of step 2 failed");
  CHECK(pmap_params_step(r.params) == 1, "step count %lld", (long long)pmap_params_step(r.params));
  if (before) check_replicas(&r, before, "after a failed all-reduce");
  CHECK_OK(step(&r, 1, NULL));
  free(before);
  run_close(&r);
}

static void test_fault_stall(void) {
  run r;
  const double timeout = 0.25;
  if (run_open(&r, "mlp", 3, timeout, PMAP_GUARD_ON, NULL, "stall:device=1:step=1")) return;
  double t0 = now_s();
  CHECK_FAILS(step(&r, 0, NULL), PMAP_ERR_TIMEOUT, "within 0.250 s");
  double secs = now_s() - t0;
  CHECK(secs < 10 * timeout, "a stalled device kept the call %.2f s (timeout %.2f s)", secs,
        timeout);
  CHECK(pmap_params_step(r.params) == 0, "step count %lld", (long long)pmap_params_step(r.params));
  CHECK_OK(step(&r, 0, NULL));
  run_close(&r);
}

static void test_fault_nan(void) {
  run r, ref;
  if (run_open(&r, "mlp", 4, 0.0, PMAP_GUARD_ON, NULL, "nan:device=2:step=3")) return;
  if (run_open(&ref, "mlp", 4, 0.0, PMAP_GUARD_ON, NULL, NULL)) return;
  for (int b = 0; b < 4; b++) {
    if (b == 2)
      CHECK_FAILS(step(&r, b, NULL), PMAP_ERR_NUMERIC,
                  "step 3: the local loss or gradients of device 2 ");
    CHECK_OK(step(&r, b, NULL));
    CHECK_OK(step(&ref, b, NULL));
  }
  float *want = replica(&ref, 0);
  if (want) check_replicas(&r, want, "poisoned step skipped, then retried");
  free(want);
  run_close(&ref);
  run_close(&r);
}

static void test_fault_drift(void) {
  run r;
  if (run_open(&r, "linear", 3, 0.0, PMAP_GUARD_ON, NULL, "drift:device=1:step=2")) return;
  CHECK_OK(step(&r, 0, NULL));
  CHECK_OK(step(&r, 1, NULL));
  float *w0 = replica(&r, 0), *w1 = replica(&r, 1), *w2 = replica(&r, 2);
  if (w0 && w1 && w2) {
    CHECK(memcmp(w0, w1, r.P * sizeof *w0) != 0, "drift did not change device 1");
    test_same_bits("device 2 untouched by drift", w2, w0, r.P);
  }
  free(w0);
  free(w1);
  free(w2);
  run_close(&r);
  setenv("PMAP_FAULT", "melt:device=1", 1);
  pmap_ctx *ctx = NULL;
  CHECK_FAILS(pmap_ctx_create(NULL, &ctx), PMAP_ERR_INVALID_ARGUMENT, "melt");
  setenv("PMAP_FAULT", "nan:device=1:step=x", 1);
  CHECK_FAILS(pmap_ctx_create(NULL, &ctx), PMAP_ERR_INVALID_ARGUMENT, "step=x");
  setenv("PMAP_FAULT", "nan:device=1:step=0", 1); /* steps count from 1: it would never fire */
  CHECK_FAILS(pmap_ctx_create(NULL, &ctx), PMAP_ERR_INVALID_ARGUMENT, "steps count from 1");
  /* A device the context does not have: the fault would never fire. */
  setenv("PMAP_FAULT", "nan:device=7:step=1", 1);
  pmap_config two = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  CHECK_FAILS(pmap_ctx_create(&two, &ctx), PMAP_ERR_INVALID_ARGUMENT,
              "pmap_ctx_create: environment variable PMAP_FAULT names device 7");
  CHECK(ctx == NULL, "a failed create returned a context");
  unsetenv("PMAP_FAULT");
}

/* ------------------------------------------------------------------------------------------ */

static void test_shrink(void) {
  run a, b;
  if (run_open(&a, "convnet", 2, 0.0, PMAP_GUARD_ON, NULL, NULL)) return;
  if (run_open(&b, "convnet", 2, 0.0, PMAP_GUARD_ON, NULL, NULL)) return;
  for (int s = 0; s < 6; s++) {
    if (s == 3) CHECK_OK(pmap_params_shrink(a.params));
    CHECK_OK(step(&a, s % 4, NULL));
    CHECK_OK(step(&b, s % 4, NULL));
  }
  CHECK_OK(pmap_params_shrink(a.params));
  CHECK_OK(pmap_params_shrink(a.params));
  float *want = replica(&b, 0);
  if (want) check_replicas(&a, want, "shrink between steps changes nothing");
  free(want);
  CHECK_FAILS(pmap_params_shrink(NULL), PMAP_ERR_INVALID_ARGUMENT, "NULL");
  run_close(&a);
  run_close(&b);
}

typedef struct pmax_job {
  float out[PMAP_MAX_DEVICES];
} pmax_job;

static pmap_status pmax_fn(pmap_device *dev, void *arg) {
  pmax_job *j = arg;
  int d = pmap_axis_index(dev);
  float v = d == 1 ? NAN : (float)d;
  return pmap_pmax(dev, &v, &j->out[d], 1);
}

static void test_nan_collective(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 3};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  pmax_job j;
  CHECK_OK(pmap_run(ctx, pmax_fn, &j));
  for (int d = 0; d < 3; d++) CHECK(isnan(j.out[d]), "pmax with a NaN gave %g", (double)j.out[d]);
  pmap_ctx_destroy(ctx);
}

/* A clipping scale that underflows float, or an infinite norm with the guard off, is applied,
 * never taken for a skipped step: the step counts and the loss is this step's. */
static pmap_status big_grad(const pmap_grad_args *a, void *user) {
  float g = *(const float *)user;
  for (size_t i = 0; i < a->num_params; i++) a->grads[i] += a->scale * g;
  *a->loss = 42.0f;
  return PMAP_SUCCESS;
}

static void test_clip_extremes(void) {
  const struct {
    float g, clip;
    int guard;
  } cases[] = {{1e20f, 1e-30f, PMAP_GUARD_ON}, {INFINITY, 1.0f, PMAP_GUARD_OFF}};
  for (int c = 0; c < 2; c++) {
    pmap_config cfg = {
        .backend = PMAP_BACKEND_CPU, .num_devices = 2, .numeric_guard = cases[c].guard};
    pmap_ctx *ctx = NULL;
    pmap_params *p = NULL;
    pmap_optimizer sgd = pmap_sgd(1.0f, 0.0f);
    sgd.clip_norm = cases[c].clip;
    float init[2] = {1.0f, 1.0f}, w[2], xs[2] = {0}, loss = 7.0f;
    int64_t sh[1] = {2};
    pmap_array x = pmap_array_f32(xs, 1, sh);
    CHECK_OK(pmap_ctx_create(&cfg, &ctx));
    CHECK_OK(pmap_params_create_custom(ctx, 2, init, big_grad, (void *)&cases[c].g, &sgd, &p));
    CHECK_OK(pmap_update(p, &x, &x, &loss));
    CHECK(loss == 42.0f, "case %d: loss %g is not this step's", c, (double)loss);
    CHECK(pmap_params_step(p) == 1, "case %d: step count %lld", c, (long long)pmap_params_step(p));
    CHECK_OK(pmap_params_read(p, 1, w, 2));
    if (c == 0)
      CHECK(isfinite(w[0]), "clip 1e-30: w %g", (double)w[0]); /* a step of 1e-30: w stays */
    else
      CHECK(!isfinite(w[0]), "guard off, infinite gradient: w %g stayed finite", (double)w[0]);
    pmap_params_destroy(p);
    pmap_ctx_destroy(ctx);
  }
}

int main(void) {
  test_clip_extremes();
  for (int n = 1; n <= 4; n++) test_nan_input(n, PMAP_GUARD_ON);
  test_nan_input(2, PMAP_GUARD_OFF);
  test_huge_lr();
  test_clip_reference(1);
  test_clip_reference(4);
  test_clip_devices();
  test_fault_alloc();
  test_fault_collective();
  test_fault_stall();
  test_fault_nan();
  test_fault_drift();
  test_shrink();
  test_nan_collective();
  return test_exit("guard");
}
