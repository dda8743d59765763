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

/* Creates comms[0..local_devices) for this process: the unique id from process 0, then one
 * ncclCommInitRank per local device (on GPU gpus[i], rank proc * local_devices + i of
 * nproc * local_devices) inside one NCCL group. On failure no communicator is left. Call it
 * from the CUDA backend's ctx_init, where one process would call ncclCommInitAll. */
pmap_status dist_nccl_init_comms(pmap_dist *d, int proc, int nproc, int local_devices,
                                 const int *gpus, ncclComm_t *comms);

#endif
