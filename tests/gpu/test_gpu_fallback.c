/* test_gpu_fallback.c: what the CUDA backend does for machines and layouts that differ from a
 * plain one. Without a GPU (CUDA builds): the NCCL channel limits for ranks sharing a GPU and
 * the bucket size's parsing. With one: kernels loaded eagerly where logical devices share a
 * GPU (in child processes, since CUDA reads the choice once: unset, it is made EAGER; LAZY is
 * refused), a blocking-sync wait that fails falling back to polling (PMAP_CUDA_WAIT_FAIL), and
 * allocation without memory pools (PMAP_CUDA_NO_MEMPOOL), each training like the default.
 * Skips (77) the GPU part without a GPU. */
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_util.h"
#include "pmap_examples.h"
#include "runtime/backend.h"
#include "runtime/cuda/cuda_backend.h"

#define STEPS 6

static void test_cta_limits(void) {
  /* sms, ranks per GPU, want max; min is 1 where set, both 0 without sharing */
  static const int cases[][3] = {{132, 1, 0},  {132, 2, 32}, {132, 4, 16}, {132, 8, 8},
                                 {108, 3, 18}, {2, 4, 1},    {1, 2, 1},    {264, 2, 32}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    int lo = -1, hi = -1;
    cuda_nccl_cta_limits(cases[i][0], cases[i][1], &lo, &hi);
    CHECK(hi == cases[i][2] && lo == (hi ? 1 : 0), "%d SMs, %d ranks per GPU: min %d max %d",
          cases[i][0], cases[i][1], lo, hi);
    CHECK(hi * cases[i][1] <= (cases[i][0] > 1 ? cases[i][0] : 1) || cases[i][1] <= 1 || hi == 1,
          "%d ranks of %d channels overfill %d SMs", cases[i][1], hi, cases[i][0]);
  }
}

static void test_bucket_parse(void) {
  static const struct {
    const char *text;
    size_t bytes;
  } good[] = {{NULL, 25u << 20},
              {"", 25u << 20},
              {"1", 1u << 20},
              {"0.03125", 32768},
              {"4096", (size_t)4096 << 20},
              {"0.0009765625", 1024},
              {"2.5", 5u << 19}};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    size_t b = 0;
    CHECK_OK(cuda_bucket_bytes_parse(good[i].text, &b));
    CHECK(b == good[i].bytes, "PMAP_CUDA_BUCKET_MB=%s: %zu bytes, want %zu",
          good[i].text ? good[i].text : "(unset)", b, good[i].bytes);
  }
  static const char *const bad[] = {"0", "-1", "4097", "0.0005", "nan", "inf", "1x", "x", "1e9"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    size_t b = 0;
    CHECK_FAILS(cuda_bucket_bytes_parse(bad[i], &b), PMAP_ERR_INVALID_ARGUMENT, bad[i]);
  }
}

/* ---- module loading, in child processes ---- */

/* In a child: a context of two devices on GPU 0. `want_lazy_refused`: CUDA_MODULE_LOADING=LAZY
 * must be refused, naming it; else the context works, CUDA loads eagerly and has 32 hardware
 * queues (both set by pmap). 77 where this NCCL cannot share a GPU at all. */
