/* layernorm.cu: layer normalisation of rows (ops/ops.h layernorm_*). A block per row computes
 * the row's moments with the fixed-order block sum; dgamma and dbeta take a thread per feature
 * walking down the rows, so every sum runs in a fixed order (no atomics). */
#include "cuda_common.cuh"

static __global__ void layernorm_forward_kernel(const float *x, const float *gamma,
                                                const float *beta, int64_t f, float eps, float *y,
                                                float *stats, pmap_bf16 *y16) {
  __shared__ float moments[2];
  int64_t r = blockIdx.x;
  const float *xr = x + r * f;
  double s = 0.0, ss = 0.0;
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x) s += xr[j], ss += (double)xr[j] * xr[j];
  s = cuda_block_sum(s);
  __syncthreads();
  ss = cuda_block_sum(ss);
  if (threadIdx.x == 0) {
    pmap_ln_moments(s, ss, (double)f, eps, &moments[0], &moments[1]);
    stats[2 * r] = moments[0];
    stats[2 * r + 1] = moments[1];
  }
  __syncthreads();
  float mean = moments[0], rstd = moments[1];
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x) {
    float v = (xr[j] - mean) * rstd * gamma[j] + beta[j];
    y[r * f + j] = v;
    if (y16) y16[r * f + j] = pmap_bf16_round(v);
  }
}

static __global__ void layernorm_dx_kernel(const float *x, const float *gamma, const float *stats,
                                           const float *dy, int64_t f, float *dx) {
  __shared__ float means[2];
  int64_t r = blockIdx.x;
  const float *xr = x + r * f, *dyr = dy + r * f;
  float mean = stats[2 * r], rstd = stats[2 * r + 1];
  double sg = 0.0, sgx = 0.0;
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x) {
    float g = dyr[j] * gamma[j];
    sg += g, sgx += (double)g * ((xr[j] - mean) * rstd);
  }
  sg = cuda_block_sum(sg);
  __syncthreads();
  sgx = cuda_block_sum(sgx);
  if (threadIdx.x == 0) means[0] = (float)(sg / (double)f), means[1] = (float)(sgx / (double)f);
  __syncthreads();
  for (int64_t j = threadIdx.x; j < f; j += blockDim.x)
    dx[r * f + j] =
        pmap_norm_dx(dyr[j] * gamma[j], (xr[j] - mean) * rstd, rstd, means[0], means[1]);
}

static __global__ void layernorm_dparams_kernel(const float *x, const float *stats, const float *dy,
                                                int64_t rows, int64_t f, float *dgamma,
                                                float *dbeta) {
  for (size_t j = cuda_thread_index(); j < (size_t)f; j += cuda_grid_stride()) {
    double sg = 0.0, sb = 0.0;
    for (int64_t r = 0; r < rows; r++) {
      float xhat = (x[r * f + (int64_t)j] - stats[2 * r]) * stats[2 * r + 1];
      sg += (double)dy[r * f + (int64_t)j] * xhat;
      sb += dy[r * f + (int64_t)j];
    }
    dgamma[j] += (float)sg;
    dbeta[j] += (float)sb;
  }
}

static void layernorm_forward_launch(cudaStream_t stream, const float *x, const float *gamma,
                                     const float *beta, int64_t rows, int64_t f, float eps,
                                     float *y, float *stats, pmap_bf16 *y16) {
  layernorm_forward_kernel<<<(unsigned)rows, CUDA_BLOCK, 0, stream>>>(x, gamma, beta, f, eps, y,
                                                                      stats, y16);
}

static void layernorm_backward_launch(cudaStream_t stream, const float *x, const float *gamma,
                                      const float *stats, const float *dy, int64_t rows, int64_t f,
                                      float *dx, float *dgamma, float *dbeta) {
  if (dx)
    layernorm_dx_kernel<<<(unsigned)rows, CUDA_BLOCK, 0, stream>>>(x, gamma, stats, dy, f, dx);
  layernorm_dparams_kernel<<<cuda_grid((size_t)f), CUDA_BLOCK, 0, stream>>>(x, stats, dy, rows, f,
                                                                            dgamma, dbeta);
}

/* Rows are blocks: at most the grid's x extent. */
static pmap_status check_rows(op_queue *q, int64_t rows) {
  if (rows > INT32_MAX)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "device %d: layernorm over %lld rows",
                    q->where.index, (long long)rows);
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_layernorm_forward(op_queue *q, const float *x, const float *gamma,
                                              const float *beta, int64_t rows, int64_t f, float eps,
                                              float *y, float *stats, pmap_bf16 *y16) {
  if (rows <= 0 || f <= 0) return PMAP_SUCCESS;
  PMAP_TRY(check_rows(q, rows));
  layernorm_forward_launch(q->stream, x, gamma, beta, rows, f, eps, y, stats, y16);
  CUDA_CHECK_LAUNCH(q, "layernorm_forward_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_layernorm_backward(op_queue *q, const float *x, const float *gamma,
                                               const float *stats, const float *dy, int64_t rows,
                                               int64_t f, float *dx, float *dgamma, float *dbeta) {
  if (rows <= 0 || f <= 0) return PMAP_SUCCESS;
  PMAP_TRY(check_rows(q, rows));
  layernorm_backward_launch(q->stream, x, gamma, stats, dy, rows, f, dx, dgamma, dbeta);
  CUDA_CHECK_LAUNCH(q, "layernorm_backward kernels");
  return PMAP_SUCCESS;
}
