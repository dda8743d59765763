/* test_recompute.c: pmap_config.recompute. With PMAP_RECOMPUTE_FULL a step keeps only each
 * recomputed residual block's input and computes the block again before its backward, with
 * PMAP_RECOMPUTE_SELECTIVE only the block's element-wise results (norms, activations, folded
 * or not): the parameters after several steps and the predictions are the same bits as
 * without, on 1 to 3 devices, fp32 and bf16, with micro-batches; the plan's activations shrink
 * where a block is recomputed (and only there: a block with batch norm is not), the plan says
 * which, and a limit that only the recomputed plan fits trains under it while the stored one is
 * refused; AUTO takes the first rung that fits. Public API only. */
#include "pmap_examples.h"
#include "testutil.h"

enum { BATCH = 12, STEPS = 3 };

/* A transformer of 2 blocks on the copy task. */
static pmap_model *gpt_model(void) {
  pmap_gpt_config c = {.vocab = 128, .context = 12, .width = 24, .depth = 2, .heads = 3, .tied = 1};
  pmap_model *m = NULL;
  CHECK_OK(pmap_gpt_model(&c, &m));
  return m;
}

/* The dense models' two ends: 16 inputs into 24 units; 5 classes out of the blocks. */
static pmap_model *dense_start(void) {
  int64_t in = 16;
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, &in, &m));
  CHECK_OK(pmap_model_add_dense(m, 24));
  return m;
}

static pmap_model *dense_finish(pmap_model *m) {
  CHECK_OK(pmap_model_add_dense(m, 5));
  CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT));
  return m;
}

/* Dense layers in residual blocks: one with dropout and a nested block (layer norm, tanh), one
 * with batch norm (whose state a second forward pass would update twice: not recomputed), one
 * plain. */
static pmap_model *mixed_model(void) {
  pmap_model *m = dense_start();
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_dense(m, 24));
  CHECK_OK(pmap_model_add_gelu(m));
  CHECK_OK(pmap_model_add_dropout(m, 0.25f));
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_layernorm(m));
  CHECK_OK(pmap_model_add_dense(m, 24));
  CHECK_OK(pmap_model_add_tanh(m));
  CHECK_OK(pmap_model_end_residual(m));
  CHECK_OK(pmap_model_add_dense(m, 24));
  CHECK_OK(pmap_model_end_residual(m));
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_batchnorm(m, 0));
  CHECK_OK(pmap_model_add_dense(m, 24));
  CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_end_residual(m));
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_dense(m, 24));
  CHECK_OK(pmap_model_end_residual(m));
  return dense_finish(m);
}

/* Element-wise layers of every kind in two blocks: a layer norm with a GELU of its own after it,
 * a ReLU and a sigmoid folded into dense layers, a tanh after the sigmoid (of its own: reading a
 * result that is computed again itself), a tanh folded into the last dense layer. */
static pmap_model *acts_model(void) {
  pmap_model *m = dense_start();
  for (int b = 0; b < 2; b++) {
    CHECK_OK(pmap_model_begin_residual(m));
    CHECK_OK(pmap_model_add_layernorm(m));
    CHECK_OK(pmap_model_add_gelu(m));
    CHECK_OK(pmap_model_add_dense(m, 32));
    CHECK_OK(pmap_model_add_relu(m));
    CHECK_OK(pmap_model_add_dense(m, 24));
    CHECK_OK(pmap_model_add_sigmoid(m));
    CHECK_OK(pmap_model_add_tanh(m));
    CHECK_OK(pmap_model_add_dense(m, 24));
    CHECK_OK(pmap_model_add_tanh(m));
    CHECK_OK(pmap_model_end_residual(m));
  }
  return dense_finish(m);
}

/* Blocks of dense layers alone: nothing element-wise to recompute selectively. */
static pmap_model *dense_blocks_model(void) {
  pmap_model *m = dense_start();
  for (int b = 0; b < 2; b++) {
    CHECK_OK(pmap_model_begin_residual(m));
    CHECK_OK(pmap_model_add_dense(m, 24));
    CHECK_OK(pmap_model_end_residual(m));
  }
  return dense_finish(m);
}

/* A model of one plain block: the last block is never run again, so nothing is saved, and the
 * plan says none. */
