/* adam.cu: the fused Adam step over the flat parameter buffer (ops/ops.h adam_step), with the
 * bias-corrected update of ops/op_math.h. */
#include "cuda_common.cuh"

static __global__ void adam_step_kernel(float *w, const float *g, float *m, float *v, size_t n,
                                        float lr, float beta1, float beta2, float eps, float bc1,
                                        float bc2) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    float wi = w[i], mi = m[i], vi = v[i];
    pmap_adam_update(&wi, g[i], &mi, &vi, lr, beta1, beta2, eps, bc1, bc2);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
  }
}

static void adam_step_launch(cudaStream_t stream, float *w, const float *g, float *m, float *v,
                             size_t n, float lr, float beta1, float beta2, float eps, float bc1,
                             float bc2) {
  adam_step_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(w, g, m, v, n, lr, beta1, beta2, eps,
                                                            bc1, bc2);
}

extern "C" pmap_status cuda_adam_step(pmap_device *dev, float *w, const float *g, float *m,
                                      float *v, size_t n, float lr, float beta1, float beta2,
                                      float eps, float bc1, float bc2) {
  cuda_device *cd = cuda_device_of(dev);
  if (n == 0) return PMAP_SUCCESS;
  adam_step_launch(cd->stream, w, g, m, v, n, lr, beta1, beta2, eps, bc1, bc2);
  CUDA_CHECK_LAUNCH(cd, "adam_step_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_adam_preload(cuda_device *cd) {
  CUDA_PRELOAD(cd, adam_step_kernel);
  return PMAP_SUCCESS;
}
