/* attention.cu: CUDA kernels of causal self-attention and token embeddings: the strided batch of
 * GEMMs (cublasSgemmStridedBatched, row-major as gemm.cu), the causal softmax and its backward
 * (a thread per row; the sums in double in column order as on the CPU, but the exponentials in
 * double too, where the CPU takes its vector exp in float: the two agree to float rounding, not
 * bitwise) and the embedding's gather and its scatter-add, which takes a thread per (row of the
 * table, feature) walking the tokens in order: no atomics, the same bits on every run. */
#include <limits.h>

#include "cuda_common.cuh"

extern "C" pmap_status cuda_gemm_strided(op_queue *q, int trans_a, int trans_b, int64_t m,
                                         int64_t n, int64_t k, float alpha, const float *a,
                                         int64_t lda, int64_t stride_a, const float *b, int64_t ldb,
                                         int64_t stride_b, float beta, float *c, int64_t ldc,
                                         int64_t stride_c, int64_t batch) {
  if (m == 0 || n == 0 || batch == 0) return PMAP_SUCCESS;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX ||
      lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX || batch > INT_MAX)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "device %d: gemm_strided m %lld n %lld k %lld batch %lld is outside cuBLAS's "
                    "int range",
                    q->where.index, (long long)m, (long long)n, (long long)k, (long long)batch);
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  int ilda = lda > 0 ? (int)lda : 1, ildb = ldb > 0 ? (int)ldb : 1;
  CUBLAS_CHECK(q, cublasSgemmStridedBatched(q->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b,
                                            ildb, stride_b, a, ilda, stride_a, &beta, c, (int)ldc,
                                            stride_c, (int)batch));
  return PMAP_SUCCESS;
}

/* Each row's exponentials in double (not the CPU's float vector exp), summed in double in column
 * order; each times the float reciprocal of the sum, in double; the bf16 copy where one is asked
 * for; the row's [max, reciprocal] read from stats_in or written to stats_out where given. Row r
 * of the n x rows is the query at position first + r mod rows, and sees columns 0..that. */
static __global__ void causal_softmax_kernel(const float *x, float *y, int64_t total, int64_t rows,
                                             int64_t t, int64_t first, float scale, pmap_bf16 *y16,
                                             const float *stats_in, float *stats_out) {
  for (size_t r = cuda_thread_index(); r < (size_t)total; r += cuda_grid_stride()) {
    int64_t i = first + (int64_t)r % rows;
    const float *xr = x + (int64_t)r * t;
    float *yr = y + (int64_t)r * t;
    float mx = -INFINITY, inv;
    if (stats_in) {
      mx = stats_in[2 * r], inv = stats_in[2 * r + 1];
    } else {
      for (int64_t j = 0; j <= i; j++) mx = fmaxf(mx, scale * xr[j]);
      double sum = 0.0;
      for (int64_t j = 0; j <= i; j++) sum += exp((double)(scale * xr[j] - mx));
      inv = (float)(1.0 / sum);
    }
    for (int64_t j = 0; j <= i; j++) yr[j] = (float)(exp((double)(scale * xr[j] - mx)) * inv);
    for (int64_t j = i + 1; j < t; j++) yr[j] = 0.0f;
    if (y16)
      for (int64_t j = 0; j < t; j++) y16[(int64_t)r * t + j] = pmap_bf16_round(yr[j]);
    if (stats_out) stats_out[2 * r] = mx, stats_out[2 * r + 1] = inv;
  }
}

/* y read from y16 (widened) when it is given; dx16 written where it is asked for. */
static __global__ void causal_softmax_back_kernel(const float *y, const float *dy, float *dx,
                                                  int64_t total, int64_t rows, int64_t t,
                                                  int64_t first, float scale, const pmap_bf16 *y16,
                                                  pmap_bf16 *dx16) {
  for (size_t r = cuda_thread_index(); r < (size_t)total; r += cuda_grid_stride()) {
    int64_t i = first + (int64_t)r % rows, at = (int64_t)r * t;
    const float *dyr = dy + at;
    float *dxr = dx + at;
    double dot = 0.0;
    for (int64_t j = 0; j <= i; j++)
      dot += (double)(y16 ? pmap_bf16_widen(y16[at + j]) : y[at + j]) * dyr[j];
    for (int64_t j = 0; j <= i; j++) {
      float yj = y16 ? pmap_bf16_widen(y16[at + j]) : y[at + j];
      dxr[j] = (float)(scale * yj * (dyr[j] - dot));
    }
    for (int64_t j = i + 1; j < t; j++) dxr[j] = 0.0f;
    if (dx16)
      for (int64_t j = 0; j < t; j++) dx16[at + j] = pmap_bf16_round(dxr[j]);
  }
}

