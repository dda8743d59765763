/* dist_nccl.c: the NCCL bootstrap across processes over the MPI transport: the unique id of
 * process 0 broadcast to every process, then every process's local ranks initialised in one
 * group, so that one communicator spans the GPUs of every process. */
#include <cuda_runtime_api.h>
#include <stdio.h>

#include "dist_nccl.h"
#include "runtime/error.h"

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

pmap_status dist_nccl_init_comms(pmap_dist *d, int proc, int nproc, int local_devices,
                                 const int *gpus, ncclComm_t *comms) {
  ncclUniqueId id;
  PMAP_TRY(dist_nccl_unique_id(d, &id));
  int saved = 0;
  cudaGetDevice(&saved);
  int global = nproc * local_devices;
  ncclResult_t r = ncclGroupStart();
  int started = 0;
  for (int i = 0; i < local_devices && r == ncclSuccess; i++) {
    comms[i] = NULL;
    if (cudaSetDevice(gpus[i]) != cudaSuccess) {
      r = ncclUnhandledCudaError;
      break;
    }
    r = ncclCommInitRank(&comms[i], global, id, proc * local_devices + i);
    started = i + 1;
  }
  ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess) r = end;
  cudaSetDevice(saved);
  if (r == ncclSuccess) return PMAP_SUCCESS;
  for (int i = 0; i < started; i++)
    if (comms[i]) ncclCommAbort(comms[i]);
  return PMAP_ERR(PMAP_ERR_DEVICE,
                  "process %d: ncclCommInitRank of %d local devices (ranks %d..%d of %d) failed: "
                  "%s",
                  proc, local_devices, proc * local_devices, (proc + 1) * local_devices - 1, global,
                  ncclGetErrorString(r));
}
