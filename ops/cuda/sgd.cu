/* sgd.cu: the fused SGD step over the flat parameter buffer (ops/ops.h sgd_step), with the
 * update of ops/op_math.h; the momentum buffer is touched only when momentum != 0; the bf16 copy
 * of the updated weights in the same pass where one is asked for. */
#include "cuda_common.cuh"

/* vals non-NULL (a fast step): the settings come from there, and a skipped step changes
 * nothing. */
static __global__ void sgd_step_kernel(float *w, const float *g, float *v, pmap_bf16 *w16, size_t n,
                                       pmap_step_hyper h, const cuda_step_vals *vals) {
  if (vals) {
    if (vals->skip) return;
    h = vals->hyper;
  }
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    float wi = w[i], vi = h.momentum != 0.0f ? v[i] : 0.0f;
    pmap_sgd_update(&wi, g[i], &vi, h.lr, h.momentum, h.nesterov, h.weight_decay);
    w[i] = wi;
    if (h.momentum != 0.0f) v[i] = vi;
    if (w16) w16[i] = pmap_bf16_round(wi);
  }
}

static void sgd_step_launch(cudaStream_t stream, float *w, const float *g, float *v, pmap_bf16 *w16,
                            size_t n, const pmap_step_hyper *h, const cuda_step_vals *vals) {
  sgd_step_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(w, g, v, w16, n, *h, vals);
}

extern "C" pmap_status cuda_sgd_step(op_queue *q, float *w, const float *g, float *v,
                                     pmap_bf16 *w16, size_t n, const pmap_step_hyper *h) {
  if (n == 0) return PMAP_SUCCESS;
  sgd_step_launch(q->stream, w, g, v, w16, n, h, cuda_vals_of(q));
  CUDA_CHECK_LAUNCH(q, "sgd_step_kernel");
  return PMAP_SUCCESS;
}
