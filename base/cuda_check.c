/* cuda_check.c: the message of a failed CUDA, cuBLAS or NCCL call (see CUDA_CHECK_GEN in
 * cuda_check.h): which device and GPU, the call's text, and the library's own words. */
#include <stdio.h>

#include "cuda_check.h"

pmap_status cuda_fail(const cuda_where *cd, cuda_lib lib, int code, const char *call,
                      const char *file, int line, const char *func) {
  pmap_status st = PMAP_ERR_DEVICE;
  const char *name = "CUDA", *msg = NULL, *detail = NULL;
  switch (lib) {
  case CUDA_LIB_RUNTIME:
    msg = cudaGetErrorString((cudaError_t)code);
    if (code == (int)cudaErrorMemoryAllocation) st = PMAP_ERR_OUT_OF_MEMORY;
    /* Clear the runtime's last error so that the next launch check reports only its own. */
    (void)cudaGetLastError();
    break;
  case CUDA_LIB_CUBLAS:
    name = "cuBLAS";
    msg = cublasGetStatusString((cublasStatus_t)code);
    if (code == (int)CUBLAS_STATUS_ALLOC_FAILED) st = PMAP_ERR_OUT_OF_MEMORY;
    break;
  case CUDA_LIB_NCCL:
    name = "NCCL";
    msg = ncclGetErrorString((ncclResult_t)code);
    /* The library's last detailed message, e.g. which peer or transport failed. */
    detail = ncclGetLastError(NULL);
    break;
  }
  char where[64];
  if (cd)
    snprintf(where, sizeof where, "device %d (GPU %d)", cd->index, cd->gpu);
  else
    snprintf(where, sizeof where, "CUDA backend");
  int has_detail = detail && *detail;
  return pmap_error_set(st, "%s: %s failed: %s error %d: %s%s%s -> at %s:%d (%s)", where, call,
                        name, code, msg ? msg : "(no message)", has_detail ? "; " : "",
                        has_detail ? detail : "", file, line, func);
}
