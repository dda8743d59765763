/* bias_act.cu: dense's bias with the activation after it (ops/op_list.h bias_act_forward, one
 * kernel, with the output's bf16 copy where one is asked for), and the activation's backward
 * with the bias gradient (act_bias_backward: the activation's kernel, then bias_backward's
 * column sums, then the bf16 copy). */
#include "cuda_common.cuh"

static __global__ void bias_act_forward_kernel(int act, float *y, const float *b, size_t n,
                                               int64_t ch, float *z, pmap_bf16 *z16, float *slope) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    float v = b ? y[i] + b[i % (size_t)ch] : y[i];
    float zi = pmap_act_apply(act, v);
    if (slope) slope[i] = pmap_gelu_slope(v); /* GELU only (the op's contract) */
    if (slope != y) y[i] = v;
    z[i] = zi;
    if (z16) z16[i] = pmap_bf16_round(zi);
  }
}

static void bias_act_forward_launch(cudaStream_t stream, int act, float *y, const float *b,
                                    size_t n, int64_t ch, float *z, pmap_bf16 *z16, float *slope) {
  bias_act_forward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(act, y, b, n, ch, z, z16, slope);
}

extern "C" pmap_status cuda_bias_act_forward(op_queue *q, pmap_act act, float *y, const float *b,
                                             int64_t outer, int64_t ch, float *z, pmap_bf16 *z16,
                                             float *slope) {
  size_t n = (size_t)(outer * ch);
  if (n == 0) return PMAP_SUCCESS;
  bias_act_forward_launch(q->stream, (int)act, y, b, n, ch, z, z16,
                          act == PMAP_ACT_GELU ? slope : NULL);
  CUDA_CHECK_LAUNCH(q, "bias_act_forward_kernel");
  return PMAP_SUCCESS;
}

/* dx = slope dz, the kept GELU slope's product. */
static __global__ void slope_mul_kernel(const float *slope, const float *dz, float *dx, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) dx[i] = slope[i] * dz[i];
}

extern "C" pmap_status cuda_act_bias_backward(op_queue *q, pmap_act act, const float *x,
                                              const float *z, const float *dz, float *dx, float *db,
                                              int64_t outer, int64_t ch, pmap_bf16 *dx16,
                                              const float *slope) {
  size_t n = (size_t)(outer * ch);
  pmap_status st = PMAP_SUCCESS;
  if (slope && act == PMAP_ACT_GELU) {
    if (n) {
      slope_mul_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, q->stream>>>(slope, dz, dx, n);
      CUDA_CHECK_LAUNCH(q, "slope_mul_kernel");
    }
  } else {
    st = cuda_act_backward(q, act, x, z, dz, dx, n);
  }
  if (!st) st = cuda_bias_backward(q, dx, db, outer, ch, 1);
  if (!st && dx16) st = cuda_round_bf16(q, dx, dx16, NULL, n);
  return st;
}
