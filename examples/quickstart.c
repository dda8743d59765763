/* quickstart.c: the README's example: fit y = 2x - 1 on 4 CPU devices with pmap_update. */
#include <stdio.h>
#include "pmap.h"

int main(void) {
  enum { B = 128 };
  float x[B], y[B], w[2], loss = 0.0f;
  for (int i = 0; i < B; i++) x[i] = (float)i / B - 0.5f, y[i] = 2.0f * x[i] - 1.0f;
  int64_t shape[2] = {B, 1}, in[1] = {1};
  pmap_array xs = pmap_array_f32(x, 2, shape), ys = pmap_array_f32(y, 2, shape);

  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = 4}; /* 4 devices, each takes 32 rows */
  pmap_ctx *ctx = NULL;
  pmap_model *model = NULL;
  pmap_params *params = NULL;
  pmap_optimizer sgd = pmap_sgd(0.5f, 0.0f);
  if (pmap_ctx_create(&cfg, &ctx) || pmap_model_create(1, in, &model) ||
      pmap_model_add_dense(model, 1) || pmap_params_create(ctx, model, &sgd, 42, &params))
    goto fail;
  for (int step = 0; step < 200; step++)
    if (pmap_update(params, &xs, &ys, &loss)) goto fail; /* forward, backward, pmean, SGD */
  if (pmap_params_read(params, 3, w, 2)) goto fail;      /* any replica: all are identical */
  printf("loss %.2e  w %.4f  b %.4f\n", (double)loss, (double)w[0], (double)w[1]);
  pmap_params_destroy(params);
  pmap_model_destroy(model);
  pmap_ctx_destroy(ctx);
  return 0;
fail:
  fprintf(stderr, "pmap: %s\n", pmap_last_error());
  pmap_params_destroy(params);
  pmap_model_destroy(model);
  pmap_ctx_destroy(ctx);
  return 1;
}
