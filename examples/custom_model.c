/* custom_model.c: training a model pmap does not know (a hand-written two-layer tanh network,
 * examples/tanh_net.h) with pmap_params_create_custom: the runtime shards the batch, averages
 * [gradients | loss] in one all-reduce and applies Adam on every replica. Trains on 1 and on 4
 * CPU devices and prints both results, which differ only in the order of their float sums. */
#include <stdio.h>
#include <string.h>

#include "tanh_net.h"

enum { ROWS = 256, F = 3, H = 16, K = 2, STEPS = 300 };

static float uniform(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) & 0xffffff) / (float)(1 << 24) - 0.5f;
}

/* Trains on `devices` CPU devices; the final loss into *loss and the parameters into w. */
static int train(int devices, const float *x, const float *t, const float *init, float *w,
                 float *loss) {
  tanh_net net = {F, H, K};
  size_t P = tanh_net_params(&net);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  pmap_optimizer adam = pmap_adam(0.01f);
  int64_t xs_shape[2] = {ROWS, F}, ys_shape[2] = {ROWS, K};
  pmap_array xs = pmap_array_f32((float *)x, 2, xs_shape),
             ys = pmap_array_f32((float *)t, 2, ys_shape);
  int rc = 1;
  if (pmap_ctx_create(&cfg, &ctx) ||
      pmap_params_create_custom(ctx, P, init, tanh_net_grad, &net, &adam, &params))
    goto out;
  for (int s = 0; s < STEPS; s++)
    if (pmap_update(params, &xs, &ys, loss)) goto out;
  if (pmap_params_read(params, devices - 1, w, P)) goto out;
  rc = 0;
out:
  if (rc) fprintf(stderr, "custom_model: %s\n", pmap_last_error());
  pmap_params_destroy(params);
  pmap_ctx_destroy(ctx);
  return rc;
}

int main(void) {
  static float x[ROWS * F], t[ROWS * K], init[F * H + H + H * K + K], w1[sizeof init / 4],
      w4[sizeof init / 4];
  uint64_t s = 42;
  for (int i = 0; i < ROWS * F; i++) x[i] = 2.0f * uniform(&s);
  for (int r = 0; r < ROWS; r++) { /* a smooth target the network can fit */
    t[r * K] = sinf(2.0f * x[r * F]) + x[r * F + 1] * x[r * F + 2];
    t[r * K + 1] = cosf(x[r * F + 1]) - 0.5f * x[r * F + 2];
  }
  for (size_t i = 0; i < sizeof init / sizeof *init; i++) init[i] = uniform(&s);
  float loss1 = 0.0f, loss4 = 0.0f;
  if (train(1, x, t, init, w1, &loss1) || train(4, x, t, init, w4, &loss4)) return 1;
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < sizeof init / sizeof *init; i++) {
    diff += ((double)w1[i] - w4[i]) * ((double)w1[i] - w4[i]);
    norm += (double)w1[i] * w1[i];
  }
  /* How far another order of the sums can move the parameters (tests/bounds.h, bound_order32):
   * 6 standard deviations of a random walk of roundings, u = 2^-24 each, over a row's path (the
   * layers forward and back, (F + H) + (H + K), and 4 for tanhf) and the two weight gradients'
   * sums over the rows, for every step; times 10, the MSE's condition. */
  double bound = 6.0 * 10.0 * 0x1p-24 * sqrt(((F + H) + (H + K) + 4 + 2.0 * ROWS) * STEPS);
  printf(
      "1 device: loss %.6f; 4 devices: loss %.6f; parameters differ by %.2e (relative; "
      "bound %.2e)\n",
      (double)loss1, (double)loss4, sqrt(diff / norm), bound);
  return sqrt(diff / norm) <= bound && loss1 < 0.05f ? 0 : 1;
}
