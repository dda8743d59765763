/* cpu_backend.c: the CPU backend. A device is a worker thread; its memory is host memory, so an
 * input shard is read in place (no staging) and copies are memcpy. What the CPU ops need of a
 * device's thread (the GEMM library pinned to one thread) is the CPU op backend's (ops/cpu). */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "base/env.h"
#include "base/error.h"

#define CPU_ALIGN 64
#define CPU_DEFAULT_DEVICES 4

pmap_status pmap_cpu_default_devices(int *out) {
  long v = CPU_DEFAULT_DEVICES;
  PMAP_TRY(pmap_env_long("PMAP_CPU_DEVICES", 1, PMAP_MAX_DEVICES, CPU_DEFAULT_DEVICES, &v));
  *out = (int)v;
  return PMAP_SUCCESS;
}

static pmap_status cpu_ctx_init(pmap_ctx *ctx, const pmap_config *cfg) {
  (void)cfg;
  cpu_ctx *cc = calloc(1, sizeof *cc);
  if (cc) cc->dev = aligned_alloc(CPU_ALIGN, sizeof(cpu_device) * (size_t)ctx->n);
  if (cc) cc->slots = calloc(2 * (size_t)ctx->n, sizeof *cc->slots);
  if (!cc || !cc->dev || !cc->slots) {
    if (cc) free(cc->dev);
    if (cc) free(cc->slots);
    free(cc);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "cpu backend: out of memory for %d devices", ctx->n);
  }
  for (int i = 0; i < ctx->n; i++) {
    ctx->dev[i].be = &cc->dev[i];
    atomic_init(&cc->dev[i].live, 0);
  }
  ctx->be_ctx = cc;
  return PMAP_SUCCESS;
}

static void cpu_ctx_fini(pmap_ctx *ctx) {
  cpu_ctx *cc = ctx->be_ctx;
  if (!cc) return;
  free(cc->dev);
  free(cc->slots);
  free(cc->part);
  free(cc);
  ctx->be_ctx = NULL;
}

/* Buffers start CPU_OFFSET bytes past a cache line. With 64-byte aligned operands and 4 KiB
 * rows, oneDNN's sgemm reads B in place instead of packing it and runs at half speed on AVX2
 * (17 ms against 8 ms for 256x1024x1024); 16 bytes off keeps it on the packing path, and every
 * other kernel here is indifferent. The allocation's own pointer sits in the bytes before. */
#define CPU_OFFSET 16

static pmap_status cpu_alloc(pmap_device *dev, size_t bytes, void **out) {
  if (bytes > PTRDIFF_MAX - 2 * CPU_ALIGN) {
    *out = NULL;
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "device %d: cannot allocate %zu bytes (too large)",
                    dev->index, bytes);
  }
  /* Counted in the device's live bytes before it is made, so that the limit holds however
   * the device's allocations interleave; given back if the allocation fails. */
  _Atomic size_t *live = &((cpu_device *)dev->be)->live;
  size_t before = atomic_fetch_add(live, bytes), limit = dev->ctx->max_memory;
  if (limit && (before > limit || bytes > limit - before)) {
    atomic_fetch_sub(live, bytes);
    *out = NULL;
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "device %d: %zu bytes more than the %zu it holds would pass the %zu bytes a "
                    "device may hold (pmap_config.max_memory)",
                    dev->index, bytes, before, limit);
  }
  size_t rounded = (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN + CPU_ALIGN;
  char *raw = aligned_alloc(CPU_ALIGN, rounded);
  if (!raw) {
    atomic_fetch_sub(live, bytes);
    *out = NULL;
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "device %d: cannot allocate %zu bytes", dev->index,
                    bytes);
  }
  /* Before the pointer: the size asked for, counted in the device's live bytes until freed. */
  memcpy(raw + CPU_OFFSET - sizeof raw - sizeof bytes, &bytes, sizeof bytes);
  memcpy(raw + CPU_OFFSET - sizeof raw, &raw, sizeof raw);
  *out = raw + CPU_OFFSET;
  return PMAP_SUCCESS;
}

static void cpu_free(pmap_device *dev, void *ptr) {
  if (!ptr) return;
  char *raw;
  size_t bytes;
  memcpy(&raw, (char *)ptr - sizeof raw, sizeof raw);
  memcpy(&bytes, (char *)ptr - sizeof raw - sizeof bytes, sizeof bytes);
  atomic_fetch_sub(&((cpu_device *)dev->be)->live, bytes);
  free(raw);
}

/* Host memory: what the devices hold is counted; what is free is the host's business. */
static pmap_status cpu_memory(pmap_device *dev, size_t *in_use, size_t *free_bytes) {
  *in_use = atomic_load(&((cpu_device *)dev->be)->live);
  *free_bytes = SIZE_MAX;
  return PMAP_SUCCESS;
}

static pmap_status cpu_copy(pmap_device *dev, void *dst, const void *src, size_t bytes) {
  (void)dev;
  if (bytes && dst != src) memcpy(dst, src, bytes);
  return PMAP_SUCCESS;
}

const pmap_backend_i pmap_cpu_backend = {
    .name = "cpu",
    .ctx_init = cpu_ctx_init,
    .ctx_fini = cpu_ctx_fini,
    .device_init = NULL,
    .device_fini = NULL,
    .enter = NULL,
    .leave = NULL,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_copy,
    .download = cpu_copy,
    .stage = NULL,
    .sync = NULL,
    .coll = &pmap_cpu_coll,
    .memory = cpu_memory,
};
