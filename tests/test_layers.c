/* test_layers.c: the layers end to end on CPU virtual devices: the example models res-mlp and
 * cifar-bn, a dropout model and batch norm across replicas train on N = 1..4 devices exactly as
 * on 1 device (loss and parameters after 20 steps; batch norm also on an uneven global batch);
 * batch norm without cross_replica differs but keeps its replicas identical; residual blocks
 * (nested, empty, ending together) and the layers inside them have the gradients of finite
 * differences of the whole model; a
 * block left open is refused; a checkpoint carries batch norm's running statistics. */
#include <unistd.h>

#include "bounds.h"
#include "mixed_model.h"
#include "pmap_examples.h"
#include "testutil.h"

#define STEPS 20

typedef pmap_status (*build_fn)(pmap_model **out);

/* ---- models ------------------------------------------------------------------------------ */

/* 12 -> 16 -> batch norm -> ReLU -> 4 with cross_replica set or not. */
static pmap_status build_bn(pmap_model **out, int cross) {
  int64_t in[1] = {12};
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(1, in, &m);
  if (!st) st = pmap_model_add_dense(m, 16);
  if (!st) st = pmap_model_add_batchnorm(m, cross);
  if (!st) st = pmap_model_add_relu(m);
  if (!st) st = pmap_model_add_dense(m, 4);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}
static pmap_status build_bn_cross(pmap_model **out) { return build_bn(out, 1); }
static pmap_status build_bn_local(pmap_model **out) { return build_bn(out, 0); }

/* 12 -> 32 -> tanh -> dropout 0.3 -> 4. */
static pmap_status build_dropout(pmap_model **out) {
  int64_t in[1] = {12};
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(1, in, &m);
  if (!st) st = pmap_model_add_dense(m, 32);
  if (!st) st = pmap_model_add_tanh(m);
  if (!st) st = pmap_model_add_dropout(m, 0.3f);
  if (!st) st = pmap_model_add_dense(m, 4);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}

/* 6 -> 8 -> [layernorm -> 8 -> GELU -> 8 -> [sigmoid] ] -> 3: nested residual blocks. */
static pmap_status build_res_dense(pmap_model **out) {
  int64_t in[1] = {6};
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(1, in, &m);
  if (!st) st = pmap_model_add_dense(m, 8);
  if (!st) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_add_layernorm(m);
  if (!st) st = pmap_model_add_dense(m, 8);
  if (!st) st = pmap_model_add_gelu(m);
  if (!st) st = pmap_model_add_dense(m, 8);
  if (!st) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_add_sigmoid(m);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_add_dense(m, 3);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}

/* 6 -> 8 -> [[8 -> ReLU -> [[] -> tanh -> 8 -> GELU]] -> [] -> layernorm] -> 3: blocks nested
 * four deep, two of them empty, two ending at one layer, and dense layers with their activation
 * folded (which take a scratch gradient): the output gradients come from a pool of 3 + 4
 * buffers (models/exec.c), chosen as the backward pass goes, and every block's start still
 * reads its end's gradient. */
static pmap_status build_res_deep(pmap_model **out) {
  int64_t in[1] = {6};
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(1, in, &m);
  if (!st) st = pmap_model_add_dense(m, 8);
  for (int k = 0; k < 2 && !st; k++) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_add_dense(m, 8);
  if (!st) st = pmap_model_add_relu(m);
  for (int k = 0; k < 2 && !st; k++) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_add_tanh(m);
  if (!st) st = pmap_model_add_dense(m, 8);
  if (!st) st = pmap_model_add_gelu(m);
  for (int k = 0; k < 2 && !st; k++) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_add_layernorm(m);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_add_dense(m, 3);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}

/* Widths the output gradients' pool sizes its buffers for one by one (tests/mixed_model.h). */
static pmap_status build_mixed_widths(pmap_model **out) {
  return build_mixed_model(out, 6, 40, 24, 10, -1.0f);
}

/* (1, 4, 4) -> flatten -> dense 8 x 4 -> dense 3: a first layer that hands its gradient on. */
static pmap_status build_flatten_first(pmap_model **out) {
  int64_t in[3] = {1, 4, 4};
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(3, in, &m);
  if (!st) st = pmap_model_add_flatten(m);
  for (int k = 0; k < 4 && !st; k++) st = pmap_model_add_dense(m, 8);
  if (!st) st = pmap_model_add_tanh(m);
  if (!st) st = pmap_model_add_dense(m, 3);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}

