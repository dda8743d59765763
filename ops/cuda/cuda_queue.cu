/* cuda_queue.cu: a device's CUDA op queue (cuda_queue.h): made on the device's thread from its
 * stream and BLAS handle, with its scratch and the fast steps' values allocated through the
 * device's allocator (device memory alone: page-locked host memory is the backend's, made when
 * the device starts), after a check that the GPU can run pmap's kernels. */
#include <stdlib.h>

#include "cuda_ops.h"

/* Never launched. Every .cu file of ops/cuda is compiled for the same GPUs, so whether this
 * kernel has code for the device answers for all of them. (Where logical devices share a GPU,
 * the backend has every module loaded when CUDA starts: runtime/cuda/cuda_ctx.c.) */
static __global__ void queue_probe_kernel() {}

extern "C" void cuda_queue_destroy(op_queue *q) {
  if (!q) return; /* the caller waited for the queued work (op_backend.queue_destroy) */
  if (q->work) q->init.free(q->init.owner, q->work);
  if (q->scratch) q->init.free(q->init.owner, q->scratch);
  if (q->vals) q->init.free(q->init.owner, q->vals);
  free(q);
}

extern "C" pmap_status cuda_queue_create(const op_queue_init *init, op_queue **out) {
  op_queue *q = (op_queue *)calloc(1, sizeof *q);
  if (!q)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "device %d: out of memory for its op queue",
                    init->device);
  q->where.index = init->device;
  q->where.gpu = -1;
  q->stream = (cudaStream_t)init->stream;
  q->blas = (cublasHandle_t)init->blas;
  q->init = *init;
  pmap_status st = PMAP_SUCCESS;
  void *p = NULL;
  CUDA_CHECK_GOTO(q, st, cudaGetDevice(&q->where.gpu), fail);
  PMAP_TRY_GOTO(st, init->alloc(init->owner, CUDA_SCRATCH_BYTES, &p), fail);
  q->scratch = p;
  PMAP_TRY_GOTO(st, init->alloc(init->owner, sizeof(cuda_step_vals), &p), fail);
  q->vals = (cuda_step_vals *)p;
  /* No page-locked memory here: a queue is made inside a job, where another device may already
   * have issued a collective (the step's values go as a kernel's argument, step_vals.cu). */
  /* A GPU without code for the kernels fails here, with CUDA's message, not at the first op. */
  cudaFuncAttributes attr;
  CUDA_CHECK_GOTO(q, st, cudaFuncGetAttributes(&attr, queue_probe_kernel), fail);
  *out = q;
  return PMAP_SUCCESS;
fail:
  cuda_queue_destroy(q);
  return st;
}

extern "C" pmap_status cuda_work_reserve(op_queue *q, size_t count) {
  if (count <= q->work_cap) return PMAP_SUCCESS;
  if (q->work) q->init.free(q->init.owner, q->work);
  q->work = NULL;
  q->work_cap = 0;
  void *p = NULL;
  PMAP_TRY(q->init.alloc(q->init.owner, count * sizeof(float), &p));
  q->work = (float *)p;
  q->work_cap = count;
  return PMAP_SUCCESS;
}
