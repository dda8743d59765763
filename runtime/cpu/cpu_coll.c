/* cpu_coll.c: shared-memory collectives over the worker threads of one context. Each device
 * publishes its buffers; an all-reduce is a reduce-scatter (device d sums chunk d over every
 * device, in device order 0..N-1) followed by an all-gather of the chunks, so each element is
 * summed once, in a fixed order, and every device gets bitwise the same result.
 *
 * Between two barriers of a collective a device may read or write other devices' buffers. The
 * barriers give one verdict for everybody (runtime/sync.h), and a device whose collective fails
 * returns only once no device is between barriers any more (cpu_ctx.touching): after any return,
 * success or not, no device touches another device's buffers. */
#include <sched.h>
#include <string.h>

#include "cpu_backend.h"
#include "base/error.h"

/* Chunk boundaries are multiples of 16 floats (a cache line), so no two devices write one line. */
#define CHUNK_ALIGN 16

pmap_status cpu_arrive(cpu_passage *ps, int touch_next) {
  pmap_ctx *ctx = ps->dev->ctx;
  cpu_ctx *cc = ctx->be_ctx;
  if (ps->counted) atomic_fetch_sub_explicit(&cc->touching, 1, memory_order_acq_rel);
  ps->counted = 0;
  const pmap_wait_policy *w = ps->wait ? ps->wait : &ctx->wait;
  int r = pmap_barrier_arrive(ps->dev, w, touch_next ? &cc->touching : NULL);
  if (r == PMAP_WAIT_OK) {
    ps->counted = touch_next;
    return PMAP_SUCCESS;
  }
  while (atomic_load_explicit(&cc->touching, memory_order_acquire) > 0) sched_yield();
  return pmap_wait_status(ps->dev, r, ps->call);
}

/* out[i] = op over devices j = 0..n-1 of src[j][i], for i in [lo, hi). out may alias any
 * src[k], so each block is reduced into a local buffer before it is written. max propagates NaN
 * (as jnp.max does). */
void cpu_reduce_range(const float *const *src, int n, float *out, size_t lo, size_t hi,
                      pmap_redop op) {
  cpu_reduce_at(src, lo, n, out + lo, hi - lo, op);
}