static pmap_model *one_block_model(void) {
  pmap_model *m = dense_start();
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_dense(m, 24));
  CHECK_OK(pmap_model_add_gelu(m));
  CHECK_OK(pmap_model_end_residual(m));
  return dense_finish(m);
}

/* A model whose only block holds batch norm: nothing to recompute. */
static pmap_model *bn_model(void) {
  pmap_model *m = dense_start();
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_batchnorm(m, 1));
  CHECK_OK(pmap_model_add_dense(m, 24));
  CHECK_OK(pmap_model_end_residual(m));
  return dense_finish(m);
}

typedef struct data {
  pmap_array xs, ys;
  float *x;
  int32_t *y;
  int own; /* 1: x and y are this test's */
} data;

static void data_of(int gpt, data *d) {
  memset(d, 0, sizeof *d);
  if (gpt) {
    CHECK_OK(pmap_copy_task_data(5, BATCH * STEPS, 12, &d->xs, &d->ys));
    return;
  }
  d->own = 1;
  d->x = malloc(sizeof(float) * BATCH * STEPS * 16);
  d->y = malloc(sizeof(int32_t) * BATCH * STEPS);
  uint64_t s = 88172645463325252ull;
  for (int i = 0; i < BATCH * STEPS * 16; i++) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    d->x[i] = (float)(s % 2001u) / 1000.0f - 1.0f;
  }
  for (int i = 0; i < BATCH * STEPS; i++) d->y[i] = (int32_t)((unsigned)i * 7u % 5u);
  int64_t xs[2] = {BATCH * STEPS, 16}, ys[1] = {BATCH * STEPS};
  d->xs = pmap_array_f32(d->x, 2, xs);
  d->ys = pmap_array_i32(d->y, 1, ys);
}

static void data_free(data *d) {
  if (d->own) {
    free(d->x), free(d->y);
  } else {
    pmap_example_data_free(&d->xs, &d->ys);
  }
}

/* Rows [k BATCH, k BATCH + BATCH) of a. */
static pmap_array rows(const pmap_array *a, int k) {
  pmap_array r = *a;
  size_t row = (size_t)(pmap_array_numel(a) / a->shape[0]) * 4; /* f32 and i32 */
  r.data = (char *)a->data + (size_t)k * BATCH * row;
  r.shape[0] = BATCH;
  return r;
}

typedef struct outcome {
  float *w;    /* (P) the last device's parameters after the steps */
  float *pred; /* the predictions of the first batch's rows */
  size_t P, n_pred;
  pmap_memory_plan plan;
  pmap_status st; /* the first failure */
} outcome;

/* STEPS steps of model m on n devices, recompute and precision as given, under max_memory. */
static void train(const pmap_model *m, const data *d, int n, int recompute, int bf16, int micro,
                  size_t max_memory, outcome *o) {
  memset(o, 0, sizeof *o);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = n,
                     .recompute = recompute,
                     .max_memory = max_memory};
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_adam(1e-2f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_params_create(ctx, m, &opt, 9, &p));
  if (!p) {
    pmap_ctx_destroy(ctx);
    return;
  }
  if (bf16) CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16));
  CHECK_OK(pmap_params_set_micro_batches(p, micro));
  CHECK_OK(pmap_params_memory(p, BATCH, &o->plan));
  for (int k = 0; k < STEPS && !o->st; k++) {
    pmap_array x = rows(&d->xs, k), y = rows(&d->ys, k);
    o->st = pmap_update(p, &x, &y, NULL);
  }
  o->P = pmap_params_count(p);
  o->w = malloc(o->P * sizeof *o->w);
  if (!o->st) {
    CHECK_OK(pmap_params_read(p, n - 1, o->w, o->P));
    pmap_array x = rows(&d->xs, 0);
    int rank = 0;
    int64_t shape[PMAP_MAX_RANK];
    pmap_model_output_shape(m, &rank, shape);
    int64_t oshape[PMAP_MAX_RANK + 1] = {BATCH};
    o->n_pred = BATCH;
    for (int k = 0; k < rank; k++) oshape[k + 1] = shape[k], o->n_pred *= (size_t)shape[k];
    o->pred = malloc(o->n_pred * sizeof *o->pred);
    pmap_array out = pmap_array_f32(o->pred, rank + 1, oshape);
    CHECK_OK(pmap_predict(p, &x, &out));
  }
  pmap_params_destroy(p);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

