/* op_list.h: every op, once: its name, its arguments and its contract. Included with PMAP_OP
 * defined to make what each use needs (no include guard): the op table's members (ops.h), each
 * backend's declarations and table (ops/cpu/cpu_ops.h, ops/cuda/cuda_ops.h: <backend>_<name>,
 * so a backend that lacks an op does not link) and the op harness's cases (tests/ops).
 *
 * Write contract: forward ops overwrite their outputs (=); backward ops overwrite activation
 * gradients (dx =) and ACCUMULATE parameter gradients (dw +=, db +=), so a caller zeroes the
 * gradient buffer once per step and gradient accumulation over micro-batches comes free. Every
 * pointer is device memory of the queue's device (host memory on CPU); arrays are row-major.
 * An op is queued on q and may run asynchronously (CUDA): a caller's next wait on the device
 * completes it. */
/* clang-format off */

/* c (m, n) = alpha * op(a) op(b) + beta * c, op(a) (m, k), op(b) (k, n); trans_* transposes the
 * stored matrix (a stored (k, m) when trans_a). beta == 0 ignores c's old contents. */
PMAP_OP(gemm, (op_queue *q, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
               int64_t ldc))
/* x[i] = value for i < n. */
PMAP_OP(fill, (op_queue *q, float *x, float value, size_t n))
/* y[i] = x[i] for i < n; x and y do not overlap. Inside a step whose numeric guard is decided
 * on the device (a CUDA fast step) a copy queued after the verdict to skip the step changes
 * nothing, as the optimizer's steps do (the non-trained state's commit). */
PMAP_OP(copy, (op_queue *q, const float *x, float *y, size_t n))
/* y (outer, ch, inner) += b (ch) broadcast: dense uses inner 1, conv inner OH*OW. */
PMAP_OP(bias_forward, (op_queue *q, float *y, const float *b, int64_t outer, int64_t ch,
                       int64_t inner))
/* db (ch) += sum over outer and inner of dy (outer, ch, inner). */
PMAP_OP(bias_backward, (op_queue *q, const float *dy, float *db, int64_t outer, int64_t ch,
                        int64_t inner))
/* y (n) = max(x, 0); y may equal x. */
PMAP_OP(relu_forward, (op_queue *q, const float *x, float *y, size_t n))
/* dx (n) = dy where y > 0, else 0; dx may equal dy. */
PMAP_OP(relu_backward, (op_queue *q, const float *y, const float *dy, float *dx, size_t n))
/* y (bd, oc, oh, ow) = conv(x (bd, c, h, w), w (oc, c, kh, kw)) + b (oc) broadcast (b NULL: no
 * bias), then pmap_relu of it where relu. col: scratch of c*kh*kw*oh*ow floats. */
PMAP_OP(conv2d_forward, (op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                         const float *w, const float *b, int relu, float *y, float *col))
/* From dy, the gradient of the forward's output y: g = pmap_relu_grad(y, dy) where y is not NULL
 * (the forward applied the ReLU), else g = dy; db (oc) += the sums of g over examples and
 * pixels (db may be NULL), dw (oc, c, kh, kw) += ..., dx (bd, c, h, w) = ... (dx may be NULL:
 * not needed). col: scratch as above; dcol: a second scratch of the same size. */
PMAP_OP(conv2d_backward, (op_queue *q, const pmap_conv_shape *s, int64_t bd, const float *x,
                          const float *w, const float *y, const float *dy, float *dx, float *dw,
                          float *db, float *col, float *dcol))
/* loss = 1/n sum (pred - t)^2 written to *loss (device memory), dpred (n) = 2/n (pred - t). */
PMAP_OP(mse, (op_queue *q, const float *pred, const float *t, size_t n, float *dpred, float *loss))
/* Mean over rows of softmax cross-entropy: logits (rows, k), labels (rows) in [0, k);
 * dlogits (rows, k) = (softmax - onehot) / rows; *loss (device memory) = the mean. */
PMAP_OP(softmax_xent, (op_queue *q, const float *logits, const int32_t *labels, int64_t rows,
                       int64_t k, float *dlogits, float *loss))
/* w, g, v (n): SGD step (momentum, Nesterov, L2 weight decay: ops/op_math.h); v is read and
 * written only when h->momentum != 0. w16 (n; NULL: none) = the updated w rounded to bfloat16
 * (pmap_bf16_round), in the same pass: the bf16 policy's copy for the next forward. */
