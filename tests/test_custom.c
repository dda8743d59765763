/* test_custom.c: models the runtime does not know (pmap_params_create_custom): the example's
 * hand-written gradient against central finite differences of a float64 loss, N devices equal
 * one device (within the bound of sums in another order, tests/bounds.h), micro-batches and
 * uneven batches through a custom function, the numeric guard on its output, and the errors of
 * the custom path. CPU backend. */
#include <stdatomic.h>

#include "../examples/tanh_net.h"
#include "bounds.h"
#include "testutil.h"

enum { F = 3, H = 5, K = 2, ROWS = 24 };
static const tanh_net NET = {F, H, K};

/* tanh_net's path, counted as tests/bounds.h counts the examples': the layers F -> H and H -> K
 * forward and back ((F + H) + (H + K)), 4 for tanhf's few ulps; its two weight gradients sum the
 * rows (k_batch 2). MSE on targets U(-1, 1): kappa 10 as the examples' MSE models. */
static const bound_model tanh_path = {"tanh_net", (F + H) + (H + K) + 4, 2, 0, 0, 0, 10, 1};

/* The loss in double, for finite differences. */
static double loss_f64(const double *w, const float *x, const float *t, int64_t rows) {
  const double *w1 = w, *b1 = w1 + F * H, *w2 = b1 + H, *b2 = w2 + H * K;
  double sum = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    double hid[H];
    for (int j = 0; j < H; j++) {
      double s = b1[j];
      for (int i = 0; i < F; i++) s += (double)x[r * F + i] * w1[i * H + j];
      hid[j] = tanh(s);
    }
    for (int o = 0; o < K; o++) {
      double s = b2[o];
      for (int j = 0; j < H; j++) s += hid[j] * w2[j * K + o];
      sum += (s - t[r * K + o]) * (s - t[r * K + o]);
    }
  }
  return sum / (double)(rows * K);
}

static void make_data(float *x, float *t, float *w, size_t P) {
  uint64_t s = 99;
  test_fill(x, ROWS * F, &s, -1.0f, 1.0f);
  test_fill(t, ROWS * K, &s, -1.0f, 1.0f);
  test_fill(w, P, &s, -0.8f, 0.8f);
}

static void test_gradient(void) {
  size_t P = tanh_net_params(&NET);
  float x[ROWS * F], t[ROWS * K], w[64], g[64], loss = 0.0f;
  double wd[64], want[64];
  make_data(x, t, w, P);
  for (int pass = 0; pass < 2; pass++) {
    float scale = pass ? 0.25f : 1.0f;
    for (size_t i = 0; i < P; i++) g[i] = pass ? 1.0f : 0.0f; /* pass 1: += onto ones */
    int64_t xs_shape[2] = {ROWS, F}, ys_shape[2] = {ROWS, K};
    pmap_grad_args a = {
        NULL, w, g, &loss, scale, pmap_array_f32(x, 2, xs_shape), pmap_array_f32(t, 2, ys_shape),
        0,    0, P};
    CHECK_OK(tanh_net_grad(&a, (void *)&NET));
    for (size_t i = 0; i < P; i++) wd[i] = w[i];
    for (size_t i = 0; i < P; i++) {
      double h = 1e-4, keep = wd[i];
      wd[i] = keep + h;
      double up = loss_f64(wd, x, t, ROWS);
      wd[i] = keep - h;
      double down = loss_f64(wd, x, t, ROWS);
      wd[i] = keep;
      want[i] = scale * (up - down) / (2 * h) + (pass ? 1.0 : 0.0);
    }
    /* Not two orders of one sum: the central differences of the float64 loss err by
     * h^2 f''' / 6 (1e-8) and 1e-16 / h; the float gradient by its path's roundings (below 3e-5,
     * as the loss below); 1e-4 holds both with room. */
    test_close(pass ? "tanh_net gradient, scale 0.25, accumulated" : "tanh_net gradient", g, want,
               P, 1e-4);
    /* The float loss errs from float64 less than two float orders differ. */
    double lw = loss_f64(wd, x, t, ROWS), lb = bound_order32(&tanh_path, ROWS, 1);
    if (pass == 0)
      printf("tanh_net loss vs float64: %.2e (bound %.2e)\n", fabs(loss - lw) / lw, lb);
    test_close("tanh_net loss", &loss, &lw, 1, lb);
  }
}

typedef struct trained {
  float w[64], loss;
  double size; /* 2 rms(y) of the outputs of the last loss */
  int ok;
} trained;

/* 2 rms(y) of the net's outputs on `rows` rows at parameters w, for loss_scale. */
static double output_size(const float *w, const float *x, int64_t rows) {
  float hid[ROWS * H], y[ROWS * K];
  tanh_net_forward(&NET, w, x, rows, hid, y);
  return bound_output_size(y, (size_t)(rows * K), 0);
}

