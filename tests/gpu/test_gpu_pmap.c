/* test_gpu_pmap.c: training on the CUDA backend end to end, on every example model: N logical
 * devices agree with the CPU on N devices and with 1 GPU device on the same global batch,
 * replicas stay bitwise identical, prediction matches the CPU's, and the seed examples
 * converge. N: PMAP_GPU_TEST_DEVICES, else every GPU (2 on one GPU); PMAP_GPU_TEST_QUICK=1 takes
 * three of the models and no convergence runs. One CUDA context of 1 device and one of N serve
 * every model (the sharded optimizer's runs make their own). Skips (77) without a GPU. */
#include "gpu_util.h"
#include "pmap_examples.h"

#define COMPARE_STEPS 20

/* Steps of a comparison: gpt-mini's CPU step takes about a second with the portable GEMM (what
 * a GPU machine without OpenBLAS or oneDNN has), so it is compared over 3. */
static int compare_steps(const char *model) {
  return strcmp(model, "gpt-mini") ? COMPARE_STEPS : 3;
}

/* The CUDA contexts the tests share, of 1 device and of N (NULL where N = 1): a context costs
 * an NCCL communicator and its first connections, counted in bench/gpu-check-plan.sh. */
static pmap_ctx *cuda_one, *cuda_many;

/* Parameters after `steps` steps of `model` (its defaults, global batch `batch`) on ctx, and the
 * loss of every step (steps entries). Checks that every replica holds the same bits. */
static void train(pmap_ctx *ctx, const char *model, int64_t steps, int64_t batch, float *w,
                  float *losses) {
  pmap_example_info info;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(pmap_example_info_get(model, &info));
  CHECK_OK(pmap_example_model(model, &m));
  CHECK_OK(pmap_params_create(ctx, m, &info.opt, 0, &p));
  int64_t samples = info.samples > batch ? info.samples / batch * batch : batch;
  CHECK_OK(pmap_example_data(model, 1, samples, &xs, &ys));
  if (test_failures) goto out;
  size_t xrow = (size_t)(pmap_array_numel(&xs) / samples);
  size_t yrow = (size_t)(pmap_array_numel(&ys) / samples);
  for (int64_t s = 0; s < steps; s++) {
    int64_t row = (s * batch) % samples;
    pmap_array xb = xs, yb = ys;
    xb.data = (float *)xs.data + (size_t)row * xrow;
    yb.data = (char *)ys.data + (size_t)row * yrow * 4;
    xb.shape[0] = yb.shape[0] = batch;
    CHECK_OK(pmap_update(p, &xb, &yb, &losses[s]));
  }
  size_t P = pmap_params_count(p);
  CHECK_OK(pmap_params_read(p, 0, w, P));
  float *other = malloc(P * sizeof *other);
  for (int d = 1; d < pmap_ctx_num_devices(ctx) && other; d++) {
    CHECK_OK(pmap_params_read(p, d, other, P));
    char what[64];
    snprintf(what, sizeof what, "%s replica %d vs 0", model, d);
    test_same_bits(what, other, w, P);
  }
  free(other);
out:
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
}

static size_t n_params(const char *model) {
  pmap_model *m = NULL;
  CHECK_OK(pmap_example_model(model, &m));
  size_t n = pmap_model_num_params(m);
  pmap_model_destroy(m);
  return n;
}

/* Trains `model` from seed 0 on the same global batch of fresh random data, compare_steps of
 * it, on a new CPU context of n devices (cpu), else on the shared CUDA context of n devices
 * (cuda_one or cuda_many); 0 when that context is not possible here. */
static int train_on(int cpu, int n, const char *model, int64_t batch, float *w, float *losses) {
  pmap_ctx *ctx = NULL;
  if (cpu) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
    CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  } else {
    ctx = n == 1 ? cuda_one : cuda_many;
  }
  if (!ctx) return 0;
  train(ctx, model, compare_steps(model), batch, w, losses);
  if (cpu) pmap_ctx_destroy(ctx);
  return 1;
}

