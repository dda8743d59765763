/* bounds.h: the arithmetic the tests' tolerances are argued from, wherever two computations of
 * the same mathematics are compared (two providers, instruction sets, device or process counts,
 * precisions). docs/tolerances.md gives the argument; in short:
 *
 * - A float sum of k terms of random sign, taken in two orders, differs by about u sqrt(k) of
 *   its size (each rounding adds an error of at most u = 2^-24 of a partial sum, of random sign:
 *   the errors add as a random walk; Higham and Mary's probabilistic rounding analysis). A value
 *   on one row's path carries the sums of every layer it went through: their lengths add up to
 *   k_path per row and step, and the batch-wide sums (a weight gradient over the rows, a batch
 *   norm's statistics) add k_batch per row.
 * - A value rounded to bfloat16 errs by at most v = 2^-8 of itself. Under bf16 against fp32,
 *   every one of the r_all roundings on the path differs. Between two bf16 runs that sum in
 *   other orders, a rounding of a computed value (r_act of them) differs only where the float
 *   sums' difference moves it across a rounding boundary: for a value spread over its bfloat16
 *   interval, with probability p = 2 u sqrt(k_round) / v at most.
 * - The loss (or a parameter) moves by kappa times the relative change of a value on its path
 *   (the loss's condition: for cross-entropy 2 max|z| / L, below 4 while the logits stay below
 *   twice the loss; for these MSE models 2 |y| / |y - t|, below 10 with targets a few times
 *   their noise), and it averages the independent contributions of its rows (rows times tokens
 *   terms for a language model).
 * - Steps add their differences as a random walk (sqrt(steps)); training at these rates does
 *   not amplify them on the whole (which kappa's margin covers).
 * - Bounds stand at lambda = 6 standard deviations of that model: a check exceeds its bound by
 *   chance with probability below 2 exp(-lambda^2 / 2) = 3e-8.
 *
 * These are bounds for every CPU and every summation order, not observations: a test prints
 * what it measured beside its bound. Where the model does not apply (Adam's parameters, whose
 * normalised step turns a last-bit difference of a near-zero gradient into a whole step), a test
 * says so and compares what the model covers. */
#ifndef PMAP_TEST_BOUNDS_H
#define PMAP_TEST_BOUNDS_H

#include <math.h>
#include <stddef.h>
#include <string.h>

#define BOUND_U32 0x1p-24 /* float's unit roundoff */
#define BOUND_U16 0x1p-8  /* bfloat16's (8 significant bits) */
#define BOUND_LAMBDA 6.0

/* One row's path through an example model, per training step (forward and backward); the
 * counts follow its layers (models/examples.c), each line below says how. */
typedef struct bound_model {
  const char *name;
  double k_path;  /* summed lengths of the float reductions on one row's path */
  double k_batch; /* summed lengths per row of the reductions over the batch */
  double r_all;   /* bfloat16 roundings on the path (operands of every GEMM, forward, backward) */
  double r_act;   /* of them, roundings of computed values (not the input, not a parameter) */
  double k_round; /* the longest float reduction whose result is rounded to bfloat16 */
  double kappa;   /* the loss's condition */
  double tokens;  /* independent loss terms per row */
} bound_model;

/* A GEMM layer of a inputs and b outputs adds a (forward) + b (its input gradient) to k_path and
 * 1 to k_batch (its weight gradient sums the rows); a convolution adds c kh kw and oc kh kw, and
 * OH OW to k_batch; a batch norm adds 2 H W to k_batch (statistics, their gradients). Under bf16
 * a GEMM rounds its input, its weights and its output gradient (r_all 3), of which the input
 * (but the first layer's) and the output gradient are computed (r_act 2). */
