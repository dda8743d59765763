/* heap-plan: the heap a training step takes beyond pmap_params_memory's plan, for
 * docs/precision.md's table. `heap-plan MODEL BATCH fp32|bf16 [DEVICES [WARM_BATCH]]`: glibc's
 * count of bytes in use (mallinfo2) before pmap_params_create and after 3 steps at BATCH, less
 * the plan's total on each device. With WARM_BATCH, a throwaway params first runs a step at that
 * batch in the same process (so that what a process keeps from an earlier run, such as the GEMM
 * libraries' kernels, is in place). The inputs are made before the first count. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmap.h"
#include "pmap_examples.h"

static int fail(const char *what) {
  fprintf(stderr, "heap-plan: %s: %s\n", what, pmap_last_error());
  return 1;
}

static size_t in_use(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

int main(int argc, char **argv) {
  if (argc < 4 || (strcmp(argv[3], "fp32") && strcmp(argv[3], "bf16"))) {
    fprintf(stderr, "usage: heap-plan MODEL BATCH fp32|bf16 [DEVICES [WARM_BATCH]]\n");
    return 2;
  }
  const char *model = argv[1];
  long batch = atol(argv[2]), warm = argc > 5 ? atol(argv[5]) : 0;
  int devices = argc > 4 ? atoi(argv[4]) : 2;
  pmap_precision prec = strcmp(argv[3], "bf16") ? PMAP_PRECISION_FP32 : PMAP_PRECISION_BF16;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_example_info info;
  pmap_array xs, ys, wx, wy;
  float loss;
  if (pmap_ctx_create(&cfg, &ctx)) return fail("pmap_ctx_create");
  if (pmap_example_info_get(model, &info) || pmap_example_model(model, &m))
    return fail("the model");
  if (pmap_example_data(model, 1, batch, &xs, &ys)) return fail("the data");
  if (warm > 0) {
    pmap_params *w = NULL;
    if (pmap_example_data(model, 2, warm, &wx, &wy)) return fail("the warm-up data");
    if (pmap_params_create(ctx, m, &info.opt, 0, &w) || pmap_params_set_precision(w, prec) ||
        pmap_update(w, &wx, &wy, &loss))
      return fail("the warm-up step");
    pmap_params_destroy(w);
    pmap_example_data_free(&wx, &wy);
  }
  malloc_trim(0);
  size_t before = in_use();
  if (pmap_params_create(ctx, m, &info.opt, 0, &p) || pmap_params_set_precision(p, prec))
    return fail("pmap_params_create");
  for (int s = 0; s < 3; s++)
    if (pmap_update(p, &xs, &ys, &loss)) return fail("pmap_update");
  size_t after = in_use();
  pmap_memory_plan plan;
  if (pmap_params_memory(p, batch, &plan)) return fail("pmap_params_memory");
  double grown = (double)after - (double)before, planned = (double)devices * (double)plan.total;
  printf("%s batch %ld %s%s: heap grew %.3f MB, plan %.3f MB x %d devices, beyond %.3f MB\n", model,
         batch, argv[3], warm > 0 ? " (after a run)" : "", grown / 1e6, plan.total / 1e6, devices,
         (grown - planned) / 1e6);
  pmap_params_destroy(p);
  pmap_example_data_free(&xs, &ys);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return 0;
}