/* CPU on n devices, CUDA on n devices and CUDA on 1 device, from the same initial parameters on
 * the same global batch: CUDA agrees with the CPU, n CUDA devices with 1, and every replica
 * holds the same bits (checked in train). The runs differ in the order of their float sums
 * alone (cuBLAS's and the CPU's GEMMs, NCCL's all-reduce; FP32 GEMMs, gpu_util.h turns TF32 off;
 * a fused multiply-add leaves a rounding out): bound_order32 of the model over the steps on the
 * global batch (tests/bounds.h), parameters and losses, Adam's too (float orders alone,
 * docs/tolerances.md). */
static void test_agreement(const char *model, int n) {
  size_t P = n_params(model);
  int64_t batch = 16 * n; /* the same global batch on 1 and on n devices */
  const bound_model *bm = bound_model_of(model);
  CHECK(bm != NULL, "%s: no bound model", model);
  if (!bm) return;
  float *w_cpu = calloc(P, sizeof(float)), *w_one = calloc(P, sizeof(float)),
        *w_many = calloc(P, sizeof(float));
  float l_cpu[COMPARE_STEPS], l_one[COMPARE_STEPS], l_many[COMPARE_STEPS];
  const int steps = compare_steps(model);
  double bound = bound_order32(bm, (double)batch, steps);
  char what[128];
  train_on(1, n, model, batch, w_cpu, l_cpu);
  int one = train_on(0, 1, model, batch, w_one, l_one);
  int many = n > 1 ? train_on(0, n, model, batch, w_many, l_many) : one;
  if (n == 1) {
    memcpy(w_many, w_one, P * sizeof *w_many);
    memcpy(l_many, l_one, sizeof l_many);
  }
  if (many) {
    snprintf(what, sizeof what, "%s: CUDA vs CPU on %d device%s, parameters after %d steps", model,
             n, n == 1 ? "" : "s", steps);
    gpu_within(what, w_many, w_cpu, P, bound);
    snprintf(what, sizeof what, "%s: CUDA vs CPU on %d device%s, losses", model, n,
             n == 1 ? "" : "s");
    gpu_within(what, l_many, l_cpu, (size_t)steps, bound);
  }
  if (one && many && n > 1) {
    snprintf(what, sizeof what, "%s: CUDA %d devices vs 1, parameters", model, n);
    gpu_within(what, w_many, w_one, P, bound);
    snprintf(what, sizeof what, "%s: CUDA %d devices vs 1, losses", model, n);
    gpu_within(what, l_many, l_one, (size_t)steps, bound);
  }
  if (many)
    printf("%-9s: %d CUDA device%s agree with the CPU%s (losses %.6f -> %.6f)\n", model, n,
           n == 1 ? "" : "s", n > 1 ? " and with 1 CUDA device" : "", (double)l_many[0],
           (double)l_many[steps - 1]);
  free(w_cpu);
  free(w_one);
  free(w_many);
}

/* The sharded optimizer (ncclReduceScatter, the optimizer on each device's part, ncclAllGather)
 * and the sharded gradients (each layer's gradients all-reduced as its backward ends, the
 * device's part copied out) against the replicated step (ncclAllReduce) on n CUDA devices, for
 * each of `count` models, on a context of each (the setting is read when a context is made):
 * NCCL may sum in another order for the collectives, so the runs agree within bound_order32 of
 * the model rather than bitwise; replicas stay bitwise identical (checked in train). */
