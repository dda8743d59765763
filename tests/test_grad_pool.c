/* test_grad_pool.c: the plan of the output gradients' pool (models/exec.c) on models of mixed
 * widths, nested and ending-together residual blocks, dropout that passes its gradient on (rate
 * 0) and that does not, a flatten, a folded GELU and the transformers: every layer's output
 * gradient, input gradient and scratch lie in buffers large enough for them, never the same
 * buffer twice at once, never one a block's start has still to read, and the gradient a layer
 * hands on is where the next layer's plan looks for it. The pool must also take less than the
 * widest buffer times their count (its buffers sized each for what it holds), and where the
 * plan pools, less than a buffer per layer. The values trained through it are held against
 * finite differences in tests/test_layers.c. */
#include <stdlib.h>
#include <string.h>

#include "mixed_model.h"
#include "models/model.h"
#include "pmap_examples.h"
#include "testutil.h"

#define ROWS 5

/* tests/mixed_model.h's model with a dropout of rate 0.25 inside its first block. */
static pmap_status build_mixed(pmap_model **out) {
  return build_mixed_model(out, 12, 40, 64, 20, 0.25f);
}

/* (2, 6, 6) -> conv 3 + ReLU -> flatten -> dense 30 + GELU -> dense 4. */
static pmap_status build_conv(pmap_model **out) {
  int64_t in[3] = {2, 6, 6};
  pmap_model *m = NULL;
  pmap_status st = pmap_model_create(3, in, &m);
  if (!st) st = pmap_model_add_conv2d(m, 3, 3, 3, 1, 1);
  if (!st) st = pmap_model_add_relu(m);
  if (!st) st = pmap_model_add_flatten(m);
  if (!st) st = pmap_model_add_dense(m, 30);
  if (!st) st = pmap_model_add_gelu(m);
  if (!st) st = pmap_model_add_dense(m, 4);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}

/* A first layer that hands its gradient on: (1, 4, 4) -> flatten, or 16 -> dropout 0; then
 * dense 8 four times -> dense 1 (long enough to pool). */
static pmap_status build_first_passes(pmap_model **out, int flatten) {
  int64_t in3[3] = {1, 4, 4}, in1[1] = {16};
  pmap_model *m = NULL;
  pmap_status st = flatten ? pmap_model_create(3, in3, &m) : pmap_model_create(1, in1, &m);
  if (!st) st = flatten ? pmap_model_add_flatten(m) : pmap_model_add_dropout(m, 0.0f);
  for (int k = 0; k < 4 && !st; k++) st = pmap_model_add_dense(m, 8);
  if (!st) st = pmap_model_add_dense(m, 1);
  if (st) pmap_model_destroy(m);
  *out = st ? NULL : m;
  return st;
}
static pmap_status build_flatten_first(pmap_model **out) { return build_first_passes(out, 1); }
static pmap_status build_dropout_first(pmap_model **out) { return build_first_passes(out, 0); }

static int passes(const layer *l) {
  return l->folded || (l->cls->passes_dy && l->cls->passes_dy(l));
}

/* The checks of the file's comment on m over ROWS rows; want_pooled: the plan must pool; mixed:
 * some of its buffers must be narrower than the widest. */
