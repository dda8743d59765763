/* fill.cu: x[i] = value (ops/ops.h fill); zero is a memset on the stream. */
#include "cuda_common.cuh"

static __global__ void fill_kernel(float *x, float value, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) x[i] = value;
}

static void fill_launch(cudaStream_t stream, float *x, float value, size_t n) {
  fill_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(x, value, n);
}

extern "C" pmap_status cuda_fill(pmap_device *dev, float *x, float value, size_t n) {
  cuda_device *cd = cuda_device_of(dev);
  if (n == 0) return PMAP_SUCCESS;
  if (value == 0.0f) {
    CUDA_CHECK(cd, cudaMemsetAsync(x, 0, n * sizeof *x, cd->stream));
    return PMAP_SUCCESS;
  }
  fill_launch(cd->stream, x, value, n);
  CUDA_CHECK_LAUNCH(cd, "fill_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_fill_preload(cuda_device *cd) {
  CUDA_PRELOAD(cd, fill_kernel);
  return PMAP_SUCCESS;
}
