/* bias_act.cu: dense's bias with the activation after it (ops/op_list.h bias_act_forward, one
 * kernel), and the activation's backward with the bias gradient (act_bias_backward: the
 * activation's kernel, then bias_backward's column sums). */
#include "cuda_common.cuh"

static __global__ void bias_act_forward_kernel(int act, float *y, const float *b, size_t n,
                                               int64_t ch, float *z) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    float v = y[i] + b[i % (size_t)ch];
    y[i] = v;
    z[i] = pmap_act_apply(act, v);
  }
}

static void bias_act_forward_launch(cudaStream_t stream, int act, float *y, const float *b,
                                    size_t n, int64_t ch, float *z) {
  bias_act_forward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(act, y, b, n, ch, z);
}

extern "C" pmap_status cuda_bias_act_forward(op_queue *q, pmap_act act, float *y, const float *b,
                                             int64_t outer, int64_t ch, float *z) {
  size_t n = (size_t)(outer * ch);
  if (n == 0) return PMAP_SUCCESS;
  bias_act_forward_launch(q->stream, (int)act, y, b, n, ch, z);
  CUDA_CHECK_LAUNCH(q, "bias_act_forward_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_act_bias_backward(op_queue *q, pmap_act act, const float *x,
                                              const float *z, const float *dz, float *dx, float *db,
                                              int64_t outer, int64_t ch) {
  pmap_status st = cuda_act_backward(q, act, x, z, dz, dx, (size_t)(outer * ch));
  if (st) return st;
  return cuda_bias_backward(q, dx, db, outer, ch, 1);
}