/* (2, 6, 6) -> conv 4 -> [tanh -> conv 4] -> maxpool 2 -> (4, 3, 3) -> avgpool 2 stride 1 ->
 * global average -> 2. */
static pmap_status build_res_conv(pmap_model **out) {
  int64_t in[3] = {2, 6, 6};
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(3, in, &m);
  if (!st) st = pmap_model_add_conv2d(m, 4, 3, 3, 1, 1);
  if (!st) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_add_tanh(m);
  if (!st) st = pmap_model_add_conv2d(m, 4, 3, 3, 1, 1);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_add_maxpool2d(m, 2, 2, 2);
  if (!st) st = pmap_model_add_avgpool2d(m, 2, 2, 1);
  if (!st) st = pmap_model_add_global_avgpool(m);
  if (!st) st = pmap_model_add_dense(m, 2);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}

/* ---- runs -------------------------------------------------------------------------------- */

typedef struct run {
  pmap_ctx *ctx;
  pmap_params *params;
} run;

static int uneven; /* contexts take uneven global batches */

static int run_open(run *r, pmap_model *m, int devices, const pmap_optimizer *opt) {
  memset(r, 0, sizeof *r);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices, .uneven_batches = uneven};
  if (pmap_ctx_create(&cfg, &r->ctx) || pmap_params_create(r->ctx, m, opt, 11, &r->params)) {
    fprintf(stderr, "FAIL setting up %d devices: %s\n", devices, pmap_last_error());
    test_failures++;
    pmap_ctx_destroy(r->ctx);
    return 0;
  }
  return 1;
}

static void run_close(run *r) {
  pmap_params_destroy(r->params);
  pmap_ctx_destroy(r->ctx);
}

static float *read_params(run *r, int device) {
  size_t p = pmap_params_count(r->params);
  float *w = malloc(p * sizeof *w);
  CHECK_OK(pmap_params_read(r->params, device, w, p));
  return w;
}

/* Random data for a model with MSE loss: xs (rows, input...), ys (rows, k). */
static void random_data(const pmap_model *m, int64_t rows, const int64_t *in, int in_rank,
                        pmap_array *xs, pmap_array *ys, uint64_t seed) {
  int64_t f = 1, k = 0;
  for (int i = 0; i < in_rank; i++) f *= in[i];
  int rank;
  int64_t shape[PMAP_MAX_RANK];
  pmap_model_output_shape(m, &rank, shape);
  k = shape[0];
  float *x = malloc((size_t)(rows * f) * sizeof *x), *y = malloc((size_t)(rows * k) * sizeof *y);
  test_fill(x, (size_t)(rows * f), &seed, -1.5f, 1.5f);
  test_fill(y, (size_t)(rows * k), &seed, -1.0f, 1.0f);
  *xs = (pmap_array){
      x, PMAP_F32, in_rank + 1, {rows, in[0], in_rank > 1 ? in[1] : 0, in_rank > 1 ? in[2] : 0}};
  *ys = (pmap_array){y, PMAP_F32, 2, {rows, k, 0, 0}};
}

/* Losses compare relative to bound_loss_scale (tests/bounds.h): the outputs' size bounds how
 * much a loss near 0 moves. */

/* Trains STEPS steps of global batch xs, ys on `devices` devices; losses into loss (and with
 * size non-NULL each step's output size), the parameters of the last device returned; checks
 * every replica holds the same parameters. */
static float *train(pmap_model *m, const pmap_optimizer *opt, int devices, const pmap_array *xs,
                    const pmap_array *ys, float *loss, double *size) {
  run r;
  if (!run_open(&r, m, devices, opt)) return NULL;
  for (int s = 0; s < STEPS; s++) {
    if (size) size[s] = test_output_size(r.params, m, xs, ys);
    CHECK_OK(pmap_update(r.params, xs, ys, &loss[s]));
  }
  float *w = read_params(&r, devices - 1), *w0 = read_params(&r, 0);
  char what[96];
  snprintf(what, sizeof what, "replicas identical on %d devices", devices);
  test_same_bits(what, w0, w, pmap_params_count(r.params));
  free(w0);
  run_close(&r);
  return w;
}

/* Losses and parameters on N = 2, 3, 4 devices against 1 device. The runs differ in the order of
 * their float sums only (each device sums its shard, the all-reduce the devices, batch norm's
 * statistics likewise): every step's loss within bound_order32(bm, rows, s + 1) of 1 device's
 * (relative to max(L, S / kappa)), the parameters within bound_order32(bm, rows, STEPS)
 * (tests/bounds.h, docs/tolerances.md). */
