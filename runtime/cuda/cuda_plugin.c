/* cuda_plugin.c: the runtime's door into the CUDA plugin (libpmap-cuda.so, base/plugin.h): its
 * entry point, which gives the runtime the backend, and the core functions the backend's code
 * calls, under their own names, forwarded to the core's through the table the entry receives.
 * The plugin's other door is the op backend's (ops/cuda/cuda_ops.cu). */
#include <stdatomic.h>

#include "cuda_backend.h"
#include "runtime/dist/dist.h"

/* Set by the entry point, before any other code of the backend runs. */
static const backend_core_i *_Atomic core;

PMAP_PLUGIN_EXPORT uint64_t pmap_cuda_backend_entry(uint64_t abi, const backend_core_i *c,
                                                    backend_impl *out);

uint64_t pmap_cuda_backend_entry(uint64_t abi, const backend_core_i *c, backend_impl *out) {
  uint64_t mine = backend_plugin_abi();
  if (abi != mine) return mine; /* another build: touch nothing of it */
  pmap_plugin_bind_base(c->base);
  atomic_store(&core, c);
  *out = (backend_impl){&pmap_cuda_backend, pmap_cuda_device_count, pmap_cuda_unavailable_reason};
  return mine;
}

int64_t pmap_now_ns(void) { return atomic_load(&core)->now_ns(); }

int sync_barrier_wait(sync_barrier *b, const pmap_wait_policy *p) {
  return atomic_load(&core)->barrier_wait(b, p);
}

pmap_status pmap_wait_status(pmap_device *dev, int wait_result, const char *call) {
  return atomic_load(&core)->wait_status(dev, wait_result, call);
}

void pmap_ctx_abort(pmap_ctx *ctx) { atomic_load(&core)->ctx_abort(ctx); }

pmap_status pmap_abandoned(pmap_device *dev, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pmap_status st = atomic_load(&core)->abandonedv(dev, fmt, ap);
  va_end(ap);
  return st;
}

int dist_rank(const pmap_dist *d) { return atomic_load(&core)->dist_rank(d); }

pmap_status dist_broadcast_bytes(pmap_dist *d, void *buf, size_t bytes, int root) {
  return atomic_load(&core)->dist_broadcast_bytes(d, buf, bytes, root);
}
