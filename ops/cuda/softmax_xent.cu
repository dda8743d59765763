/* softmax_xent.cu: softmax cross-entropy over rows of logits (ops/ops.h softmax_xent): a thread
 * per row runs pmap_xent_row (ops/op_math.h, the CPU's formula); the loss
 * terms are summed in double per block, then once more in loss_reduce.cu. */
#include "cuda_common.cuh"

static __global__ void softmax_xent_kernel(const float *logits, const int32_t *labels, int64_t rows,
                                           int64_t k, float scale, float *dlogits,
                                           double *partial) {
  double acc = 0.0;
  for (size_t r = cuda_thread_index(); r < (size_t)rows; r += cuda_grid_stride()) {
    acc += pmap_xent_row(logits + (int64_t)r * k, labels[r], k, scale, dlogits + (int64_t)r * k);
  }
  acc = cuda_block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

static void softmax_xent_launch(cudaStream_t stream, unsigned blocks, const float *logits,
                                const int32_t *labels, int64_t rows, int64_t k, float scale,
                                float *dlogits, double *partial) {
  softmax_xent_kernel<<<blocks, CUDA_BLOCK, 0, stream>>>(logits, labels, rows, k, scale, dlogits,
                                                         partial);
}

extern "C" pmap_status cuda_softmax_xent(op_queue *q, const float *logits, const int32_t *labels,
                                         int64_t rows, int64_t k, float *dlogits, float *loss) {
  if (rows <= 0 || k <= 0) return cuda_fill(q, loss, 0.0f, 1);
  unsigned blocks = cuda_grid((size_t)rows);
  if (blocks > CUDA_REDUCE_BLOCKS) blocks = CUDA_REDUCE_BLOCKS;
  double *partial = (double *)q->scratch;
  softmax_xent_launch(q->stream, blocks, logits, labels, rows, k, 1.0f / (float)rows, dlogits,
                      partial);
  CUDA_CHECK_LAUNCH(q, "softmax_xent_kernel");
  return cuda_loss_finalize(q, partial, blocks, (double)rows, loss);
}
