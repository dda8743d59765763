/* act.cu: the element-wise activations tanh, sigmoid and GELU (ops/ops.h act_*), with the
 * formulas of ops/op_math.h. Both may run in place. */
#include "cuda_common.cuh"

static __global__ void act_forward_kernel(int act, const float *x, float *y, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride())
    y[i] = pmap_act_apply(act, x[i]);
}

static __global__ void act_backward_kernel(int act, const float *x, const float *y, const float *dy,
                                           float *dx, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride())
    dx[i] = pmap_act_grad(act, x[i], y[i], dy[i]);
}

static void act_forward_launch(cudaStream_t stream, int act, const float *x, float *y, size_t n) {
  act_forward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(act, x, y, n);
}

static void act_backward_launch(cudaStream_t stream, int act, const float *x, const float *y,
                                const float *dy, float *dx, size_t n) {
  act_backward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(act, x, y, dy, dx, n);
}

extern "C" pmap_status cuda_act_forward(op_queue *q, pmap_act act, const float *x, float *y,
                                        size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  act_forward_launch(q->stream, (int)act, x, y, n);
  CUDA_CHECK_LAUNCH(q, "act_forward_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_act_backward(op_queue *q, pmap_act act, const float *x, const float *y,
                                         const float *dy, float *dx, size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  act_backward_launch(q->stream, (int)act, x, y, dy, dx, n);
  CUDA_CHECK_LAUNCH(q, "act_backward_kernel");
  return PMAP_SUCCESS;
}
