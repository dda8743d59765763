/* test_guard.c: the numeric guard (non-finite loss or gradients skip the step on every replica,
 * identically, naming the step and the devices), gradient clipping against a float64 reference,
 * NaN propagation, the fault hooks of PMAP_FAULT (each ends in its documented status with the
 * context still usable), and pmap_params_shrink. CPU backend. */
#include <time.h>

#include "bounds.h"
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
    /* The float step lr s g: the gradient within q = bound_order32(linear, 24, 1) of the exact
     * one (a float sum errs from the exact one less than two orders differ), its direction
     * g / |g| within 2 q, and a few roundings (the norm's, s, lr s g: 8 u); w1 = fl(w0 - step)
     * then errs by u |w1| per element, dw = w1 - w0 being exact in double. */
    double q = bound_order32(bound_model_of("linear"), 24, 1);
    double bound =
        2.0 * q + 8.0 * BOUND_U32 + BOUND_U32 * hypot(w1[0], w1[1]) / hypot(dref[0], dref[1]);
    double e = hypot(dw[0] - dref[0], dw[1] - dref[1]) / hypot(dref[0], dref[1]);
    printf("clipped SGD step on %d devices vs float64: %.2e (bound %.2e)\n", n, e, bound);
    test_close(what, dwf, dref, 2, bound);
  }
  free(w0);
  free(w1);
  run_close(&r);
}

/* N devices with clipping and Adam equal 1 device, within the bound of 8 steps summed in another
 * order: mlp's path (tests/bounds.h) and the clipping norm's sum over every gradient element,
 * which scales each of them. */
static void test_clip_devices(void) {
  pmap_example_info info;
  CHECK_OK(pmap_example_info_get("mlp", &info));
  pmap_optimizer adam = info.opt;
  adam.clip_norm = 0.5f;
  float *want = NULL;
  double bound = 0.0;
  for (int n = 1; n <= 4; n *= 2) {
    run r;
    if (run_open(&r, "mlp", n, 0.0, PMAP_GUARD_ON, &adam, NULL)) return;
    for (int s = 0; s < 8; s++) CHECK_OK(step(&r, s % 4, NULL));
    float *w = replica(&r, n - 1);
    if (!want) {
      bound_model path = *bound_model_of("mlp");
      path.k_path += (double)r.P;
      bound = bound_order32(&path, 24, 8);
      want = w;
    } else if (w) {
      printf("clipped Adam on %d devices vs 1: %.2e (bound %.2e)\n", n, test_rel_err(w, want, r.P),
             bound);
      test_close_f("clipped Adam, N devices vs 1", w, want, r.P, bound);
      free(w);
    }
    run_close(&r);
  }
  free(want);
}

/* Clipping scales by the norm summed from the parts' norms (one part per device), so the parts
 * must not depend on the guard: with the guard on and off, the same clipped steps give the same
 * bits. Sizes around where the guard's N flags would move the parts' boundaries, on 3 and 4
 * devices, gradients of a function of the step, the device and the index. */
typedef struct wavy {
  int64_t step;
} wavy;

static pmap_status wavy_grad(const pmap_grad_args *a, void *user) {
  wavy *w = user;
  uint64_t key = (uint64_t)w->step * 7919u + (uint64_t)pmap_axis_index(a->dev) * 104729u;
  for (size_t i = 0; i < a->num_params; i++) {
    uint64_t z = (key + i) * 0x9e3779b97f4a7c15ull;
    z ^= z >> 29;
    a->grads[i] += a->scale * ((float)(z % 2001u) / 1000.0f - 1.0f);
  }
  *a->loss = 1.0f;
  return PMAP_SUCCESS;
}

/* Flags name devices and do not decide: device 1's own gradient of three values 2.5e38 has a
 * norm past FLT_MAX (4.3e38), their mean over 4 devices (6.25e37 each, norm 1.1e38) is finite,
 * so the step is taken, with a gradient function (whose flags are computed every step) as with a
 * built-in model (whose are not). */
static pmap_status own_huge_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  for (size_t i = 0; i < a->num_params; i++)
    a->grads[i] += pmap_axis_index(a->dev) == 1 && i < 3 ? 2.5e38f : 0.0f;
  *a->loss = 1.0f;
  return PMAP_SUCCESS;
}

