/* step_vals.cu: the values of a fast step (models/step_fast.c) on the device: this step's
 * optimizer settings and number, written in stream order (cuda_step_values), and the numeric
 * guard's and clipping's decision taken there (cuda_decide): the same tests and the same scale
 * as the host's in models/step.c, written where the scale and optimizer kernels read them, so a
 * captured step needs no host decision. */
#include "cuda_common.cuh"

/* tail: [loss | flags (n) | norm] of the averaged gradient buffer. */
static __global__ void decide_kernel(const float *tail, int n, int check, float clip,
                                     float norm_max, cuda_step_vals *vals) {
  /* The averaged loss and norm: a device's own non-finite value makes them non-finite, and the
   * flags in between only name the devices (models/step_paths.c decides alike). */
  int finite = 1;
  if (check) finite = isfinite(tail[0]) && isfinite(tail[n + 1]) ? 1 : 0;
  float norm = tail[n + 1], scale = 1.0f;
  if (check && pmap_guard_norm_over(norm, clip, norm_max)) finite = 0;
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

extern "C" pmap_status cuda_decide(op_queue *q, float *g, size_t P, const float *tail, int n,
                                   int check, float clip, float norm_max) {
  if (!q->vals_on)
    return PMAP_ERR(PMAP_ERR_INTERNAL, "device %d: a decision outside a fast step", q->where.index);
  decide_kernel<<<1, 1, 0, q->stream>>>(tail, n, check, clip, norm_max, q->vals);
  CUDA_CHECK_LAUNCH(q, "decide_kernel");
  if (clip > 0.0f && P > 0) {
    scale_vals_kernel<<<cuda_grid(P), CUDA_BLOCK, 0, q->stream>>>(g, P, q->vals);
    CUDA_CHECK_LAUNCH(q, "scale_vals_kernel");
  }
  return PMAP_SUCCESS;
}

/* The values as the kernel's argument: copied at the launch, written in stream order, and no
 * host buffer to keep (a pinned one would be a page-locked allocation in the middle of a job,
 * which may synchronize a GPU that several devices share while a collective is in flight). */
static __global__ void set_vals_kernel(cuda_step_vals v, cuda_step_vals *vals) { *vals = v; }

static pmap_status vals_upload(op_queue *q, const cuda_step_vals *v) {
  set_vals_kernel<<<1, 1, 0, q->stream>>>(*v, q->vals);
  CUDA_CHECK_LAUNCH(q, "set_vals_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_step_values(op_queue *q, const pmap_step_hyper *h, int64_t step) {
  if (!h) {
    q->vals_on = 0;
    return PMAP_SUCCESS;
  }
  cuda_step_vals v = {*h, (uint64_t)step, 1.0f, 0};
  PMAP_TRY(vals_upload(q, &v));
  q->vals_step = (uint64_t)step;
  q->vals_on = 1;
  return PMAP_SUCCESS;
}