static int loading_child(int want_lazy_refused) {
  int ids[2] = {0, 0};
  pmap_config cfg = {.backend = PMAP_BACKEND_CUDA, .num_devices = 2, .device_ids = ids};
  pmap_ctx *ctx = NULL;
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  if (st == PMAP_ERR_UNAVAILABLE && strstr(pmap_last_error(), "NCCL_MULTI_RANK_GPU_ENABLE") &&
      !strstr(pmap_last_error(), "CUDA_MODULE_LOADING")) {
    printf("note: no GPU sharing here: %s\n", pmap_last_error());
    return GPU_SKIP;
  }
  if (want_lazy_refused) {
    CHECK(st == PMAP_ERR_UNAVAILABLE && strstr(pmap_last_error(), "CUDA_MODULE_LOADING") &&
              strstr(pmap_last_error(), "lazily"),
          "lazy loading with a shared GPU: %s: %s", pmap_status_string(st), pmap_last_error());
  } else {
    CHECK(st == PMAP_SUCCESS, "two devices on GPU 0: %s: %s", pmap_status_string(st),
          pmap_last_error());
    const char *mode = getenv("CUDA_MODULE_LOADING");
    CHECK(mode && !strcmp(mode, "EAGER"), "CUDA_MODULE_LOADING is %s, want EAGER",
          mode ? mode : "unset");
    CHECK(cuda_module_loading_lazy() == 0, "CUDA loads kernels lazily (mode %d)",
          cuda_module_loading_lazy());
    const char *queues = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    CHECK(queues && !strcmp(queues, CUDA_SHARED_MAX_CONNECTIONS),
          "CUDA_DEVICE_MAX_CONNECTIONS is %s, want " CUDA_SHARED_MAX_CONNECTIONS,
          queues ? queues : "unset");
  }
  pmap_ctx_destroy(ctx);
  return test_failures ? 1 : 0;
}

