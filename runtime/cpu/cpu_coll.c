/* cpu_coll.c: shared-memory collectives over the worker threads of one context. Each device
 * publishes its buffers; an all-reduce is a reduce-scatter (device d sums chunk d over every
 * device, in device order 0..N-1) followed by an all-gather of the chunks, so each element is
 * summed once, in a fixed order, and every device gets bitwise the same result. */
#include <string.h>

#include "cpu_backend.h"
#include "runtime/error.h"

/* Chunk boundaries are multiples of 16 floats (a cache line), so no two devices write one line. */
#define CHUNK_ALIGN 16

static pmap_status bar(pmap_device *dev, const char *call) {
  pmap_ctx *ctx = dev->ctx;
  return pmap_wait_status(dev, sync_barrier_wait(&ctx->bar, &ctx->wait), call);
}

/* out[i] = op over devices j = 0..n-1 of src[j][i], for i in [lo, hi). out may alias any
 * src[k], so each block is reduced into a local buffer before it is written. */
static void reduce_range(const float *const *src, int n, float *out, size_t lo, size_t hi,
                         pmap_redop op) {
  enum { BLOCK = 256 };
  float acc[BLOCK];
  float fn = (float)n;
  for (size_t b0 = lo; b0 < hi; b0 += BLOCK) {
    size_t len = hi - b0 < BLOCK ? hi - b0 : BLOCK;
    const float *s0 = src[0] + b0;
    for (size_t i = 0; i < len; i++) acc[i] = s0[i];
    for (int j = 1; j < n; j++) {
      const float *s = src[j] + b0;
      if (op == PMAP_RED_MAX)
        for (size_t i = 0; i < len; i++) acc[i] = s[i] > acc[i] ? s[i] : acc[i];
      else
        for (size_t i = 0; i < len; i++) acc[i] += s[i];
    }
    if (op == PMAP_RED_MEAN)
      for (size_t i = 0; i < len; i++) acc[i] /= fn;
    memcpy(out + b0, acc, len * sizeof *out);
  }
}

static pmap_status cpu_all_reduce(pmap_device *dev, const float *send, float *recv, size_t count,
                                  pmap_redop op) {
  pmap_ctx *ctx = dev->ctx;
  int n = ctx->n, d = dev->index;
  if (count == 0) return PMAP_SUCCESS;
  if (n == 1) { /* sum, mean and max of one value are the value */
    if (recv != send) memcpy(recv, send, count * sizeof *recv);
    return PMAP_SUCCESS;
  }
  const float **sends = ctx->slots, **recvs = ctx->slots + n;
  sends[d] = send;
  recvs[d] = recv;
  PMAP_TRY(bar(dev, "all_reduce"));
  if (count <= CPU_SMALL_REDUCE) {
    /* Every device reduces everything into its scratch, then copies it out once no device
     * reads the sends any more (recv may be a send). */
    float *tmp = ((cpu_device *)dev->be)->small;
    reduce_range(sends, n, tmp, 0, count, op);
    PMAP_TRY(bar(dev, "all_reduce"));
    memcpy(recv, tmp, count * sizeof *recv);
    return PMAP_SUCCESS;
  }
  size_t chunk = (count + (size_t)n - 1) / (size_t)n;
  chunk = (chunk + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
  size_t lo = chunk * (size_t)d < count ? chunk * (size_t)d : count;
  size_t hi = lo + chunk < count ? lo + chunk : count;
  reduce_range(sends, n, recv, lo, hi, op);
  PMAP_TRY(bar(dev, "all_reduce"));
  for (int k = 0; k < n; k++) {
    if (k == d) continue;
    size_t klo = chunk * (size_t)k < count ? chunk * (size_t)k : count;
    size_t khi = klo + chunk < count ? klo + chunk : count;
    if (khi > klo) memcpy(recv + klo, recvs[k] + klo, (khi - klo) * sizeof *recv);
  }
  /* Nobody may leave (and reuse its buffers) while another device still copies from them. */
  PMAP_TRY(bar(dev, "all_reduce"));
  return PMAP_SUCCESS;
}

static pmap_status cpu_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                                 int root) {
  pmap_ctx *ctx = dev->ctx;
  if (count == 0) return PMAP_SUCCESS;
  ctx->slots[dev->index] = send;
  PMAP_TRY(bar(dev, "broadcast"));
  const float *src = ctx->slots[root];
  if (recv != src) memcpy(recv, src, count * sizeof *recv);
  PMAP_TRY(bar(dev, "broadcast"));
  return PMAP_SUCCESS;
}

static pmap_status cpu_all_gather(pmap_device *dev, const float *send, float *recv, size_t count) {
  pmap_ctx *ctx = dev->ctx;
  if (count == 0) return PMAP_SUCCESS;
  ctx->slots[dev->index] = send;
  PMAP_TRY(bar(dev, "all_gather"));
  for (int k = 0; k < ctx->n; k++) {
    float *dst = recv + (size_t)k * count;
    if (dst != ctx->slots[k]) memcpy(dst, ctx->slots[k], count * sizeof *dst);
  }
  PMAP_TRY(bar(dev, "all_gather"));
  return PMAP_SUCCESS;
}

static pmap_status cpu_barrier(pmap_device *dev) { return bar(dev, "barrier"); }

const pmap_coll_i pmap_cpu_coll = {
    .all_reduce = cpu_all_reduce,
    .broadcast = cpu_broadcast,
    .all_gather = cpu_all_gather,
    .barrier = cpu_barrier,
};