static void test_own_norm_past_max(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 4};
  pmap_optimizer opt = pmap_sgd(1e-36f, 0.0f);
  float init[5] = {0}, xs[4] = {0}, w[5];
  int64_t sh[1] = {4};
  pmap_array x = pmap_array_f32(xs, 1, sh);
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_params_create_custom(ctx, 5, init, own_huge_grad, NULL, &opt, &p));
  CHECK(pmap_update(p, &x, &x, NULL) == PMAP_SUCCESS && pmap_params_step(p) == 1,
        "a device's own norm past FLT_MAX with a finite mean: %s", pmap_last_error());
  CHECK_OK(pmap_params_read(p, 0, w, 5));
  /* w = -lr 6.25e37 = -62.5 within three roundings of 2^-24 (the floats 2.5e38 and 1e-36, their
   * product; the mean's division by 4 is exact): 1.8e-7 relative, held to 1e-6. */
  CHECK(fabsf(w[0] + 62.5f) < 62.5f * 1e-6f && w[3] == 0.0f, "w %g %g", (double)w[0], (double)w[3]);
  pmap_params_destroy(p);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

static void test_clip_guard_off(void) {
  for (int n = 3; n <= 4; n++)
    for (size_t P = 184; P <= 192; P++) {
      float *w[2] = {malloc(P * sizeof(float)), malloc(P * sizeof(float))};
      for (int guard = 0; guard < 2 && w[0] && w[1]; guard++) {
        pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                           .num_devices = n,
                           .numeric_guard = guard ? PMAP_GUARD_ON : PMAP_GUARD_OFF,
                           .shard_optimizer = PMAP_SHARD_OFF};
        pmap_optimizer opt = pmap_sgd(1.0f, 0.9f);
        opt.clip_norm = 1e-3f;
        float *init = calloc(P, sizeof *init), xs[12] = {0};
        int64_t sh[1] = {12};
        pmap_array x = pmap_array_f32(xs, 1, sh);
        pmap_ctx *ctx = NULL;
        pmap_params *p = NULL;
        wavy wv = {0};
        CHECK_OK(pmap_ctx_create(&cfg, &ctx));
        CHECK_OK(pmap_params_create_custom(ctx, (int64_t)P, init, wavy_grad, &wv, &opt, &p));
        for (wv.step = 0; wv.step < 6 && p; wv.step++) CHECK_OK(pmap_update(p, &x, &x, NULL));
        if (p) CHECK_OK(pmap_params_read(p, n - 1, w[guard], P));
        pmap_params_destroy(p);
        CHECK_OK(pmap_ctx_destroy(ctx));
        free(init);
      }
      if (w[0] && w[1])
        CHECK(!memcmp(w[0], w[1], P * sizeof(float)),
              "%d devices, %zu parameters: clipped steps differ with the guard on and off", n, P);
      free(w[0]), free(w[1]);
    }
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
  /* What would be ignored without a word: a key twice, after= where the kind fires once,
   * step= on alloc (it counts allocations). */
  static const char *const ignored[][2] = {
      {"nan:device=1:step=2:step=3", "gives step= twice"},
      {"alloc:device=0:device=1", "gives device= twice"},
      {"collective:device=1:after=2", "after=A is for alloc"},
      {"stall:step=2:after=0", "a stall fault fires once"},
      {"alloc:device=1:step=2", "counts allocations, not steps"},
  };
  for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) {
    setenv("PMAP_FAULT", ignored[i][0], 1);
    CHECK_FAILS(pmap_ctx_create(&two, &ctx), PMAP_ERR_INVALID_ARGUMENT, ignored[i][1]);
  }
  /* gather fires only in a sharded optimizer's all-gather: refused where none can be (one
   * device, sharding off), and for params whose optimizer is replicated. */
  setenv("PMAP_FAULT", "gather:device=0:step=2", 1);
  pmap_config one = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  CHECK_FAILS(pmap_ctx_create(&one, &ctx), PMAP_ERR_INVALID_ARGUMENT,
              "never shards one (one device)");
  pmap_config off = {
      .backend = PMAP_BACKEND_CPU, .num_devices = 2, .shard_optimizer = PMAP_SHARD_OFF};
  CHECK_FAILS(pmap_ctx_create(&off, &ctx), PMAP_ERR_INVALID_ARGUMENT, "PMAP_SHARD_OFF");
  pmap_model *m = NULL;
  CHECK_OK(pmap_example_model("linear", &m));
  pmap_optimizer adam = pmap_adam(0.01f);
  for (int shard = PMAP_SHARD_AUTO; m && shard <= PMAP_SHARD_ON; shard += PMAP_SHARD_ON) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .shard_optimizer = shard};
    pmap_params *p = NULL;
    CHECK_OK(pmap_ctx_create(&cfg, &ctx));
    if (!ctx) continue;
    if (shard == PMAP_SHARD_AUTO) /* 2 parameters: replicated */
      CHECK_FAILS(pmap_params_create(ctx, m, &adam, 0, &p), PMAP_ERR_INVALID_ARGUMENT,
                  "optimizer state is replicated (2 parameters");
    else
      CHECK_OK(pmap_params_create(ctx, m, &adam, 0, &p));
    pmap_params_destroy(p);
    CHECK_OK(pmap_ctx_destroy(ctx));
    ctx = NULL;
  }
  pmap_model_destroy(m);
  unsetenv("PMAP_FAULT");
}

