/* copy.cu: y = x on the device's stream (ops/ops.h copy). In a fast step it reads the step's
 * values and leaves y alone once the device-side guard decided to skip the step, as the
 * optimizer kernels do; before the verdict the values say "not skipped". */
#include "cuda_common.cuh"

static __global__ void copy_kernel(const float *x, float *y, size_t n, const cuda_step_vals *vals) {
  if (vals && vals->skip) return;
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) y[i] = x[i];
}

extern "C" pmap_status cuda_copy(op_queue *q, const float *x, float *y, size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  const cuda_step_vals *vals = cuda_vals_of(q);
  if (!vals) {
    CUDA_CHECK(q, cudaMemcpyAsync(y, x, n * sizeof *y, cudaMemcpyDeviceToDevice, q->stream));
    return PMAP_SUCCESS;
  }
  copy_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, q->stream>>>(x, y, n, vals);
  CUDA_CHECK_LAUNCH(q, "copy_kernel");
  return PMAP_SUCCESS;
}
