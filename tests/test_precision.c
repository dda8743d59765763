/* test_precision.c: the bf16 policy end to end, on both CPU bf16 GEMMs (oneDNN's matmul where
 * built, and the portable path): every example model trains under bf16 from fp32's initial
 * parameters with its loss curve within the model's bound of fp32's (the README's precision
 * table), N devices within their bound of 1, replicas bitwise identical, runs bitwise repeated,
 * both CPU bf16 GEMMs agreeing as two bf16 runs of other orders do, the numeric guard skipping a
 * step of a NaN or of an overflow to bfloat16's infinity; checkpoints keep the float masters,
 * record the policy and resume under either; the memory plan shows the saving; the calls refuse
 * bad input. Prints what it measures; fails when a bound is exceeded. */
#include "ops/cpu/bf16.h"
#include "ops/cpu/conv.h"
#include "bounds.h"
#include "pmap_examples.h"
#include "testutil.h"

/* Loss curves: the mean loss of each tenth of the steps, bf16 against fp32 (relative), the
 * largest over the tenths and the last; 2 devices against 1 under bf16 likewise. The bounds
 * follow from each model's path (tests/bounds.h): bf16 against fp32 differs in every bfloat16
 * rounding (bound_prec16), 2 devices against 1 in the order of the float sums and in the
 * roundings that order moves (bound_order16), over the run's steps on its batch. */
static const struct {
  const char *model;
  int steps;
} table[] = {
    {"linear", 100},   {"mlp", 100},     {"convnet", 40},  {"mlp-1024", 20},
    {"cifar-cnn", 20}, {"res-mlp", 100}, {"cifar-bn", 20}, {"gpt-mini", 30},
};
#define MAX_STEPS 100

typedef struct run {
  float loss[MAX_STEPS];
  float *w; /* the parameters at the end (malloc'ed) */
  size_t n;
  pmap_memory_plan plan;
} run;

/* Trains `model` `steps` steps on `devices` devices under `prec` from seed 0, on the model's
 * data in order; 0, or -1 after printing why. */
static int train(const char *model, int steps, int devices, pmap_precision prec, run *out) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  memset(out, 0, sizeof *out);
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  if (!st) st = pmap_example_info_get(model, &info);
  if (!st) st = pmap_example_model(model, &m);
  if (!st) st = pmap_params_create(ctx, m, &info.opt, 0, &p);
  if (!st) st = pmap_params_set_precision(p, prec);
  int64_t batch = info.batch; /* even: 1, 2 and 4 devices divide it */
  int64_t have = info.samples > batch ? info.samples / batch : 1;
  if (!st) st = pmap_example_data(model, 1, have * batch, &xs, &ys);
  for (int s = 0; s < steps && !st; s++) {
    pmap_array x = xs, y = ys;
    int64_t xrow = pmap_array_numel(&xs) / xs.shape[0], yrow = pmap_array_numel(&ys) / ys.shape[0];
    x.data = (char *)xs.data + (size_t)((s % have) * batch * xrow) * 4;
    y.data = (char *)ys.data + (size_t)((s % have) * batch * yrow) * 4;
    x.shape[0] = y.shape[0] = batch;
    st = pmap_update(p, &x, &y, &out->loss[s]);
  }
  if (!st) st = pmap_params_verify(p); /* replicas bitwise identical */
  out->n = st ? 0 : pmap_params_count(p);
  if (!st && !(out->w = malloc(out->n * sizeof *out->w))) st = PMAP_ERR_OUT_OF_MEMORY;
  if (!st) st = pmap_params_read(p, devices - 1, out->w, out->n);
  if (!st) st = pmap_params_memory(p, batch, &out->plan);
  if (st) {
    fprintf(stderr, "FAIL %s, %d devices, %s: %s: %s\n", model, devices, pmap_precision_name(prec),
            pmap_status_string(st), pmap_last_error());
    test_failures++;
  }
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return st ? -1 : 0;
}

