/* fill.cu: x[i] = value (ops/ops.h fill); zero is a memset on the stream. */
#include "cuda_common.cuh"

static __global__ void fill_kernel(float *x, float value, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) x[i] = value;
}

static void fill_launch(cudaStream_t stream, float *x, float value, size_t n) {
  fill_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(x, value, n);
}

extern "C" pmap_status cuda_fill(op_queue *q, float *x, float value, size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  if (value == 0.0f) {
    CUDA_CHECK(q, cudaMemsetAsync(x, 0, n * sizeof *x, q->stream));
    return PMAP_SUCCESS;
  }
  fill_launch(q->stream, x, value, n);
  CUDA_CHECK_LAUNCH(q, "fill_kernel");
  return PMAP_SUCCESS;
}
