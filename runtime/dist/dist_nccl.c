/* dist_nccl.c: the NCCL bootstrap across processes over the MPI transport: the unique id of
 * process 0 broadcast to every process; the CUDA backend (runtime/cuda/cuda_ctx.c) then
 * initialises every process's local ranks in one group, so that one communicator spans the GPUs
 * of every process. */
#include <stdio.h>

#include "dist_nccl.h"
#include "base/error.h"

pmap_status dist_nccl_unique_id(pmap_dist *d, ncclUniqueId *id) {
  /* Every process takes part in the broadcast, even when process 0's ncclGetUniqueId failed:
   * the id then travels as zeros and every process reports the failure. */
  ncclUniqueId zero = {{0}};
  *id = zero;
  if (!d) return PMAP_ERR(PMAP_ERR_INTERNAL, "dist_nccl_unique_id: no transport");
  ncclResult_t r = ncclSuccess;
  if (dist_rank(d) == 0) r = ncclGetUniqueId(id);
  PMAP_TRY(dist_broadcast_bytes(d, id, sizeof *id, 0));
  if (r != ncclSuccess)
    return PMAP_ERR(PMAP_ERR_DEVICE, "process 0: ncclGetUniqueId failed: %s",
                    ncclGetErrorString(r));
  int empty = 1;
  for (size_t i = 0; i < sizeof id->internal; i++) empty &= id->internal[i] == 0;
  if (empty)
    return PMAP_ERR(PMAP_ERR_DEVICE,
                    "process %d: process 0 could not create the NCCL unique id (see its message)",
                    dist_rank(d));
  return PMAP_SUCCESS;
}