/* The largest relative difference of the tenths' mean losses, and that of the last tenth. */
static void curves(const float *a, const float *b, int steps, double *most, double *last) {
  int w = steps / 10 > 0 ? steps / 10 : 1;
  *most = *last = 0.0;
  for (int s0 = 0; s0 + w <= steps; s0 += w) {
    double sa = 0, sb = 0;
    for (int s = s0; s < s0 + w; s++) sa += a[s], sb += b[s];
    double e = fabs(sa - sb) / fmax(fabs(sb), 1e-30);
    if (!(e <= *most)) *most = e;
    *last = e;
  }
}

/* Every model under bf16 against fp32, 2 devices against 1, each against its bound. */
static void models(const char *provider) {
  printf("bf16 GEMM %s\n%-10s %5s  %-19s %-19s %-19s %-10s\n", provider, "model", "steps",
         "curve (bound)", "last (bound)", "2 dev (bound)", "params");
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    const char *model = table[i].model;
    int steps = table[i].steps;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    if (!strcmp(model, "gpt-mini") || !strcmp(model, "mlp-1024")) continue; /* the time limit */
#endif
    /* Under ThreadSanitizer the threading paths of a few models: a third of the time. */
    if (TEST_UNDER_TSAN && strcmp(model, "linear") && strcmp(model, "res-mlp") &&
        strcmp(model, "cifar-bn"))
      continue;
    const bound_model *bm = bound_model_of(model);
    pmap_example_info info;
    CHECK(bm && pmap_example_info_get(model, &info) == PMAP_SUCCESS, "%s: no bound", model);
    if (!bm) continue;
    double prec = bound_prec16(bm, (double)info.batch, steps);
    double order = bound_order16(bm, (double)info.batch, steps);
    run f, b1, b2;
    if (train(model, steps, 1, PMAP_PRECISION_FP32, &f) ||
        train(model, steps, 1, PMAP_PRECISION_BF16, &b1) ||
        train(model, steps, 2, PMAP_PRECISION_BF16, &b2))
      continue;
    double most = 0, last = 0, dev_most = 0, dev_last = 0;
    curves(b1.loss, f.loss, steps, &most, &last);
    curves(b2.loss, b1.loss, steps, &dev_most, &dev_last);
    double moved = test_rel_err(b1.w, f.w, f.n);
    printf("%-10s %5d  %-8.2e (%-8.2e) %-8.2e (%-8.2e) %-8.2e (%-8.2e) %-10.2e\n", model, steps,
           most, prec, last, prec, dev_most, order, moved);
    CHECK(most <= prec, "%s: bf16's loss curve departs from fp32's by %.3g > %.3g", model, most,
          prec);
    CHECK(last <= prec, "%s: bf16's last losses depart from fp32's by %.3g > %.3g", model, last,
          prec);
    CHECK(dev_most <= order, "%s: bf16 on 2 devices departs from 1 by %.3g > %.3g", model, dev_most,
          order);
    /* The policy changes the arithmetic: bf16's parameters are not fp32's. */
    CHECK(moved > 0.0, "%s: bf16 trained exactly as fp32 (the policy did nothing)", model);
    free(f.w), free(b1.w), free(b2.w);
  }
}

/* The same bits on a second run; 2 and 4 devices' replicas verified inside train. */
static void repeats(void) {
  run a, b, c;
  if (train("res-mlp", 30, 2, PMAP_PRECISION_BF16, &a) ||
      train("res-mlp", 30, 2, PMAP_PRECISION_BF16, &b) ||
      train("res-mlp", 30, 4, PMAP_PRECISION_BF16, &c))
    return;
  test_same_bits("res-mlp bf16 on 2 devices, run twice", a.w, b.w, a.n);
  test_same_bits("res-mlp bf16 losses, run twice", a.loss, b.loss, 30);
  free(a.w), free(b.w), free(c.w);
}

