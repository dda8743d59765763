/* gpu_util.h: what the tests of the gpu suite share: the skip (exit 77) where this build has no
 * CUDA backend or no GPU is usable, CUDA contexts of N logical devices over the GPUs there are
 * (several on one GPU where NCCL allows it), and the bounds of their comparisons (tests/bounds.h
 * and the tensor cores' bfloat16 sums). */
#ifndef PMAP_GPU_UTIL_H
#define PMAP_GPU_UTIL_H

#include "../bounds.h"
#include "../testutil.h"

#define GPU_SKIP 77

/* A float sum of k exact products (a bfloat16 GEMM's) on tensor cores, relative to its root mean
 * square, as bound_sum(k) is for a CPU's float sum. A tensor core adds a group of products to its
 * accumulator at once (8 or more on every GPU with bfloat16, A100 on: Fasi, Higham, Mikaitis and
 * Pranesh, "Numerical behavior of NVIDIA tensor cores", 2021), aligning them to the largest and
 * truncating what falls below float's last place, and normalises the result by truncation too.
 * Each product then errs by up to 2u of the accumulator, as a rounding of twice u with a random
 * sign (2 bound_sum(k)), and the accumulator A_j shrinks by up to 2u |A_j| at each of the k / 8
 * groups, always toward 0: these add linearly; with |A_j| of root mean square sqrt(8 j / k) of
 * the sum's, to at most 2u (2/3) k / 8 of it. 1e-4 at k = 4900, 3 bound_sum(k) near k = 1000. */
static inline double gpu_bound_sum16(double k) {
  return 2.0 * bound_sum(k) + 2.0 * BOUND_U32 * (2.0 / 3.0) * k / 8.0;
}

/* a against b (n): the relative error ||a - b|| / ||b|| within bound; prints both. */
static inline void gpu_within(const char *what, const float *a, const float *b, size_t n,
                              double bound) {
  printf("%s: %.3g (bound %.3g)\n", what, test_rel_err(a, b, n), bound);
  test_close_f(what, a, b, n, bound);
}

/* GPUs the CUDA backend sees; 0 after saying why where there are none, -1 on another failure.
 * Called first by every test: the tolerances assume FP32 GEMMs, so TF32 is turned off here
 * (a -Dtf32=true build would have it on) unless PMAP_CUDA_TF32 asks for it explicitly. */
static inline int gpu_count(void) {
  /* Line by line into a log file too: a test killed at its time limit keeps what it printed. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *tf32 = getenv("PMAP_CUDA_TF32");
  if (!tf32 || !*tf32) setenv("PMAP_CUDA_TF32", "0", 1);
  if (!pmap_backend_built(PMAP_BACKEND_CUDA)) {
    printf("SKIP: this build has no CUDA backend (configure with -Dcuda=enabled)\n");
    return 0;
  }
  pmap_config cfg = {.backend = PMAP_BACKEND_CUDA, .num_devices = PMAP_DEVICES_DEFAULT};
  pmap_ctx *ctx = NULL;
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  /* No GPU is a skip, and the message must carry CUDA's own reason (no device, or a driver
   * older than the runtime). Any other refusal, e.g. another NCCL than the one built against,
   * is a failure: the GPU is there. */
  if (st == PMAP_ERR_UNAVAILABLE && strstr(pmap_last_error(), "no CUDA device is usable")) {
    if (!strstr(pmap_last_error(), "cudaGetDeviceCount")) {
      fprintf(stderr, "FAIL: the refusal does not give CUDA's reason: %s\n", pmap_last_error());
      return -1;
    }
    printf("SKIP: no usable GPU: %s\n", pmap_last_error());
    return 0;
  }
  if (st != PMAP_SUCCESS) {
    fprintf(stderr, "FAIL: CUDA context on every GPU: %s: %s\n", pmap_status_string(st),
            pmap_last_error());
    return -1;
  }
  int n = pmap_ctx_num_devices(ctx);
  pmap_ctx_destroy(ctx);
  return n;
}

/* The logical devices of the multi-device tests: PMAP_GPU_TEST_DEVICES (1..8; bench/gpu-check.sh
 * runs the suite with 2 and with 4 on one GPU), else dflt; -1 after saying why on a bad value. */
static inline int gpu_test_devices(int dflt) {
  const char *s = getenv("PMAP_GPU_TEST_DEVICES");
  if (!s || !*s) return dflt;
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (*end || v < 1 || v > 8) {
    fprintf(stderr, "FAIL: PMAP_GPU_TEST_DEVICES=\"%s\" is not an integer in [1, 8]\n", s);
    return -1;
  }
  return (int)v;
}

/* PMAP_GPU_TEST_QUICK=1: the shorter form of a multi-device test (bench/gpu-check.sh's run on 4
 * logical devices after the full one on 2), which each test defines. */
static inline int gpu_test_quick(void) {
  const char *s = getenv("PMAP_GPU_TEST_QUICK");
  return s && !strcmp(s, "1");
}

/* A CUDA context of n logical devices, device i on GPU i % gpus. Returns PMAP_ERR_UNAVAILABLE
 * (after saying why) where that needs GPU sharing that this NCCL does not allow, unless
 * PMAP_GPU_TEST_DEVICES asked for it: then, as any other failure, it fails the test. */
static inline pmap_status gpu_ctx(int n, int gpus, double timeout_s, pmap_ctx **out) {
  int ids[PMAP_MAX_DEVICES];
  for (int i = 0; i < n; i++) ids[i] = i % gpus;
  pmap_config cfg = {
      .backend = PMAP_BACKEND_CUDA, .num_devices = n, .device_ids = ids, .timeout_s = timeout_s};
  *out = NULL;
  pmap_status st = pmap_ctx_create(&cfg, out);
  const char *asked = getenv("PMAP_GPU_TEST_DEVICES");
  if (st == PMAP_ERR_UNAVAILABLE && n > gpus && !(asked && *asked)) {
    CHECK(strstr(pmap_last_error(), "NCCL_MULTI_RANK_GPU_ENABLE") != NULL,
          "the refusal to share a GPU does not say what would allow it: %s", pmap_last_error());
    printf("note: %d logical devices on %d GPU%s not possible here: %s\n", n, gpus,
           gpus == 1 ? "" : "s", pmap_last_error());
    return st;
  }
  CHECK(st == PMAP_SUCCESS, "CUDA context of %d devices on %d GPUs: %s: %s", n, gpus,
        pmap_status_string(st), pmap_last_error());
  return st;
}

#endif