static void outcome_free(outcome *o) { free(o->w), free(o->pred); }

static void same_bits(const char *what, const outcome *a, const outcome *b) {
  CHECK(!a->st && !b->st, "%s: a step failed (%d, %d): %s", what, (int)a->st, (int)b->st,
        pmap_last_error());
  if (a->st || b->st || !a->w || !b->w) return;
  CHECK(a->P == b->P && !memcmp(a->w, b->w, a->P * sizeof(float)),
        "%s: the parameters differ from the stored run's", what);
  CHECK(a->pred && b->pred && !memcmp(a->pred, b->pred, a->n_pred * sizeof(float)),
        "%s: the predictions differ from the stored run's", what);
}

static void test_recomputed_same_bits(void) {
  const char *names[] = {"gpt", "mixed", "acts"};
  for (int which = 0; which < 3; which++) {
    pmap_model *m = which == 0 ? gpt_model() : which == 1 ? mixed_model() : acts_model();
    data d;
    data_of(!which, &d);
    for (int bf16 = 0; bf16 < 2; bf16++)
      for (int n = 1; n <= 3; n++)
        for (int micro = 1; micro <= 2; micro++) {
          if (TEST_UNDER_TSAN && (n == 2 || micro == 2)) continue;
          char what[128];
          outcome none, full, sel;
          train(m, &d, n, PMAP_RECOMPUTE_NONE, bf16, micro, 0, &none);
          train(m, &d, n, PMAP_RECOMPUTE_FULL, bf16, micro, 0, &full);
          train(m, &d, n, PMAP_RECOMPUTE_SELECTIVE, bf16, micro, 0, &sel);
          snprintf(what, sizeof what, "%s, %s, %d devices, %d micro-batches, full", names[which],
                   bf16 ? "bf16" : "fp32", n, micro);
          same_bits(what, &none, &full);
          CHECK(none.plan.recompute == PMAP_RECOMPUTE_NONE &&
                    full.plan.recompute == PMAP_RECOMPUTE_FULL,
                "%s: plan.recompute %d and %d", what, none.plan.recompute, full.plan.recompute);
          CHECK(full.plan.activations < none.plan.activations &&
                    full.plan.total ==
                        none.plan.total - none.plan.activations + full.plan.activations,
                "%s: activations %zu recomputed, %zu stored", what, full.plan.activations,
                none.plan.activations);
          what[strlen(what) - 4] = 0;
          strcat(what, "selective");
          same_bits(what, &none, &sel);
          /* The mixed model's element-wise layers lie in one block that qualifies (batch norm's
           * does not, the last holds none): one block saves nothing, so it is stored. */
          if (which == 1)
            CHECK(sel.plan.recompute == PMAP_RECOMPUTE_NONE &&
                      sel.plan.activations == none.plan.activations,
                  "%s: plan.recompute %d, activations %zu selective, %zu stored", what,
                  sel.plan.recompute, sel.plan.activations, none.plan.activations);
          else
            CHECK(sel.plan.recompute == PMAP_RECOMPUTE_SELECTIVE &&
                      sel.plan.activations < none.plan.activations &&
                      sel.plan.total ==
                          none.plan.total - none.plan.activations + sel.plan.activations,
                  "%s: plan.recompute %d, activations %zu selective, %zu stored", what,
                  sel.plan.recompute, sel.plan.activations, none.plan.activations);
          for (int k = 0; k < 3; k++) { /* every plan gives every rung's bytes */
            const pmap_memory_plan *pl = k == 0 ? &none.plan : k == 1 ? &full.plan : &sel.plan;
            CHECK(pl->activations_stored == none.plan.activations &&
                      pl->activations_recomputed == full.plan.activations &&
                      pl->activations_selective == sel.plan.activations,
                  "%s: plan %d gives the rungs %zu, %zu, %zu", what, k, pl->activations_stored,
                  pl->activations_recomputed, pl->activations_selective);
          }
          if (n == 1 && micro == 1)
            printf(
                "%s, %s: activations %zu bytes stored, %zu selective (%.2f), %zu full (%.2f)\n",
                names[which], bf16 ? "bf16" : "fp32", none.plan.activations, sel.plan.activations,
                (double)sel.plan.activations / (double)none.plan.activations, full.plan.activations,
                (double)full.plan.activations / (double)none.plan.activations);
          outcome_free(&none);
          outcome_free(&full);
          outcome_free(&sel);
        }
    data_free(&d);
    pmap_model_destroy(m);
  }
}