/* ------------------------------------------------------------------------------------------ */
/* Layers that exchange values between devices (batch norm per device, whose running statistics
 * come from every device's rows, and across devices): non-finite values in some devices' rows
 * reach every device's loss through the exchange, and the guard names the devices they came
 * from, and says the others only received them. */

typedef struct bn_case {
  int cross, image, n, shard, micro;
} bn_case;

/* x (rows, 6) or (rows, 2, 3, 3) -> batch norm -> relu -> flatten -> dense 3, softmax. */
static int bn_open(run *r, const bn_case *k) {
  memset(r, 0, sizeof *r);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = k->n,
                     .shard_optimizer = k->shard ? PMAP_SHARD_ON : PMAP_SHARD_OFF};
  int64_t flat[1] = {6}, image[3] = {2, 3, 3};
  CHECK_OK(pmap_ctx_create(&cfg, &r->ctx));
  CHECK_OK(pmap_model_create(k->image ? 3 : 1, k->image ? image : flat, &r->model));
  if (!r->ctx || !r->model) return -1;
  CHECK_OK(pmap_model_add_batchnorm(r->model, k->cross));
  CHECK_OK(pmap_model_add_relu(r->model));
  if (k->image) CHECK_OK(pmap_model_add_flatten(r->model));
  CHECK_OK(pmap_model_add_dense(r->model, 3));
  CHECK_OK(pmap_model_set_loss(r->model, PMAP_LOSS_SOFTMAX_XENT));
  pmap_optimizer opt = pmap_sgd(0.1f, 0.9f);
  CHECK_OK(pmap_params_create(r->ctx, r->model, &opt, 5, &r->params));
  if (!r->params) return -1;
  CHECK_OK(pmap_params_set_micro_batches(r->params, k->micro));
  r->P = pmap_params_count(r->params);
  return 0;
}

/* One step of 4 rows per device (features per row f), with what `poison` puts into them;
 * returns the status and leaves the message. */
static pmap_status bn_step(run *r, const bn_case *k,
                           void (*poison)(float *x, int n, int f, int arg), int arg) {
  enum { F = 18, ROWS = 4 * 4 };
  int f = k->image ? F : 6, rows = 4 * k->n;
  float x[ROWS * F];
  int32_t y[ROWS];
  for (int i = 0; i < rows * f; i++) x[i] = (float)((i * 7) % 11) / 11.0f - 0.4f;
  for (int i = 0; i < rows; i++) y[i] = i % 3;
  if (poison) poison(x, k->n, f, arg);
  int64_t xs_shape[4] = {rows, 2, 3, 3}, flat[2] = {rows, 6}, ys_shape[1] = {rows};
  pmap_array xs = pmap_array_f32(x, k->image ? 4 : 2, k->image ? xs_shape : flat);
  pmap_array ys = pmap_array_i32(y, 1, ys_shape);
  return pmap_update(r->params, &xs, &ys, NULL);
}

/* A NaN in one row of each device of the bit set `devices`. */
static void nan_rows(float *x, int n, int f, int devices) {
  for (int d = 0; d < n; d++)
    if (devices >> d & 1) x[(d * 4 + 1) * f + 2] = NAN;
}

