/* dist.h: the inter-process transport under the collectives (P processes x D local devices).
 * Local device 0 of each process calls these for its process, after the local devices have
 * combined their values over shared memory; every wait is bounded by the context's timeout.
 * Built on MPI (dist_mpi.c) where configured; dist_none.c stands in without it. */
#ifndef PMAP_RUNTIME_DIST_H
#define PMAP_RUNTIME_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "pmap.h"

typedef struct pmap_dist pmap_dist;

/* The operations checked alike on every process before data moves. */
typedef enum dist_op {
  DIST_SUM = 0,
  DIST_MAX = 1,
  DIST_BROADCAST = 2,
  DIST_ALL_GATHER = 3,
  DIST_BARRIER = 4,
} dist_op;

/* Decides from cfg->dist (and, for PMAP_DIST_AUTO, the environment variable PMAP_DIST and the
 * launcher's variables) whether the context spans processes. *out is NULL for one process;
 * otherwise the transport is open, every process has checked that the others run the same
 * backend with the same local device count, and *rank / *size are set. timeout_ns < 0: never. */
pmap_status dist_open(const pmap_config *cfg, pmap_backend kind, int local_devices,
                      int64_t timeout_ns, pmap_dist **out, int *rank, int *size);
/* Closes the transport (accepts NULL). After a failed exchange nothing is released that the
 * transport may still write into. */
void dist_close(pmap_dist *d);

/* buf (count): this process's partial values; on return the sum (in process order 0..P-1, so
 * every process gets bitwise the same) or the max (NaN propagates) over processes. */
pmap_status dist_all_reduce(pmap_dist *d, float *buf, size_t count, dist_op op);
/* buf (count) of process root to every process. */
pmap_status dist_broadcast(pmap_dist *d, float *buf, size_t count, int root);
/* send (count) of every process; *out points to (P, count) in process order, owned by the
 * transport and valid until its next call. */
pmap_status dist_all_gather(pmap_dist *d, const float *send, size_t count, const float **out);
pmap_status dist_barrier(pmap_dist *d);
/* bytes of process root to every process (the NCCL unique id, runtime/dist/dist_nccl.c). */
pmap_status dist_broadcast_bytes(pmap_dist *d, void *buf, size_t bytes, int root);

/* This process's index among the transport's processes. */
int dist_rank(const pmap_dist *d);

/* Whether an exchange failed (timeout, a process gone, an MPI error): the processes are no
 * longer in step, so every later exchange fails at once with the first failure's message. */
int dist_broken(const pmap_dist *d);

#endif