/* 20 Adam steps on `n` devices (uneven: a global batch of `rows`), `micro` micro-batches. */
static trained train(int n, int64_t rows, int micro, int uneven) {
  trained out = {{0}, 0.0f, 0.0, 0};
  size_t P = tanh_net_params(&NET);
  float x[ROWS * F], t[ROWS * K], init[64];
  make_data(x, t, init, P);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n, .uneven_batches = uneven};
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  pmap_optimizer adam = pmap_adam(0.02f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_params_create_custom(ctx, P, init, tanh_net_grad, (void *)&NET, &adam, &p));
  if (!p) {
    pmap_ctx_destroy(ctx);
    return out;
  }
  CHECK_OK(pmap_params_set_micro_batches(p, micro));
  int64_t xs_shape[2] = {rows, F}, ys_shape[2] = {rows, K};
  pmap_array xs = pmap_array_f32(x, 2, xs_shape), ys = pmap_array_f32(t, 2, ys_shape);
  out.ok = 1;
  for (int s = 0; s < 20; s++) {
    if (s == 19) { /* the outputs at the last loss's parameters */
      float w19[64];
      CHECK_OK(pmap_params_read(p, 0, w19, P));
      out.size = output_size(w19, x, rows);
    }
    pmap_status st = pmap_update(p, &xs, &ys, &out.loss);
    CHECK(st == PMAP_SUCCESS, "N %d rows %lld micro %d: %s", n, (long long)rows, micro,
          pmap_last_error());
    out.ok &= st == PMAP_SUCCESS;
  }
  float w0[64], wd[64];
  CHECK_OK(pmap_params_read(p, 0, w0, P));
  for (int d = 1; d < n; d++) {
    CHECK_OK(pmap_params_read(p, d, wd, P));
    test_same_bits("custom replicas", wd, w0, P);
  }
  memcpy(out.w, w0, P * sizeof *w0);
  pmap_params_destroy(p);
  pmap_ctx_destroy(ctx);
  return out;
}

/* Devices and micro-batches sum the rows' gradients in other orders: 20 steps within
 * bound_order32(tanh_path, rows, 20) of 1 device, the parameters and the last loss (relative to
 * max(L, S / kappa)). */
static void test_devices(void) {
  size_t P = tanh_net_params(&NET);
  trained one = train(1, ROWS, 1, 0);
  double bound = bound_order32(&tanh_path, ROWS, 20), bound19 = bound_order32(&tanh_path, 19, 20);
  char what[96];
  struct {
    int n;
    int64_t rows;
    int micro, uneven;
  } cases[] = {{2, ROWS, 1, 0}, {3, ROWS, 1, 0}, {4, ROWS, 1, 0}, {1, ROWS, 3, 0},
               {4, ROWS, 2, 0}, {2, ROWS, 5, 0}, {4, ROWS, 4, 1}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    trained got = train(cases[c].n, cases[c].rows, cases[c].micro, cases[c].uneven);
    snprintf(what, sizeof what, "custom: N %d micro %d vs 1 device", cases[c].n, cases[c].micro);
    if (got.ok && one.ok) {
      printf("%-46s parameters %.2e (bound %.2e)\n", what, test_rel_err(got.w, one.w, P), bound);
      test_close_f(what, got.w, one.w, P, bound);
    }
  }
  /* Uneven: 19 rows on 4 devices (5, 5, 5, 4... as 4, 5, 5, 5) equal 1 device on 19 rows. */
  trained ref = train(1, 19, 1, 0);
  for (int n = 2; n <= 4; n++)
    for (int micro = 1; micro <= 3; micro += 2) {
      trained got = train(n, 19, micro, 1);
      snprintf(what, sizeof what, "custom: 19 rows on %d devices, micro %d vs 1 device", n, micro);
      if (!got.ok || !ref.ok) continue;
      double el = fabs((double)got.loss - ref.loss) /
                  bound_loss_scale(ref.loss, ref.size, 0, tanh_path.kappa);
      printf("%-46s parameters %.2e, loss %.2e (bound %.2e)\n", what, test_rel_err(got.w, ref.w, P),
             el, bound19);
      test_close_f(what, got.w, ref.w, P, bound19);
      CHECK(el <= bound19, "%s: loss %.9g vs %.9g: %.3g > %.3g", what, (double)got.loss,
            (double)ref.loss, el, bound19);
    }
}

static pmap_status nan_grad(const pmap_grad_args *a, void *user) {
  _Atomic int *calls = user; /* every device's thread counts itself */
  atomic_fetch_add(calls, 1);
  *a->loss = pmap_axis_index(a->dev) == 1 ? NAN : 1.0f;
  for (size_t i = 0; i < a->num_params; i++) a->grads[i] += 0.5f;
  return PMAP_SUCCESS;
}