/* conv2d's bias gradient under bf16 sums the float output gradient, as dense's does: only the
 * convolution's operands are rounded. One conv2d (16 -> 16 channels, 3x3, 8x8, with and without
 * its folded ReLU) under MSE against targets c below its outputs, every value a few bits wide so
 * that the convolution is exact: dy = 2 c / (B OH OW OC) wherever the ReLU passes, and
 * c = 1 + 3/1024 rounds to 1 in bfloat16, so a bias gradient from the rounded dy is 0.29 % short.
 * SGD at rate 1 from bias b leaves b - db; on both CPU convolutions, 1 and 2 devices. */
static void conv_bias_case(const char *path, int relu, int devices) {
  const int64_t C = 16, OC = 16, H = 8, W = 8, B = 4, out = OC * H * W;
  const double c = 1.0 + 3.0 / 1024.0;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  int64_t in[3] = {C, H, W};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_sgd(1.0f, 0.0f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_model_create(3, in, &m));
  CHECK_OK(pmap_model_add_conv2d(m, OC, 3, 3, 1, 1));
  if (relu) CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_flatten(m));
  CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_MSE));
  CHECK_OK(pmap_params_create(ctx, m, &opt, 0, &p));
  if (!p) return;
  size_t nw = (size_t)(OC * C * 9), n = pmap_params_count(p);
  CHECK(n == nw + (size_t)OC, "conv2d has %zu parameters, not %zu", n, nw + (size_t)OC);
  float *w = calloc(n, sizeof *w), *x = calloc((size_t)(B * C * H * W), sizeof *x);
  float *t = calloc((size_t)(B * out), sizeof *t), *after = calloc(n, sizeof *after);
  double *z = calloc((size_t)(B * out), sizeof *z);
  for (size_t j = 0; j < nw; j++) w[j] = (float)((int)((j * 5) % 7) - 3) / 8.0f;
  for (int64_t o = 0; o < OC; o++) w[nw + (size_t)o] = (float)((int)(o % 5) - 2) / 4.0f;
  for (int64_t j = 0; j < B * C * H * W; j++) x[j] = (float)((int)((j * 7) % 5) - 2) / 2.0f;
  /* The convolution in float64 (exact here), the targets, and the reference gradient. */
  double *db = calloc((size_t)OC, sizeof *db);
  for (int64_t e = 0; e < B; e++)
    for (int64_t o = 0; o < OC; o++)
      for (int64_t oy = 0; oy < H; oy++)
        for (int64_t ox = 0; ox < W; ox++) {
          double v = w[nw + (size_t)o];
          for (int64_t ci = 0; ci < C; ci++)
            for (int ky = 0; ky < 3; ky++)
              for (int kx = 0; kx < 3; kx++) {
                int64_t iy = oy + ky - 1, ix = ox + kx - 1;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                v += (double)w[(size_t)(((o * C + ci) * 3 + ky) * 3 + kx)] *
                     x[((e * C + ci) * H + iy) * W + ix];
              }
          size_t at = (size_t)(e * out + (o * H + oy) * W + ox);
          double y = relu && v <= 0 ? 0.0 : v;
          t[at] = (float)(y - c);
          z[at] = y - (double)t[at];
          if (!relu || v > 0) db[o] += 2.0 * z[at] / (double)(B * out);
        }
  CHECK_OK(pmap_params_write(p, w, n));
  CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16));
  int64_t xs_shape[4] = {B, C, H, W}, ys_shape[2] = {B, out};
  pmap_array xs = pmap_array_f32(x, 4, xs_shape), ys = pmap_array_f32(t, 2, ys_shape);
  float loss = 0;
  CHECK_OK(pmap_update(p, &xs, &ys, &loss));
  CHECK_OK(pmap_params_verify(p));
  CHECK_OK(pmap_params_read(p, devices - 1, after, n));
  double worst = 0;
  for (int64_t o = 0; o < OC; o++) {
    double got = (double)w[nw + (size_t)o] - (double)after[nw + (size_t)o];
    double e = fabs(got - db[o]) / fmax(fabs(db[o]), 1e-3);
    if (e > worst) worst = e;
  }
  printf("conv2d bias gradient under bf16 (%s, %s, %d devices): %.2e from the float dy's\n", path,
         relu ? "ReLU" : "no ReLU", devices, worst);
  CHECK(worst <= 1e-5,
        "%s%s, %d devices: conv2d's bias gradient under bf16 differs from the float dy's sum by "
        "%.3g (relative; the rounded dy's is 2.9e-3 short)",
        path, relu ? " with ReLU" : "", devices, worst);
  free(w), free(x), free(t), free(after), free(z), free(db);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

