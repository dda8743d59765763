/* cpu_hier.c: the CPU collectives of a context that spans processes. Each is local, then
 * inter-process, then local: the devices of a process combine their values over shared memory
 * (in device order) into the process's partial, local device 0 exchanges the partials with the
 * other processes through runtime/dist (combined there in process order), and every device copies
 * the result out. The order of every addition is fixed, so every global device gets bitwise the
 * same values. What each process calls was compared at the rendezvous (runtime/backend.c), so
 * only data moves here.
 *
 * The barriers are cpu_coll.c's, with its guarantee: a device touches other devices' buffers
 * only between a released barrier and its next arrival, and no collective returns while any
 * device does. The inter-process step reads and writes only the context's scratch (cpu_ctx.part),
 * which device 0 grows at the start of a collective, when the previous one's final barrier has
 * seen every device done with it. */
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "runtime/dist/dist.h"
#include "base/error.h"

#define CHUNK_ALIGN 16

static pmap_status ensure_part(pmap_device *dev, size_t floats) {
  cpu_ctx *cc = dev->ctx->be_ctx;
  if (floats <= cc->part_cap) return PMAP_SUCCESS;
  float *p = realloc(cc->part, floats * sizeof *p);
  if (!p)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "device %d: out of memory for %zu floats of an inter-process collective",
                    dev->index, floats);
  cc->part = p;
  cc->part_cap = floats;
  return PMAP_SUCCESS;
}

/* Device 0's inter-process step failed: wake the local devices, which then fail too. */
static pmap_status dist_failed(pmap_device *dev, pmap_status st) {
  pmap_ctx_abort(dev->ctx);
  return st;
}

pmap_status cpu_hier_all_reduce(pmap_device *dev, const float *send, float *recv, size_t count,
                                pmap_redop op) {
  pmap_ctx *ctx = dev->ctx;
  cpu_ctx *cc = ctx->be_ctx;
  int n = ctx->n, d = dev->index;
  pmap_redop local = op == PMAP_RED_MAX ? PMAP_RED_MAX : PMAP_RED_SUM;
  cpu_passage ps = {dev, "all_reduce", 0, NULL};
  if (d == 0) PMAP_TRY(ensure_part(dev, count));
  cc->slots[d] = send;
  PMAP_TRY(cpu_arrive(&ps, 1));
  size_t chunk = (count + (size_t)n - 1) / (size_t)n;
  chunk = (chunk + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
  size_t lo = chunk * (size_t)d < count ? chunk * (size_t)d : count;
  size_t hi = lo + chunk < count ? lo + chunk : count;
  if (hi > lo) cpu_reduce_range(cc->slots, n, cc->part, lo, hi, local);
  PMAP_TRY(cpu_arrive(&ps, 0));
  if (d == 0) {
    pmap_status st = dist_all_reduce(ctx->dist, cc->part, count, op == PMAP_RED_MAX);
    if (st) return dist_failed(dev, st);
    if (op == PMAP_RED_MEAN) {
      float g = (float)(n * ctx->nproc);
      for (size_t i = 0; i < count; i++) cc->part[i] /= g;
    }
  }
  pmap_wait_policy w = pmap_patient_wait(ctx);
  ps.wait = &w;
  PMAP_TRY(cpu_arrive(&ps, 0));
  ps.wait = NULL;
  if (count) memcpy(recv, cc->part, count * sizeof *recv);
  return cpu_arrive(&ps, 0);
}

pmap_status cpu_hier_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                               int root) {
  pmap_ctx *ctx = dev->ctx;
  cpu_ctx *cc = ctx->be_ctx;
  int n = ctx->n, d = dev->index, root_proc = root / n;
  cpu_passage ps = {dev, "broadcast", 0, NULL};
  if (d == 0) PMAP_TRY(ensure_part(dev, count));
  cc->slots[d] = send;
  PMAP_TRY(cpu_arrive(&ps, 1));
  if (d == 0 && ctx->proc == root_proc && count)
    memcpy(cc->part, cc->slots[root % n], count * sizeof *recv);
  PMAP_TRY(cpu_arrive(&ps, 0));
  if (d == 0) {
    pmap_status st = dist_broadcast(ctx->dist, cc->part, count * sizeof *cc->part, root_proc);
    if (st) return dist_failed(dev, st);
  }
  pmap_wait_policy w = pmap_patient_wait(ctx);
  ps.wait = &w;
  PMAP_TRY(cpu_arrive(&ps, 0));
  ps.wait = NULL;
  if (count) memcpy(recv, cc->part, count * sizeof *recv);
  return cpu_arrive(&ps, 0);
}

pmap_status cpu_hier_all_gather(pmap_device *dev, const float *send, float *recv, size_t count) {
  pmap_ctx *ctx = dev->ctx;
  cpu_ctx *cc = ctx->be_ctx;
  int n = ctx->n, d = dev->index;
  cpu_passage ps = {dev, "all_gather", 0, NULL};
  if (d == 0) PMAP_TRY(ensure_part(dev, count * (size_t)n));
  PMAP_TRY(cpu_arrive(&ps, 0));
  if (count) memcpy(cc->part + (size_t)d * count, send, count * sizeof *send);
  PMAP_TRY(cpu_arrive(&ps, 0));
  if (d == 0) {
    const void *all = NULL;
    pmap_status st =
        dist_all_gather(ctx->dist, cc->part, count * (size_t)n * sizeof *cc->part, &all);
    if (st) return dist_failed(dev, st);
    cc->gathered = all;
  }
  pmap_wait_policy w = pmap_patient_wait(ctx);
  ps.wait = &w;
  PMAP_TRY(cpu_arrive(&ps, 0));
  ps.wait = NULL;
  if (count) memcpy(recv, cc->gathered, count * (size_t)n * (size_t)ctx->nproc * sizeof *recv);
  return cpu_arrive(&ps, 0);
}

/* Every process's device 0 received every other's record at the rendezvous: the processes have
 * all arrived, so only the devices of this process meet here. */
pmap_status cpu_hier_barrier(pmap_device *dev) {
  cpu_passage ps = {dev, "barrier", 0, NULL};
  return cpu_arrive(&ps, 0);
}