PMAP_OP(sgd_step, (op_queue *q, float *w, const float *g, float *v, pmap_bf16 *w16, size_t n,
                   const pmap_step_hyper *h))
/* w, g, m, v (n): Adam step with bias corrections, and AdamW's decoupled weight decay; w16 as
 * sgd_step's. */
PMAP_OP(adam_step, (op_queue *q, float *w, const float *g, float *m, float *v, pmap_bf16 *w16,
                    size_t n, const pmap_step_hyper *h))
/* *norm (device memory) = sqrt(sum of x[i]^2) for i < n, summed in double in a fixed order:
 * non-finite exactly when some x[i] is (or the norm exceeds FLT_MAX). The numeric guard and
 * gradient clipping read it. */
PMAP_OP(norm2, (op_queue *q, const float *x, size_t n, float *norm))
/* x[i] *= s for i < n (gradient clipping). */
PMAP_OP(scale, (op_queue *q, float *x, float s, size_t n))
/* y[i] += alpha * x[i] for i < n (weighted sums of micro-batch losses). */
PMAP_OP(axpy, (op_queue *q, float alpha, const float *x, float *y, size_t n))
/* y (n) = act(x); y may equal x. */
PMAP_OP(act_forward, (op_queue *q, pmap_act act, const float *x, float *y, size_t n))
/* dx (n) = act'(x) dy from the forward input x and output y; dx may equal dy. */
PMAP_OP(act_backward, (op_queue *q, pmap_act act, const float *x, const float *y, const float *dy,
                       float *dx, size_t n))
/* y (n) = a + b; y may equal a or b (residual connections). */
PMAP_OP(add, (op_queue *q, const float *a, const float *b, float *y, size_t n))
/* Layer normalisation of each row of x (rows, f): y = (x - mean) rstd gamma + beta with
 * rstd = 1 / sqrt(var + eps) (biased variance); stats (rows, 2) = mean, rstd for backward. y16
 * (NULL: none): y rounded to bfloat16 in the same pass (the next GEMM's input under bf16). */
PMAP_OP(layernorm_forward, (op_queue *q, const float *x, const float *gamma, const float *beta,
                            int64_t rows, int64_t f, float eps, float *y, float *stats,
                            pmap_bf16 *y16))
/* dx (rows, f) = ... (dx may be NULL: not needed), dgamma (f) += sum over rows of dy xhat,
 * dbeta (f) += sum of dy. */
PMAP_OP(layernorm_backward, (op_queue *q, const float *x, const float *gamma, const float *stats,
                             const float *dy, int64_t rows, int64_t f, float *dx, float *dgamma,
                             float *dbeta))
/* y (bd, c, oh, ow) = max (is_max) or mean of each window of x (bd, c, h, w). */
PMAP_OP(pool2d_forward, (op_queue *q, int is_max, const pmap_pool_shape *s, int64_t bd,
                         const float *x, float *y))
/* dx (bd, c, h, w) = the gradient of the windows that hold each element (max: only to the
 * first maximum of a window), gathered per element, so overlapping windows need no atomics. */
PMAP_OP(pool2d_backward, (op_queue *q, int is_max, const pmap_pool_shape *s, int64_t bd,
                          const float *x, const float *dy, float *dx))
/* Inverted dropout: y[i] = x[i] keep(i) / (1 - rate), where keep is drawn from a counter-based
 * hash of (key, first + i): the mask of an element depends on its global index only, not on
 * the device holding it. y may equal x. */
PMAP_OP(dropout_forward, (op_queue *q, const float *x, float *y, size_t n, float rate, uint64_t key,
                          uint64_t first))
/* dx[i] = dy[i] keep(i) / (1 - rate), the same mask; dx may equal dy. */
PMAP_OP(dropout_backward, (op_queue *q, const float *dy, float *dx, size_t n, float rate,
                           uint64_t key, uint64_t first))
/* Batch norm statistics of x (outer, c, inner) per channel: stats (3c + 1) = sum (c) and sum
 * of squares (c) of x - shift, count, then shift (c): the mean of prev (stats of the same
 * layout from a first pass, not stats itself) or 0 when prev is NULL. Sums in double, in a
 * fixed order. The
 * caller may all-reduce the first 2c + 1 (the shifts are the same on every device when prev
 * is): a first pass, its all-reduce, a second pass around its mean and that all-reduce give
 * the variance without the cancellation of E[x^2] - E[x]^2. */