/* Runs this program as a child with CUDA_MODULE_LOADING set to `mode` (NULL: unset). */
static int run_child(const char *arg, const char *mode) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS"); /* pmap must set it, as CUDA_MODULE_LOADING */
    if (mode)
      setenv("CUDA_MODULE_LOADING", mode, 1);
    else
      unsetenv("CUDA_MODULE_LOADING");
    execl("/proc/self/exe", "test_gpu_fallback", arg, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

static void test_loading(void) {
  int rc = run_child("--child-eager", NULL);
  CHECK(rc == 0 || rc == GPU_SKIP, "eager child exited %d", rc);
  if (rc == GPU_SKIP) return;
  rc = run_child("--child-lazy", "LAZY");
  CHECK(rc == 0, "lazy child exited %d", rc);
  printf("kernels loaded eagerly where devices share a GPU; CUDA_MODULE_LOADING=LAZY refused\n");
}

/* ---- the same training with a fallback and without ---- */

typedef struct run {
  float loss[STEPS];
  float *w;
  size_t P;
} run;

/* STEPS steps of `model` on a context of n devices (device i on GPU i % gpus); check(ctx) looks
 * inside the backend before the context goes. */
static int train(const char *model, int n, int gpus, run *out, void (*check)(pmap_ctx *)) {
  pmap_ctx *ctx = NULL;
  if (gpu_ctx(n, gpus, 0.0, &ctx) != PMAP_SUCCESS) return 0;
  pmap_example_info info;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_array xs = {0}, ys = {0};
  int64_t batch = 8 * n;
  CHECK_OK(pmap_example_info_get(model, &info));
  CHECK_OK(pmap_example_model(model, &m));
  CHECK_OK(pmap_params_create(ctx, m, &info.opt, 5, &p));
  CHECK_OK(pmap_example_data(model, 11, batch * STEPS, &xs, &ys));
  if (!test_failures) {
    size_t xrow = (size_t)(pmap_array_numel(&xs) / (batch * STEPS));
    size_t yrow = (size_t)(pmap_array_numel(&ys) / (batch * STEPS));
    for (int s = 0; s < STEPS; s++) {
      pmap_array xb = xs, yb = ys;
      xb.data = (float *)xs.data + (size_t)(s * batch) * xrow;
      yb.data = (char *)ys.data + (size_t)(s * batch) * yrow * 4;
      xb.shape[0] = yb.shape[0] = batch;
      CHECK_OK(pmap_update(p, &xb, &yb, &out->loss[s]));
    }
    out->P = pmap_params_count(p);
    out->w = calloc(out->P, sizeof *out->w);
    if (out->w) CHECK_OK(pmap_params_read(p, n - 1, out->w, out->P));
    if (check) check(ctx);
  }
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return out->w != NULL;
}

/* The fallbacks change how the devices wait and allocate, not what they compute: at most the
 * order of a sum (cuBLAS may choose another algorithm where its workspace comes from elsewhere),
 * so the runs of model (n devices, 8 rows each) agree within bound_order32 over the steps. */
static void compare(const char *what, const char *model, int n, const run *a, const run *b) {
  char name[128];
  if (!a->w || !b->w || a->P != b->P) {
    CHECK(0, "%s: no parameters to compare", what);
    return;
  }
  const bound_model *m = bound_model_of(model);
  CHECK(m != NULL, "%s: no bound model", model);
  if (!m) return;
  double tol = bound_order32(m, 8.0 * n, STEPS);
  snprintf(name, sizeof name, "%s: losses", what);
  gpu_within(name, a->loss, b->loss, STEPS, tol);
  snprintf(name, sizeof name, "%s: parameters", what);
  gpu_within(name, a->w, b->w, a->P, tol);
  int same = !memcmp(a->w, b->w, a->P * sizeof *a->w);
  printf("%s: agrees with the default%s\n", what, same ? " bit for bit" : " within its bound");
}

static int wait_fail_device;

static void check_wait_fallback(pmap_ctx *ctx) {
  const char *mode = getenv("PMAP_CUDA_WAIT");
  for (int d = 0; d < ctx->n; d++) {
    const cuda_device *cd = ctx->dev[d].be;
    if (d == wait_fail_device)
      CHECK(cd->done == NULL, "device %d: its blocking waits failed but it still sleeps on them",
            d);
    else if (!mode || strcmp(mode, "poll"))
      CHECK(cd->done != NULL, "device %d: lost its blocking waits to device %d's failure", d,
            wait_fail_device);
  }
}

static void check_no_pool(pmap_ctx *ctx) {
  for (int d = 0; d < ctx->n; d++) {
    const cuda_device *cd = ctx->dev[d].be;
    CHECK(cd->no_pool && cd->n_blocks > 0, "device %d: no_pool %d with %zu blocks", d, cd->no_pool,
          cd->n_blocks);
  }
}

static void test_fallbacks(int n, int gpus) {
  const char *models[] = {"mlp", "cifar-bn"};
  for (int i = 0; i < 2; i++) {
    run base = {0}, waits = {0}, nopool = {0};
    char what[128];
    if (!train(models[i], n, gpus, &base, NULL)) continue;
    /* A worker's waits fail for the plain model, the caller's (device 0) for the other. */
    wait_fail_device = i == 0 ? n - 1 : 0;
    char dev[16];
    snprintf(dev, sizeof dev, "%d", wait_fail_device);
    setenv("PMAP_CUDA_WAIT_FAIL", dev, 1);
    if (train(models[i], n, gpus, &waits, check_wait_fallback)) {
      snprintf(what, sizeof what, "%s on %d devices, device %d's blocking waits failing", models[i],
               n, wait_fail_device);
      compare(what, models[i], n, &waits, &base);
    }
    unsetenv("PMAP_CUDA_WAIT_FAIL");
    /* Allocation without memory pools: cifar-bn's batch norm runs collectives inside forward
     * while its convolutions grow their workspace, on a GPU the devices may share. */
    setenv("PMAP_CUDA_NO_MEMPOOL", "1", 1);
    if (train(models[i], n, gpus, &nopool, check_no_pool)) {
      snprintf(what, sizeof what, "%s on %d devices without memory pools", models[i], n);
      compare(what, models[i], n, &nopool, &base);
    }
    unsetenv("PMAP_CUDA_NO_MEMPOOL");
    free(base.w);
    free(waits.w);
    free(nopool.w);
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--child-eager")) return loading_child(0);
  if (argc > 1 && !strcmp(argv[1], "--child-lazy")) return loading_child(1);
  test_cta_limits();
  test_bucket_parse();
  int gpus = gpu_count();
  if (gpus < 0) return 1;
  if (gpus == 0) return test_failures ? test_exit("gpu_fallback") : GPU_SKIP;
  test_loading();
  int n = gpu_test_devices(gpus >= 2 ? gpus : 2);
  if (n < 0) return 1;
  test_fallbacks(n, gpus);
  return test_exit("gpu_fallback");
}