static void conv_bias(void) {
  const char *paths[] = {"im2col", "onednn"};
  for (int i = 0; i < 2; i++) {
    if (cpu_conv_force(paths[i]) != PMAP_SUCCESS) {
      printf("conv2d bias gradient: no %s convolution in this build\n", paths[i]);
      continue;
    }
    /* The shape the cases take is one oneDNN's primitives serve (not im2col's fallback). */
    pmap_conv_shape s = {16, 8, 8, 16, 8, 8, 3, 3, 1, 1};
    if (!strcmp(paths[i], "onednn"))
      for (int64_t bd = 2; bd <= 4; bd += 2)
        CHECK(conv_dnnl_serves(NULL, &s, bd), "oneDNN does not serve the case's shape at %lld",
              (long long)bd);
    for (int relu = 0; relu < 2; relu++)
      for (int d = 1; d <= 2; d++) conv_bias_case(paths[i], relu, d);
  }
  const char *env = getenv("PMAP_CONV");
  if (cpu_conv_force(env && *env ? env : "auto")) CHECK_OK(cpu_conv_force("im2col"));
}

/* One SGD step of a dense ReLU net under bf16 where every float sum is exact: inputs in
 * {-1, 0, 1}, weights in {-2, ..., 2} (|h| <= 128 and |y| <= 2^14: integers of at most 8 and
 * 15 bits), targets y - e with e in {-2, ..., 2} computed in double, so the output gradient is
 * 2 e / 2^10 and every product and partial sum, forward and backward, and the step at rate 2^-4
 * are exact in float. The bfloat16 roundings are then of the same floats in any order: the
 * parameters after the step, and the loss, have the same bits whatever sums them. Large enough
 * (32 x 64 x 64) that the bf16 GEMM's own path runs, not its small-shape loop. */
static int exact_step(int devices, float *w_out, size_t cap, float *loss) {
  enum { B = 32, IN = 64, HID = 64, OUT = 32 };
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  int64_t in[1] = {IN};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_sgd(0x1p-4f, 0.0f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_dense(m, HID));
  CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_dense(m, OUT));
  CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_MSE));
  CHECK_OK(pmap_params_create(ctx, m, &opt, 0, &p));
  size_t n = p ? pmap_params_count(p) : 0, w1 = IN * HID, b1 = HID, w2 = HID * OUT;
  CHECK(n == w1 + b1 + w2 + OUT && n <= cap, "the net has %zu parameters", n);
  static float x[B * IN], t[B * OUT];
  uint64_t seed = 77;
  for (size_t i = 0; i < w1 + b1 + w2 + OUT && i < cap; i++)
    w_out[i] = (float)((int)(test_rand_u64(&seed) % 5) - 2);
  for (size_t i = 0; i < B * IN; i++) x[i] = (float)((int)(test_rand_u64(&seed) % 3) - 1);
  for (int r = 0; r < B; r++)
    for (int o = 0; o < OUT; o++) {
      double y = w_out[w1 + b1 + w2 + o];
      for (int h = 0; h < HID; h++) {
        double a = w_out[w1 + h];
        for (int i = 0; i < IN; i++) a += (double)x[r * IN + i] * w_out[i * HID + h];
        y += (a > 0 ? a : 0) * w_out[w1 + b1 + h * OUT + o];
      }
      t[r * OUT + o] = (float)(y - (double)((int)(test_rand_u64(&seed) % 5) - 2));
    }
  int64_t xs_shape[2] = {B, IN}, ys_shape[2] = {B, OUT};
  pmap_array xs = pmap_array_f32(x, 2, xs_shape), ys = pmap_array_f32(t, 2, ys_shape);
  if (!test_failures) {
    CHECK_OK(pmap_params_write(p, w_out, n));
    CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16));
    CHECK_OK(pmap_update(p, &xs, &ys, loss));
    CHECK_OK(pmap_params_verify(p));
    CHECK_OK(pmap_params_read(p, devices - 1, w_out, n));
  }
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return test_failures ? -1 : (int)n;
}

