/* cuda_queue.h: a device's op queue on CUDA (ops/ops.h op_queue): what the kernels of ops/cuda
 * need of their device (its stream and BLAS handle, made by the CUDA backend, and scratch of
 * their own) and the fast steps' values. Usable from C and CUDA C++. */
#ifndef PMAP_CUDA_QUEUE_H
#define PMAP_CUDA_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#include "base/cuda_check.h"
#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Blocks of the first pass of a loss reduction; its partial sums (doubles) sit in the scratch. */
#define CUDA_REDUCE_BLOCKS 256
/* Scratch per queue: the reduction partials. */
#define CUDA_SCRATCH_BYTES (CUDA_REDUCE_BLOCKS * sizeof(double))

/* The values of a step that change from step to step, in device memory, for the fast steps
 * (models/step_fast.c): step_values writes hyper and step before each step (stream-ordered,
 * outside any captured graph); decide writes scale and skip. */
typedef struct cuda_step_vals {
  pmap_step_hyper hyper; /* the optimizer's settings after the schedule */
  uint64_t step;         /* keys dropout's masks */
  float scale;           /* the gradients' clipping scale (1: none) */
  int skip;              /* 1: the numeric guard skips the step: the optimizer changes nothing */
} cuda_step_vals;

struct op_queue {
  cuda_where where;    /* the device, for messages (first: the checks of cuda_check.h name it) */
  cudaStream_t stream; /* the device's: every op is queued there, in order */
  cublasHandle_t blas; /* the device's, bound to stream */
  op_queue_init init;  /* the device's allocator (for scratch and work) */
  void *scratch;       /* (CUDA_SCRATCH_BYTES) */
  float *work;         /* (work_cap floats) op workspace, e.g. batched im2col columns */
  size_t work_cap;
  /* Fast steps. While vals_on, the optimizer, copy, clipping and dropout kernels read this step's
   * values from `vals` instead of taking them as arguments (dropout turns its key back into its
   * salt with vals_step, the step it was written for). */
  cuda_step_vals *vals; /* (1) device */
  int vals_on;
  uint64_t vals_step;
};

/* Grows q's workspace (q->work) to at least `count` floats (stream-ordered). */
pmap_status cuda_work_reserve(op_queue *q, size_t count);

#ifdef __cplusplus
}
#endif
#endif