static void check_equivalence(const char *name, pmap_model *m, const pmap_optimizer *opt,
                              const pmap_array *xs, const pmap_array *ys, const bound_model *bm) {
  float loss1[STEPS], lossn[STEPS];
  double size[STEPS], rows = (double)xs->shape[0];
  float *w1 = train(m, opt, 1, xs, ys, loss1, size);
  size_t p = pmap_model_num_params(m);
  double params = bound_order32(bm, rows, STEPS);
  for (int n = 2; w1 && n <= 4; n++) {
    if (TEST_UNDER_TSAN && n != 3) continue; /* every layer on 3 devices there (testutil.h) */
    float *wn = train(m, opt, n, xs, ys, lossn, NULL);
    if (!wn) break;
    double el = 0, bl = 1, worst = 0; /* the step whose loss is nearest its bound */
    for (int s = 0; s < STEPS; s++) {
      double den = bound_loss_scale(loss1[s], size[s], ys->dtype != PMAP_F32, bm->kappa);
      double e = fabs((double)lossn[s] - loss1[s]) / den;
      double b = bound_order32(bm, rows, s + 1);
      if (!(e / b <= worst) && !isnan(worst)) worst = e / b, el = e, bl = b; /* NaN stays */
    }
    double ew = test_rel_err(wn, w1, p);
    printf("%-42s %d devices: losses %.2e (bound %.2e), parameters %.2e (bound %.2e)\n", name, n,
           el, bl, ew, params);
    CHECK(worst <= 1.0, "%s: a loss of %d steps on %d devices vs 1: %.3g > %.3g", name, STEPS, n,
          el, bl);
    CHECK(ew <= params, "%s: parameters after %d steps on %d devices vs 1: %.3g > %.3g", name,
          STEPS, n, ew, params);
    free(wn);
  }
  free(w1);
}

static void example_equivalence(const char *name, int64_t batch) {
  pmap_model *m = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  const bound_model *bm = bound_model_of(name);
  CHECK(bm != NULL, "%s: no bound", name);
  CHECK_OK(pmap_example_info_get(name, &info));
  CHECK_OK(pmap_example_model(name, &m));
  CHECK_OK(pmap_example_data(name, 3, batch, &xs, &ys));
  if (m && xs.data && bm) check_equivalence(name, m, &info.opt, &xs, &ys, bm);
  pmap_example_data_free(&xs, &ys);
  pmap_model_destroy(m);
}

/* The built models' paths, counted as tests/bounds.h counts the examples' (a GEMM layer of a
 * inputs and b outputs adds a + b to k_path and 1 to k_batch, a batch norm 2 to k_batch); MSE on
 * targets U(-1, 1), kappa 10 as the examples' MSE models (loss_scale covers a loss that falls). */
static const bound_model bn_path = {"batch norm", (12 + 16) + (16 + 4), 1 + 2 + 1, 0, 0, 0, 10, 1};
static const bound_model dropout_path = {"dropout", (12 + 32) + (32 + 4), 1 + 1, 0, 0, 0, 10, 1};

static void built_equivalence(const char *name, build_fn build, int64_t batch,
                              const bound_model *bm) {
  pmap_model *m = NULL;
  CHECK_OK(build(&m));
  if (!m) return;
  int64_t in[1] = {12};
  pmap_array xs, ys;
  random_data(m, batch, in, 1, &xs, &ys, 5);
  pmap_optimizer opt = pmap_sgd(0.05f, 0.9f);
  check_equivalence(name, m, &opt, &xs, &ys, bm);
  free(xs.data), free(ys.data);
  pmap_model_destroy(m);
}

/* Batch norm over each device's shard differs from the global batch's on 2 devices, and its
 * running statistics (moved by the global moments) stay the same on every replica. */
static void local_batchnorm_differs(void) {
  pmap_model *m = NULL;
  CHECK_OK(build_bn_local(&m));
  if (!m) return;
  int64_t in[1] = {12};
  pmap_array xs, ys;
  random_data(m, 24, in, 1, &xs, &ys, 9);
  pmap_optimizer opt = pmap_sgd(0.05f, 0.0f);
  float l1[STEPS], l2[STEPS];
  float *w1 = train(m, &opt, 1, &xs, &ys, l1, NULL);
  float *w2 = train(m, &opt, 2, &xs, &ys, l2, NULL);
  /* More than the order of the sums alone could move the first loss (bn_path's bound). */
  double order = bound_order32(&bn_path, 24, 1) * fabs((double)l1[0]);
  CHECK(w1 && w2 && fabs((double)l1[0] - l2[0]) > order,
        "batch norm without cross_replica: 2 devices gave the loss of 1 (%g vs %g, order %.3g)",
        (double)l2[0], (double)l1[0], order);
  free(w1), free(w2), free(xs.data), free(ys.data);
  pmap_model_destroy(m);
}

