/* bf16.cu: the CUDA kernels of the bf16 policy: rounding to bfloat16 and back (ops/op_math.h's
 * rounding, so the bits are the CPU's), and the bfloat16 GEMMs on cuBLAS's tensor cores
 * (cublasGemmEx and cublasGemmStridedBatchedEx, bfloat16 operands, float output, float compute),
 * row-major as gemm.cu. */
#include <limits.h>

#include "cuda_common.cuh"

static __global__ void round_bf16_kernel(const float *x, pmap_bf16 *y16, float *y32, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    uint16_t h = pmap_bf16_round(x[i]);
    if (y16) y16[i] = h;
    if (y32) y32[i] = pmap_bf16_widen(h);
  }
}

static __global__ void round_bf16_block_kernel(const float *x, int64_t ldx, const float *b,
                                               pmap_bf16 *y16, int64_t ldy, int64_t rows,
                                               int64_t cols) {
  size_t n = (size_t)rows * (size_t)cols;
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) {
    int64_t r = (int64_t)(i / (size_t)cols), c = (int64_t)(i % (size_t)cols);
    float v = x[r * ldx + c];
    y16[r * ldy + c] = pmap_bf16_round(b ? v + b[c] : v);
  }
}

static __global__ void widen_bf16_kernel(const pmap_bf16 *x, float *y, size_t n) {
  for (size_t i = cuda_thread_index(); i < n; i += cuda_grid_stride()) y[i] = pmap_bf16_widen(x[i]);
}

extern "C" pmap_status cuda_round_bf16(op_queue *q, const float *x, pmap_bf16 *y16, float *y32,
                                       size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  round_bf16_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, q->stream>>>(x, y16, y32, n);
  CUDA_CHECK_LAUNCH(q, "round_bf16_kernel");
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_round_bf16_block(op_queue *q, const float *x, int64_t ldx,
                                             const float *b, float *db, pmap_bf16 *y16, int64_t ldy,
                                             int64_t rows, int64_t cols) {
  if (db && ldx != cols)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "round_bf16_block: a bias gradient needs ldx %lld = cols %lld", (long long)ldx,
                    (long long)cols);
  if (rows <= 0 || cols <= 0) return PMAP_SUCCESS;
  size_t n = (size_t)rows * (size_t)cols;
  round_bf16_block_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, q->stream>>>(x, ldx, b, y16, ldy, rows,
                                                                      cols);
  CUDA_CHECK_LAUNCH(q, "round_bf16_block_kernel");
  if (db) return cuda_bias_backward(q, x, db, rows, cols, 1); /* its fixed-order column sums */
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_widen_bf16(op_queue *q, const pmap_bf16 *x, float *y, size_t n) {
  if (n == 0) return PMAP_SUCCESS;
  widen_bf16_kernel<<<cuda_grid(n), CUDA_BLOCK, 0, q->stream>>>(x, y, n);
  CUDA_CHECK_LAUNCH(q, "widen_bf16_kernel");
  return PMAP_SUCCESS;
}

/* The extents cuBLAS takes as int; an error naming the call otherwise. */
static pmap_status int_range(op_queue *q, const char *call, int64_t m, int64_t n, int64_t k,
                             int64_t lda, int64_t ldb, int64_t ldc, int64_t batch) {
  if (m < 0 || n < 0 || k < 0 || batch < 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX ||
      lda > INT_MAX || ldb > INT_MAX || ldc > INT_MAX || batch > INT_MAX)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "device %d: %s m %lld n %lld k %lld (lda %lld ldb %lld ldc %lld, batch %lld) "
                    "is outside cuBLAS's int range",
                    q->where.index, call, (long long)m, (long long)n, (long long)k, (long long)lda,
                    (long long)ldb, (long long)ldc, (long long)batch);
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_gemm_bf16(op_queue *q, int trans_a, int trans_b, int64_t m, int64_t n,
                                      int64_t k, float alpha, const pmap_bf16 *a, int64_t lda,
                                      const pmap_bf16 *b, int64_t ldb, float beta, float *c,
                                      int64_t ldc) {
  if (m == 0 || n == 0) return PMAP_SUCCESS;
  PMAP_TRY(int_range(q, "gemm_bf16", m, n, k, lda, ldb, ldc, 1));
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  int ilda = lda > 0 ? (int)lda : 1, ildb = ldb > 0 ? (int)ldb : 1;
  CUBLAS_CHECK(q, cublasGemmEx(q->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b, CUDA_R_16BF,
                               ildb, a, CUDA_R_16BF, ilda, &beta, c, CUDA_R_32F, (int)ldc,
                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_gemm_strided_bf16(op_queue *q, int trans_a, int trans_b, int64_t m,
                                              int64_t n, int64_t k, float alpha, const pmap_bf16 *a,
                                              int64_t lda, int64_t stride_a, const pmap_bf16 *b,
                                              int64_t ldb, int64_t stride_b, float beta, float *c,
                                              int64_t ldc, int64_t stride_c, int64_t batch,
                                              int64_t groups, int64_t group_a, int64_t group_b,
                                              int64_t group_c) {
  if (m == 0 || n == 0 || batch == 0 || groups == 0) return PMAP_SUCCESS;
  PMAP_TRY(int_range(q, "gemm_strided_bf16", m, n, k, lda, ldb, ldc, batch));
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  int ilda = lda > 0 ? (int)lda : 1, ildb = ldb > 0 ? (int)ldb : 1;
  /* One strided batch per group: cuBLAS takes a single batch stride. */
  for (int64_t g = 0; g < groups; g++)
    CUBLAS_CHECK(q, cublasGemmStridedBatchedEx(
                        q->blas, op_b, op_a, (int)n, (int)m, (int)k, &alpha, b + g * group_b,
                        CUDA_R_16BF, ildb, stride_b, a + g * group_a, CUDA_R_16BF, ilda, stride_a,
                        &beta, c + g * group_c, CUDA_R_32F, (int)ldc, stride_c, (int)batch,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return PMAP_SUCCESS;
}
