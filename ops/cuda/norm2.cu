/* norm2.cu: the L2 norm of a device array (ops/ops.h norm2), summed in double in a fixed order
 * (per-block partial sums, then one block adds them), for the numeric guard and gradient
 * clipping; the in-place scale that clipping applies, and axpy (micro-batch loss sums). */
#include "cuda_common.cuh"

static __global__ void norm2_kernel(const float *x, size_t n, double *partial) {
  double acc = 0.0;
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride())
    acc += (double)x[i] * (double)x[i];
  acc = cuda_block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

static __global__ void norm2_finalize_kernel(const double *partial, unsigned blocks, float *norm) {
  double v = threadIdx.x < blocks ? partial[threadIdx.x] : 0.0;
  v = cuda_block_sum(v);
  if (threadIdx.x == 0) *norm = (float)sqrt(v);
}

static void norm2_launch(cudaStream_t stream, unsigned blocks, const float *x, size_t n,
                         double *partial, float *norm) {
  norm2_kernel<<<blocks, CUDA_BLOCK, 0, stream>>>(x, n, partial);
  norm2_finalize_kernel<<<1, CUDA_REDUCE_BLOCKS, 0, stream>>>(partial, blocks, norm);
}

extern "C" pmap_status cuda_norm2(op_queue *q, const float *x, size_t n, float *norm) {
  if (n == 0) return cuda_fill(q, norm, 0.0f, 1);
  unsigned blocks = cuda_grid(n);
  if (blocks > CUDA_REDUCE_BLOCKS) blocks = CUDA_REDUCE_BLOCKS;
  norm2_launch(q->stream, blocks, x, n, (double *)q->scratch, norm);
  CUDA_CHECK_LAUNCH(q, "norm2_kernel");
  return PMAP_SUCCESS;
}

static __global__ void scale_kernel(float *x, float s, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) x[i] *= s;
}

extern "C" pmap_status cuda_scale(op_queue *q, float *x, float s, size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  scale_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, q->stream>>>(x, s, n);
  CUDA_CHECK_LAUNCH(q, "scale_kernel");
  return PMAP_SUCCESS;
}

static __global__ void axpy_kernel(float alpha, const float *x, float *y, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) y[i] += alpha * x[i];
}

extern "C" pmap_status cuda_axpy(op_queue *q, float alpha, const float *x, float *y, size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  axpy_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, q->stream>>>(alpha, x, y, n);
  CUDA_CHECK_LAUNCH(q, "axpy_kernel");
  return PMAP_SUCCESS;
}