/* Only batch norm's block, or one plain block: nothing is recomputed, the plan says so and is
 * the stored one. */
static void test_nothing_to_recompute(void) {
  for (int which = 0; which < 3; which++) {
    const char *what = which == 2   ? "dense blocks"
                       : which == 1 ? "one plain block"
                                    : "batch norm's block";
    pmap_model *m = which == 2 ? dense_blocks_model() : which ? one_block_model() : bn_model();
    data d;
    data_of(0, &d);
    outcome none, full, sel;
    train(m, &d, 2, PMAP_RECOMPUTE_NONE, 0, 1, 0, &none);
    train(m, &d, 2, PMAP_RECOMPUTE_FULL, 0, 1, 0, &full);
    train(m, &d, 2, PMAP_RECOMPUTE_SELECTIVE, 0, 1, 0, &sel);
    same_bits(what, &none, &full);
    same_bits(what, &none, &sel);
    /* Dense blocks recompute fully, but hold nothing element-wise. */
    if (which < 2)
      CHECK(full.plan.recompute == PMAP_RECOMPUTE_NONE &&
                full.plan.activations == none.plan.activations &&
                full.plan.activations_recomputed == full.plan.activations_stored,
            "%s: recompute %d, activations %zu against %zu", what, full.plan.recompute,
            full.plan.activations, none.plan.activations);
    CHECK(sel.plan.recompute == PMAP_RECOMPUTE_NONE &&
              sel.plan.activations == none.plan.activations &&
              sel.plan.activations_selective == sel.plan.activations_stored,
          "%s, selective: recompute %d, activations %zu against %zu", what, sel.plan.recompute,
          sel.plan.activations, none.plan.activations);
    outcome_free(&none);
    outcome_free(&full);
    outcome_free(&sel);
    data_free(&d);
    pmap_model_destroy(m);
  }
}

/* A limit between the two plans: the stored steps are refused, the recomputed ones train under
 * it to the same bits as without any limit (the plan is what a step allocates). */
static void test_fits_only_recomputed(void) {
  pmap_model *m = gpt_model();
  data d;
  data_of(1, &d);
  outcome none, full, limited, refused;
  train(m, &d, 2, PMAP_RECOMPUTE_NONE, 0, 1, 0, &none);
  train(m, &d, 2, PMAP_RECOMPUTE_FULL, 0, 1, 0, &full);
  size_t limit = full.plan.total;
  CHECK(limit < none.plan.total, "plans %zu and %zu", full.plan.total, none.plan.total);
  train(m, &d, 2, PMAP_RECOMPUTE_FULL, 0, 1, limit, &limited);
  same_bits("under the recomputed plan's limit", &none, &limited);
  train(m, &d, 2, PMAP_RECOMPUTE_NONE, 0, 1, limit, &refused);
  CHECK(refused.st == PMAP_ERR_OUT_OF_MEMORY, "stored steps under %zu bytes: status %d", limit,
        (int)refused.st);
  outcome_free(&none);
  outcome_free(&full);
  outcome_free(&limited);
  outcome_free(&refused);
  data_free(&d);
  pmap_model_destroy(m);
}

/* PMAP_RECOMPUTE_AUTO: stored without a limit and under a limit the stored plan fits,
 * selective under one the selective plan fits and the stored one does not, recomputed in full
 * under one only the full plan fits; the plan gives every rung's bytes; the same bits. */
