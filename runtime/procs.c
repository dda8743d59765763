/* procs.c: what the runtime knows of the processes of a context: the names messages give devices
 * and processes (global index, process, host), and host values exchanged between processes
 * outside jobs (checks that every process passes the same step, replica checksums). */
#include <stdio.h>

#include "backend.h"
#include "base/error.h"
#include "runtime/dist/dist.h"

const char *pmap_dev_name(const pmap_device *dev, char *buf, size_t size) {
  const pmap_ctx *ctx = dev->ctx;
  if (!ctx->dist)
    snprintf(buf, size, "device %d", dev->index);
  else
    snprintf(buf, size, "device %d (process %d of %d, host %s)", ctx->proc * ctx->n + dev->index,
             ctx->proc, ctx->nproc, dist_host(ctx->dist, ctx->proc));
  return buf;
}

const char *pmap_proc_host(const pmap_ctx *ctx, int proc) { return dist_host(ctx->dist, proc); }

const char *pmap_proc_name(const pmap_ctx *ctx, int proc, char *buf, size_t size) {
  snprintf(buf, size, "process %d (host %s)", proc, dist_host(ctx->dist, proc));
  return buf;
}

pmap_status pmap_ctx_exchange(pmap_ctx *ctx, const char *call, const void *mine, size_t bytes,
                              const void **all) {
  *all = mine;
  if (!ctx->dist) return PMAP_SUCCESS;
  return dist_exchange(ctx->dist, call, mine, bytes, all);
}