static pmap_status failing_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  return pmap_axis_index(a->dev) == 2 ? PMAP_ERR_DEVICE : PMAP_SUCCESS;
}

/* Device 2 fails with its own message and status (PMAP_ERR_ABORTED included, which it
 * returns of its own accord while the others wait in the step's all-reduce); with `user` NULL,
 * without a message. */
static pmap_status aborting_grad(const pmap_grad_args *a, void *user) {
  const pmap_status *want = user;
  if (pmap_axis_index(a->dev) != 2) return PMAP_SUCCESS;
  return pmap_set_error(*want, "my_loss: label %d out of range on row %lld", 7, (long long)a->row0);
}

static pmap_status silent_abort_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  return pmap_axis_index(a->dev) == 2 ? PMAP_ERR_ABORTED : PMAP_SUCCESS;
}

static void test_own_errors(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 3};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  float init[4] = {1, 2, 3, 4}, after[4], x[6] = {0}, y[6] = {0};
  int64_t shape[2] = {6, 1};
  pmap_array xs = pmap_array_f32(x, 2, shape), ys = pmap_array_f32(y, 2, shape);
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  const pmap_status kinds[] = {PMAP_ERR_ABORTED, PMAP_ERR_DEVICE, PMAP_ERR_INVALID_ARGUMENT};
  for (int k = 0; k < 3; k++) {
    pmap_params *p = NULL;
    CHECK_OK(pmap_params_create_custom(ctx, 4, init, aborting_grad, (void *)&kinds[k], &sgd, &p));
    for (int rep = 0; p && rep < 20; rep++) {
      CHECK_FAILS(pmap_update(p, &xs, &ys, NULL), kinds[k],
                  "device 2: my_loss: label 7 out of range on row 4");
      CHECK(!strncmp(pmap_last_error(), "pmap_update: device 2: my_loss", 30),
            "the message does not start with the call and the device: %s", pmap_last_error());
      CHECK(strstr(pmap_last_error(), "without calling") == NULL,
            "reported as a device that left: %s", pmap_last_error());
    }
    CHECK_OK(pmap_params_read(p, 0, after, 4));
    test_same_bits("params after a gradient function's own failure", after, init, 4);
    CHECK(pmap_params_step(p) == 0, "a failed step counted");
    pmap_params_destroy(p);
  }
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create_custom(ctx, 4, init, silent_abort_grad, NULL, &sgd, &p));
  CHECK_FAILS(pmap_update(p, &xs, &ys, NULL), PMAP_ERR_ABORTED,
              "device 2: the mapped function returned aborted");
  pmap_params_destroy(p);
  /* pmap_set_error keeps the status it is given and clears the message with NULL. */
  CHECK(pmap_set_error(PMAP_ERR_NUMERIC, "x %d", 5) == PMAP_ERR_NUMERIC &&
            !strcmp(pmap_last_error(), "x 5"),
        "pmap_set_error: %s", pmap_last_error());
  CHECK(pmap_set_error(PMAP_SUCCESS, NULL) == PMAP_SUCCESS && !*pmap_last_error(), "cleared");
  CHECK_OK(pmap_ctx_destroy(ctx));
}