/* The first row of every device 1.5e19 in feature 0: each device's sums of squares (2.25e38)
 * are finite, their sum across 2 or more devices is not. */
static void big_rows(float *x, int n, int f, int unused) {
  (void)unused;
  for (int d = 0; d < n; d++) x[d * 4 * f] = 1.5e19f;
}

/* "0, 2, 3": the devices of the bit set (of n). */
static void list_of(int set, int n, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int d = 0; d < n && len < size; d++)
    if (set >> d & 1) len += (size_t)snprintf(buf + len, size - len, "%s%d", len ? ", " : "", d);
}

static void bn_check(const bn_case *k, int victims, int overflow) {
  char what[160];
  snprintf(what, sizeof what, "batch norm %s%s on %d devices%s, %d micro-batches",
           k->cross ? "across devices" : "per device", k->image ? " (C, H, W)" : "", k->n,
           k->shard ? " sharded" : "", k->micro);
  run r;
  if (bn_open(&r, k)) {
    run_close(&r);
    return;
  }
  CHECK_OK(bn_step(&r, k, NULL, 0));
  float *before = replica(&r, 0);
  pmap_status st = overflow ? bn_step(&r, k, big_rows, 0) : bn_step(&r, k, nan_rows, victims);
  const char *msg = pmap_last_error();
  char own[64], got[64], want[400];
  int all = (1 << k->n) - 1, n_own = __builtin_popcount(victims);
  list_of(victims, k->n, own, sizeof own);
  list_of(all & ~victims, k->n, got, sizeof got);
  if (overflow)
    snprintf(want, sizeof want,
             "step 2: every device's own values were finite; their sums in a layer's exchange "
             "between the devices (such as batch norm's statistics) were not (overflow) (");
  else if (victims == all)
    snprintf(want, sizeof want,
             "step 2: the local loss or gradients of devices %s were non-finite (", own);
  else
    snprintf(want, sizeof want,
             "step 2: the local loss or gradients of device%s %s were non-finite; device%s %s "
             "only received non-finite values from %s in a layer's exchange",
             n_own > 1 ? "s" : "", own, k->n - n_own > 1 ? "s" : "", got,
             n_own > 1 ? "them" : "it");
  CHECK(st == PMAP_ERR_NUMERIC && strstr(msg, want),
        "%s, NaN rows on devices %s: %s, \"%s\"; want \"%s\"", what, own, pmap_status_string(st),
        msg, want);
  CHECK(pmap_params_step(r.params) == 1, "%s: the skipped step counted", what);
  if (before) check_replicas(&r, before, "after a skipped step whose source was searched");
  CHECK_OK(bn_step(&r, k, NULL, 0)); /* and the next clean step goes on */
  free(before);
  run_close(&r);
}

static void test_exchange_sources(void) {
  for (int cross = 0; cross < 2; cross++)
    for (int n = 2; n <= 4; n++)
      for (int v = 0; v < n; v++) {
        bn_case k = {cross, v == 1, n, n == 3, 1 + (v == 0)};
        bn_check(&k, 1 << v, 0);
      }
  for (int cross = 0; cross < 2; cross++) {
    bn_case four = {cross, 0, 4, 0, 2}, three = {cross, 1, 3, 1, 1};
    bn_check(&four, 1 << 0 | 1 << 3, 0); /* two sources */
    bn_check(&four, 15, 0);              /* every device a source */
    bn_check(&three, 0, 1);              /* no source: the exchange overflowed */
  }
}

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

/* Adam and AdamW with the guard on skip a step whose gradient norm passes PMAP_ADAM_NORM_MAX
 * (1e19), whose squares could overflow the second moment (and with it freeze the parameter for
 * good): PMAP_ERR_NUMERIC naming the norm and the device whose own gradient passes it, nothing
 * changed. Below the limit, with a clip that brings the gradient under it, with SGD and with
 * the guard off the step is taken. Replicated and sharded optimizers. */
typedef struct huge_grad {
  float g; /* every gradient element of device `who` (the others: 1) */
  int who;
} huge_grad;

static pmap_status huge_grad_fn(const pmap_grad_args *a, void *user) {
  const huge_grad *h = user;
  float g = pmap_axis_index(a->dev) == h->who ? h->g : 1.0f;
  for (size_t i = 0; i < a->num_params; i++) a->grads[i] += a->scale * g;
  *a->loss = 1.0f;
  return PMAP_SUCCESS;
}

