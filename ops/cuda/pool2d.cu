/* pool2d.cu: max and average pooling over NCHW examples (ops/ops.h pool2d_*). Forward: a thread
 * per output; backward: a thread per input element gathering from the windows that hold it
 * (ops/op_math.h pmap_pool_dx), so overlapping windows need no atomics and the result is
 * deterministic. */
#include "cuda_common.cuh"

static __global__ void pool2d_forward_kernel(int is_max, pmap_pool_shape s, const float *x,
                                             float *y, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    int64_t ox = (int64_t)(i % (size_t)s.ow), oy = (int64_t)(i / (size_t)s.ow % (size_t)s.oh);
    int64_t p = (int64_t)(i / (size_t)(s.ow * s.oh));
    y[i] = pmap_pool_window(is_max, x + p * s.h * s.w, s.w, oy, ox, s.kh, s.kw, s.stride);
  }
}

static __global__ void pool2d_backward_kernel(int is_max, pmap_pool_shape s, const float *x,
                                              const float *dy, float *dx, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    int64_t ix = (int64_t)(i % (size_t)s.w), iy = (int64_t)(i / (size_t)s.w % (size_t)s.h);
    int64_t p = (int64_t)(i / (size_t)(s.w * s.h));
    dx[i] = pmap_pool_dx(is_max, x + p * s.h * s.w, dy + p * s.oh * s.ow, s.w, s.oh, s.ow, s.kh,
                         s.kw, s.stride, iy, ix);
  }
}

static void pool2d_forward_launch(cudaStream_t stream, int is_max, const pmap_pool_shape *s,
                                  const float *x, float *y, size_t n) {
  pool2d_forward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(is_max, *s, x, y, n);
}

static void pool2d_backward_launch(cudaStream_t stream, int is_max, const pmap_pool_shape *s,
                                   const float *x, const float *dy, float *dx, size_t n) {
  pool2d_backward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(is_max, *s, x, dy, dx, n);
}

extern "C" pmap_status cuda_pool2d_forward(op_queue *q, int is_max, const pmap_pool_shape *s,
                                           int64_t bd, const float *x, float *y) {
  size_t n = (size_t)(bd * s->c * s->oh * s->ow);
  if (n == 0) return PMAP_SUCCESS;
  pool2d_forward_launch(q->stream, is_max, s, x, y, n);
  CUDA_CHECK_LAUNCH(q, "pool2d_forward_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_pool2d_backward(op_queue *q, int is_max, const pmap_pool_shape *s,
                                            int64_t bd, const float *x, const float *dy,
                                            float *dx) {
  size_t n = (size_t)(bd * s->c * s->h * s->w);
  if (n == 0) return PMAP_SUCCESS;
  pool2d_backward_launch(q->stream, is_max, s, x, dy, dx, n);
  CUDA_CHECK_LAUNCH(q, "pool2d_backward_kernel");
  return PMAP_SUCCESS;
}