/* Both CPU bf16 GEMMs compute the same products and float sums, in other orders. Where the sums
 * are exact they give the same bits (exact_step, on 1 and 2 devices). On the example models a
 * last-bit difference of a sum can move a bfloat16 rounding by a step: they agree as two bf16
 * runs of other orders do (bound_order16), mlp-1024's parameters after 5 SGD steps and its
 * losses, gpt-mini's losses over 10 steps (Adam's parameters have no such bound: its
 * normalised step turns a last-bit difference of a near-zero gradient into a whole step). */
static void providers(void) {
  if (cpu_bf16_force("onednn") != PMAP_SUCCESS) {
    printf("providers: this build has no oneDNN (portable alone)\n");
    return;
  }
  static float ref[8192], got[8192];
  float lref = 0, lgot = 0;
  for (int d = 1; d <= 2; d++) {
    CHECK_OK(cpu_bf16_force("onednn"));
    int n = exact_step(d, ref, 8192, &lref);
    CHECK_OK(cpu_bf16_force("portable"));
    if (n <= 0 || exact_step(d, got, 8192, &lgot) != n) break;
    test_same_bits("one exact bf16 step: portable against onednn", got, ref, (size_t)n);
    test_same_bits("its loss", &lgot, &lref, 1);
  }
  static const struct {
    const char *model;
    int steps, params; /* params: the parameters are compared (SGD) */
  } cases[] = {{"mlp-1024", 5, 1}, {"gpt-mini", 10, 0}};
  for (int i = 0; i < 2; i++) {
    pmap_example_info info;
    CHECK_OK(pmap_example_info_get(cases[i].model, &info));
    double bound =
        bound_order16(bound_model_of(cases[i].model), (double)info.batch, cases[i].steps);
    run a, b;
    CHECK_OK(cpu_bf16_force("onednn"));
    if (train(cases[i].model, cases[i].steps, 1, PMAP_PRECISION_BF16, &a)) return;
    CHECK_OK(cpu_bf16_force("portable"));
    if (train(cases[i].model, cases[i].steps, 1, PMAP_PRECISION_BF16, &b)) return;
    double e = test_rel_err(a.w, b.w, a.n), most = 0, last = 0;
    curves(a.loss, b.loss, cases[i].steps, &most, &last);
    printf(
        "providers: %s after %d bf16 steps, onednn against portable: parameters %.2e, "
        "losses %.2e (bound %.2e)\n",
        cases[i].model, cases[i].steps, e, most, bound);
    if (cases[i].params)
      CHECK(e <= bound, "%s: the bf16 GEMMs' parameters differ by %.3g > %.3g", cases[i].model, e,
            bound);
    CHECK(most <= bound, "%s: the bf16 GEMMs' losses differ by %.3g > %.3g", cases[i].model, most,
          bound);
    free(a.w), free(b.w);
  }
}

/* Saved under bf16, loaded into fresh params: the policy and the float masters come back, and
 * the run goes on bitwise as if never stopped; then on under fp32. */
