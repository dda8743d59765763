/* cpu_backend.h: per-device state of the CPU backend, shared by its files. */
#ifndef PMAP_CPU_BACKEND_H
#define PMAP_CPU_BACKEND_H

#include "runtime/backend.h"

/* All-reduces of at most this many elements take the two-barrier path through a scratch. */
#define CPU_SMALL_REDUCE 1024

typedef struct cpu_device {
  float small[CPU_SMALL_REDUCE];
} cpu_device;

extern const pmap_coll_i pmap_cpu_coll;

#endif
