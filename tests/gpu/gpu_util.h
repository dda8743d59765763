/* gpu_util.h: what the tests of the gpu suite share: the skip (exit 77) where this build has no
 * CUDA backend or no GPU is usable, and CUDA contexts of N logical devices over the GPUs there
 * are (several on one GPU where NCCL allows it). */
#ifndef PMAP_GPU_UTIL_H
#define PMAP_GPU_UTIL_H

#include "../testutil.h"

#define GPU_SKIP 77

/* GPUs the CUDA backend sees; 0 after saying why where there are none, -1 on another failure.
 * Called first by every test: the tolerances assume FP32 GEMMs, so TF32 is turned off here
 * (a -Dtf32=true build would have it on) unless PMAP_CUDA_TF32 asks for it explicitly. */
static inline int gpu_count(void) {
  const char *tf32 = getenv("PMAP_CUDA_TF32");
  if (!tf32 || !*tf32) setenv("PMAP_CUDA_TF32", "0", 1);
  if (!pmap_backend_built(PMAP_BACKEND_CUDA)) {
    printf("SKIP: this build has no CUDA backend (configure with -Dcuda=enabled)\n");
    return 0;
  }
  pmap_config cfg = {.backend = PMAP_BACKEND_CUDA, .num_devices = PMAP_DEVICES_DEFAULT};
  pmap_ctx *ctx = NULL;
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  if (st == PMAP_ERR_UNAVAILABLE) {
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

/* A CUDA context of n logical devices, device i on GPU i % gpus. Returns PMAP_ERR_UNAVAILABLE
 * (after saying why) where that needs GPU sharing that this NCCL does not allow; any other
 * failure is a test failure. */
static inline pmap_status gpu_ctx(int n, int gpus, double timeout_s, pmap_ctx **out) {
  int ids[PMAP_MAX_DEVICES];
  for (int i = 0; i < n; i++) ids[i] = i % gpus;
  pmap_config cfg = {.backend = PMAP_BACKEND_CUDA, .num_devices = n, .device_ids = ids, .timeout_s = timeout_s};
  *out = NULL;
  pmap_status st = pmap_ctx_create(&cfg, out);
  if (st == PMAP_ERR_UNAVAILABLE && n > gpus) {
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
