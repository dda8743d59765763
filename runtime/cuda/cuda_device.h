/* cuda_device.h: the CUDA backend's per-device state (runtime/cuda). The kernels (ops/cuda) do
 * not see it: they run on a queue of their own made from this device's stream and BLAS handle. */
#ifndef PMAP_CUDA_DEVICE_H
#define PMAP_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/cuda_check.h"
#include "pmap.h"

/* Device scratch per device: one float for the start-up barrier. */
#define CUDA_SCRATCH_BYTES ((size_t)256)
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

typedef struct cuda_device {
  cuda_where where;      /* index: the logical device, also its NCCL rank; gpu: the physical one */
  cudaStream_t stream;   /* every kernel, copy and collective of this device, in order */
  cublasHandle_t blas;   /* bound to `stream`, with its own workspace */
  void *blas_ws;         /* (CUDA_BLAS_WORKSPACE_BYTES) */
  ncclComm_t comm;       /* rank `index`; owned by the context (runtime/cuda/cuda_ctx.c) */
  ncclComm_t graph_comm; /* its blocking rank for captured steps; NULL: none (cuda_comm_of) */
  void *scratch;         /* (CUDA_SCRATCH_BYTES) */
  cuda_stage stage[2];
  cudaEvent_t done; /* blocking-sync event: what a wait sleeps on (runtime/cuda/cuda_coll.c) */
  /* The trace's marks (cuda_backend.c cuda_mark): timing events recorded on `stream`, n_marks
   * of them in the current job, and the one that ends them when their times are read. */
  cudaEvent_t *marks, mark_end;
  int n_marks, cap_marks;
  /* Two pinned host buffers (of the context's pinned_bytes) that input rows pass through on
   * their way to `stage`, used in turns; ev[k] marks the end of the last copy out of buf[k]. */
  void *pinned[2];
  cudaEvent_t pinned_ev[2];
  int pinned_next;
  void *down;          /* (CUDA_DOWN_BYTES) pinned */
  uint64_t *alloc_gen; /* the context's allocation count (atomic builtins): a captured graph
                          names buffers, so any allocation makes the next step capture anew */
  int capturing;       /* the stream is being captured: stage copies nothing */
  /* Gradient buckets: all-reduced on comm_stream after bucket_ready (recorded on `stream`),
   * joined back by bucket_done. */
  cudaStream_t comm_stream;
  cudaEvent_t bucket_ready, bucket_done;
  /* Memory (runtime/cuda/cuda_mem.c): stream-ordered allocations, from `pool` (the device's own,
   * where it shares its GPU) or else the GPU's default pool; or where the GPU has no memory
   * pools (no_pool) plain ones kept in `blocks` for reuse until the device stops. */
  int no_pool;
  cudaMemPool_t pool;        /* NULL: the GPU's default pool */
  int shared;                /* another logical device of the context uses the same GPU */
  struct cuda_block *blocks; /* (n_blocks) no_pool: every allocation, live or free */
  size_t n_blocks, cap_blocks;
} cuda_device;

/* The backend state of a device of a CUDA context (dev->be). */
cuda_device *cuda_device_of(pmap_device *dev);

#endif