static void test_auto(void) {
  pmap_model *m = gpt_model();
  data d;
  data_of(1, &d);
  outcome none, full, sel, runs[4];
  /* Under a limit none reaches: the optimizer is then sharded as under the tight ones. */
  size_t huge = (size_t)1 << 50;
  train(m, &d, 2, PMAP_RECOMPUTE_NONE, 0, 1, huge, &none);
  train(m, &d, 2, PMAP_RECOMPUTE_FULL, 0, 1, huge, &full);
  train(m, &d, 2, PMAP_RECOMPUTE_SELECTIVE, 0, 1, huge, &sel);
  CHECK(full.plan.total < sel.plan.total && sel.plan.total < none.plan.total,
        "plans full %zu, selective %zu, stored %zu", full.plan.total, sel.plan.total,
        none.plan.total);
  const size_t limits[4] = {0, full.plan.total, sel.plan.total, none.plan.total};
  const int want[4] = {PMAP_RECOMPUTE_NONE, PMAP_RECOMPUTE_FULL, PMAP_RECOMPUTE_SELECTIVE,
                       PMAP_RECOMPUTE_NONE};
  for (int k = 0; k < 4; k++) {
    train(m, &d, 2, PMAP_RECOMPUTE_AUTO, 0, 1, limits[k], &runs[k]);
    const pmap_memory_plan *pl = &runs[k].plan;
    size_t act = want[k] == PMAP_RECOMPUTE_FULL        ? full.plan.activations
                 : want[k] == PMAP_RECOMPUTE_SELECTIVE ? sel.plan.activations
                                                       : none.plan.activations;
    same_bits("auto", &none, &runs[k]);
    CHECK(pl->recompute == want[k] && pl->activations == act,
          "auto run %d (limit %zu): recompute %d, activations %zu", k, limits[k], pl->recompute,
          pl->activations);
    CHECK(pl->activations_stored == none.plan.activations &&
              pl->activations_recomputed == full.plan.activations &&
              pl->activations_selective == sel.plan.activations,
          "auto run %d: the rungs' bytes %zu, %zu and %zu, want %zu, %zu and %zu", k,
          pl->activations_stored, pl->activations_recomputed, pl->activations_selective,
          none.plan.activations, full.plan.activations, sel.plan.activations);
    outcome_free(&runs[k]);
  }
  outcome_free(&none);
  outcome_free(&full);
  outcome_free(&sel);
  data_free(&d);
  pmap_model_destroy(m);
}

/* AUTO changes its choice as the plan changes: under a limit only the recomputed plan fits at
 * one micro-batch, and the stored one fits at two, the steps go recomputed, stored, recomputed
 * again, to the same bits as steps stored throughout with the same micro-batches. */
static void test_auto_switches(void) {
  pmap_model *m = gpt_model();
  data d;
  data_of(1, &d);
  outcome none, full, half;
  train(m, &d, 2, PMAP_RECOMPUTE_NONE, 0, 1, 0, &none);
  train(m, &d, 2, PMAP_RECOMPUTE_FULL, 0, 1, 0, &full);
  train(m, &d, 2, PMAP_RECOMPUTE_NONE, 0, 2, 0, &half);
  size_t limit = full.plan.total > half.plan.total ? full.plan.total : half.plan.total;
  CHECK(limit < none.plan.total, "no limit between the plans: %zu %zu %zu", full.plan.total,
        half.plan.total, none.plan.total);
  float *w[2] = {NULL, NULL};
  int seen[3] = {-1, -1, -1};
  for (int mode = 0; mode < 2; mode++) { /* 0: stored throughout, 1: auto under the limit */
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                       .num_devices = 2,
                       .recompute = mode ? PMAP_RECOMPUTE_AUTO : PMAP_RECOMPUTE_NONE,
                       .max_memory = mode ? limit : 0};
    pmap_ctx *ctx = NULL;
    pmap_params *p = NULL;
    pmap_optimizer opt = pmap_adam(1e-2f);
    CHECK_OK(pmap_ctx_create(&cfg, &ctx));
    CHECK_OK(pmap_params_create(ctx, m, &opt, 9, &p));
    for (int k = 0; k < STEPS && p; k++) {
      CHECK_OK(pmap_params_set_micro_batches(p, k == 1 ? 2 : 1));
      pmap_memory_plan plan;
      CHECK_OK(pmap_params_memory(p, BATCH, &plan));
      if (mode) seen[k] = plan.recompute;
      pmap_array x = rows(&d.xs, k), y = rows(&d.ys, k);
      CHECK_OK(pmap_update(p, &x, &y, NULL));
    }
    w[mode] = malloc(none.P * sizeof(float));
    if (p) CHECK_OK(pmap_params_read(p, 1, w[mode], none.P));
    pmap_params_destroy(p);
    CHECK_OK(pmap_ctx_destroy(ctx));
  }
  /* A recomputing rung at one micro-batch (full, or selective where that fits the limit: the
   * optimizer is sharded under it), stored at two, the same rung again at one. */
  CHECK((seen[0] == PMAP_RECOMPUTE_FULL || seen[0] == PMAP_RECOMPUTE_SELECTIVE) &&
            seen[1] == PMAP_RECOMPUTE_NONE && seen[2] == seen[0],
        "auto chose %d, %d, %d", seen[0], seen[1], seen[2]);
  CHECK(w[0] && w[1] && !memcmp(w[0], w[1], none.P * sizeof(float)),
        "auto's switches changed the trained parameters");
  free(w[0]), free(w[1]);
  outcome_free(&none);
  outcome_free(&full);
  outcome_free(&half);
  data_free(&d);
  pmap_model_destroy(m);
}

