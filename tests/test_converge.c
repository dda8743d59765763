/* test_converge.c: the seed examples reach their known results on 4 CPU devices: linear fits
 * w = 2, b = -1 down to the noise floor (the JAX tutorial's loss ~0.21-0.25); mlp and convnet
 * halve their loss. */
#include "pmap_examples.h"
#include "testutil.h"

/* Trains `model` with its defaults on 4 devices; returns the loss of the first step and the
 * mean loss of the last 10, and the parameters of device 0 in w (2 floats read for linear). */
static void train(const char *model, float *first, float *last, float *w) {
  pmap_example_info info;
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_array xs = {0}, ys = {0};
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 4};
  *first = *last = NAN;
  CHECK_OK(pmap_example_info_get(model, &info));
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_example_model(model, &m));
  CHECK_OK(pmap_params_create(ctx, m, &info.opt, 0, &p));
  CHECK_OK(pmap_example_data(model, 1, info.samples, &xs, &ys));
  if (test_failures) goto out;
  int64_t batches = info.samples / info.batch;
  double tail = 0.0;
  for (int64_t s = 0; s < info.steps; s++) {
    int64_t row = (s % batches) * info.batch;
    pmap_array xb = xs, yb = ys;
    xb.data = (float *)xs.data + (size_t)(row * (pmap_array_numel(&xs) / info.samples));
    yb.data = (char *)ys.data + (size_t)(row * (pmap_array_numel(&ys) / info.samples)) * 4;
    xb.shape[0] = yb.shape[0] = info.batch;
    float loss;
    CHECK_OK(pmap_update(p, &xb, &yb, &loss));
    if (s == 0) *first = loss;
    if (s >= info.steps - 10) tail += loss / 10.0;
  }
  *last = (float)tail;
  if (w) CHECK_OK(pmap_params_read(p, 0, w, 2));
  printf("%-8s first loss %.6f, mean of the last 10 %.6f\n", model, (double)*first, (double)*last);
out:
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

int main(void) {
  float first, last, w[2] = {NAN, NAN};
  train("linear", &first, &last, w);
  printf("linear   w %.4f b %.4f\n", (double)w[0], (double)w[1]);
  CHECK(last < 0.3f, "linear: final loss %g, want < 0.3", (double)last);
  CHECK(fabsf(w[0] - 2.0f) < 0.1f, "linear: w %g, want 2 +- 0.1", (double)w[0]);
  CHECK(fabsf(w[1] + 1.0f) < 0.1f, "linear: b %g, want -1 +- 0.1", (double)w[1]);
  train("mlp", &first, &last, NULL);
  CHECK(last <= 0.5f * first, "mlp: loss %g -> %g did not halve", (double)first, (double)last);
  train("convnet", &first, &last, NULL);
  CHECK(last <= 0.5f * first, "convnet: loss %g -> %g did not halve", (double)first, (double)last);
  return test_exit("converge");
}
