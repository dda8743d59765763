/* gpu_probe: the facts of this machine's GPUs that the CUDA backend depends on, one "key: value"
 * line each, for bench/gpu-check.sh's environment file: the NCCL this process loaded (its version
 * and file); each GPU's name, multiprocessors and memory pools; what starting CUDA, GPU 0's
 * context and a cuBLAS handle take; whether CUDA loads kernels lazily and its hardware queues;
 * the NCCL channel limits the backend gives 2 and 4 logical devices sharing GPU 0; whether a
 * blocking-sync wait returns; what a pmap context of 1 device and of 2 sharing GPU 0 takes to
 * make and destroy (the GPU check's plan raises its limits to these); and the host time of one
 * all-reduce's launch on each of a device's communicators (the plain step's non-blocking one,
 * and the captured steps' blocking one).
 *
 * Each phase is announced before it runs, with the seconds since the probe started ("phase NAME
 * at T s: what it does"), so that a probe ended at its time limit shows where it was: a slow
 * start of CUDA, or a context that did not come. A blocking-sync wait that does not return is
 * given up on after WAIT_GIVE_UP_S (it waits on a thread of its own) and said so ("hung"); the
 * contexts after it then poll (PMAP_CUDA_WAIT=poll), so their costs are measured either way.
 * Exit status 0 when it could ask, 2 without a usable GPU. Not a test: it judges nothing. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "runtime/cuda/cuda_backend.h"

/* How long the kernel the blocking-sync wait waits behind runs (gpu_spin.cu). */
#define SPIN_S 0.1
/* A blocking-sync wait behind that kernel that has not returned after this long hangs. */
#define WAIT_GIVE_UP_S 5.0
/* All-reduces of one float launched on each communicator to time their launch. */
#define ISSUE_REPS 200

cudaError_t gpu_probe_spin(cudaStream_t s, double seconds);

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double t_start;

