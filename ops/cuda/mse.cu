/* mse.cu: mean squared error (ops/ops.h mse): dpred = 2/n (pred - t) and the loss
 * 1/n sum (pred - t)^2, summed in double like the CPU reference and written to device memory
 * (the loss slot after the gradients, so that one all-reduce averages both). */
#include "cuda_common.cuh"

static __global__ void mse_kernel(const float *pred, const float *t, size_t n, float scale,
                                  float *dpred, double *partial) {
  double acc = 0.0;
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    float p = pred[i], ti = t[i];
    acc += (double)pmap_mse_term(p, ti);
    dpred[i] = pmap_mse_grad(p, ti, scale);
  }
  acc = cuda_block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

static void mse_launch(cudaStream_t stream, unsigned blocks, const float *pred, const float *t,
                       size_t n, float scale, float *dpred, double *partial) {
  mse_kernel<<<blocks, CUDA_BLOCK, 0, stream>>>(pred, t, n, scale, dpred, partial);
}

extern "C" pmap_status cuda_mse(op_queue *q, const float *pred, const float *t, size_t n,
                                float *dpred, float *loss) {
  if (n == 0) return cuda_fill(q, loss, 0.0f, 1);
  unsigned blocks = cuda_grid(n);
  if (blocks > CUDA_REDUCE_BLOCKS) blocks = CUDA_REDUCE_BLOCKS;
  double *partial = (double *)q->scratch;
  mse_launch(q->stream, blocks, pred, t, n, 2.0f / (float)n, dpred, partial);
  CUDA_CHECK_LAUNCH(q, "mse_kernel");
  return cuda_loss_finalize(q, partial, blocks, (double)n, loss);
}
