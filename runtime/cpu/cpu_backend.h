/* cpu_backend.h: per-device state of the CPU backend, shared by its files. */
#ifndef PMAP_CPU_BACKEND_H
#define PMAP_CPU_BACKEND_H

#include <stdatomic.h>

#include "runtime/backend.h"

/* All-reduces of at most this many elements take the two-barrier path through a scratch. */
#define CPU_SMALL_REDUCE 1024

typedef struct cpu_device {
  float small[CPU_SMALL_REDUCE];
  _Alignas(64) _Atomic size_t
      live; /* (its own cache line) bytes allocated for the device and not freed (backend memory) */
} cpu_device;

/* The CPU backend's context-wide state (ctx->be_ctx). */
typedef struct cpu_ctx {
  cpu_device *dev;     /* (n) */
  const float **slots; /* (2n) send then recv pointers published to a collective */
  /* Devices past a released barrier of a collective that may still read or write other
   * devices' buffers; each takes itself off before its next arrival. A device whose collective
   * fails waits for it to reach 0 before it returns, so no buffer is used after its owner got
   * an error back (and may free it). */
  _Atomic int touching;
  /* Across processes (runtime/cpu/cpu_hier.c): this process's partial or final values of a
   * collective, grown by device 0 while no device uses it. */
  float *part;
  size_t part_cap;
  const float *gathered; /* (P, D, count) of an all-gather, the transport's memory */
} cpu_ctx;

/* out[i] = op over devices j = 0..n-1 of src[j][i], for i in [lo, hi), in device order. */
void cpu_reduce_range(const float *const *src, int n, float *out, size_t lo, size_t hi,
                      pmap_redop op);
/* out[i] = op over devices j = 0..n-1 of src[j][at + i], for i in [0, len), in device order;
 * out may alias a src[k] at the same element. */
void cpu_reduce_at(const float *const *src, size_t at, int n, float *out, size_t len,
                   pmap_redop op);

/* One device's passage through the barriers of one collective. */
typedef struct cpu_passage {
  pmap_device *dev;
  const char *call;
  int counted; /* counted in touching: past a barrier after which buffers are shared */
  const pmap_wait_policy *wait; /* NULL: the context's */
} cpu_passage;

/* Arrives at the next barrier of a collective (runtime/cpu/cpu_coll.c). touch_next: after it,
 * devices use each other's buffers. On failure it returns once no device touches any. */
pmap_status cpu_arrive(cpu_passage *ps, int touch_next);

/* The collectives of a context that spans processes: local shared memory, then one exchange
 * per process through runtime/dist on device 0, then local again (runtime/cpu/cpu_hier.c). */
pmap_status cpu_hier_all_reduce(pmap_device *dev, const float *send, float *recv, size_t count,
                                pmap_redop op);
pmap_status cpu_hier_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                               int root);
pmap_status cpu_hier_all_gather(pmap_device *dev, const float *send, float *recv, size_t count);
pmap_status cpu_hier_barrier(pmap_device *dev);

extern const pmap_coll_i pmap_cpu_coll;

#endif