void cpu_reduce_at(const float *const *src, size_t at, int n, float *out, size_t len_all,
                   pmap_redop op) {
  enum { BLOCK = 256 };
  float acc[BLOCK];
  float fn = (float)n;
  for (size_t b0 = 0; b0 < len_all; b0 += BLOCK) {
    size_t len = len_all - b0 < BLOCK ? len_all - b0 : BLOCK;
    const float *s0 = src[0] + at + b0;
    for (size_t i = 0; i < len; i++) acc[i] = s0[i];
    for (int j = 1; j < n; j++) {
      const float *s = src[j] + at + b0;
      if (op == PMAP_RED_MAX)
        for (size_t i = 0; i < len; i++) acc[i] = s[i] > acc[i] || s[i] != s[i] ? s[i] : acc[i];
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
  cpu_ctx *cc = ctx->be_ctx;
  int n = ctx->n, d = dev->index;
  if (ctx->dist) return cpu_hier_all_reduce(dev, send, recv, count, op);
  if (count == 0) return PMAP_SUCCESS;
  if (n == 1) { /* sum, mean and max of one value are the value */
    if (recv != send) memcpy(recv, send, count * sizeof *recv);
    return PMAP_SUCCESS;
  }
  const float **sends = cc->slots, **recvs = cc->slots + n;
  sends[d] = send;
  recvs[d] = recv;
  cpu_passage ps = {dev, "all_reduce", 0, NULL};
  PMAP_TRY(cpu_arrive(&ps, 1));
  if (count <= CPU_SMALL_REDUCE) {
    /* Every device reduces everything into its scratch, then copies it out once no device
     * reads the sends any more (recv may be a send). */
    float *tmp = ((cpu_device *)dev->be)->small;
    cpu_reduce_range(sends, n, tmp, 0, count, op);
    PMAP_TRY(cpu_arrive(&ps, 0));
    memcpy(recv, tmp, count * sizeof *recv);
    return PMAP_SUCCESS;
  }
  size_t chunk = (count + (size_t)n - 1) / (size_t)n;
  chunk = (chunk + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
  size_t lo = chunk * (size_t)d < count ? chunk * (size_t)d : count;
  size_t hi = lo + chunk < count ? lo + chunk : count;
  cpu_reduce_range(sends, n, recv, lo, hi, op);
  PMAP_TRY(cpu_arrive(&ps, 1));
  for (int k = 0; k < n; k++) {
    if (k == d) continue;
    size_t klo = chunk * (size_t)k < count ? chunk * (size_t)k : count;
    size_t khi = klo + chunk < count ? klo + chunk : count;
    if (khi > klo) memcpy(recv + klo, recvs[k] + klo, (khi - klo) * sizeof *recv);
  }
  /* Nobody may leave (and reuse its buffers) while another device still copies from them. */
  PMAP_TRY(cpu_arrive(&ps, 0));
  return PMAP_SUCCESS;
}

/* Device d reduces chunk d of every device's buffer into its own, in the all-reduce's order (so
 * each element is bitwise what the all-reduce gives). Across processes the hierarchical
 * all-reduce stands in. */
static pmap_status cpu_reduce_scatter(pmap_device *dev, float *buf, size_t chunk, pmap_redop op) {
  pmap_ctx *ctx = dev->ctx;
  cpu_ctx *cc = ctx->be_ctx;
  int n = ctx->n, d = dev->index;
  if (ctx->dist)
    return cpu_hier_all_reduce(dev, buf, buf, chunk * (size_t)n * (size_t)ctx->nproc, op);
  if (chunk == 0) return PMAP_SUCCESS;
  if (n == 1) return cpu_all_reduce(dev, buf, buf, chunk, op);
  const float **bufs = cc->slots;
  bufs[d] = buf;
  cpu_passage ps = {dev, "reduce_scatter", 0, NULL};
  PMAP_TRY(cpu_arrive(&ps, 1));
  size_t lo = chunk * (size_t)d;
  cpu_reduce_range(bufs, n, buf, lo, lo + chunk, op);
  /* Nobody may leave (and reuse its buffer) while another device still reads its chunk. */
  PMAP_TRY(cpu_arrive(&ps, 0));
  return PMAP_SUCCESS;
}

/* Device d reduces the piece's elements of its part, in the all-reduce's order. Not across
 * processes (the caller's sharded gradients are not). */
static pmap_status cpu_reduce_part(pmap_device *dev, const float *send, size_t lo, size_t count,
                                   size_t chunk, float *recv, size_t recv_lo, pmap_redop op) {
  pmap_ctx *ctx = dev->ctx;
  cpu_ctx *cc = ctx->be_ctx;
  int n = ctx->n, d = dev->index;
  if (ctx->dist) return PMAP_ERR(PMAP_ERR_INTERNAL, "reduce_part: not across processes");
  size_t a = chunk * (size_t)d, b = a + chunk, end = lo + count;
  a = a > lo ? a : lo;
  b = b < end ? b : end;
  if (count == 0) return PMAP_SUCCESS;
  if (n == 1) {
    if (b > a) cpu_reduce_at(&send, a - lo, 1, recv + (a - recv_lo), b - a, op);
    return PMAP_SUCCESS;
  }
  const float **sends = cc->slots;
  sends[d] = send;
  cpu_passage ps = {dev, "reduce_part", 0, NULL};
  PMAP_TRY(cpu_arrive(&ps, 1));
  if (b > a) cpu_reduce_at(sends, a - lo, n, recv + (a - recv_lo), b - a, op);
  /* Nobody may leave (and reuse its buffer) while another device still reads its piece. */
  PMAP_TRY(cpu_arrive(&ps, 0));
  return PMAP_SUCCESS;
}

static pmap_status cpu_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                                 int root) {
  cpu_ctx *cc = dev->ctx->be_ctx;
  if (dev->ctx->dist) return cpu_hier_broadcast(dev, send, recv, count, root);
  if (count == 0) return PMAP_SUCCESS;
  cc->slots[dev->index] = send;
  cpu_passage ps = {dev, "broadcast", 0, NULL};
  PMAP_TRY(cpu_arrive(&ps, 1));
  const float *src = cc->slots[root];
  if (recv != src) memcpy(recv, src, count * sizeof *recv);
  PMAP_TRY(cpu_arrive(&ps, 0));
  return PMAP_SUCCESS;
}

static pmap_status cpu_all_gather(pmap_device *dev, const float *send, float *recv, size_t count) {
  pmap_ctx *ctx = dev->ctx;
  cpu_ctx *cc = ctx->be_ctx;
  if (ctx->dist) return cpu_hier_all_gather(dev, send, recv, count);
  if (count == 0) return PMAP_SUCCESS;
  cc->slots[dev->index] = send;
  cpu_passage ps = {dev, "all_gather", 0, NULL};
  PMAP_TRY(cpu_arrive(&ps, 1));
  for (int k = 0; k < ctx->n; k++) {
    float *dst = recv + (size_t)k * count;
    if (dst != cc->slots[k]) memcpy(dst, cc->slots[k], count * sizeof *dst);
  }
  PMAP_TRY(cpu_arrive(&ps, 0));
  return PMAP_SUCCESS;
}

static pmap_status cpu_barrier(pmap_device *dev) {
  if (dev->ctx->dist) return cpu_hier_barrier(dev);
  cpu_passage ps = {dev, "barrier", 0, NULL};
  return cpu_arrive(&ps, 0);
}

const pmap_coll_i pmap_cpu_coll = {
    .all_reduce = cpu_all_reduce,
    .broadcast = cpu_broadcast,
    .all_gather = cpu_all_gather,
    .reduce_scatter = cpu_reduce_scatter,
    .reduce_part = cpu_reduce_part,
    .barrier = cpu_barrier,
};