/* Adam's first step of lr on a weight w0 against w0 - lr computed in float: lr m / (sqrt(v) +
 * eps) is lr within the roundings of m, v, their bias corrections, sqrt, the quotient, the
 * product and eps (below u for |g| >= 1): 8 u lr; the step's and AdamW's decay's subtractions
 * and the expected value's two round values below |w0| + lr by u of them each: 4 u (|w0| + lr). */
static double adam_step_bound(double w0, double lr) {
  return 8.0 * BOUND_U32 * lr + 4.0 * BOUND_U32 * (fabs(w0) + lr);
}

static void test_adam_norm(void) {
  const struct {
    float g, clip;
    int kind, guard, skipped;
  } cases[] = {
      {4e19f, 0.0f, PMAP_OPT_ADAM, PMAP_GUARD_ON, 1},  /* vhat = g^2 / 4 overflows in step 1 */
      {1e21f, 0.0f, PMAP_OPT_ADAMW, PMAP_GUARD_ON, 1}, /* the second moment itself overflows */
      {3e18f, 0.0f, PMAP_OPT_ADAM, PMAP_GUARD_ON, 0},  /* norm 3e18: under the limit */
      {1e21f, 10.0f, PMAP_OPT_ADAM, PMAP_GUARD_ON, 0}, /* clipped to 10 first */
      {1e21f, 0.0f, PMAP_OPT_SGD, PMAP_GUARD_ON, 0},   /* no second moment */
      {1e21f, 0.0f, PMAP_OPT_ADAM, PMAP_GUARD_OFF, 0}, /* the guard off: taken as it is */
  };
  for (int shard = 0; shard < 2; shard++)
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                         .num_devices = 2,
                         .numeric_guard = cases[c].guard,
                         .shard_optimizer = shard ? PMAP_SHARD_ON : PMAP_SHARD_OFF};
      pmap_ctx *ctx = NULL;
      pmap_params *p = NULL;
      pmap_optimizer opt = cases[c].kind == PMAP_OPT_SGD    ? pmap_sgd(1e-3f, 0.0f)
                           : cases[c].kind == PMAP_OPT_ADAM ? pmap_adam(1e-3f)
                                                            : pmap_adamw(1e-3f, 0.01f);
      opt.clip_norm = cases[c].clip;
      huge_grad hg = {cases[c].g, 1}; /* the mean over the 2 devices: about g / 2 */
      float init[4] = {1.0f, -1.0f, 0.5f, 2.0f}, w[4], xs[2] = {0}, loss = 7.0f;
      int64_t sh[1] = {2};
      pmap_array x = pmap_array_f32(xs, 1, sh);
      CHECK_OK(pmap_ctx_create(&cfg, &ctx));
      CHECK_OK(pmap_params_create_custom(ctx, 4, init, huge_grad_fn, &hg, &opt, &p));
      pmap_status st = pmap_update(p, &x, &x, &loss);
      const char *msg = pmap_last_error();
      if (cases[c].skipped) {
        CHECK(st == PMAP_ERR_NUMERIC, "shard %d case %zu: status %d (%s), not skipped", shard, c,
              (int)st, msg);
        CHECK(strstr(msg, "exceeds 1e+19") && strstr(msg, "device 1 exceed"),
              "shard %d case %zu: message %s", shard, c, msg);
        CHECK(pmap_params_step(p) == 0 && loss == 7.0f, "shard %d case %zu: step %lld loss %g",
              shard, c, (long long)pmap_params_step(p), (double)loss);
      } else {
        CHECK(st == PMAP_SUCCESS, "shard %d case %zu: %s", shard, c, msg);
        CHECK(pmap_params_step(p) == 1, "shard %d case %zu: step %lld", shard, c,
              (long long)pmap_params_step(p));
      }
      for (int d = 0; d < 2; d++) {
        CHECK_OK(pmap_params_read(p, d, w, 4));
        for (int i = 0; i < 4; i++) {
          if (cases[c].skipped)
            CHECK(w[i] == init[i], "shard %d case %zu device %d: w[%d] %g changed", shard, c, d, i,
                  (double)w[i]);
          else if (cases[c].kind != PMAP_OPT_SGD && cases[c].guard == PMAP_GUARD_ON)
            /* Adam's first step moves each weight by lr, whatever the gradient's size: lr m / sqrt(v)
             * within a few roundings of lr (8 u lr), w and the expected init - lr each rounded
             * (u |w| each). */
            CHECK(fabs((double)w[i] - (init[i] - 1e-3f)) <= adam_step_bound(init[i], 1e-3),
                  "shard %d case %zu: w[%d] %g, want %g", shard, c, i, (double)w[i],
                  (double)(init[i] - 1e-3f));
        }
      }
      /* A skipped step leaves the optimizer able to take the next (ordinary) gradient. */
      if (cases[c].skipped) {
        hg.g = 1.0f;
        CHECK_OK(pmap_update(p, &x, &x, &loss));
        CHECK_OK(pmap_params_read(p, 0, w, 4));
        float want = init[0] - 1e-3f - (cases[c].kind == PMAP_OPT_ADAMW ? 1e-5f * init[0] : 0.0f);
        CHECK(fabs((double)w[0] - want) <= adam_step_bound(init[0], 1e-3), /* as above */
              "shard %d case %zu: after: w %g, want %g", shard, c, (double)w[0], (double)want);
      }
      pmap_params_destroy(p);
      pmap_ctx_destroy(ctx);
    }
}