static void checkpoints(void) {
  const char *path = "test_precision.ckpt";
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL, *q = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_example_info_get("mlp", &info));
  CHECK_OK(pmap_example_model("mlp", &m));
  CHECK_OK(pmap_params_create(ctx, m, &info.opt, 0, &p));
  CHECK_OK(pmap_params_create(ctx, m, &info.opt, 9, &q));
  CHECK_OK(pmap_example_data("mlp", 1, 64, &xs, &ys));
  if (test_failures) return;
  float l = 0, lq = 0;
  CHECK_OK(pmap_params_save(p, path)); /* fp32: version 1, as earlier builds wrote */
  FILE *fh = fopen(path, "rb");
  unsigned char head[12] = {0};
  CHECK(fh && fread(head, 1, 12, fh) == 12 && head[8] == 1, "an fp32 save is not version 1");
  if (fh) fclose(fh);
  CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16));
  for (int s = 0; s < 5; s++) CHECK_OK(pmap_update(p, &xs, &ys, &l));
  CHECK_OK(pmap_params_save(p, path));
  fh = fopen(path, "rb");
  CHECK(fh && fread(head, 1, 12, fh) == 12 && head[8] == 2, "a bf16 save is not version 2");
  if (fh) fclose(fh);
  CHECK_OK(pmap_params_load(q, path));
  CHECK(pmap_params_precision(q) == PMAP_PRECISION_BF16, "the load did not restore bf16");
  for (int s = 0; s < 3; s++) {
    CHECK_OK(pmap_update(p, &xs, &ys, &l));
    CHECK_OK(pmap_update(q, &xs, &ys, &lq));
  }
  size_t n = pmap_params_count(p);
  float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
  CHECK_OK(pmap_params_read(p, 1, a, n));
  CHECK_OK(pmap_params_read(q, 1, b, n));
  test_same_bits("bf16 resumed from its checkpoint against the run never stopped", b, a, n);
  /* Resuming under the other policy: allowed; the masters are the same floats. */
  CHECK_OK(pmap_params_load(q, path));
  CHECK_OK(pmap_params_set_precision(q, PMAP_PRECISION_FP32));
  CHECK_OK(pmap_update(q, &xs, &ys, &lq));
  CHECK(isfinite(lq) && pmap_params_precision(q) == PMAP_PRECISION_FP32, "resume under fp32");
  CHECK_OK(pmap_params_load(q, path)); /* a bf16 file into fp32 params: bf16 again */
  CHECK(pmap_params_precision(q) == PMAP_PRECISION_BF16, "the second load did not restore bf16");
  remove(path);
  free(a), free(b);
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_params_destroy(q);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

/* What bf16 computes: a GEMM layer's output is the float GEMM of its operands rounded to
 * bfloat16. With every parameter and the input already bfloat16 values, bf16's prediction of a
 * dense layer is fp32's up to the order of the sums, and a convolution's (float kernels on the
 * rounded values) fp32's bitwise. */
static float round16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u; /* the values here are finite */
  memcpy(&x, &u, sizeof x);
  return x;
}