PMAP_OP(bn_stats, (op_queue *q, const float *x, int64_t outer, int64_t c, int64_t inner,
                   const float *prev, float *stats))
/* y = (x - mean) rstd gamma + beta per channel. training: mean and the biased variance from
 * stats (ops/op_math.h pmap_bn_train_moments: y is NaN where those, or the moments in run_stats
 * (layout of bn_stats; may be NULL), are not finite or overflowed float); then, when running
 * (2c: mean, var) is not NULL, running = momentum running + (1 - momentum) of the moments in
 * run_stats, unless those are not finite (pmap_running_update). Inference (!training): mean and
 * var from running. */
PMAP_OP(bn_forward, (op_queue *q, const float *x, const float *stats, const float *run_stats,
                     float *running, const float *gamma, const float *beta, int64_t outer,
                     int64_t c, int64_t inner, float eps, float momentum, int training, float *y))
/* sums (2c) = per channel sum of dy, sum of dy xhat (xhat from x and stats); overwritten. */
PMAP_OP(bn_backward_sums, (op_queue *q, const float *x, const float *dy, const float *stats,
                           int64_t outer, int64_t c, int64_t inner, float eps, float *sums))
/* dx = gamma rstd (dy - sum_dy / count - xhat sum_dyxhat / count) from (possibly
 * all-reduced) stats and sums; dx overwritten. */
PMAP_OP(bn_backward_dx, (op_queue *q, const float *x, const float *dy, const float *stats,
                         const float *gamma, const float *sums, int64_t outer, int64_t c,
                         int64_t inner, float eps, float *dx))
/* Dense's bias and the activation after it in one pass: y (outer, ch) += bias (ch) broadcast,
 * then z (outer, ch) = act(y): the same bits bias_forward (inner 1) then act_forward leave (bias
 * NULL: none, y as it is, so act_forward's bits; with a slope, the slope of a kept sum). z16
 * (outer, ch; NULL: none) = z rounded to bfloat16 in the same pass, the bf16 policy's copy of
 * the next GEMM's input (round_bf16's bits). slope (GELU only, else NULL; NULL: none; may equal
 * y, then y holds the slope instead of y + b) = act'(y + b), the bits act_backward leaves for
 * dy = 1: what act_bias_backward multiplies by in place of computing it again. */
PMAP_OP(bias_act_forward, (op_queue *q, pmap_act act, float *y, const float *bias,
                           int64_t outer, int64_t ch, float *z, pmap_bf16 *z16, float *slope))
/* The activation's backward and the bias gradient in one pass: dx (outer, ch) = act'(x) dz from
 * the forward's input x and output z, and db (ch) += the sums over outer of dx: the same bits
 * act_backward then bias_backward (inner 1) leave. dx may equal dz. dx16 (NULL: none) = dx
 * rounded to bfloat16 in the same pass (the operand of the layer's backward GEMMs). slope
 * (GELU only; NULL: none) = bias_act_forward's slope: dx = slope dz (the same bits; x is then
 * not read and may be NULL). */
PMAP_OP(act_bias_backward, (op_queue *q, pmap_act act, const float *x, const float *z,
                            const float *dz, float *dx, float *db, int64_t outer, int64_t ch,
                            pmap_bf16 *dx16, const float *slope))
/* For i < batch: c_i (m, n) = alpha op(a_i) op(b_i) + beta c_i, where x_i = x + i stride_x, each
 * as gemm (attention's per-head products; cublasSgemmStridedBatched on CUDA). The c_i must not
 * overlap. */
PMAP_OP(gemm_strided, (op_queue *q, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                       float alpha, const float *a, int64_t lda, int64_t stride_a, const float *b,
                       int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                       int64_t stride_c, int64_t batch))
/* Causal softmax of n groups of `rows` rows of t scores (x: (n, rows, t)), row i of a group being
 * the query at position first + i (first + rows <= t; a whole (t, t) score matrix: rows t, first
 * 0; a block of its rows: a blocked attention's): y[g, i, j] = exp(scale x[g, i, j] - max) / sum
 * over j' <= first + i for j <= first + i, and 0 past it (those entries of x are not read). y may
 * equal x. y16 (NULL: none): y rounded to bfloat16 in the same pass (the bf16 policy's P, which
 * is all its backward reads). A row's values do not depend on the other rows, on rows or on t
 * past the row's own columns: a block gives the bits of the same rows in the whole matrix. y is
 * each exponential times the float reciprocal of the sum (summed in double). stats (NULL: none)
 * holds each row's [max, reciprocal] (n x rows x 2 floats): stats_out writes them; with stats_in
 * (a call's stats_out over the same x) the row's max and sum are not taken again, and y has the
 * bits of that call's (a blocked attention's backward pass takes P again so). */
