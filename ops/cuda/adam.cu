/* adam.cu: the fused Adam step over the flat parameter buffer (ops/ops.h adam_step), with the
 * bias-corrected update (and AdamW's decoupled weight decay) of ops/op_math.h, and the bf16
 * copy of the updated weights in the same pass where one is asked for. */
#include "cuda_common.cuh"

/* vals non-NULL (a fast step): the settings come from there, and a skipped step changes
 * nothing. */
static __global__ void adam_step_kernel(float *w, const float *g, float *m, float *v,
                                        pmap_bf16 *w16, size_t n, pmap_step_hyper h,
                                        const cuda_step_vals *vals) {
  if (vals) {
    if (vals->skip) return;
    h = vals->hyper;
  }
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    float wi = w[i], mi = m[i], vi = v[i];
    pmap_adam_update(&wi, g[i], &mi, &vi, h.lr, h.beta1, h.beta2, h.eps, h.bc1, h.bc2,
                     h.weight_decay);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    if (w16) w16[i] = pmap_bf16_round(wi);
  }
}

static void adam_step_launch(cudaStream_t stream, float *w, const float *g, float *m, float *v,
                             pmap_bf16 *w16, size_t n, const pmap_step_hyper *h,
                             const cuda_step_vals *vals) {
  adam_step_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(w, g, m, v, w16, n, *h, vals);
}

extern "C" pmap_status cuda_adam_step(op_queue *q, float *w, const float *g, float *m, float *v,
                                      pmap_bf16 *w16, size_t n, const pmap_step_hyper *h) {
  if (n == 0) return PMAP_SUCCESS;
  adam_step_launch(q->stream, w, g, m, v, w16, n, h, cuda_vals_of(q));
  CUDA_CHECK_LAUNCH(q, "adam_step_kernel");
  return PMAP_SUCCESS;
}
