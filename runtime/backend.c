/* backend.c: the only code outside the backends that calls a backend's table for memory, copies
 * and sync. Optional members are handled here, once, and the allocation fault hook lives here. */
#include "backend.h"

#include "error.h"
#include "fault.h"

pmap_status backend_alloc(pmap_device *dev, size_t bytes, void **out) {
  *out = NULL;
  if (pmap_fault_fires(dev->ctx->fault, FAULT_ALLOC, dev->index, -1))
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "device %d: allocation of %zu bytes failed (injected by PMAP_FAULT)",
                    dev->index, bytes);
  return dev->ctx->be->alloc(dev, bytes, out);
}

void backend_free(pmap_device *dev, void *ptr) {
  if (ptr) dev->ctx->be->free(dev, ptr);
}

pmap_status backend_upload(pmap_device *dev, void *dst, const void *src, size_t bytes) {
  if (!bytes) return PMAP_SUCCESS;
  return dev->ctx->be->upload(dev, dst, src, bytes);
}

pmap_status backend_download(pmap_device *dev, void *dst, const void *src, size_t bytes) {
  if (!bytes) return PMAP_SUCCESS;
  return dev->ctx->be->download(dev, dst, src, bytes);
}

pmap_status backend_sync(pmap_device *dev) {
  return dev->ctx->be->sync ? dev->ctx->be->sync(dev) : PMAP_SUCCESS;
}

pmap_status backend_stage(pmap_device *dev, int slot, const void *host, size_t bytes,
                          const void **out) {
  if (!dev->ctx->be->stage) {
    *out = host;
    return PMAP_SUCCESS;
  }
  void *d = NULL;
  PMAP_TRY(dev->ctx->be->stage(dev, slot, host, bytes, &d));
  *out = d;
  return PMAP_SUCCESS;
}

pmap_status backend_all_reduce(pmap_device *dev, const float *send, float *recv, size_t count,
                               pmap_redop op) {
  return dev->ctx->be->coll->all_reduce(dev, send, recv, count, op);
}

pmap_status backend_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                              int root) {
  return dev->ctx->be->coll->broadcast(dev, send, recv, count, root);
}

pmap_status backend_all_gather(pmap_device *dev, const float *send, float *recv, size_t count) {
  return dev->ctx->be->coll->all_gather(dev, send, recv, count);
}

pmap_status backend_barrier(pmap_device *dev) { return dev->ctx->be->coll->barrier(dev); }