static void phase(const char *name, const char *what) {
  printf("phase %s at %.2f s: %s\n", name, now_s() - t_start, what);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The wait of blocking_wait, on a thread of its own so that one that hangs is given up on. */
typedef struct wait_probe {
  cudaEvent_t ev;
  cudaError_t e;
  double waited;
  _Atomic int done;
} wait_probe;

static void *wait_main(void *p) {
  wait_probe *w = p;
  double t0 = now_s();
  w->e = cudaEventSynchronize(w->ev);
  w->waited = now_s() - t0;
  atomic_store(&w->done, 1);
  return NULL;
}

/* A blocking-sync event behind a kernel that runs SPIN_S: the wait must sleep until the GPU
 * signals it (behind an empty stream it would return at once even where such waits hang).
 * 1 when it hung; its thread, stream and event are then left as they are. */
static int blocking_wait(void) {
  static wait_probe w; /* a hung wait's thread still holds it at the exit */
  cudaStream_t s = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess)
    e = cudaEventCreateWithFlags(&w.ev, cudaEventBlockingSync | cudaEventDisableTiming);
  if (e == cudaSuccess) e = gpu_probe_spin(s, SPIN_S);
  if (e == cudaSuccess) e = cudaEventRecord(w.ev, s);
  pthread_t t;
  if (e == cudaSuccess && pthread_create(&t, NULL, wait_main, &w) != 0) e = cudaErrorUnknown;
  if (e != cudaSuccess) {
    printf("blocking-sync wait: not tried: %s\n", cudaGetErrorString(e));
    (void)cudaGetLastError();
    return 0;
  }
  double t0 = now_s();
  while (!atomic_load(&w.done) && now_s() - t0 < WAIT_GIVE_UP_S) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (!atomic_load(&w.done)) {
    printf(
        "blocking-sync wait: hung: no return within %.0f s behind a %.3f s kernel; the "
        "contexts below poll (PMAP_CUDA_WAIT=poll)\n",
        WAIT_GIVE_UP_S, SPIN_S);
    (void)pthread_detach(t);
    return 1;
  }
  (void)pthread_join(t, NULL);
  if (w.e != cudaSuccess)
    printf("blocking-sync wait: %s\n", cudaGetErrorString(w.e));
  else
    printf("blocking-sync wait: works (%.3f s behind a %.3f s kernel%s)\n", w.waited, SPIN_S,
           w.waited < 0.5 * SPIN_S ? ": returned before the kernel could have ended" : "");
  (void)cudaEventDestroy(w.ev);
  (void)cudaStreamDestroy(s);
  (void)cudaGetLastError();
  return 0;
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

/* Each device's launch times of ISSUE_REPS all-reduces on each of its communicators. */
typedef struct issue_job {
  double times[2][2][ISSUE_REPS]; /* [device][0 non-blocking, 1 blocking][rep], seconds */
  int blocking;                   /* every device has its blocking rank */
} issue_job;

/* One device's launches: the plain path's own call (a collective of pmap_cuda_coll: NCCL's call
 * and its settling, the collective queued, not waited for), then the same NCCL call on the
 * captured steps' blocking rank, outside a capture. Both devices launch the same collectives in
 * the same order, so the kernels pair up; the stream is waited for after each kind. */
static pmap_status issue_run(pmap_device *dev, void *arg) {
  issue_job *j = arg;
  int d = pmap_local_index(dev);
  cuda_device *cd = cuda_device_of(dev);
  float *buf = NULL;
  PMAP_TRY(pmap_device_alloc(dev, 1, &buf));
  pmap_status st = PMAP_SUCCESS;
  for (int r = 0; r < ISSUE_REPS && !st; r++) {
    double t0 = now_s();
    st = pmap_cuda_coll.all_reduce(dev, buf, buf, 1, PMAP_RED_SUM);
    j->times[d][0][r] = now_s() - t0;
  }
  if (!st) st = cuda_wait(dev, "the probe's all-reduces", 1);
  for (int r = 0; r < ISSUE_REPS && !st && cd->graph_comm; r++) {
    double t0 = now_s();
    st = cuda_nccl_enter(dev, "the probe's all-reduces");
    if (!st)
      st = cuda_nccl_issued(
          dev, ncclAllReduce(buf, buf, 1, ncclFloat32, ncclSum, cd->graph_comm, cd->stream),
          "ncclAllReduce", "the probe's all-reduces (blocking communicator)");
    j->times[d][1][r] = now_s() - t0;
  }
  if (!st) st = cuda_wait(dev, "the probe's all-reduces", 1);
  if (!cd->graph_comm) j->blocking = 0;
  pmap_device_free(dev, buf);
  return st;
}

static void issue_line(const char *what, double *t) {
  qsort(t, 2 * ISSUE_REPS, sizeof *t, cmp_double);
  printf("%s median %.1f us, 90th percentile %.1f us", what, 1e6 * t[ISSUE_REPS],
         1e6 * t[2 * ISSUE_REPS * 9 / 10]);
}

/* The host time of an all-reduce's launch on 2 devices sharing GPU 0, in a context that captures
 * its steps (so that each device has both communicators). */
static void issue_cost(void) {
  int ids[2] = {0, 0};
  pmap_config cfg = {
      .backend = PMAP_BACKEND_CUDA, .num_devices = 2, .device_ids = ids, .cuda_graphs = 1};
  pmap_ctx *ctx = NULL;
  double t0 = now_s();
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  double made = now_s() - t0;
  static issue_job j;
  j.blocking = 1;
  if (st == PMAP_SUCCESS) st = pmap_run(ctx, issue_run, &j);
  if (st != PMAP_SUCCESS) {
    printf("nccl launch, 2 devices on GPU 0: not measured: %s: %s\n", pmap_status_string(st),
           pmap_last_error());
    pmap_ctx_destroy(ctx);
    return;
  }
  pmap_ctx_destroy(ctx);
  /* Both devices' launches together (they are the same calls). */
  double all[2][2 * ISSUE_REPS];
  for (int k = 0; k < 2; k++)
    for (int d = 0; d < 2; d++)
      for (int r = 0; r < ISSUE_REPS; r++) all[k][d * ISSUE_REPS + r] = j.times[d][k][r];
  printf(
      "nccl launch, 2 devices on GPU 0 (their context with both communicators made in %.2f s), "
      "%d all-reduces of 1 float each:",
      made, ISSUE_REPS);
  issue_line(" non-blocking communicator (the plain step's)", all[0]);
  if (j.blocking) issue_line("; blocking (the captured steps')", all[1]);
  printf("\n");
}

/* The NCCL this process loaded, and from which file: the one every later step loads too. */
static void nccl_loaded(void) {
  int v = 0;
  (void)ncclGetVersion(&v);
  Dl_info info;
  const char *file = "an unknown file";
  if (dladdr((void *)(uintptr_t)ncclGetVersion, &info) && info.dli_fname) file = info.dli_fname;
  printf("nccl loaded: %d (%d.%d.%d) from %s\n", v, v / 10000, v / 100 % 100, v % 100, file);
}

int main(void) {
  /* Line by line: a probe killed in its last test keeps the lines before it. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  t_start = now_s();
  phase("nccl", "the NCCL library this process loaded");
  nccl_loaded();
  phase("start", "CUDA, GPU 0's context (every module, with eager loading) and a cuBLAS handle");
  cuda_module_loading_prepare(); /* as the backend does before its first CUDA call */
  const char *mode = getenv("CUDA_MODULE_LOADING");
  int n = 0;
  double t0 = now_s();
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n < 1) {
    printf("gpus: 0 (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "none");
    return 2;
  }
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  printf("gpus: %d\ncuda driver: %d\ncuda runtime: %d\n", n, driver, runtime);
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
  phase("blocking-sync wait",
        "a kernel of 0.1 s, then a blocking-sync wait behind it, given up "
        "on after 5 s");
  int hung = blocking_wait();
  if (hung) (void)setenv("PMAP_CUDA_WAIT", "poll", 1);
  phase("contexts",
        "a pmap context of 1 device, then of 2 devices on GPU 0, each made and "
        "destroyed");
  context_cost(1);
  context_cost(2);
  phase("nccl launch",
        "2 devices on GPU 0 with both communicators; the host time of each "
        "all-reduce's launch");
  issue_cost();
  phase("done", "every phase ran");
  /* A wait that hung still holds its thread inside CUDA: the process ends without the exit's
   * teardown of CUDA, which could wait for that thread. */
  if (hung) _Exit(0);
  return 0;
}
