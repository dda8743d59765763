/* cpu_backend.h: per-device state of the CPU backend, shared by its files. */
#ifndef PMAP_CPU_BACKEND_H
#define PMAP_CPU_BACKEND_H

#include "runtime/backend.h"

/* All-reduces of at most this many elements take the two-barrier path through a scratch. */
#define CPU_SMALL_REDUCE 1024

typedef struct cpu_device {
  float small[CPU_SMALL_REDUCE];
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
} cpu_ctx;

extern const pmap_coll_i pmap_cpu_coll;

#endif