extern "C" pmap_status cuda_causal_softmax_forward(op_queue *q, const float *x, float *y, int64_t n,
                                                   int64_t rows, int64_t t, int64_t first,
                                                   float scale, pmap_bf16 *y16,
                                                   const float *stats_in, float *stats_out) {
  size_t total = (size_t)(n * rows);
  if (total == 0) return PMAP_SUCCESS;
  causal_softmax_kernel<<<cuda_grid(total), CUDA_BLOCK, 0, q->stream>>>(
      x, y, (int64_t)total, rows, t, first, scale, y16, stats_in, stats_out);
  CUDA_CHECK_LAUNCH(q, "causal_softmax_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_causal_softmax_backward(op_queue *q, const float *y, const float *dy,
                                                    float *dx, int64_t n, int64_t rows, int64_t t,
                                                    int64_t first, float scale,
                                                    const pmap_bf16 *y16, pmap_bf16 *dx16) {
  size_t total = (size_t)(n * rows);
  if (total == 0) return PMAP_SUCCESS;
  causal_softmax_back_kernel<<<cuda_grid(total), CUDA_BLOCK, 0, q->stream>>>(
      y, dy, dx, (int64_t)total, rows, t, first, scale, y16, dx16);
  CUDA_CHECK_LAUNCH(q, "causal_softmax_back_kernel");
  return PMAP_SUCCESS;
}

static __global__ void embedding_forward_kernel(const int32_t *ids, const float *table, int64_t n,
                                                int64_t v, int64_t d, float *y) {
  for (size_t e = cuda_thread_index(); e < (size_t)(n * d); e += cuda_grid_stride()) {
    int64_t i = (int64_t)e / d, j = (int64_t)e % d, id = ids[i];
    y[e] = id >= 0 && id < v ? table[id * d + j] : 0.0f;
  }
}

/* A thread per element of the table: its row's tokens in increasing order. */
static __global__ void embedding_backward_kernel(const int32_t *ids, const float *dy, int64_t n,
                                                 int64_t v, int64_t d, float *dtable) {
  for (size_t e = cuda_thread_index(); e < (size_t)(v * d); e += cuda_grid_stride()) {
    int64_t row = (int64_t)e / d, j = (int64_t)e % d;
    float acc = dtable[e];
    for (int64_t i = 0; i < n; i++)
      if (ids[i] == row) acc += dy[i * d + j];
    dtable[e] = acc;
  }
}

extern "C" pmap_status cuda_embedding_forward(op_queue *q, const int32_t *ids, const float *table,
                                              int64_t n, int64_t v, int64_t d, float *y) {
  size_t total = (size_t)(n * d);
  if (total == 0) return PMAP_SUCCESS;
  embedding_forward_kernel<<<cuda_grid(total), CUDA_BLOCK, 0, q->stream>>>(ids, table, n, v, d, y);
  CUDA_CHECK_LAUNCH(q, "embedding_forward_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_embedding_backward(op_queue *q, const int32_t *ids, const float *dy,
                                               int64_t n, int64_t v, int64_t d, float *dtable) {
  size_t total = (size_t)(v * d);
  if (total == 0 || n == 0) return PMAP_SUCCESS;
  embedding_backward_kernel<<<cuda_grid(total), CUDA_BLOCK, 0, q->stream>>>(ids, dy, n, v, d,
                                                                            dtable);
  CUDA_CHECK_LAUNCH(q, "embedding_backward_kernel");
  return PMAP_SUCCESS;
}