static void test_errors_and_guard(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 3};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  float init[4] = {1, 2, 3, 4}, after[4], x[6] = {0}, y[6] = {0};
  _Atomic int calls = 0;
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  /* A failed create leaves *out as it was (nothing passed in changes on failure). */
  pmap_params *const sentinel = (pmap_params *)&calls, *p = sentinel;
  pmap_optimizer bad_lr = pmap_sgd(-1.0f, 0.0f);
  CHECK_FAILS(pmap_params_create_custom(ctx, 0, init, nan_grad, &calls, &sgd, &p),
              PMAP_ERR_INVALID_ARGUMENT, "num_params 0");
  CHECK_FAILS(pmap_params_create_custom(ctx, 4, init, NULL, &calls, &sgd, &p),
              PMAP_ERR_INVALID_ARGUMENT, "fn is NULL");
  CHECK_FAILS(pmap_params_create_custom(ctx, 4, init, nan_grad, &calls, &bad_lr, &p),
              PMAP_ERR_INVALID_ARGUMENT, "learning rate -1");
  CHECK(p == sentinel, "a failed pmap_params_create_custom wrote %p to *out", (void *)p);
  p = NULL;
  CHECK_OK(pmap_params_create_custom(ctx, 4, init, nan_grad, &calls, &sgd, &p));
  int64_t shape[2] = {6, 1}, bad[2] = {5, 1};
  pmap_array xs = pmap_array_f32(x, 2, shape), ys = pmap_array_f32(y, 2, shape);
  CHECK_FAILS(pmap_update(p, &xs, &ys, NULL), PMAP_ERR_NUMERIC, "device 1 ");
  CHECK(atomic_load(&calls) == 3, "the function ran %d times for 3 devices", atomic_load(&calls));
  CHECK_OK(pmap_params_read(p, 2, after, 4));
  test_same_bits("custom params after a skipped step", after, init, 4);
  pmap_array ys_bad = pmap_array_f32(y, 2, bad);
  CHECK_FAILS(pmap_update(p, &xs, &ys_bad, NULL), PMAP_ERR_INVALID_ARGUMENT, "leading extent 6");
  pmap_array xi = pmap_array_i32((int32_t *)x, 2, shape);
  CHECK_FAILS(pmap_update(p, &xi, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT, "xs must be f32");
  float out[6];
  pmap_array o = pmap_array_f32(out, 2, shape);
  CHECK_FAILS(pmap_predict(p, &xs, &o), PMAP_ERR_INVALID_ARGUMENT, "no forward pass");
  pmap_params_destroy(p);
  CHECK_OK(pmap_params_create_custom(ctx, 4, init, failing_grad, NULL, &sgd, &p));
  CHECK_FAILS(pmap_update(p, &xs, &ys, NULL), PMAP_ERR_DEVICE, "device 2");
  CHECK(pmap_params_step(p) == 0, "a failed custom step counted");
  pmap_params_destroy(p);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* A gradient function with a collective inside (a cross-replica statistic), on an uneven batch
 * with micro-batches: every device runs as many pieces, so the collectives match. */
static pmap_status psum_grad(const pmap_grad_args *a, void *user) {
  int extra = user != NULL;
  float one = 1.0f, n = 0.0f, b[6] = {1000, 1000, 1000, 1000, 1000, 1000};
  pmap_status st = pmap_psum(a->dev, &one, &n, 1);
  if (st) return st;
  /* With user set, device 0 calls one more collective than the others. */
  if (extra && pmap_axis_index(a->dev) == 0 && (st = pmap_psum(a->dev, b, b, 6))) return st;
  const float *x = a->xs.data;
  float s = 0.0f;
  for (int64_t i = 0; i < a->xs.shape[0]; i++) s += x[i];
  a->grads[0] += a->scale * s / (float)a->xs.shape[0];
  *a->loss = s / (float)a->xs.shape[0];
  return PMAP_SUCCESS;
}

static pmap_status warm_fn(pmap_device *dev, void *arg) {
  (void)arg;
  float b[6] = {0};
  pmap_status st = pmap_psum(dev, b, b, 6);
  return st ? st : pmap_psum(dev, b, b, 6);
}

static void test_collectives_inside(void) {
  pmap_config cfg = {
      .backend = PMAP_BACKEND_CPU, .num_devices = 4, .timeout_s = 20, .uneven_batches = 1};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  float init = 0.0f, xs[5] = {1, 2, 3, 4, 5}, ys[5] = {0}, w[4];
  int64_t sh[1] = {5};
  pmap_array x = pmap_array_f32(xs, 1, sh), y = pmap_array_f32(ys, 1, sh);
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create_custom(ctx, 1, &init, psum_grad, NULL, &sgd, &p));
  for (int micro = 1; micro <= 3; micro++) {
    CHECK_OK(pmap_params_set_micro_batches(p, micro));
    CHECK_OK(pmap_update(p, &x, &y, NULL));
  }
  pmap_params_destroy(p);
  /* One device calls an extra collective, after a job that left records of matching shape:
   * every device fails (no replica steps), none crashes. */
  int marker = 1;
  CHECK_OK(pmap_params_create_custom(ctx, 1, &init, psum_grad, &marker, &sgd, &p));
  CHECK_OK(pmap_run(ctx, warm_fn, NULL));
  CHECK_OK(pmap_params_set_micro_batches(p, 2));
  CHECK_FAILS(pmap_update(p, &x, &y, NULL), PMAP_ERR_INVALID_ARGUMENT, "different collectives");
  for (int d = 0; d < 4; d++) CHECK_OK(pmap_params_read(p, d, &w[d], 1));
  for (int d = 0; d < 4; d++)
    CHECK(w[d] == init, "replica %d changed to %g by a step that failed", d, (double)w[d]);
  CHECK_OK(pmap_params_verify(p));
  CHECK(pmap_params_step(p) == 0, "a failed step counted");
  pmap_params_destroy(p);
  pmap_ctx_destroy(ctx);
}

int main(void) {
  test_own_errors();
  test_collectives_inside();
  test_gradient();
  test_devices();
  test_errors_and_guard();
  return test_exit("custom");
}
