/* gemm.cu: row-major SGEMM on cuBLAS (ops/ops.h gemm). cuBLAS is column-major; a row-major
 * matrix read column-major is its transpose, so C = op(A) op(B) is computed as
 * C^T = op(B)^T op(A)^T with the operands swapped and nothing copied. */
#include <limits.h>

#include "cuda_common.cuh"

/* FP32 by default; TF32 tensor cores only when the handle's math mode was set for them. */
static pmap_status gemm_launch(op_queue *q, cublasHandle_t h, int trans_a, int trans_b, int m,
                               int n, int k, float alpha, const float *a, int lda, const float *b,
                               int ldb, float beta, float *c, int ldc) {
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(q, cublasSgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_gemm(op_queue *q, int trans_a, int trans_b, int64_t m, int64_t n,
                                 int64_t k, float alpha, const float *a, int64_t lda,
                                 const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m == 0 || n == 0) return PMAP_SUCCESS;
  if (m < 0 || n < 0 || k < 0 || m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX ||
      ldb > INT_MAX || ldc > INT_MAX)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "device %d: gemm m %lld n %lld k %lld (lda %lld ldb %lld ldc %lld) is outside "
                    "cuBLAS's int range",
                    q->where.index, (long long)m, (long long)n, (long long)k, (long long)lda,
                    (long long)ldb, (long long)ldc);
  /* cuBLAS insists on leading dimensions >= 1 even where k == 0 leaves them unread. */
  int ilda = lda > 0 ? (int)lda : 1, ildb = ldb > 0 ? (int)ldb : 1;
  return gemm_launch(q, q->blas, trans_a, trans_b, (int)m, (int)n, (int)k, alpha, a, ilda, b, ildb,
                     beta, c, (int)ldc);
}
