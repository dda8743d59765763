/* gpu_probe: the facts of this machine's GPUs that the CUDA backend depends on, one "key: value"
 * line each, for bench/gpu-check.sh's environment file: each GPU's name, multiprocessors and
 * memory pools; the NCCL loaded; what starting CUDA, GPU 0's context and a cuBLAS handle take;
 * whether CUDA loads kernels lazily and its hardware queues; the NCCL channel limits the backend
 * gives 2 and 4 logical devices sharing GPU 0; whether a blocking-sync wait returns; then what a
 * pmap context of 1 device and of 2 sharing GPU 0 takes to make and destroy (the GPU check's
 * plan raises its limits to these). Exit status 0 when it could ask, 2 without a usable GPU.
 * Not a test: it judges nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/cuda/cuda_backend.h"

/* How long the kernel the blocking-sync wait waits behind runs (gpu_spin.cu). */
#define SPIN_S 0.1

cudaError_t gpu_probe_spin(cudaStream_t s, double seconds);

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A blocking-sync event behind a kernel that runs SPIN_S: the wait must sleep until the GPU
 * signals it (behind an empty stream it would return at once even where such waits hang). */
static void blocking_wait(void) {
  cudaStream_t s = NULL;
  cudaEvent_t ev = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&ev, cudaEventBlockingSync | cudaEventDisableTiming);
  if (e == cudaSuccess) e = gpu_probe_spin(s, SPIN_S);
  double t0 = now_s();
  if (e == cudaSuccess) e = cudaEventRecord(ev, s);
  if (e == cudaSuccess) e = cudaEventSynchronize(ev);
  double waited = now_s() - t0;
  if (e != cudaSuccess)
    printf("blocking-sync wait: %s\n", cudaGetErrorString(e));
  else
    printf("blocking-sync wait: works (%.3f s behind a %.3f s kernel%s)\n", waited, SPIN_S,
           waited < 0.5 * SPIN_S ? ": returned before the kernel could have ended" : "");
  if (ev) (void)cudaEventDestroy(ev);
  if (s) (void)cudaStreamDestroy(s);
  (void)cudaGetLastError();
}

/* Makes and destroys a pmap context of n devices on GPU 0, timing both. */
static void context_cost(int n) {
  int ids[2] = {0, 0};
  pmap_config cfg = {.backend = PMAP_BACKEND_CUDA, .num_devices = n, .device_ids = ids};
  pmap_ctx *ctx = NULL;
  double t0 = now_s();
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  double t1 = now_s();
  char what[48];
  snprintf(what, sizeof what, n == 1 ? "1 device" : "%d devices on GPU 0", n);
  if (st != PMAP_SUCCESS) {
    printf("pmap context, %s: not made: %s: %s\n", what, pmap_status_string(st), pmap_last_error());
    return;
  }
  pmap_ctx_destroy(ctx);
  printf("pmap context, %s: create %.2f s, destroy %.2f s\n", what, t1 - t0, now_s() - t1);
}

int main(void) {
  /* Line by line: a probe killed in its last test keeps the lines before it. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  cuda_module_loading_prepare(); /* as the backend does before its first CUDA call */
  const char *mode = getenv("CUDA_MODULE_LOADING");
  int n = 0;
  double t0 = now_s();
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1) {
    printf("gpus: 0 (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
    return 2;
  }
  int driver = 0, runtime = 0, nccl = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  (void)ncclGetVersion(&nccl);
  printf("gpus: %d\ncuda driver: %d\ncuda runtime: %d\nnccl loaded: %d\n", n, driver, runtime,
         nccl);
  int sms0 = 0;
  for (int g = 0; g < n; g++) {
    struct cudaDeviceProp p;
    int sms = 0, pools = 0;
    if (cudaGetDeviceProperties(&p, g) != cudaSuccess) continue;
    (void)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, g);
    (void)cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, g);
    if (g == 0) sms0 = sms;
    printf("gpu %d: %s, compute capability %d.%d, %d SMs, %.1f GiB, memory pools %s\n", g, p.name,
           p.major, p.minor, sms, (double)p.totalGlobalMem / 1073741824.0, pools ? "yes" : "no");
  }
  /* What a device's start costs: the GPU's context (every module with eager loading), then a
   * cuBLAS handle. */
  double t1 = now_s();
  cublasHandle_t blas = NULL;
  if (cudaSetDevice(0) == cudaSuccess && cudaFree(NULL) == cudaSuccess) {
    double t2 = now_s();
    cublasStatus_t b = cublasCreate(&blas);
    printf("start: CUDA %.2f s, context on GPU 0 %.2f s, cuBLAS handle %.2f s%s\n", t1 - t0,
           t2 - t1, now_s() - t2, b == CUBLAS_STATUS_SUCCESS ? "" : " (failed)");
    if (blas) (void)cublasDestroy(blas);
  }
  (void)cudaGetLastError();
  int lazy = cuda_module_loading_lazy();
  printf("module loading: %s (CUDA_MODULE_LOADING %s)\n",
         lazy == 1   ? "lazy"
         : lazy == 0 ? "eager"
                     : "unknown",
         mode ? mode : "unset");
  for (int ranks = 2; ranks <= 4; ranks += 2) {
    int lo = 0, hi = 0;
    cuda_nccl_cta_limits(sms0, ranks, &lo, &hi);
    printf("nccl channels, %d devices on GPU 0: minCTAs %d maxCTAs %d\n", ranks, lo, hi);
  }
  const char *env = getenv("NCCL_MAX_CTAS");
  if (env) printf("NCCL_MAX_CTAS: %s (overrides maxCTAs)\n", env);
  const char *queues = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  printf("hardware queues: CUDA_DEVICE_MAX_CONNECTIONS %s\n", queues ? queues : "unset (8)");
  /* Where it hangs, the lines above are already out, and gpu-check.sh polls from then on. */
  blocking_wait();
  /* After the wait's line, so that a context that hangs is not taken for a wait that does. */
  context_cost(1);
  context_cost(2);
  return 0;
}