static void test_shard_agreement(const char *const *models, int count, int n, int gpus) {
  pmap_ctx *rep = NULL, *shard = NULL, *grads = NULL;
  setenv("PMAP_SHARD_OPTIMIZER", "0", 1);
  pmap_status st = gpu_ctx(n, gpus, 0.0, &rep);
  setenv("PMAP_SHARD_OPTIMIZER", "1", 1);
  if (!st) st = gpu_ctx(n, gpus, 0.0, &shard);
  unsetenv("PMAP_SHARD_OPTIMIZER");
  if (!st) {
    int ids[PMAP_MAX_DEVICES];
    for (int i = 0; i < n; i++) ids[i] = i % gpus;
    pmap_config cfg = {.backend = PMAP_BACKEND_CUDA,
                       .num_devices = n,
                       .device_ids = ids,
                       .shard_optimizer = PMAP_SHARD_GRADS};
    CHECK_OK(st = pmap_ctx_create(&cfg, &grads));
  }
  for (int i = 0; i < count && !st; i++) {
    const char *model = models[i];
    size_t P = n_params(model);
    int64_t batch = 16 * n;
    const int steps = compare_steps(model);
    const bound_model *bm = bound_model_of(model);
    float *w_rep = calloc(P, sizeof(float)), *w_shard = calloc(P, sizeof(float));
    float l_rep[COMPARE_STEPS], l_shard[COMPARE_STEPS];
    CHECK(bm != NULL, "%s: no bound model", model);
    if (w_rep && w_shard && bm) {
      double bound = bound_order32(bm, (double)batch, steps);
      train(rep, model, steps, batch, w_rep, l_rep);
      pmap_ctx *ctxs[2] = {shard, grads};
      const char *names[2] = {"sharded optimizer", "sharded gradients"};
      for (int k = 0; k < 2; k++) {
        train(ctxs[k], model, steps, batch, w_shard, l_shard);
        char what[128];
        snprintf(what, sizeof what, "%s: CUDA %d devices, %s vs replicated, parameters", model, n,
                 names[k]);
        gpu_within(what, w_shard, w_rep, P, bound);
        snprintf(what, sizeof what, "%s: CUDA %d devices, %s vs replicated, losses", model, n,
                 names[k]);
        gpu_within(what, l_shard, l_rep, (size_t)steps, bound);
        printf("%-9s: %d CUDA devices, the %s agrees with the replicated step\n", model, n,
               names[k]);
      }
    }
    free(w_rep);
    free(w_shard);
  }
  pmap_ctx_destroy(rep);
  pmap_ctx_destroy(shard);
  pmap_ctx_destroy(grads);
}

/* The same parameters predict the same outputs on CUDA (n devices) and on the CPU, to the order
 * of their sums: the convolution's 9 products and bias, then the dense layer's 1024 and bias, on
 * every output's path. Each within bound_sum of that length of the exact outputs (the first
 * sum's error enters the second as its inputs' relative error, of random sign: the lengths
 * add), the two within twice that. */
static void test_predict(int n) {
  const char *model = "convnet";
  pmap_example_info info;
  pmap_model *m = NULL;
  pmap_params *pc = NULL, *pg = NULL;
  pmap_ctx *cpu = NULL, *gpu = NULL;
  pmap_array xs = {0}, ys = {0};
  int64_t rows = 8 * n;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  CHECK_OK(pmap_example_info_get(model, &info));
  CHECK_OK(pmap_example_model(model, &m));
  CHECK_OK(pmap_ctx_create(&cfg, &cpu));
  gpu = n == 1 ? cuda_one : cuda_many;
  if (!gpu || test_failures) goto out;
  CHECK_OK(pmap_params_create(cpu, m, &info.opt, 7, &pc));
  CHECK_OK(pmap_params_create(gpu, m, &info.opt, 7, &pg));
  CHECK_OK(pmap_example_data(model, 3, rows, &xs, &ys));
  if (test_failures) goto out;
  int rank;
  int64_t shape[PMAP_MAX_RANK];
  pmap_model_output_shape(m, &rank, shape);
  int64_t k = shape[0], oshape[2] = {rows, k};
  float *oc = malloc((size_t)(rows * k) * sizeof *oc);
  float *og = malloc((size_t)(rows * k) * sizeof *og);
  for (int64_t i = 0; i < rows * k; i++) og[i] = NAN;
  pmap_array out_c = pmap_array_f32(oc, 2, oshape), out_g = pmap_array_f32(og, 2, oshape);
  CHECK_OK(pmap_predict(pc, &xs, &out_c));
  CHECK_OK(pmap_predict(pg, &xs, &out_g));
  gpu_within("convnet predict: CUDA vs CPU", og, oc, (size_t)(rows * k),
             2.0 * bound_sum(9 + 1 + 1024 + 1));
  free(oc);
  free(og);
out:
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(pc);
  pmap_params_destroy(pg);
  pmap_model_destroy(m);
  pmap_ctx_destroy(cpu);
}

