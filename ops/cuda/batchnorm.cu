/* batchnorm.cu: batch normalisation per channel of x (outer, c, inner) (ops/ops.h bn_*). The
 * per-channel sums take a block per channel with the fixed-order block sum, in double; the
 * element-wise passes take a thread per element. The caller all-reduces stats and sums between
 * the passes for cross-replica batch norm. */
#include "cuda_common.cuh"

/* Block ch: stats[ch] = sum, stats[c + ch] = sum of squares of x - shift, stats[2c + 1 + ch] =
 * shift (prev's mean, or 0); block 0 also writes the count. */
static __global__ void bn_stats_kernel(const float *x, int64_t outer, int64_t c, int64_t inner,
                                       const float *prev, float *stats) {
  int64_t ch = blockIdx.x, total = outer * inner;
  float shift = 0.0f, unused;
  if (prev) pmap_bn_moments(prev, c, ch, &shift, &unused);
  double s = 0.0, ss = 0.0;
  for (int64_t j = threadIdx.x; j < total; j += blockDim.x) {
    int64_t o = j / inner, i = j - o * inner;
    float d = x[(o * c + ch) * inner + i] - shift;
    s += d, ss += (double)d * d;
  }
  s = cuda_block_sum(s);
  __syncthreads();
  ss = cuda_block_sum(ss);
  if (threadIdx.x == 0) {
    stats[ch] = (float)s;
    stats[c + ch] = (float)ss;
    stats[2 * c + 1 + ch] = shift;
    if (ch == 0) stats[2 * c] = (float)total;
  }
}

/* Mean and variance of channel ch: from stats (and run_stats's verdict) in training, from
 * running in inference. */
static __device__ void bn_channel(const float *stats, const float *run_stats, const float *running,
                                  int64_t c, int64_t ch, int training, float *mean, float *var) {
  if (training) {
    pmap_bn_train_moments(stats, run_stats, c, ch, mean, var);
  } else {
    *mean = running[ch];
    *var = running[c + ch];
  }
}

static __global__ void bn_forward_kernel(const float *x, const float *stats, const float *run_stats,
                                         const float *running, const float *gamma,
                                         const float *beta, int64_t c, int64_t inner, float eps,
                                         int training, float *y, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    int64_t ch = (int64_t)(i / (size_t)inner % (size_t)c);
    float mean, var;
    bn_channel(stats, run_stats, running, c, ch, training, &mean, &var);
    y[i] = (x[i] - mean) * pmap_rstd(var, eps) * gamma[ch] + beta[ch];
  }
}

static __global__ void bn_running_kernel(const float *run_stats, float *running, int64_t c,
                                         float momentum) {
  for (size_t ch = cuda_thread_index(); ch < (size_t)c; ch += cuda_grid_stride()) {
    float mean, var;
    pmap_bn_moments(run_stats, c, (int64_t)ch, &mean, &var);
    pmap_running_update(&running[ch], &running[c + ch], mean, var, momentum);
  }
}

/* Block ch: sums[ch] = sum of dy, sums[c + ch] = sum of dy xhat. */
static __global__ void bn_sums_kernel(const float *x, const float *dy, const float *stats,
                                      int64_t outer, int64_t c, int64_t inner, float eps,
                                      float *sums) {
  int64_t ch = blockIdx.x, total = outer * inner;
  float mean, var;
  pmap_bn_moments(stats, c, ch, &mean, &var);
  float rstd = pmap_rstd(var, eps);
  double s = 0.0, sx = 0.0;
  for (int64_t j = threadIdx.x; j < total; j += blockDim.x) {
    int64_t o = j / inner, i = j - o * inner, at = (o * c + ch) * inner + i;
    s += dy[at], sx += (double)dy[at] * ((x[at] - mean) * rstd);
  }
  s = cuda_block_sum(s);
  __syncthreads();
  sx = cuda_block_sum(sx);
  if (threadIdx.x == 0) {
    sums[ch] = (float)s;
    sums[c + ch] = (float)sx;
  }
}

