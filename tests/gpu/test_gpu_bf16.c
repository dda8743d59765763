/* test_gpu_bf16.c: the bf16 policy on the CUDA backend (cuBLAS's bf16 GEMMs with float compute,
 * the rounding kernels): example models trained under bf16 on N logical devices agree with the
 * CPU's bf16 on N devices, replicas stay bitwise identical, the captured step (CUDA graphs)
 * gives the plain step's bits, bf16 is not fp32, and the memory plan shows the saving. N:
 * PMAP_GPU_TEST_DEVICES, else 2. Skips (77) without a GPU.
 *
 * Bounds. cuBLAS and the CPU sum in other orders; under bf16 a last-bit difference of a sum that
 * is then rounded to bfloat16 can move it by a bfloat16 step, so the two agree as two bf16 runs
 * of other orders do: bound_order16 of the model over the steps on the batch (tests/bounds.h),
 * with the tensor cores' sums, which truncate, erring up to gpu_bound_sum16 / bound_sum times
 * as much as a CPU's (order16_tc). Losses for every model, parameters where the optimizer is
 * SGD: Adam's first steps are about lr sign(g), which a last-bit difference of a gradient near
 * 0 flips (docs/tolerances.md). bf16 against fp32 on CUDA: bound_prec16 likewise. The CPU
 * side's steps are few: the GPU machine's CPU GEMM is the portable loop (mlp-1024's step about a
 * second there). */
#include "gpu_util.h"
#include "pmap_examples.h"

static const struct {
  const char *model;
  int steps;
  int64_t batch; /* small where the CPU's step is long: the GPU machine's CPU GEMM is the
                    portable loop */
  int adam;      /* the model's optimizer is Adam: its parameters are not compared */
} cases[] = {
    {"mlp-1024", 3, 64, 0},
    {"res-mlp", 20, 256, 1},
    {"cifar-cnn", 3, 16, 0},
    {"gpt-mini", 2, 8, 1},
};

/* bound_order16 where one run's bf16 GEMMs sum on tensor cores: their float sums err by up to
 * t = gpu_bound_sum16(k) / bound_sum(k) times a CPU's at the model's longest rounded sum k, so
 * the two runs' float sums differ by up to 1 + t times what two CPU orders' do (each against
 * the exact sum); that scales the float part of the bound, and the probability that the
 * difference moves a bfloat16 rounding, whose part grows by its square root. With `prec`, the
 * same for bf16 against fp32 (bound_prec16's part of every rounding does not scale). */
static double order16_tc(const bound_model *m, double rows, double steps, int prec) {
  double t = 1.0 + gpu_bound_sum16(m->k_round) / bound_sum(m->k_round);
  double o32 = bound_order32(m, rows, steps);
  if (prec) return t * o32 + (bound_prec16(m, rows, steps) - o32);
  return t * o32 + sqrt(t) * (bound_order16(m, rows, steps) - o32);
}

/* The largest relative difference of the losses of a step (n of them). */
static double loss_err(const float *a, const float *b, int n) {
  double most = 0.0;
  for (int s = 0; s < n; s++) {
    double e = fabs((double)a[s] - b[s]) / fmax(fabs((double)b[s]), 1e-30);
    most = e > most || isnan(e) ? e : most;
  }
  return most;
}

/* `steps` steps of `model` under `prec` on ctx from seed 0 on its own data: the losses, device
 * 0's parameters (P, malloc'ed into *w), replicas checked bitwise; the memory plan into *plan. */
static void train(pmap_ctx *ctx, const char *model, int steps, int64_t batch, pmap_precision prec,
                  float *losses, float **w, size_t *n, pmap_memory_plan *plan) {
  pmap_example_info info;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_array xs = {0}, ys = {0};
  *w = NULL;
  *n = 0;
  CHECK_OK(pmap_example_info_get(model, &info));
  CHECK_OK(pmap_example_model(model, &m));
  CHECK_OK(pmap_params_create(ctx, m, &info.opt, 0, &p));
  CHECK_OK(pmap_params_set_precision(p, prec));
  CHECK_OK(pmap_example_data(model, 1, batch, &xs, &ys));
  if (test_failures) goto out;
  for (int s = 0; s < steps; s++) CHECK_OK(pmap_update(p, &xs, &ys, &losses[s]));
  CHECK_OK(pmap_params_verify(p)); /* every replica the same bits */
  *n = pmap_params_count(p);
  *w = malloc(*n * sizeof **w);
  if (*w) CHECK_OK(pmap_params_read(p, 0, *w, *n));
  if (plan) CHECK_OK(pmap_params_memory(p, batch, plan));
out:
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
}

