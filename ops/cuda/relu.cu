/* relu.cu: y = max(x, 0) and its backward dx = dy where y > 0 (ops/ops.h relu_*), with the
 * formulas of ops/op_math.h. Both may run in place. */
#include "cuda_common.cuh"

static __global__ void relu_forward_kernel(const float *x, float *y, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) y[i] = pmap_relu(x[i]);
}

static __global__ void relu_backward_kernel(const float *y, const float *dy, float *dx, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride())
    dx[i] = pmap_relu_grad(y[i], dy[i]);
}

static void relu_forward_launch(cudaStream_t stream, const float *x, float *y, size_t n) {
  relu_forward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(x, y, n);
}

static void relu_backward_launch(cudaStream_t stream, const float *y, const float *dy, float *dx,
                                 size_t n) {
  relu_backward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(y, dy, dx, n);
}

extern "C" pmap_status cuda_relu_forward(op_queue *q, const float *x, float *y, size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  relu_forward_launch(q->stream, x, y, n);
  CUDA_CHECK_LAUNCH(q, "relu_forward_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_relu_backward(op_queue *q, const float *y, const float *dy, float *dx,
                                          size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  relu_backward_launch(q->stream, y, dy, dx, n);
  CUDA_CHECK_LAUNCH(q, "relu_backward_kernel");
  return PMAP_SUCCESS;
}
