/* cuda_check.h: the one family of checks for CUDA, cuBLAS and NCCL return codes, shared by the
 * CUDA backend (runtime/cuda) and the CUDA kernels (ops/cuda): a failure records a message naming
 * the device, the call's text and the library's own words, and is returned, never an exit.
 * Written in the subset of C that C++ also accepts. */
#ifndef PMAP_BASE_CUDA_CHECK_H
#define PMAP_BASE_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which device a failure is on: the first member of the backend's device state and of a CUDA
 * op queue, so that either (or NULL: the context as a whole) names it. */
typedef struct cuda_where {
  int index; /* logical device */
  int gpu;   /* physical CUDA device */
} cuda_where;

typedef enum cuda_lib { CUDA_LIB_RUNTIME = 0, CUDA_LIB_CUBLAS = 1, CUDA_LIB_NCCL = 2 } cuda_lib;

/* Records the failure of `call` (its source text) returning `code` from library `lib` on device
 * w (NULL: the context as a whole) with the library's own message, file, line and function, and
 * returns the status: PMAP_ERR_OUT_OF_MEMORY for allocation failures, else PMAP_ERR_DEVICE. */
pmap_status cuda_fail(const cuda_where *w, cuda_lib lib, int code, const char *call,
                      const char *file, int line, const char *func);

/* The one generic check: evaluates expr once, compares it with the library's success value and
 * on failure records the error and runs on_fail (a return or a goto; never an exit). cd: a
 * pointer to a struct whose first member is a cuda_where, or NULL. */
#define CUDA_CHECK_GEN(cd, lib, ok, expr, text, on_fail)                                        \
  do {                                                                                          \
    int cuda_chk_e_ = (int)(expr);                                                              \
    if (cuda_chk_e_ != (int)(ok)) {                                                             \
      pmap_status cuda_chk_s_ = cuda_fail((const cuda_where *)(cd), (lib), cuda_chk_e_, (text), \
                                          __FILE__, __LINE__, __func__);                        \
      on_fail;                                                                                  \
    }                                                                                           \
  } while (0)

#define CUDA_CHECK(cd, expr) \
  CUDA_CHECK_GEN(cd, CUDA_LIB_RUNTIME, cudaSuccess, expr, #expr, return cuda_chk_s_)
#define CUBLAS_CHECK(cd, expr) \
  CUDA_CHECK_GEN(cd, CUDA_LIB_CUBLAS, CUBLAS_STATUS_SUCCESS, expr, #expr, return cuda_chk_s_)
#define NCCL_CHECK(cd, expr) \
  CUDA_CHECK_GEN(cd, CUDA_LIB_NCCL, ncclSuccess, expr, #expr, return cuda_chk_s_)

/* As above, storing the status in st and jumping to label for cleanup. */
#define CUDA_CHECK_GOTO(cd, st, expr, label)                       \
  CUDA_CHECK_GEN(cd, CUDA_LIB_RUNTIME, cudaSuccess, expr, #expr, { \
    (st) = cuda_chk_s_;                                            \
    goto label;                                                    \
  })
#define CUBLAS_CHECK_GOTO(cd, st, expr, label)                              \
  CUDA_CHECK_GEN(cd, CUDA_LIB_CUBLAS, CUBLAS_STATUS_SUCCESS, expr, #expr, { \
    (st) = cuda_chk_s_;                                                     \
    goto label;                                                             \
  })
#define NCCL_CHECK_GOTO(cd, st, expr, label)                    \
  CUDA_CHECK_GEN(cd, CUDA_LIB_NCCL, ncclSuccess, expr, #expr, { \
    (st) = cuda_chk_s_;                                         \
    goto label;                                                 \
  })

/* After a kernel launch: a bad configuration or an earlier asynchronous fault shows here. */
#define CUDA_CHECK_LAUNCH(cd, kernel_name)                                                        \
  CUDA_CHECK_GEN(cd, CUDA_LIB_RUNTIME, cudaSuccess, cudaGetLastError(), "launch of " kernel_name, \
                 return cuda_chk_s_)

#ifdef __cplusplus
}
#endif
#endif