/* The seed examples reach their known results (as tests/test_converge.c does on the CPU). */
static void test_converge(int n) {
  static const char *models[] = {"linear", "mlp", "convnet"};
  pmap_ctx *ctx = n == 1 ? cuda_one : cuda_many;
  if (!ctx) return;
  for (int i = 0; i < 3; i++) {
    pmap_example_info info;
    CHECK_OK(pmap_example_info_get(models[i], &info));
    size_t P = n_params(models[i]);
    float *w = calloc(P, sizeof *w), *losses = calloc((size_t)info.steps, sizeof *losses);
    int64_t batch = info.batch >= n ? info.batch / n * n : n;
    train(ctx, models[i], info.steps, batch, w, losses);
    double tail = 0.0;
    for (int64_t s = info.steps - 10; s < info.steps; s++) tail += losses[s] / 10.0;
    printf("%-8s on %d CUDA devices: first loss %.6f, mean of the last 10 %.6f\n", models[i], n,
           (double)losses[0], tail);
    if (i == 0) {
      CHECK(tail < 0.3, "linear: final loss %g, want < 0.3", tail);
      CHECK(fabsf(w[0] - 2.0f) < 0.1f, "linear: w %g, want 2 +- 0.1", (double)w[0]);
      CHECK(fabsf(w[1] + 1.0f) < 0.1f, "linear: b %g, want -1 +- 0.1", (double)w[1]);
    } else {
      CHECK(tail <= 0.5 * losses[0], "%s: loss %g -> %g did not halve", models[i],
            (double)losses[0], tail);
    }
    free(w);
    free(losses);
  }
}

int main(void) {
  int gpus = gpu_count();
  if (gpus == 0) return GPU_SKIP;
  if (gpus < 0) return 1;
  /* Several devices: PMAP_GPU_TEST_DEVICES, else every GPU, else 2 logical devices on one GPU
   * where NCCL allows it. */
  int n = gpu_test_devices(gpus >= 2 ? gpus : 2);
  if (n < 0) return 1;
  if (gpu_ctx(1, gpus, 0.0, &cuda_one) != PMAP_SUCCESS) return test_exit("gpu_pmap");
  if (n > 1 && gpu_ctx(n, gpus, 0.0, &cuda_many) != PMAP_SUCCESS) n = 1;
  if (test_failures) {
    pmap_ctx_destroy(cuda_one);
    pmap_ctx_destroy(cuda_many);
    return test_exit("gpu_pmap");
  }
  /* res-mlp: layer norm, GELU, residual blocks; cifar-bn: batch norm across devices, pooling;
   * gpt-mini: token ids, embeddings, causal attention, the tied head.
   * Quick (PMAP_GPU_TEST_QUICK=1): the dense model, the large one and the one with collectives
   * inside its layers, the sharded optimizer and gradients on one (res-mlp: many layers, so its
   * gradients are sharded from 2 devices on), no convergence runs. */
  static const char *const models[] = {"linear",    "mlp",     "convnet",  "mlp-1024",
                                       "cifar-cnn", "res-mlp", "cifar-bn", "gpt-mini"};
  int quick = gpu_test_quick();
  for (int i = 0; i < 8; i++)
    if (!quick || i == 1 || i == 3 || i == 6) test_agreement(models[i], n);
  static const char *const sharded[] = {"res-mlp", "mlp", "cifar-bn"};
  if (n > 1) test_shard_agreement(sharded, quick ? 1 : 3, n, gpus);
  test_predict(n);
  if (!quick) test_converge(n);
  pmap_ctx_destroy(cuda_one);
  pmap_ctx_destroy(cuda_many);
  return test_exit("gpu_pmap");
}
