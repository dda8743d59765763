/* bias.cu: per-channel bias (ops/ops.h bias_*): y (outer, ch, inner) += b broadcast, and the
 * backward db (ch) += the sum of dy over outer and inner. Sums run in a fixed order (no atomics),
 * so the gradient is the same on every run. */
#include "cuda_common.cuh"

/* With at least this many channels a thread per channel has enough threads to fill the GPU. */
#define BIAS_THREAD_PER_CHANNEL 256

static __global__ void bias_forward_kernel(float *y, const float *b, int64_t ch, int64_t inner,
                                           size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride())
    y[i] += b[(int64_t)(i / (size_t)inner) % ch];
}

/* inner == 1 with many channels (dense): thread c walks down column c of dy (outer, ch); the
 * threads of a warp read neighbouring addresses. */
static __global__ void bias_backward_column_kernel(const float *dy, float *db, int64_t outer,
                                                   int64_t ch) {
  for (size_t c = cuda_thread_index(); c < (size_t)ch; c += cuda_grid_stride()) {
    float s = 0.0f;
    for (int64_t o = 0; o < outer; o++) s += dy[o * ch + (int64_t)c];
    db[c] += s;
  }
}

/* Otherwise block c sums channel c over (outer, inner). */
static __global__ void bias_backward_channel_kernel(const float *dy, float *db, int64_t outer,
                                                    int64_t ch, int64_t inner) {
  int64_t c = blockIdx.x, total = outer * inner;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < total; j += blockDim.x) {
    int64_t o = j / inner, i = j - o * inner;
    s += dy[(o * ch + c) * inner + i];
  }
  s = cuda_block_sum(s);
  if (threadIdx.x == 0) db[c] += s;
}

static void bias_forward_launch(cudaStream_t stream, float *y, const float *b, int64_t outer,
                                int64_t ch, int64_t inner) {
  size_t n = (size_t)(outer * ch * inner);
  bias_forward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(y, b, ch, inner, n);
}

static const char *bias_backward_launch(cudaStream_t stream, const float *dy, float *db,
                                        int64_t outer, int64_t ch, int64_t inner) {
  if (inner == 1 && ch >= BIAS_THREAD_PER_CHANNEL) {
    bias_backward_column_kernel<<<cuda_grid((size_t)ch), CUDA_BLOCK, 0, stream>>>(dy, db, outer,
                                                                                  ch);
    return "bias_backward_column_kernel";
  }
  bias_backward_channel_kernel<<<(unsigned)ch, CUDA_BLOCK, 0, stream>>>(dy, db, outer, ch, inner);
  return "bias_backward_channel_kernel";
}

extern "C" pmap_status cuda_bias_forward(op_queue *q, float *y, const float *b, int64_t outer,
                                         int64_t ch, int64_t inner) {
  if (outer <= 0 || ch <= 0 || inner <= 0) return PMAP_SUCCESS;
  bias_forward_launch(q->stream, y, b, outer, ch, inner);
  CUDA_CHECK_LAUNCH(q, "bias_forward_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_bias_backward(op_queue *q, const float *dy, float *db, int64_t outer,
                                          int64_t ch, int64_t inner) {
  if (outer <= 0 || ch <= 0 || inner <= 0) return PMAP_SUCCESS;
  if (ch > INT32_MAX)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "device %d: bias_backward with %lld channels",
                    q->where.index, (long long)ch);
  const char *kernel = bias_backward_launch(q->stream, dy, db, outer, ch, inner);
  CUDA_CHECK_GEN(q, CUDA_LIB_RUNTIME, cudaSuccess, cudaGetLastError(), kernel, return cuda_chk_s_);
  return PMAP_SUCCESS;
}
