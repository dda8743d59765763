/* dist_nccl.h: the NCCL bootstrap across processes, for the CUDA backend (runtime/dist/
 * dist_nccl.c; built where both CUDA and MPI are). One communicator spans every global device:
 * local device d of process p is NCCL rank p * D + d of P * D. */
#ifndef PMAP_RUNTIME_DIST_NCCL_H
#define PMAP_RUNTIME_DIST_NCCL_H

#include <nccl.h>

#include "dist.h"

/* Process 0 calls ncclGetUniqueId and every process receives its id (dist_broadcast_bytes:
 * agreed first, so a missing process is a timeout naming it, not a hang). */
pmap_status dist_nccl_unique_id(pmap_dist *d, ncclUniqueId *id);

#endif
