/* loss_reduce.cu: the second pass of the loss reductions of mse.cu and softmax_xent.cu: one
 * block adds the per-block partial sums in a fixed order and writes the mean as the loss. */
#include "cuda_common.cuh"

static __global__ void loss_finalize_kernel(const double *partial, unsigned blocks, double denom,
                                            float *loss) {
  double v = threadIdx.x < blocks ? partial[threadIdx.x] : 0.0;
  v = cuda_block_sum(v);
  if (threadIdx.x == 0) *loss = (float)(v / denom);
}

static void loss_finalize_launch(cudaStream_t stream, const double *partial, unsigned blocks,
                                 double denom, float *loss) {
  loss_finalize_kernel<<<1, CUDA_REDUCE_BLOCKS, 0, stream>>>(partial, blocks, denom, loss);
}

extern "C" pmap_status cuda_loss_finalize(op_queue *q, const double *partial, unsigned blocks,
                                          double denom, float *loss) {
  loss_finalize_launch(q->stream, partial, blocks, denom, loss);
  CUDA_CHECK_LAUNCH(q, "loss_finalize_kernel");
  return PMAP_SUCCESS;
}
