/* pmap_examples.h: the example models of pmap (the seed tutorials' models and a GEMM-bound
 * benchmark model) with deterministic synthetic data, used by pmap-train, pmap-bench and the
 * tests, and handy for trying the library. */
#ifndef PMAP_EXAMPLES_H
#define PMAP_EXAMPLES_H

#include "pmap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Names: "linear", "mlp", "convnet", "mlp-1024", "cifar-cnn", "res-mlp", "cifar-bn", "gpt-mini".
 *   linear   y = w x + b on x ~ N(0,1), y = 2x - 1 + 0.5 N(0,1); MSE; SGD lr 0.005;
 *            1000 steps of the full 128 samples (the JAX pmap tutorial).
 *   mlp      10 -> 32 -> ReLU -> 32 -> ReLU -> 1 regressing a fixed random teacher plus noise;
 *            MSE; Adam lr 0.001, its moments kept across steps; 1000 steps, batch 256.
 *   convnet  (1, 32, 32) -> conv 3x3 pad 1 to 1 channel -> flatten -> dense 2; softmax
 *            cross-entropy; Adam lr 0.001 (the nnabla data-parallel tutorial's network); images
 *            U[0,1) brightened by 0.25 on the left half for class 1, the right half for class 0.
 *   mlp-1024 1024 -> 3 x (1024, ReLU) -> 10; softmax cross-entropy; SGD lr 0.01 momentum 0.9;
 *            GEMM-bound, for benchmarks.
 *   cifar-cnn (3, 32, 32) -> conv 3x3 16 ch pad 1 -> ReLU -> conv 3x3 32 ch stride 2 pad 1 ->
 *            ReLU -> conv 3x3 32 ch stride 2 -> ReLU -> flatten (32*7*7) -> dense 10; softmax
 *            cross-entropy; SGD lr 0.01 momentum 0.9; 100 steps, batch 64, 512 samples. Images
 *            are N(0,1) noise plus a faint plane wave (amplitude 0.1) that depends on the class
 *            and the channel; a CIFAR-shaped benchmark model.
 *   res-mlp  10 -> dense 32 -> 2 x residual block (layernorm -> dense 64 -> GELU -> dense 32,
 *            added to the block's input) -> layernorm -> dense 1; the mlp's data and loss;
 *            Adam lr 0.001; 500 steps, batch 256, 1024 samples.
 *   cifar-bn (3, 32, 32) -> conv 3x3 16 ch pad 1 -> batch norm -> ReLU -> max pool 2x2 ->
 *            conv 3x3 32 ch pad 1 -> batch norm -> ReLU -> average pool 2x2 -> flatten ->
 *            dense 10; batch norm across replicas (cross_replica 1); cifar-cnn's data and loss;
 *            SGD lr 0.05 momentum 0.9; 100 steps, batch 64, 512 samples.
 *   gpt-mini pmap_gpt_model(pmap_gpt_mini()): a byte-level causal transformer, vocabulary 256,
 *            context 64, width 128, 4 blocks of 4 heads, tied head; per-token cross-entropy;
 *            Adam lr 0.003; 150 steps, batch 32, 2048 samples of the copy task
 *            (pmap_copy_task_data). */
typedef struct pmap_example_info {
  const char *name;
  int64_t steps;   /* default training steps */
  int64_t batch;   /* default global batch */
  int64_t samples; /* default data set size (rows) */
  pmap_optimizer opt;
} pmap_example_info;

/* The example's defaults; PMAP_ERR_INVALID_ARGUMENT naming the known names for another name. */
PMAP_API pmap_status pmap_example_info_get(const char *name, pmap_example_info *out);
/* Builds the example's model (destroy with pmap_model_destroy). */
PMAP_API pmap_status pmap_example_model(const char *name, pmap_model **out);
/* Allocates and fills n rows of the example's data: xs f32 (n, input...), ys f32 (n, 1) for
 * MSE or i32 (n) labels. Same seed, same data. Free with pmap_example_data_free. */
PMAP_API pmap_status pmap_example_data(const char *name, uint64_t seed, int64_t n, pmap_array *xs,
                                       pmap_array *ys);
PMAP_API void pmap_example_data_free(pmap_array *xs, pmap_array *ys); /* accepts NULL */

/* A GPT-style language model (docs/models.md, "Transformers"): input (context) i32 token ids ->
 * embedding (vocab, width) -> pos_embedding -> depth x [residual(token_layernorm ->
 * causal_attention(heads, width / heads)), residual(token_layernorm -> token_dense(4 width) ->
 * gelu -> token_dense(width))] -> token_layernorm -> lm_head(tied); loss PMAP_LOSS_TOKEN_XENT. */
typedef struct pmap_gpt_config {
  int64_t vocab;   /* 1..2^24 */
  int64_t context; /* T, 1..4096 */
  int64_t width;   /* D, a multiple of heads */
  int depth;       /* transformer blocks, 1..64 */
  int heads;
  int tied; /* 1: the head uses the token embedding's table */
} pmap_gpt_config;
/* gpt-mini's: {256, 64, 128, 4, 4, 1}. */
PMAP_API pmap_gpt_config pmap_gpt_mini(void);
/* PMAP_ERR_INVALID_ARGUMENT naming the setting out of range; PMAP_ERR_OUT_OF_MEMORY. */
PMAP_API pmap_status pmap_gpt_model(const pmap_gpt_config *config, pmap_model **out);
/* The copy task, n rows of next-token prediction over byte sequences s of length context + 1:
 * k = context / 2 letters drawn from 'a'..'p', '|', the same k letters again, then '.' up to the
 * end; xs = s[0, T), ys = s[1, T], both i32 (n, context). The second copy is predictable only by
 * attending back (a perfect model's loss is (k ln 16) / T nats per token). Same seed, same
 * data; free with pmap_example_data_free. */
PMAP_API pmap_status pmap_copy_task_data(uint64_t seed, int64_t n, int64_t context, pmap_array *xs,
                                         pmap_array *ys);

#ifdef __cplusplus
}
#endif
#endif
