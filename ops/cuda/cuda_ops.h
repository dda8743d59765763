/* cuda_ops.h: the entry points of the CUDA kernels (ops/cuda, one file per op) and the CUDA op
 * table. Each runs asynchronously on the device's stream with the contract of its member in
 * ops/ops.h; pointers are device memory of that device. Usable from C and CUDA C++. */
#ifndef PMAP_CUDA_OPS_H
#define PMAP_CUDA_OPS_H

#include "cuda_queue.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const pmap_ops pmap_cuda_ops;

/* One cuda_<op> per op of ops/op_list.h (cuBLAS for gemm, a .cu file per op otherwise).
 * Convolution runs as batched im2col + one GEMM per chunk of examples: the per-example col and
 * dcol scratch of its contract is not used, the chunk's columns live in the queue's workspace. */
#define PMAP_OP(name, args) pmap_status cuda_##name args;
#include "ops/op_list.h"
#undef PMAP_OP

/* The fast steps' decision (step_vals.cu; op_backend.decide): from the averaged
 * [loss | flags (n) | norm] at tail, writes q->vals's skip and scale, and scales g (P) by it
 * when clip > 0. */
pmap_status cuda_decide(op_queue *q, float *g, size_t P, const float *tail, int n, int check,
                        float clip, float norm_max);
/* The fast steps' values (op_backend.step_values): h's settings and the step number into
 * q->vals in stream order, read by the kernels from then on; h NULL: read no more. */
pmap_status cuda_step_values(op_queue *q, const pmap_step_hyper *h, int64_t step);
/* The step's values for a kernel launched now: q->vals while a fast step reads them, else NULL
 * (the kernel then uses its arguments). */
static inline const cuda_step_vals *cuda_vals_of(const op_queue *q) {
  return q->vals_on ? q->vals : NULL;
}

/* Second pass of the loss reductions: *loss (device) = (float)(sum of partial (blocks) / denom),
 * summed in a fixed order so the loss is deterministic. blocks <= CUDA_REDUCE_BLOCKS. */
pmap_status cuda_loss_finalize(op_queue *q, const double *partial, unsigned blocks, double denom,
                               float *loss);

#ifdef __cplusplus
}
#endif
#endif