int main(void) {
  int gpus = gpu_count();
  if (gpus <= 0) return gpus == 0 ? GPU_SKIP : 1;
  int n = gpu_test_devices(2);
  if (n < 0) return 1;
  pmap_ctx *cuda = NULL, *cpu = NULL;
  if (gpu_ctx(n, gpus, 0.0, &cuda) != PMAP_SUCCESS) return test_failures ? 1 : GPU_SKIP;
  pmap_config cc = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
  CHECK_OK(pmap_ctx_create(&cc, &cpu));
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] && cpu; i++) {
    const char *model = cases[i].model;
    float lg[32], lc[32], lf[32];
    float *wg = NULL, *wc = NULL, *wf = NULL;
    size_t ng = 0, nc = 0, nf = 0;
    int steps = cases[i].steps;
    int64_t batch = (cases[i].batch + n - 1) / n * n;
    train(cuda, model, steps, batch, PMAP_PRECISION_BF16, lg, &wg, &ng, NULL);
    train(cpu, model, steps, batch, PMAP_PRECISION_BF16, lc, &wc, &nc, NULL);
    train(cuda, model, steps, batch, PMAP_PRECISION_FP32, lf, &wf, &nf, NULL);
    const bound_model *bm = bound_model_of(model);
    CHECK(bm != NULL, "%s: no bound model", model);
    if (bm && wg && wc && wf && ng == nc && ng == nf) {
      double order = order16_tc(bm, (double)batch, steps, 0);
      double prec = order16_tc(bm, (double)batch, steps, 1);
      double ew = test_rel_err(wg, wc, ng), el = loss_err(lg, lc, steps);
      double ef = loss_err(lg, lf, steps);
      printf(
          "%s on %d devices, %d bf16 steps, CUDA against CPU: parameters %.2e%s, losses %.2e "
          "(bound %.2e); bf16 against fp32 on CUDA: losses %.2e (bound %.2e), parameters "
          "%.2e\n",
          model, n, steps, ew, cases[i].adam ? " (Adam: not bounded)" : "", el, order, ef, prec,
          test_rel_err(wg, wf, ng));
      CHECK(cases[i].adam || ew <= order,
            "%s: bf16 parameters on CUDA and CPU differ by %.3g > %.3g", model, ew, order);
      CHECK(el <= order, "%s: bf16 losses on CUDA and CPU differ by %.3g > %.3g", model, el, order);
      CHECK(ef <= prec, "%s: bf16 losses on CUDA depart from fp32's by %.3g > %.3g", model, ef,
            prec);
      CHECK(test_rel_err(wg, wf, ng) > 0.0, "%s: bf16 trained exactly as fp32 on CUDA", model);
    }
    free(wg), free(wc), free(wf);
  }
  /* The memory plan on the GPU: gpt-mini's bf16 activations below fp32's. */
  pmap_memory_plan a, b;
  float l[8], *w = NULL;
  size_t np = 0;
  train(cuda, "gpt-mini", 1, 32, PMAP_PRECISION_FP32, l, &w, &np, &a);
  free(w);
  train(cuda, "gpt-mini", 1, 32, PMAP_PRECISION_BF16, l, &w, &np, &b);
  free(w);
  printf("gpt-mini's activations on CUDA: %zu bytes (fp32), %zu (bf16)\n", a.activations,
         b.activations);
  CHECK(b.activations < a.activations, "bf16 activations %zu, fp32 %zu", b.activations,
        a.activations);
  pmap_ctx_destroy(cuda);
  pmap_ctx_destroy(cpu);
  /* The captured step replays the plain step's kernels: the same bits under bf16. */
  int ids[PMAP_MAX_DEVICES];
  for (int i = 0; i < n; i++) ids[i] = i % gpus;
  float plain[8], graph[8], *w1 = NULL, *w2 = NULL;
  size_t n1 = 0, n2 = 0;
  for (int g = 0; g < 2; g++) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CUDA,
                       .num_devices = n,
                       .device_ids = ids,
                       .cuda_graphs = g ? 1 : -1};
    pmap_ctx *ctx = NULL;
    CHECK_OK(pmap_ctx_create(&cfg, &ctx));
    if (ctx)
      train(ctx, "gpt-mini", 6, 32, PMAP_PRECISION_BF16, g ? graph : plain, g ? &w2 : &w1,
            g ? &n2 : &n1, NULL);
    pmap_ctx_destroy(ctx);
  }
  if (w1 && w2 && n1 == n2) {
    test_same_bits("gpt-mini bf16 losses, graph against plain", graph, plain, 6);
    test_same_bits("gpt-mini bf16 parameters, graph against plain", w2, w1, n1);
  }
  free(w1), free(w2);
  return test_exit("gpu_bf16");
}