/* The same limit on a built-in model, whose devices' own norms (the flags) the step does not
 * compute before its reduction: the skipped step's message computes them from its gradients
 * once more and names device 1 alone, whose inputs are scaled by 1e12. The averaged norm is then
 * about 1e25 and the loss about 1e20 (both grow with the scale's square here): six decades
 * above the limit of 1e19 and eighteen below float's overflow, far more than any rounding or
 * summation order moves them; device 0's own norm is below 100. Replicated and sharded
 * optimizers; nothing changes. */
static void test_adam_norm_model(void) {
  for (int shard = 0; shard < 2; shard++) {
    run r;
    pmap_optimizer opt = pmap_adam(1e-3f);
    if (run_open(&r, "mlp", 2, 0.0, PMAP_GUARD_ON, &opt, NULL)) return;
    if (shard) { /* the same data, the optimizer sharded */
      pmap_params_destroy(r.params);
      CHECK_OK(pmap_ctx_destroy(r.ctx));
      pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                         .num_devices = 2,
                         .numeric_guard = PMAP_GUARD_ON,
                         .shard_optimizer = PMAP_SHARD_ON};
      CHECK_OK(pmap_ctx_create(&cfg, &r.ctx));
      CHECK_OK(pmap_params_create(r.ctx, r.model, &opt, 3, &r.params));
    }
    float *before = replica(&r, 0);
    float *x = (float *)r.xs.data;
    for (size_t i = 12 * 10; i < 24 * 10; i++) x[i] *= 1e12f; /* device 1's rows of batch 0 */
    float loss = 7.0f;
    pmap_status st = step(&r, 0, &loss);
    const char *msg = pmap_last_error();
    CHECK(st == PMAP_ERR_NUMERIC, "shard %d: status %s (%s)", shard, pmap_status_string(st), msg);
    CHECK(strstr(msg, "exceeds 1e+19") && strstr(msg, "the local gradients of device 1 exceed"),
          "shard %d: message %s", shard, msg);
    CHECK(pmap_params_step(r.params) == 0 && loss == 7.0f, "shard %d: step %lld, loss %g", shard,
          (long long)pmap_params_step(r.params), (double)loss);
    if (before) check_replicas(&r, before, "parameters after a step over the norm limit");
    free(before);
    run_close(&r);
  }
}

int main(void) {
  test_clip_extremes();
  test_adam_norm();
  test_adam_norm_model();
  for (int n = 1; n <= 4; n++) test_nan_input(n, PMAP_GUARD_ON);
  test_nan_input(2, PMAP_GUARD_OFF);
  test_huge_lr();
  test_clip_reference(1);
  test_clip_reference(4);
  test_clip_devices();
  test_clip_guard_off();
  test_own_norm_past_max();
  test_fault_alloc();
  test_fault_collective();
  test_fault_stall();
  test_fault_nan();
  test_fault_drift();
  test_exchange_sources();
  test_shrink();
  test_nan_collective();
  return test_exit("guard");
}