/* A checkpoint of a batch-norm model carries the running statistics (they are in the parameter
 * vector) and is refused by the same layers with cross_replica changed. */
static void batchnorm_checkpoint(void) {
  pmap_model *m = NULL, *local = NULL;
  CHECK_OK(build_bn_cross(&m));
  CHECK_OK(build_bn_local(&local));
  if (!m || !local) return;
  int64_t in[1] = {12};
  pmap_array xs, ys;
  random_data(m, 24, in, 1, &xs, &ys, 17);
  pmap_optimizer opt = pmap_sgd(0.05f, 0.9f);
  run a, b, c;
  char path[] = "/tmp/pmap-test-layers-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  if (fd >= 0) close(fd);
  if (run_open(&a, m, 2, &opt) && run_open(&b, m, 2, &opt) && run_open(&c, local, 2, &opt)) {
    float loss;
    for (int s = 0; s < 3; s++) CHECK_OK(pmap_update(a.params, &xs, &ys, &loss));
    CHECK_OK(pmap_params_save(a.params, path));
    CHECK_OK(pmap_params_load(b.params, path));
    float *wa = read_params(&a, 1), *wb = read_params(&b, 1);
    test_same_bits("batch norm checkpoint: parameters and running statistics", wb, wa,
                   pmap_params_count(a.params));
    CHECK(pmap_params_load(c.params, path) == PMAP_ERR_INVALID_ARGUMENT,
          "a checkpoint of cross-replica batch norm loaded into per-device batch norm: %s",
          pmap_last_error());
    free(wa), free(wb);
    run_close(&a), run_close(&b), run_close(&c);
  }
  unlink(path);
  free(xs.data), free(ys.data);
  pmap_model_destroy(m);
  pmap_model_destroy(local);
}

/* ---- whole-model gradients --------------------------------------------------------------- */

/* The MSE loss of the model at the parameters held by r, in double, from pmap_predict. */
static double model_loss(run *r, const pmap_array *xs, const pmap_array *ys, float *out) {
  int64_t k = ys->shape[1], rows = xs->shape[0];
  pmap_array o = {out, PMAP_F32, 2, {rows, k, 0, 0}};
  CHECK_OK(pmap_predict(r->params, xs, &o));
  double s = 0.0;
  const float *y = ys->data;
  for (int64_t i = 0; i < rows * k; i++) s += ((double)out[i] - y[i]) * ((double)out[i] - y[i]);
  return s / (double)(rows * k);
}

/* One SGD step with lr 1 moves the parameters by minus the gradient; central differences of
 * the predicted loss at sampled parameters must agree. Dropout and batch norm are left out:
 * the gradient of a training step is not that of the predict path for them. */
static void model_gradient(const char *name, build_fn build, const int64_t *in, int in_rank) {
  pmap_model *m = NULL;
  CHECK_OK(build(&m));
  if (!m) return;
  pmap_array xs, ys;
  random_data(m, 6, in, in_rank, &xs, &ys, 13);
  pmap_optimizer opt = pmap_sgd(1.0f, 0.0f);
  run r;
  if (!run_open(&r, m, 2, &opt)) return;
  size_t p = pmap_params_count(r.params);
  float *w0 = read_params(&r, 0), *w = malloc(p * sizeof *w), *g = malloc(p * sizeof *g);
  float *out = malloc((size_t)(ys.shape[0] * ys.shape[1]) * sizeof *out);
  float loss;
  CHECK_OK(pmap_update(r.params, &xs, &ys, &loss));
  float *w1 = read_params(&r, 0);
  for (size_t i = 0; i < p; i++) g[i] = w0[i] - w1[i];
  enum { SAMPLES = 40 };
  float got[SAMPLES];
  /* h small enough that a step rarely moves a max-pool window's maximum, large enough for
   * float32 predictions */
  double want[SAMPLES], h = 1e-3;
  uint64_t s = 21;
  for (int j = 0; j < SAMPLES; j++) {
    size_t i = (size_t)(test_rand_u64(&s) % p);
    memcpy(w, w0, p * sizeof *w);
    w[i] = w0[i] + (float)h;
    CHECK_OK(pmap_params_write(r.params, w, p));
    double lp = model_loss(&r, &xs, &ys, out);
    w[i] = w0[i] - (float)h;
    CHECK_OK(pmap_params_write(r.params, w, p));
    double lm = model_loss(&r, &xs, &ys, out);
    want[j] = (lp - lm) / (2.0 * h);
    got[j] = g[i];
  }
  /* Not two orders of one sum: central differences err by h^2 f''' / 6 (about 1e-7 for these
   * smooth layers), by w0 +- h rounded to float (u |w0| / h: 3e-5 relative) and by the float
   * predictions over 2 h (u |L| sqrt(k) / h: below 1e-4); 2e-3 leaves the rest to a max-pool
   * window whose maximum moves within +-h. */
  char what[128];
  snprintf(what, sizeof what, "%s: gradient of a step vs finite differences of the model", name);
  test_close(what, got, want, SAMPLES, 2e-3);
  free(w0), free(w1), free(w), free(g), free(out), free(xs.data), free(ys.data);
  run_close(&r);
  pmap_model_destroy(m);
}