static void semantics(void) {
  static const int64_t dense_in[1] = {96}, conv_in[3] = {3, 9, 11};
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  for (int conv = 0; conv < 2 && ctx; conv++) {
    pmap_model *m = NULL;
    pmap_params *p32 = NULL, *p16 = NULL;
    pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
    CHECK_OK(pmap_model_create(conv ? 3 : 1, conv ? conv_in : dense_in, &m));
    CHECK_OK(conv ? pmap_model_add_conv2d(m, 5, 3, 3, 1, 1) : pmap_model_add_dense(m, 37));
    if (conv) CHECK_OK(pmap_model_add_flatten(m));
    CHECK_OK(pmap_params_create(ctx, m, &opt, 5, &p32));
    CHECK_OK(pmap_params_create(ctx, m, &opt, 5, &p16));
    if (test_failures) return;
    CHECK_OK(pmap_params_set_precision(p16, PMAP_PRECISION_BF16));
    size_t n = pmap_params_count(p32), in = conv ? 3 * 9 * 11 : 96, out = conv ? 5 * 9 * 11 : 37;
    int64_t rows = 8, xshape[4] = {rows, conv ? 3 : 96, 9, 11}, oshape[2] = {rows, (int64_t)out};
    float *w = malloc(n * sizeof *w), *x = malloc(rows * in * sizeof *x);
    float *y32 = malloc(rows * out * sizeof *y32), *y16 = malloc(rows * out * sizeof *y16);
    uint64_t seed = 11;
    CHECK_OK(pmap_params_read(p32, 0, w, n));
    for (size_t i = 0; i < n; i++) w[i] = round16(w[i] + test_rand_uniform(&seed, -0.1f, 0.1f));
    for (size_t i = 0; i < rows * in; i++) x[i] = round16(test_rand_uniform(&seed, -2.0f, 2.0f));
    CHECK_OK(pmap_params_write(p32, w, n));
    CHECK_OK(pmap_params_write(p16, w, n));
    pmap_array xs = pmap_array_f32(x, conv ? 4 : 2, xshape), o32 = pmap_array_f32(y32, 2, oshape),
               o16 = pmap_array_f32(y16, 2, oshape);
    CHECK_OK(pmap_predict(p32, &xs, &o32));
    CHECK_OK(pmap_predict(p16, &xs, &o16));
    if (conv)
      test_same_bits("conv2d under bf16 against fp32 on bfloat16 values", y16, y32, rows * out);
    else
      test_close_f("dense under bf16 against fp32 on bfloat16 values", y16, y32, rows * out,
                   2 * bound_sum(96 + 1)); /* two orders of a 96-term dot product and the bias */
    /* The input rounded by bf16 itself: an input off the bfloat16 grid gives another output. */
    for (size_t i = 0; i < rows * in; i++) x[i] += x[i] * 1e-3f;
    CHECK_OK(pmap_predict(p16, &xs, &o16));
    CHECK_OK(pmap_predict(p32, &xs, &o32));
    double e = 0, d = 0;
    for (size_t i = 0; i < rows * out; i++) e += fabs(y16[i] - y32[i]), d += fabs(y32[i]);
    CHECK(e / d > 1e-4, "%s: bf16 does not round its input (%.3g)", conv ? "conv2d" : "dense",
          e / d);
    free(w), free(x), free(y32), free(y16);
    pmap_params_destroy(p32);
    pmap_params_destroy(p16);
    pmap_model_destroy(m);
  }
  pmap_ctx_destroy(ctx);
}

/* The numeric guard under bf16: a NaN input, and an input past bfloat16's range (its rounding an
 * infinity), skip the step on every replica with nothing changed. */
static void guard(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_example_info_get("mlp", &info));
  CHECK_OK(pmap_example_model("mlp", &m));
  CHECK_OK(pmap_params_create(ctx, m, &info.opt, 0, &p));
  CHECK_OK(pmap_example_data("mlp", 1, 32, &xs, &ys));
  if (test_failures) return;
  CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16));
  float l = 0;
  CHECK_OK(pmap_update(p, &xs, &ys, &l));
  size_t n = pmap_params_count(p);
  float *before = malloc(n * sizeof *before), *after = malloc(n * sizeof *after);
  const float bad[2] = {NAN, 3.4e38f}; /* 3.4e38 rounds to an infinity in bfloat16 */
  for (int k = 0; k < 2; k++) {
    CHECK_OK(pmap_params_read(p, 1, before, n));
    float *x = xs.data, saved = x[17 * 10 + 3];
    x[17 * 10 + 3] = bad[k];
    CHECK_FAILS(pmap_update(p, &xs, &ys, &l), PMAP_ERR_NUMERIC, "device 1");
    x[17 * 10 + 3] = saved;
    CHECK_OK(pmap_params_read(p, 1, after, n));
    test_same_bits("bf16 parameters after a skipped step", after, before, n);
    CHECK(pmap_params_step(p) == 1, "the skipped step was counted: %lld",
          (long long)pmap_params_step(p));
  }
  CHECK_OK(pmap_params_verify(p));
  free(before), free(after);
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

static pmap_status zero_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  *a->loss = 0.0f;
  return PMAP_SUCCESS;
}