static void check_plan(const char *name, pmap_model *m, int want_pooled, int mixed) {
  size_t floats = 0;
  CHECK(model_arena_floats(m, ROWS, &floats) == 0, "%s: arena floats", name);
  float *arena = calloc(floats ? floats : 1, sizeof *arena);
  replica r;
  memset(&r, 0, sizeof r);
  CHECK(arena != NULL, "%s: arena", name);
  if (!arena || replica_place(m, &r, arena, ROWS) != PMAP_SUCCESS) {
    CHECK(0, "%s: replica_place", name);
    free(arena);
    return;
  }
  int L = m->n_layers, n = r.dpool_n;
  CHECK(!want_pooled || r.dpool != NULL, "%s: the output gradients are not pooled", name);
  if (!r.dpool) goto done;
  CHECK(n >= 1 && n <= MODEL_POOL_MAX, "%s: %d buffers", name, n);
  size_t len[MODEL_POOL_MAX] = {0}, total = 0, widest = 0, own = 0;
  for (int k = 0; k < n; k++) {
    const float *end = k + 1 < n ? r.dslot[k + 1] : r.col; /* the pool ends where col starts */
    CHECK(end > r.dslot[k], "%s: buffer %d is empty or out of order", name, k);
    len[k] = (size_t)(end - r.dslot[k]);
    total += len[k];
    widest = len[k] > widest ? len[k] : widest;
  }
  CHECK(r.dslot[0] == r.dpool && r.dact[L - 1] == r.dpool, "%s: the loss's gradient", name);
  for (int i = 0; i < L; i++) own += (size_t)m->layers[i].out_size * ROWS;
  CHECK(total < own, "%s: pooled in %zu floats, one per layer %zu", name, total, own);
  CHECK(!mixed || total < widest * (size_t)n,
        "%s: %d buffers of %zu floats, all as wide as the widest (%zu)", name, n, total, widest);
  for (int i = L - 1; i >= 0; i--) {
    const layer *l = &m->layers[i];
    const int *p = r.dplan + 3 * i;
    size_t out = (size_t)l->out_size * ROWS, in = (size_t)l->in_size * ROWS;
    CHECK(p[0] >= 0 && p[0] < n && len[p[0]] >= out, "%s: layer %d: dy in buffer %d", name, i,
          p[0]);
    if (l->folded) {
      CHECK(p[1] < 0 && p[2] < 0, "%s: folded layer %d takes buffers", name, i);
    } else if (passes(l)) { /* it writes neither: both are dy's own (the first layer: no dx) */
      CHECK(p[1] == (i > 0 ? p[0] : -1) && p[2] == (i < L - 1 ? p[0] : -1),
            "%s: layer %d passes dy on, given %d, %d", name, i, p[1], p[2]);
    } else {
      CHECK((i == 0) == (p[1] < 0), "%s: layer %d: dx buffer %d", name, i, p[1]);
      CHECK((i == L - 1) == (p[2] < 0), "%s: layer %d: scratch buffer %d", name, i, p[2]);
      if (p[1] >= 0)
        CHECK(p[1] < n && p[1] != p[0] && len[p[1]] >= in, "%s: layer %d: dx in buffer %d (%zu)",
              name, i, p[1], p[1] < n ? len[p[1]] : 0);
      if (p[2] >= 0)
        CHECK(p[2] < n && p[2] != p[0] && p[2] != p[1] && len[p[2]] >= out,
              "%s: layer %d: scratch in buffer %d", name, i, p[2]);
    }
    if (i > 0 && !passes(l)) /* what it writes is neither dy nor a block start's */
      for (int k = 1; k <= 2; k++)
        for (int j = i + 1; j < L; j++) {
          int b = m->layers[j].cls->block_start ? m->layers[j].cls->block_start(&m->layers[j]) : -1;
          CHECK(!(b >= 0 && b <= i && r.dplan[3 * j] == p[k]),
                "%s: layer %d writes buffer %d, which block %d..%d's start still reads", name, i,
                p[k], b, j);
        }
    if (i > 0) /* what it hands on is where the layer before looks for its dy */
      CHECK(r.dplan[3 * (i - 1)] == (passes(l) ? p[0] : p[1]),
            "%s: layer %d hands on buffer %d, layer %d's plan has %d", name, i,
            passes(l) ? p[0] : p[1], i - 1, r.dplan[3 * (i - 1)]);
  }
done:
  replica_unplace(&r);
  free(arena);
}

static void check_built(const char *name, pmap_status (*build)(pmap_model **), int mixed) {
  pmap_model *m = NULL;
  CHECK_OK(build(&m));
  if (!m) return;
  check_plan(name, m, 1, mixed);
  model_set_precision(m, 1); /* bf16 moves outputs into the shared scratch, not gradients */
  check_plan(name, m, 1, mixed);
  model_set_recompute(m, PMAP_RECOMPUTE_FULL);
  check_plan(name, m, 1, mixed);
  pmap_model_destroy(m);
}

int main(void) {
  check_built("mixed widths", build_mixed, 1);
  check_built("conv, flatten", build_conv, 1);
  check_built("flatten first", build_flatten_first, 0);
  check_built("dropout first", build_dropout_first, 0);
  const char *examples[] = {"gpt-mini", "res-mlp", "cifar-bn", "convnet"};
  for (size_t k = 0; k < sizeof examples / sizeof *examples; k++) {
    pmap_model *m = NULL;
    CHECK_OK(pmap_example_model(examples[k], &m));
    if (m) check_plan(examples[k], m, 0, k == 0);
    pmap_model_destroy(m);
  }
  for (int depth = 1; depth <= 8; depth *= 2) {
    pmap_gpt_config c = pmap_gpt_mini();
    c.depth = depth;
    pmap_model *m = NULL;
    CHECK_OK(pmap_gpt_model(&c, &m));
    if (m) check_plan("gpt", m, 1, 1);
    pmap_model_destroy(m);
  }
  return test_exit("grad-pool");
}
