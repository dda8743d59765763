/* mixed_model.h: a model of mixed widths in nested residual blocks, for the tests of the output
 * gradients' pool (models/exec.c), which sizes its buffers one by one: in -> dense w1 + GELU ->
 * dropout 0 (hands its gradient on) -> dense in -> [dense w2 + GELU -> (dropout rate, where
 * rate >= 0) -> dense in -> [[dense w3 -> tanh -> dense in]] -> []] -> layernorm -> dense 3. */
#ifndef PMAP_TEST_MIXED_MODEL_H
#define PMAP_TEST_MIXED_MODEL_H

#include "pmap.h"

static inline pmap_status build_mixed_model(pmap_model **out, int64_t in, int64_t w1, int64_t w2,
                                            int64_t w3, float rate) {
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(1, &in, &m);
  if (!st) st = pmap_model_add_dense(m, w1);
  if (!st) st = pmap_model_add_gelu(m);
  if (!st) st = pmap_model_add_dropout(m, 0.0f);
  if (!st) st = pmap_model_add_dense(m, in);
  if (!st) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_add_dense(m, w2);
  if (!st) st = pmap_model_add_gelu(m);
  if (!st && rate >= 0.0f) st = pmap_model_add_dropout(m, rate);
  if (!st) st = pmap_model_add_dense(m, in);
  for (int k = 0; k < 2 && !st; k++) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_add_dense(m, w3);
  if (!st) st = pmap_model_add_tanh(m);
  if (!st) st = pmap_model_add_dense(m, in);
  for (int k = 0; k < 2 && !st; k++) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_add_layernorm(m);
  if (!st) st = pmap_model_add_dense(m, 3);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}

#endif
