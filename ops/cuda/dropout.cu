/* dropout.cu: inverted dropout (ops/ops.h dropout_*) with the counter-based mask of
 * ops/op_math.h: the mask of an element is a function of (key, global index) only, the same as
 * the CPU kernel's on any device count. */
#include "cuda_common.cuh"

/* vals non-NULL (a fast step): `key` is the layer's salt, and the key is rebuilt from the step
 * number in vals, so a captured step draws new masks each step. */
static __global__ void dropout_kernel(const float *x, float *y, size_t n, float rate, uint64_t key,
                                      uint64_t first, const cuda_step_vals *vals) {
  if (vals) key = pmap_dropout_key(vals->step, key);
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride())
    y[i] = x[i] * pmap_dropout_factor(key, first + i, rate);
}

static void dropout_launch(const op_queue *q, const float *x, float *y, size_t n, float rate,
                           uint64_t key, uint64_t first) {
  const cuda_step_vals *vals = cuda_vals_of(q);
  if (vals) key = pmap_dropout_salt(key, q->vals_step);
  dropout_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, q->stream>>>(x, y, n, rate, key, first, vals);
}

extern "C" pmap_status cuda_dropout_forward(op_queue *q, const float *x, float *y, size_t n,
                                            float rate, uint64_t key, uint64_t first) {
  if (n == 0) return PMAP_SUCCESS;
  dropout_launch(q, x, y, n, rate, key, first);
  CUDA_CHECK_LAUNCH(q, "dropout_kernel");
  return PMAP_SUCCESS;
}

/* The backward applies the same mask to dy. */
extern "C" pmap_status cuda_dropout_backward(op_queue *q, const float *dy, float *dx, size_t n,
                                             float rate, uint64_t key, uint64_t first) {
  if (n == 0) return PMAP_SUCCESS;
  dropout_launch(q, dy, dx, n, rate, key, first);
  CUDA_CHECK_LAUNCH(q, "dropout_kernel");
  return PMAP_SUCCESS;
}
