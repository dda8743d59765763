/* step_vals.cu: the numeric guard and gradient clipping decided on the device for the fast
 * steps (runtime/cuda/cuda_graph.c): the same tests and the same scale as the host's in
 * models/step.c, written to the step's values (cuda_step_vals) where the scale and optimizer
 * kernels read them, so a captured step needs no host decision. */
#include "cuda_common.cuh"

/* tail: [loss | flags (n) | norm] of the averaged gradient buffer. */
static __global__ void guard_clip_kernel(const float *tail, int n, int guard, float clip,
                                         cuda_step_vals *vals) {
  int finite = 1;
  if (guard)
    for (int i = 0; i < n + 2; i++) finite &= isfinite(tail[i]) ? 1 : 0;
  float norm = tail[n + 1], scale = 1.0f;
  /* In double, as on the host: clip / norm may underflow float. */
  if (clip > 0.0f && !(norm <= clip)) scale = (float)((double)clip / (double)norm);
  vals->skip = !finite;
  vals->scale = scale;
}

static __global__ void scale_vals_kernel(float *x, size_t n, const cuda_step_vals *vals) {
  float s = vals->scale;
  if (vals->skip || s == 1.0f) return;
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) x[i] *= s;
}

extern "C" pmap_status cuda_guard_clip(cuda_device *cd, float *g, size_t P, const float *tail,
                                       int n, int guard, float clip) {
  guard_clip_kernel<<<1, 1, 0, cd->stream>>>(tail, n, guard, clip, cd->vals);
  CUDA_CHECK_LAUNCH(cd, "guard_clip_kernel");
  if (clip > 0.0f && P > 0) {
    scale_vals_kernel<<<cuda_grid(P), CUDA_BLOCK, 0, cd->stream>>>(g, P, cd->vals);
    CUDA_CHECK_LAUNCH(cd, "scale_vals_kernel");
  }
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_step_vals_preload(cuda_device *cd) {
  CUDA_PRELOAD(cd, guard_clip_kernel);
  CUDA_PRELOAD(cd, scale_vals_kernel);
  return PMAP_SUCCESS;
}