static __global__ void bn_dx_kernel(const float *x, const float *dy, const float *stats,
                                    const float *gamma, const float *sums, int64_t c, int64_t inner,
                                    float eps, float *dx, size_t n) {
  float count = stats[2 * c];
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    int64_t ch = (int64_t)(i / (size_t)inner % (size_t)c);
    float mean, var;
    pmap_bn_moments(stats, c, ch, &mean, &var);
    float rstd = pmap_rstd(var, eps);
    dx[i] = pmap_norm_dx(dy[i], (x[i] - mean) * rstd, gamma[ch] * rstd, sums[ch] / count,
                         sums[c + ch] / count);
  }
}

static void bn_stats_launch(cudaStream_t stream, const float *x, int64_t outer, int64_t c,
                            int64_t inner, const float *prev, float *stats) {
  bn_stats_kernel<<<(unsigned)c, CUDA_BLOCK, 0, stream>>>(x, outer, c, inner, prev, stats);
}

static void bn_forward_launch(cudaStream_t stream, const float *x, const float *stats,
                              const float *run_stats, float *running, const float *gamma,
                              const float *beta, int64_t outer, int64_t c, int64_t inner, float eps,
                              float momentum, int training, float *y) {
  size_t n = (size_t)(outer * c * inner);
  bn_forward_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(x, stats, run_stats, running, gamma,
                                                             beta, c, inner, eps, training, y, n);
  /* After the normalisation on the same stream: inference reads running, training updates it. */
  if (training && running)
    bn_running_kernel<<<cuda_grid((size_t)c), CUDA_BLOCK, 0, stream>>>(run_stats, running, c,
                                                                       momentum);
}

static void bn_sums_launch(cudaStream_t stream, const float *x, const float *dy, const float *stats,
                           int64_t outer, int64_t c, int64_t inner, float eps, float *sums) {
  bn_sums_kernel<<<(unsigned)c, CUDA_BLOCK, 0, stream>>>(x, dy, stats, outer, c, inner, eps, sums);
}

static void bn_dx_launch(cudaStream_t stream, const float *x, const float *dy, const float *stats,
                         const float *gamma, const float *sums, int64_t outer, int64_t c,
                         int64_t inner, float eps, float *dx) {
  size_t n = (size_t)(outer * c * inner);
  bn_dx_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, stream>>>(x, dy, stats, gamma, sums, c, inner, eps,
                                                        dx, n);
}

/* Channels are blocks: at most the grid's x extent. */
static pmap_status check_channels(op_queue *q, int64_t c) {
  if (c > INT32_MAX)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "device %d: batch norm over %lld channels",
                    q->where.index, (long long)c);
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_bn_stats(op_queue *q, const float *x, int64_t outer, int64_t c,
                                     int64_t inner, const float *prev, float *stats) {
  if (c <= 0) return PMAP_SUCCESS;
  PMAP_TRY(check_channels(q, c));
  bn_stats_launch(q->stream, x, outer, c, inner, prev, stats);
  CUDA_CHECK_LAUNCH(q, "bn_stats_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_bn_forward(op_queue *q, const float *x, const float *stats,
                                       const float *run_stats, float *running, const float *gamma,
                                       const float *beta, int64_t outer, int64_t c, int64_t inner,
                                       float eps, float momentum, int training, float *y) {
  if (outer <= 0 || c <= 0 || inner <= 0) return PMAP_SUCCESS;
  bn_forward_launch(q->stream, x, stats, run_stats, running, gamma, beta, outer, c, inner, eps,
                    momentum, training, y);
  CUDA_CHECK_LAUNCH(q, "bn_forward_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_bn_backward_sums(op_queue *q, const float *x, const float *dy,
                                             const float *stats, int64_t outer, int64_t c,
                                             int64_t inner, float eps, float *sums) {
  if (c <= 0) return PMAP_SUCCESS;
  PMAP_TRY(check_channels(q, c));
  bn_sums_launch(q->stream, x, dy, stats, outer, c, inner, eps, sums);
  CUDA_CHECK_LAUNCH(q, "bn_sums_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_bn_backward_dx(op_queue *q, const float *x, const float *dy,
                                           const float *stats, const float *gamma,
                                           const float *sums, int64_t outer, int64_t c,
                                           int64_t inner, float eps, float *dx) {
  if (outer <= 0 || c <= 0 || inner <= 0) return PMAP_SUCCESS;
  bn_dx_launch(q->stream, x, dy, stats, gamma, sums, outer, c, inner, eps, dx);
  CUDA_CHECK_LAUNCH(q, "bn_dx_kernel");
  return PMAP_SUCCESS;
}