static const bound_model bound_models[] = {
    /* 1 -> 1 */
    {"linear", 1 + 1, 1, 3, 1, 1, 10, 1},
    /* 10 -> 32 -> 32 -> 1 */
    {"mlp", (10 + 32) + (32 + 32) + (32 + 1), 3, 9, 5, 32, 10, 1},
    /* conv 1 -> 1 3x3 on 32x32, dense 1024 -> 2 */
    {"convnet", (9 + 9) + (1024 + 2), 1024 + 1, 6, 3, 1024, 4, 1},
    /* 1024 -> 3 x 1024 -> 10 */
    {"mlp-1024", 3 * (1024 + 1024) + (1024 + 10), 4, 12, 7, 1024, 4, 1},
    /* convs 3 -> 16 (32x32), 16 -> 32 stride 2 (16x16), 32 -> 32 stride 2 (7x7), dense 1568 */
    {"cifar-cnn", (27 + 144) + (144 + 288) + (288 + 288) + (1568 + 10), 1024 + 256 + 49 + 1, 12, 7,
     1568, 4, 1},
    /* dense 10 -> 32, 2 x (layer norm 32, 32 -> 64, 64 -> 32), layer norm, 32 -> 1; each layer
     * norm sums its 32 features twice forward and twice backward */
    {"res-mlp", (10 + 32) + 2 * ((32 + 64) + (64 + 32)) + (32 + 1) + 3 * 4 * 32, 6 + 3 * 2, 18, 11,
     64, 10, 1},
    /* conv 3 -> 16 (32x32), batch norm, max pool, conv 16 -> 32 (16x16), batch norm, average
     * pool, dense 2048 -> 10; a batch norm's output rests on sums over the batch's pixels */
    {"cifar-bn", (27 + 144) + (144 + 288) + (2048 + 10), 1024 + 2 * 1024 + 256 + 2 * 256 + 1, 9, 5,
     2048, 4, 1},
    /* per token and block: two layer norms (128 features, 4 sums each), the qkv projection
     * (128 + 384), attention's products (32 + 64, and back), the output projection (128 + 128),
     * the MLP (128 + 512, 512 + 128); 4 blocks, final layer norm, tied head (128 + 256). Weight
     * gradients sum over every token of a row (64 tokens x 7 matrices a block). Per block 20
     * roundings: 12 forward (2 layer norm outputs, 4 weights, Q, K, V, P, O, the GELU output), 8
     * output gradients; 16 of them computed. */
    {"gpt-mini",
     4 * (2 * 4 * 128 + (128 + 384) + 2 * (32 + 64) + (128 + 128) + (128 + 512) + (512 + 128)) +
         4 * 128 + (128 + 256),
     64 * (4 * 7 + 2), 4 * 20 + 3, 4 * 16 + 2, 512, 4, 64},
};

static inline const bound_model *bound_model_of(const char *name) {
  for (size_t i = 0; i < sizeof bound_models / sizeof bound_models[0]; i++)
    if (strcmp(bound_models[i].name, name) == 0) return &bound_models[i];
  return NULL;
}

/* Two runs of `steps` steps on batches of `rows` rows (per step, across every device) whose
 * float sums differ in order only: other device or process counts, another float GEMM or
 * convolution path, another instruction set. The relative difference of the losses or of the
 * parameters. */
static inline double bound_order32(const bound_model *m, double rows, double steps) {
  return BOUND_LAMBDA * m->kappa * BOUND_U32 * sqrt((m->k_path + m->k_batch * rows) * steps);
}

/* The same for two bf16 runs: the float part, and the bfloat16 roundings the float difference
 * moves (each by one bfloat16 step, with probability p). */
static inline double bound_order16(const bound_model *m, double rows, double steps) {
  double p = fmin(1.0, 2.0 * BOUND_U32 * sqrt(m->k_round) / BOUND_U16);
  return bound_order32(m, rows, steps) +
         BOUND_LAMBDA * m->kappa * BOUND_U16 * sqrt(p * m->r_act * steps / (rows * m->tokens));
}

/* bf16 against fp32: every bfloat16 rounding on the path differs, by up to v. */
static inline double bound_prec16(const bound_model *m, double rows, double steps) {
  return bound_order32(m, rows, steps) +
         BOUND_LAMBDA * m->kappa * BOUND_U16 * sqrt(m->r_all * steps / (rows * m->tokens));
}

/* The loss's scale for a relative difference, max(L, S / kappa). S bounds |dL| / e for a
 * relative change e of the model's outputs: bound_order32 takes the loss to move by kappa e with
 * the model's constant kappa, which S / kappa > L would exceed once the loss falls near 0 (its
 * difference is then set by its outputs' rounding, not by its own size).
 * - Softmax cross-entropy (labels): per row dL = sum_j (p_j - y_j) dz_j and
 *   sum_j |p_j - y_j| = 2 (1 - p_y) <= 2 min(1, L) (as 1 - p <= -ln p): S = 2 max|z| min(1, L).
 *   The example models' logits grow to 10 to 30 in 20 steps while their loss falls to 1e-3.
 * - MSE (f32 targets): |dL| <= 2 sqrt(L) rms(dy): S = 2 rms(y) sqrt(L).
 * `size` is bound_output_size of the outputs (tests/testutil.h's test_output_size: from
 * pmap_predict, batch norm's from its running statistics standing in for the training pass's). */
static inline double bound_loss_scale(double loss, double size, int labels, double kappa) {
  loss = fabs(loss);
  return fmax(loss, size * (labels ? fmin(1.0, loss) : sqrt(loss)) / kappa);
}

/* 2 max|z| (labels: cross-entropy's logits) or 2 rms(y) (MSE's outputs) of n outputs. */
static inline double bound_output_size(const float *out, size_t n, int labels) {
  double most = 0.0, sq = 0.0;
  for (size_t i = 0; i < n; i++)
    most = fmax(most, fabs((double)out[i])), sq += (double)out[i] * out[i];
  return labels ? 2.0 * most : 2.0 * sqrt(sq / (double)(n ? n : 1));
}

/* One float dot product or sum of k terms of random sign, in two orders (or against the exact
 * value), relative to its size (the root mean square over many such sums). */
static inline double bound_sum(double k) { return BOUND_LAMBDA * BOUND_U32 * sqrt(k > 1 ? k : 1); }

#endif