/* A prediction before any step under AUTO sizes the activations as the plan of its rows says
 * (recomputed, where only that fits the limit) instead of failing for memory; it and the steps
 * after it give the bits of a run stored throughout. */
static void predict_first(const pmap_model *m, const data *d, int recompute, size_t limit,
                          outcome *o) {
  memset(o, 0, sizeof *o);
  pmap_config cfg = {
      .backend = PMAP_BACKEND_CPU, .num_devices = 2, .recompute = recompute, .max_memory = limit};
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_adam(1e-2f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_params_create(ctx, m, &opt, 9, &p));
  if (!p) {
    pmap_ctx_destroy(ctx);
    return;
  }
  CHECK_OK(pmap_params_memory(p, BATCH, &o->plan));
  int rank = 0;
  int64_t shape[PMAP_MAX_RANK], oshape[PMAP_MAX_RANK + 1] = {BATCH};
  pmap_model_output_shape(m, &rank, shape);
  o->n_pred = BATCH;
  for (int k = 0; k < rank; k++) oshape[k + 1] = shape[k], o->n_pred *= (size_t)shape[k];
  o->pred = malloc(o->n_pred * sizeof *o->pred);
  pmap_array x0 = rows(&d->xs, 0), out = pmap_array_f32(o->pred, rank + 1, oshape);
  o->st = pmap_predict(p, &x0, &out);
  CHECK(!o->st, "a prediction before any step (recompute %d, limit %zu): %s", recompute, limit,
        pmap_last_error());
  for (int k = 0; k < STEPS && !o->st; k++) {
    pmap_array x = rows(&d->xs, k), y = rows(&d->ys, k);
    o->st = pmap_update(p, &x, &y, NULL);
  }
  o->P = pmap_params_count(p);
  o->w = malloc(o->P * sizeof *o->w);
  if (!o->st) CHECK_OK(pmap_params_read(p, 1, o->w, o->P));
  pmap_params_destroy(p);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

static void test_auto_predict_first(void) {
  pmap_model *m = gpt_model();
  data d;
  data_of(1, &d);
  outcome stored, full, tight;
  predict_first(m, &d, PMAP_RECOMPUTE_NONE, 0, &stored);
  predict_first(m, &d, PMAP_RECOMPUTE_FULL, 0, &full);
  predict_first(m, &d, PMAP_RECOMPUTE_AUTO, full.plan.total, &tight);
  CHECK(full.plan.total < stored.plan.total && tight.plan.recompute == PMAP_RECOMPUTE_FULL,
        "the limit %zu does not call for recomputation (stored plan %zu, auto chose %d)",
        full.plan.total, stored.plan.total, tight.plan.recompute);
  same_bits("auto, a prediction first", &stored, &tight);
  outcome_free(&stored);
  outcome_free(&full);
  outcome_free(&tight);
  data_free(&d);
  pmap_model_destroy(m);
}

static void test_bad_setting(void) {
  for (int bad = -1; bad <= 4; bad += 5) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1, .recompute = bad};
    pmap_ctx *ctx = NULL;
    char want[32];
    snprintf(want, sizeof want, "recompute %d", bad);
    CHECK_FAILS(pmap_ctx_create(&cfg, &ctx), PMAP_ERR_INVALID_ARGUMENT, want);
    CHECK(ctx == NULL, "a context was made");
  }
}

int main(void) {
  test_bad_setting();
  test_recomputed_same_bits();
  test_nothing_to_recompute();
  test_fits_only_recomputed();
  test_auto();
  test_auto_switches();
  test_auto_predict_first();
  return test_exit("recompute");
}