static void refusals(void) {
  pmap_precision pr = PMAP_PRECISION_FP32;
  CHECK(!strcmp(pmap_precision_name(PMAP_PRECISION_BF16), "bf16"), "name of bf16");
  CHECK(!strcmp(pmap_precision_name(PMAP_PRECISION_FP32), "fp32"), "name of fp32");
  CHECK(pmap_precision_name((pmap_precision)7) == NULL, "name of 7");
  CHECK_OK(pmap_precision_parse("bf16", &pr));
  CHECK(pr == PMAP_PRECISION_BF16, "parse bf16");
  CHECK_FAILS(pmap_precision_parse("fp16", &pr), PMAP_ERR_INVALID_ARGUMENT, "\"fp16\"");
  CHECK_FAILS(pmap_precision_parse(NULL, &pr), PMAP_ERR_INVALID_ARGUMENT, "(null)");
  CHECK_FAILS(pmap_params_set_precision(NULL, PMAP_PRECISION_BF16), PMAP_ERR_INVALID_ARGUMENT,
              "params is NULL");
  CHECK(pmap_params_precision(NULL) == PMAP_PRECISION_FP32, "NULL params' precision");
  const char *isa = pmap_cpu_bf16(), *prov = pmap_bf16_provider();
  CHECK(!strcmp(isa, "amx_bf16") || !strcmp(isa, "avx512_bf16") || !strcmp(isa, "none"),
        "pmap_cpu_bf16() is \"%s\"", isa);
  CHECK(!strcmp(prov, "onednn") || !strcmp(prov, "portable"), "provider \"%s\"", prov);
  printf("CPU bf16: %s; bf16 GEMM %s (%s)\n", isa, prov, pmap_bf16_reason());
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL, *c = NULL;
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  float init[4] = {0};
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_example_model("gpt-mini", &m));
  CHECK_OK(pmap_params_create(ctx, m, &opt, 0, &p));
  CHECK_OK(pmap_params_create_custom(ctx, 4, init, zero_grad, NULL, &opt, &c));
  if (test_failures) return;
  CHECK_FAILS(pmap_params_set_precision(p, (pmap_precision)2), PMAP_ERR_INVALID_ARGUMENT,
              "precision 2");
  CHECK_FAILS(pmap_params_set_precision(p, (pmap_precision)-1), PMAP_ERR_INVALID_ARGUMENT,
              "precision -1");
  CHECK(pmap_params_precision(p) == PMAP_PRECISION_FP32, "a refused call changed the policy");
  CHECK_FAILS(pmap_params_set_precision(c, PMAP_PRECISION_BF16), PMAP_ERR_INVALID_ARGUMENT,
              "pmap_params_create_custom");
  CHECK_OK(pmap_params_set_precision(c, PMAP_PRECISION_FP32));
  /* The plan: the weights' bfloat16 copy on top, gpt-mini's activations below fp32's. */
  pmap_memory_plan a, b;
  CHECK_OK(pmap_params_memory(p, 32, &a));
  CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16));
  CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16)); /* again: nothing to do */
  CHECK_OK(pmap_params_memory(p, 32, &b));
  printf(
      "gpt-mini, 32 rows on 2 devices: activations %zu bytes (fp32) -> %zu (bf16), params "
      "%zu -> %zu\n",
      a.activations, b.activations, a.params, b.params);
  CHECK(b.params == a.params + 2 * pmap_params_count(p), "bf16 params memory %zu, fp32 %zu",
        b.params, a.params);
  CHECK(b.activations < a.activations * 0.8, "bf16 activations %zu, not 20%% below fp32's %zu",
        b.activations, a.activations);
  pmap_params_destroy(c);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

int main(void) {
  refusals();
  semantics();
  guard();
  checkpoints();
  repeats();
  conv_bias();
  providers();
  /* The models on the GEMM this process chose (PMAP_GEMM_BF16), which providers() changed. */
  const char *env = getenv("PMAP_GEMM_BF16");
  if (cpu_bf16_force(env && *env && strcmp(env, "auto") ? env : "onednn"))
    CHECK_OK(cpu_bf16_force("portable"));
  models(pmap_bf16_provider());
  return test_exit("precision");
}