static void builder_errors(void) {
  int64_t in3[3] = {2, 5, 5}, in1[1] = {4};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, in1, &m));
  CHECK_FAILS(pmap_model_end_residual(m), PMAP_ERR_INVALID_ARGUMENT, "no residual block");
  CHECK_FAILS(pmap_model_add_maxpool2d(m, 2, 2, 2), PMAP_ERR_INVALID_ARGUMENT, "(C, H, W)");
  CHECK_FAILS(pmap_model_add_dropout(m, 1.0f), PMAP_ERR_INVALID_ARGUMENT, "rate");
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_dense(m, 5));
  CHECK_FAILS(pmap_model_end_residual(m), PMAP_ERR_INVALID_ARGUMENT, "keep the shape");
  CHECK_OK(pmap_model_add_dense(m, 4));
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_FAILS(pmap_params_create(ctx, m, &opt, 1, &p), PMAP_ERR_INVALID_ARGUMENT, "open");
  CHECK_OK(pmap_model_end_residual(m));
  CHECK_OK(pmap_params_create(ctx, m, &opt, 1, &p));
  pmap_params_destroy(p);
  pmap_ctx_destroy(ctx);
  pmap_model_destroy(m);
  CHECK_OK(pmap_model_create(3, in3, &m));
  CHECK_FAILS(pmap_model_add_avgpool2d(m, 6, 6, 1), PMAP_ERR_INVALID_ARGUMENT, "does not fit");
  CHECK_OK(pmap_model_add_global_avgpool(m));
  int rank;
  int64_t shape[PMAP_MAX_RANK];
  pmap_model_output_shape(m, &rank, shape);
  CHECK(rank == 1 && shape[0] == 2, "global average pool: rank %d, %lld", rank,
        (long long)shape[0]);
  pmap_model_destroy(m);
}

int main(void) {
  builder_errors();
  int64_t in1[1] = {6}, in3[3] = {2, 6, 6}, in3f[3] = {1, 4, 4};
  model_gradient("residual dense blocks", build_res_dense, in1, 1);
  model_gradient("residual conv block with pooling", build_res_conv, in3, 3);
  model_gradient("residual blocks nested four deep", build_res_deep, in1, 1);
  model_gradient("mixed widths in nested blocks", build_mixed_widths, in1, 1);
  model_gradient("flatten first", build_flatten_first, in3f, 3);
  example_equivalence("res-mlp", 48);
  /* At its own lr 0.05 with momentum on 24 rows (the same every step), cifar-bn's loss falls
   * 80-fold in 8 steps: a ReLU input or a max pool's winner next to a tie can take the other
   * side under another order and change a step by a finite amount, which the momentum carries
   * on. The bound's margin (kappa, lambda) covers these rare flips (docs/tolerances.md). */
  example_equivalence("cifar-bn", 24);
  built_equivalence("batch norm across replicas", build_bn_cross, 36, &bn_path);
  /* 35 rows: 9 + 9 + 9 + 8 on 4 devices; the statistics count what each device holds. */
  uneven = 1;
  built_equivalence("batch norm across replicas, uneven batch", build_bn_cross, 35, &bn_path);
  uneven = 0;
  built_equivalence("dropout", build_dropout, 36, &dropout_path);
  local_batchnorm_differs();
  batchnorm_checkpoint();
  return test_exit("layers");
}