PMAP_OP(causal_softmax_forward, (op_queue *q, const float *x, float *y, int64_t n, int64_t rows,
                                 int64_t t, int64_t first, float scale, pmap_bf16 *y16,
                                 const float *stats_in, float *stats_out))
/* dx = scale y (dy - sum_j y dy) per row, 0 past the row's position, from the forward's y, the
 * rows as causal_softmax_forward's; dx may equal dy. y16 non-NULL: y is read from it, widened (y
 * is then not read, and may be NULL); dx16 (NULL: none): dx rounded to bfloat16 in the same
 * pass. */
PMAP_OP(causal_softmax_backward, (op_queue *q, const float *y, const float *dy, float *dx,
                                  int64_t n, int64_t rows, int64_t t, int64_t first, float scale,
                                  const pmap_bf16 *y16, pmap_bf16 *dx16))
/* y (n, d) = table[ids[i]] (rows of table (v, d)); ids in [0, v) (a row of y whose id is not is
 * written 0). */
PMAP_OP(embedding_forward, (op_queue *q, const int32_t *ids, const float *table, int64_t n,
                            int64_t v, int64_t d, float *y))
/* dtable (v, d) += for each i < n in increasing order, dy[i] added to row ids[i]: every row sums
 * its tokens in the same order on every backend, with no atomics (bitwise reproducible); ids out
 * of range are skipped. */
PMAP_OP(embedding_backward, (op_queue *q, const int32_t *ids, const float *dy, int64_t n,
                             int64_t v, int64_t d, float *dtable))
/* Mixed precision (the bf16 policy, docs/precision.md). A pmap_bf16 is a bfloat16: the top 16
 * bits of a float (8 exponent bits, 7 fraction bits).
 * y16 (n) = x rounded to bfloat16, to nearest with ties to even (NaN stays NaN, quiet, with its
 * sign; values past the largest bfloat16's rounding range become infinities), and/or y32 (n) =
 * those values as floats; either may be NULL (not both), y32 may equal x. */
PMAP_OP(round_bf16, (op_queue *q, const float *x, pmap_bf16 *y16, float *y32, size_t n))
/* round_bf16's y16 alone over a block of a matrix: y16 (rows, cols) at leading dimension ldy =
 * x (rows, cols) at leading dimension ldx rounded to bfloat16; what lies between the rows of
 * either is neither read nor written (attention: qkv's three parts taken apart and put back).
 * In the same pass, b (cols; NULL: none) added before the rounding (x + b in float, bias_forward's
 * add), and db (cols; NULL: none) += the sums over the rows of x, bias_backward's (inner 1) in
 * its order (db needs ldx == cols). */
PMAP_OP(round_bf16_block, (op_queue *q, const float *x, int64_t ldx, const float *b, float *db,
                           pmap_bf16 *y16, int64_t ldy, int64_t rows, int64_t cols))
/* y (n) = x as floats (exact). */
PMAP_OP(widen_bf16, (op_queue *q, const pmap_bf16 *x, float *y, size_t n))
/* gemm's contract with bfloat16 operands: c (m, n) = alpha op(a) op(b) + beta c, the products
 * exact and summed in float (c is float). Backends may flush bfloat16 subnormals to zero. */
PMAP_OP(gemm_bf16, (op_queue *q, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const pmap_bf16 *a, int64_t lda, const pmap_bf16 *b, int64_t ldb,
                    float beta, float *c, int64_t ldc))
/* gemm_strided's contract with bfloat16 operands (float c), as gemm_bf16, over groups of
 * batches: for g < groups and i < batch, c_gi = alpha op(a_gi) op(b_gi) + beta c_gi where
 * x_gi = x + g group_x + i stride_x (attention: the examples' heads in one call). */
PMAP_OP(gemm_strided_bf16, (op_queue *q, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const pmap_bf16 *a, int64_t lda, int64_t stride_a,
                            const pmap_bf16 *b, int64_t ldb, int64_t stride_b, float beta,
                            float *c, int64_t ldc, int64_t stride_c, int64_t batch, int64_t groups,
                            int64_t group_a, int64_t group_b, int64_t group_c))
/* clang-format on */
