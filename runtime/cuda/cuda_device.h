/* cuda_device.h: the CUDA backend's per-device state and its one family of error checks, shared
 * by the backend (runtime/cuda, C) and the kernels (ops/cuda, CUDA C++). Written in the subset of
 * C that C++ also accepts, so both sides see the same struct. */
#ifndef PMAP_CUDA_DEVICE_H
#define PMAP_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "ops/ops.h"
#include "base/error.h"

/* Blocks of the first pass of a loss reduction; its partial sums (doubles) sit in the scratch. */
#define CUDA_REDUCE_BLOCKS 256
/* Device scratch per device: the reduction partials, then one float for the start-up barrier. */
#define CUDA_SCRATCH_BYTES (CUDA_REDUCE_BLOCKS * sizeof(double) + 256)
/* cuBLAS workspace per handle, given explicitly so a GEMM never allocates (32 MiB suits Hopper). */
#define CUDA_BLAS_WORKSPACE_BYTES ((size_t)32 << 20)

/* Pinned host memory for downloads of at most this many bytes (the loss of a step): the copy is
 * asynchronous and the wait for it is the step's one host wait. */
#define CUDA_DOWN_BYTES ((size_t)4096)

/* Input staging of one slot (0 inputs, 1 labels): the device buffer a shard of host rows is
 * copied into. It grows, never shrinks. */
typedef struct cuda_stage {
  void *dev; /* (cap bytes) */
  size_t cap;
} cuda_stage;

/* The values of a step that change from step to step, in device memory, for the fast steps
 * (runtime/cuda/cuda_graph.c): the host writes hyper and step before each step (stream-ordered,
 * outside any captured graph); the guard and clipping kernel writes scale and skip. */
typedef struct cuda_step_vals {
  pmap_step_hyper hyper; /* the optimizer's settings after the schedule */
  uint64_t step;         /* keys dropout's masks */
  float scale;           /* the gradients' clipping scale (1: none) */
  int skip;              /* 1: the numeric guard skips the step: the optimizer changes nothing */
} cuda_step_vals;

typedef struct cuda_device {
  int index;           /* logical device, also its NCCL rank */
  int gpu;             /* physical CUDA device */
  cudaStream_t stream; /* every kernel, copy and collective of this device, in order */
  cublasHandle_t blas; /* bound to `stream`, with its own workspace */
  void *blas_ws;       /* (CUDA_BLAS_WORKSPACE_BYTES) */
  ncclComm_t comm;     /* rank `index`; owned by the context (runtime/cuda/cuda_ctx.c) */
  void *scratch;       /* (CUDA_SCRATCH_BYTES) */
  float *work;         /* (work_cap floats) op workspace, e.g. batched im2col columns */
  size_t work_cap;
  cuda_stage stage[2];
  cudaEvent_t done; /* blocking-sync event: what a wait sleeps on (runtime/cuda/cuda_coll.c) */
  /* Two pinned host buffers (of the context's pinned_bytes) that input rows pass through on
   * their way to `stage`, used in turns; ev[k] marks the end of the last copy out of buf[k]. */
  void *pinned[2];
  cudaEvent_t pinned_ev[2];
  int pinned_next;
  void *down;          /* (CUDA_DOWN_BYTES) pinned */
  uint64_t *alloc_gen; /* the context's allocation count (atomic builtins): a captured graph
                          names buffers, so any allocation makes the next step capture anew */
  /* Fast steps (runtime/cuda/cuda_graph.c). While vals_on, the optimizer, clipping and dropout
   * kernels read this step's values from `vals` instead of taking them as arguments (dropout
   * turns its key back into its salt with vals_step, the step it was written for). */
  cuda_step_vals *vals; /* (1) device */
  int vals_on;
  uint64_t vals_step;
  cuda_step_vals *vals_host[2]; /* pinned, in turns; vals_ev[k] marks the end of its copy */
  cudaEvent_t vals_ev[2];
  int vals_next;
  int capturing; /* the stream is being captured: stage copies nothing */
  /* Gradient buckets: all-reduced on comm_stream after bucket_ready (recorded on `stream`),
   * joined back by bucket_done. */
  cudaStream_t comm_stream;
  cudaEvent_t bucket_ready, bucket_done;
  /* Memory (runtime/cuda/cuda_mem.c): stream-ordered allocations, or where the GPU has no
   * memory pools (no_pool) plain ones kept in `blocks` for reuse until the device stops. */
  int no_pool;
  int shared;                /* another logical device of the context uses the same GPU */
  struct cuda_block *blocks; /* (n_blocks) no_pool: every allocation, live or free */
  size_t n_blocks, cap_blocks;
} cuda_device;

/* The backend state of a device of a CUDA context (dev->be). */
cuda_device *cuda_device_of(pmap_device *dev);

/* Grows dev's workspace (cd->work) to at least `count` floats (stream-ordered). */
pmap_status cuda_work_reserve(pmap_device *dev, size_t count);

typedef enum cuda_lib { CUDA_LIB_RUNTIME = 0, CUDA_LIB_CUBLAS = 1, CUDA_LIB_NCCL = 2 } cuda_lib;

/* Records the failure of `call` (its source text) returning `code` from library `lib` on device
 * cd (NULL: the context as a whole) with the library's own message, file, line and function, and
 * returns the status: PMAP_ERR_OUT_OF_MEMORY for allocation failures, else PMAP_ERR_DEVICE. */
pmap_status cuda_fail(const cuda_device *cd, cuda_lib lib, int code, const char *call,
                      const char *file, int line, const char *func);

/* The one generic check: evaluates expr once, compares it with the library's success value and
 * on failure records the error and runs on_fail (a return or a goto; never an exit). */
#define CUDA_CHECK_GEN(cd, lib, ok, expr, text, on_fail)                             \
  do {                                                                               \
    int cuda_chk_e_ = (int)(expr);                                                   \
    if (cuda_chk_e_ != (int)(ok)) {                                                  \
      pmap_status cuda_chk_s_ =                                                      \
          cuda_fail((cd), (lib), cuda_chk_e_, (text), __FILE__, __LINE__, __func__); \
      on_fail;                                                                       \
    }                                                                                \
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
