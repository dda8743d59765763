/* test_blocks.c: the named parameter blocks. Every layer class of the table (models/layer.c) has
 * a unique checkpoint code and name and appears in a model below; every layer of those models
 * declares blocks that fill its weights, bias and state exactly, and the model's blocks tile the
 * flat vector in order, trained where the optimizer steps; pmap_params_read_named returns what
 * pmap_params_read holds at each block's offset, on every device; bad arguments are refused,
 * naming the values, with nothing written. */
#include "models/model.h"
#include "testutil.h"

typedef pmap_status (*build_fn)(pmap_model *m);

/* (6): every element-wise and per-feature kind, on rank 1. */
static pmap_status build_mlp(pmap_model *m) {
  pmap_status st = pmap_model_add_dense(m, 5);
  if (!st) st = pmap_model_add_relu(m);
  if (!st) st = pmap_model_add_dense(m, 4);
  if (!st) st = pmap_model_add_tanh(m);
  if (!st) st = pmap_model_add_sigmoid(m);
  if (!st) st = pmap_model_add_gelu(m);
  if (!st) st = pmap_model_add_layernorm(m);
  if (!st) st = pmap_model_add_dropout(m, 0.25f);
  if (!st) st = pmap_model_add_batchnorm(m, 1);
  if (!st) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_add_dense(m, 4);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_add_dense(m, 2);
  return st;
}

/* (2, 6, 6): the image kinds, a rank-3 layer norm and a per-channel batch norm. */
static pmap_status build_conv(pmap_model *m) {
  pmap_status st = pmap_model_add_conv2d(m, 3, 3, 2, 1, 1);
  if (!st) st = pmap_model_add_batchnorm(m, 0);
  if (!st) st = pmap_model_add_maxpool2d(m, 2, 2, 2);
  if (!st) st = pmap_model_add_layernorm(m);
  if (!st) st = pmap_model_add_avgpool2d(m, 1, 1, 1);
  if (!st) st = pmap_model_add_flatten(m);
  if (!st) st = pmap_model_add_dense(m, 3);
  if (!st) st = pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT);
  return st;
}

static pmap_status build_global_pool(pmap_model *m) {
  pmap_status st = pmap_model_add_conv2d(m, 4, 1, 1, 1, 0);
  if (!st) st = pmap_model_add_global_avgpool(m);
  if (!st) st = pmap_model_add_dense(m, 2);
  return st;
}

/* (8) token ids: the transformer kinds, with the head tied or not. */
static pmap_status build_gpt(pmap_model *m, int tied) {
  pmap_status st = pmap_model_add_embedding(m, 11, 6);
  if (!st) st = pmap_model_add_pos_embedding(m);
  if (!st) st = pmap_model_begin_residual(m);
  if (!st) st = pmap_model_add_token_layernorm(m);
  if (!st) st = pmap_model_add_causal_attention(m, 2, 3);
  if (!st) st = pmap_model_end_residual(m);
  if (!st) st = pmap_model_add_token_dense(m, 12);
  if (!st) st = pmap_model_add_gelu(m);
  if (!st) st = pmap_model_add_token_dense(m, 6);
  if (!st) st = pmap_model_add_lm_head(m, tied);
  return st;
}
static pmap_status build_gpt_tied(pmap_model *m) { return build_gpt(m, 1); }
static pmap_status build_gpt_untied(pmap_model *m) { return build_gpt(m, 0); }

static const struct {
  const char *name;
  int rank;
  int64_t in[3];
  build_fn build;
} cases[] = {
    {"mlp", 1, {6}, build_mlp},
    {"conv", 3, {2, 6, 6}, build_conv},
    {"global-pool", 3, {3, 4, 5}, build_global_pool},
    {"gpt-tied", 1, {8}, build_gpt_tied},
    {"gpt-untied", 1, {8}, build_gpt_untied},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

static pmap_model *make(int c) {
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(cases[c].rank, cases[c].in, &m));
  if (!m) return NULL;
  pmap_status st = cases[c].build(m);
  CHECK(st == PMAP_SUCCESS, "case %s: %s", cases[c].name, pmap_last_error());
  if (st) {
    pmap_model_destroy(m);
    return NULL;
  }
  return m;
}

/* Codes and names unique, every class in some case's model. */
static void check_classes(void) {
  int n = layer_class_count();
  CHECK(n >= 20, "the table holds %d layer classes", n);
  CHECK(layer_class_at(n) == NULL && layer_class_at(-1) == NULL, "past the table");
  for (int i = 0; i < n; i++) {
    const layer_class *a = layer_class_at(i);
    CHECK(a->name && a->name[0] && a->code != 0, "class %d: name %s, code %u", i,
          a->name ? a->name : "(null)", a->code);
    for (int j = 0; j < i; j++) {
      const layer_class *b = layer_class_at(j);
      CHECK(a->code != b->code, "classes %s and %s share the checkpoint code %u", a->name, b->name,
            a->code);
      CHECK(strcmp(a->name, b->name) != 0, "two classes are named %s", a->name);
    }
    int used = 0;
    for (int c = 0; c < N_CASES && !used; c++) {
      pmap_model *m = make(c);
      for (int k = 0; m && k < m->n_layers; k++) used |= m->layers[k].cls == a;
      pmap_model_destroy(m);
    }
    CHECK(used, "class %s (code %u) is in no model of tests/test_blocks.c: add one", a->name,
          a->code);
    printf("  class %-16s code %2u\n", a->name, a->code);
  }
}

static int in_table(const layer_class *cls) {
  for (int i = 0; i < layer_class_count(); i++)
    if (layer_class_at(i) == cls) return 1;
  return 0;
}

/* One layer's blocks against its sizes. */
static void check_layer(const char *what, const layer *l) {
  layer_block b[LAYER_MAX_BLOCKS];
  int n = layer_blocks(l, b);
  CHECK(in_table(l->cls),
        "%s: its class is not in the table: list it in its file's "
        "LAYER_FILE_CLASSES",
        what);
  size_t sum[3] = {0, 0, 0}, want[3] = {l->w_size, l->b_size, l->s_size};
  CHECK(n >= 0 && n <= LAYER_MAX_BLOCKS, "%s: %d blocks", what, n);
  for (int k = 0; k < n; k++) {
    CHECK(b[k].name && b[k].name[0], "%s: block %d has no name", what, k);
    CHECK(b[k].region == LAYER_WEIGHTS || b[k].region == LAYER_BIAS || b[k].region == LAYER_STATE,
          "%s: block %s region %d", what, b[k].name, (int)b[k].region);
    CHECK(b[k].rank >= 1 && b[k].rank <= PMAP_MAX_RANK, "%s: block %s rank %d", what, b[k].name,
          b[k].rank);
    for (int a = 0; a < b[k].rank; a++)
      CHECK(b[k].shape[a] > 0, "%s: block %s extent %d is %lld", what, b[k].name, a,
            (long long)b[k].shape[a]);
    for (int j = 0; j < k; j++)
      CHECK(strcmp(b[j].name, b[k].name) != 0, "%s: two blocks named %s", what, b[k].name);
    if ((int)b[k].region >= 0 && (int)b[k].region < 3) sum[b[k].region] += b[k].count;
  }
  const char *region[3] = {"weights", "bias", "state"};
  for (int r = 0; r < 3; r++)
    CHECK(sum[r] == want[r], "%s: blocks of its %s sum to %zu, the layer holds %zu", what,
          region[r], sum[r], want[r]);
}

/* The model's blocks tile the flat vector in order; trained blocks are the trained spans. */
static void check_model(const char *name, const pmap_model *m) {
  char what[96];
  for (int i = 0; i < m->n_layers; i++) {
    snprintf(what, sizeof what, "%s layer %d (%s)", name, i, m->layers[i].cls->name);
    check_layer(what, &m->layers[i]);
  }
  size_t n = pmap_model_num_param_blocks(m), at = 0;
  CHECK(n > 0, "%s: no blocks", name);
  model_span *spans = calloc((size_t)m->n_layers + 1, sizeof *spans);
  unsigned char *trained = calloc(m->n_params + 1, 1);
  int n_spans = model_trained_spans(m, spans);
  for (int s = 0; s < n_spans; s++) memset(trained + spans[s].off, 1, spans[s].len);
  for (size_t k = 0; k < n; k++) {
    pmap_param_block b;
    CHECK_OK(pmap_model_param_block(m, k, &b));
    CHECK(b.offset == at, "%s: block %s at %zu, want %zu (the blocks in the vector's order)", name,
          b.name, b.offset, at);
    size_t count = 1;
    for (int a = 0; a < b.rank; a++) count *= (size_t)b.shape[a];
    for (int a = b.rank; a < PMAP_MAX_RANK; a++)
      CHECK(b.shape[a] == 0, "%s: %s axis %d is %lld", name, b.name, a, (long long)b.shape[a]);
    CHECK(b.count == count, "%s: %s count %zu, shape says %zu", name, b.name, b.count, count);
    CHECK(
        b.layer >= 0 && b.layer < m->n_layers && strcmp(b.kind, m->layers[b.layer].cls->name) == 0,
        "%s: %s of layer %d kind %s", name, b.name, b.layer, b.kind);
    char want[PMAP_BLOCK_NAME_MAX];
    snprintf(want, sizeof want, "%d.%s.%s", b.layer, b.kind, b.block);
    CHECK(strcmp(b.name, want) == 0 && strlen(b.name) < PMAP_BLOCK_NAME_MAX - 1,
          "%s: name %s, want %s", name, b.name, want);
    for (size_t e = 0; e < b.count && b.offset + e < m->n_params; e++)
      if (trained[b.offset + e] != b.trained) {
        CHECK(0, "%s: %s says trained %d, element %zu of it is %s", name, b.name, b.trained, e,
              trained[b.offset + e] ? "trained" : "state");
        break;
      }
    pmap_param_block f;
    CHECK_OK(pmap_model_find_param_block(m, b.name, &f));
    CHECK(memcmp(&f, &b, sizeof f) == 0, "%s: found %s is not block %zu", name, b.name, k);
    at += b.count;
  }
  CHECK(at == m->n_params, "%s: the blocks cover %zu of %zu parameters", name, at, m->n_params);
  free(spans);
  free(trained);
}

/* Named reads against the flat read at the offsets, on both devices, with distinct values. */
static void check_reads(const char *name, const pmap_model *m, pmap_ctx *ctx) {
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, &opt, 3, &p));
  if (!p) return;
  size_t P = pmap_params_count(p);
  float *w = malloc(P * sizeof *w), *flat = malloc(P * sizeof *flat);
  float *got = malloc(P * sizeof *got);
  for (size_t j = 0; j < P; j++) w[j] = 0.5f * (float)j - 7.0f;
  CHECK_OK(pmap_params_write(p, w, P));
  for (int d = 0; d < pmap_ctx_num_devices(ctx); d++) {
    CHECK_OK(pmap_params_read(p, d, flat, P));
    CHECK(memcmp(flat, w, P * sizeof *w) == 0, "%s: device %d does not hold what was written", name,
          d);
    for (size_t k = 0; k < pmap_model_num_param_blocks(m); k++) {
      pmap_param_block b;
      CHECK_OK(pmap_model_param_block(m, k, &b));
      memset(got, 0xff, b.count * sizeof *got);
      CHECK_OK(pmap_params_read_named(p, d, b.name, got, b.count));
      CHECK(memcmp(got, flat + b.offset, b.count * sizeof *got) == 0,
            "%s: device %d block %s differs from pmap_params_read at %zu", name, d, b.name,
            b.offset);
    }
  }
  free(w);
  free(flat);
  free(got);
  pmap_params_destroy(p);
}

/* A dense layer computes x W + b with the blocks its names give. */
static void check_meaning(pmap_ctx *ctx) {
  int64_t in[1] = {3};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_dense(m, 2));
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, &opt, 5, &p));
  float w[6], b[2] = {0.25f, -0.5f}, x[2][3] = {{1, 2, 3}, {-1, 0.5f, 2}}, y[2][2];
  float flat[8];
  CHECK_OK(pmap_params_read(p, 0, flat, 8));
  for (int j = 0; j < 8; j++) flat[j] = j < 6 ? 0.125f * (float)(j + 1) : b[j - 6];
  CHECK_OK(pmap_params_write(p, flat, 8));
  CHECK_OK(pmap_params_read_named(p, 1, "0.dense.w", w, 6));
  float bias[2];
  CHECK_OK(pmap_params_read_named(p, 1, "0.dense.b", bias, 2));
  int64_t xs_shape[2] = {2, 3}, ys_shape[2] = {2, 2};
  pmap_array xs = pmap_array_f32(&x[0][0], 2, xs_shape), ys = pmap_array_f32(&y[0][0], 2, ys_shape);
  CHECK_OK(pmap_predict(p, &xs, &ys));
  for (int r = 0; r < 2; r++)
    for (int u = 0; u < 2; u++) {
      double want = bias[u];
      for (int f = 0; f < 3; f++) want += (double)x[r][f] * w[f * 2 + u]; /* W (F, units) */
      CHECK(fabs(y[r][u] - want) < 1e-5, "dense row %d unit %d: %g, x W + b from the blocks %g", r,
            u, (double)y[r][u], want);
    }
  pmap_params_destroy(p);
  pmap_model_destroy(m);
}

static pmap_status no_grad(const pmap_grad_args *args, void *user) {
  (void)args, (void)user;
  return PMAP_SUCCESS;
}

static int unchanged(const void *a, unsigned char fill, size_t n) {
  const unsigned char *c = a;
  for (size_t i = 0; i < n; i++)
    if (c[i] != fill) return 0;
  return 1;
}

static void check_refusals(pmap_ctx *ctx) {
  pmap_model *m = NULL;
  int64_t in[1] = {6};
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(build_mlp(m));
  size_t n = pmap_model_num_param_blocks(m);
  pmap_param_block b;
  char why[64];
  memset(&b, 0xab, sizeof b);
  CHECK(pmap_model_num_param_blocks(NULL) == 0, "blocks of NULL");
  CHECK_FAILS(pmap_model_param_block(NULL, 0, &b), PMAP_ERR_INVALID_ARGUMENT, "model is NULL");
  CHECK_FAILS(pmap_model_param_block(m, 0, NULL), PMAP_ERR_INVALID_ARGUMENT, "out is NULL");
  snprintf(why, sizeof why, "index %zu is outside [0, %zu)", n, n);
  CHECK_FAILS(pmap_model_param_block(m, n, &b), PMAP_ERR_INVALID_ARGUMENT, why);
  CHECK_FAILS(pmap_model_param_block(m, (size_t)-1, &b), PMAP_ERR_INVALID_ARGUMENT, "outside");
  CHECK_FAILS(pmap_model_find_param_block(NULL, "0.dense.w", &b), PMAP_ERR_INVALID_ARGUMENT,
              "model is NULL");
  CHECK_FAILS(pmap_model_find_param_block(m, NULL, &b), PMAP_ERR_INVALID_ARGUMENT, "name is NULL");
  CHECK_FAILS(pmap_model_find_param_block(m, "0.dense.w", NULL), PMAP_ERR_INVALID_ARGUMENT,
              "out is NULL");
  CHECK_FAILS(pmap_model_find_param_block(m, "1.relu.w", &b), PMAP_ERR_INVALID_ARGUMENT,
              "\"1.relu.w\" (layer 1 is relu, with no blocks)");
  CHECK_FAILS(pmap_model_find_param_block(m, "0.dense.weight", &b), PMAP_ERR_INVALID_ARGUMENT,
              "layer 0 is dense, with the blocks 0.dense.w, 0.dense.b");
  CHECK_FAILS(pmap_model_find_param_block(m, "", &b), PMAP_ERR_INVALID_ARGUMENT,
              "the model has 14: 0.dense.w, 0.dense.b, 2.dense.w, 2.dense.b, ...");
  CHECK_FAILS(pmap_model_find_param_block(m, "99.dense.w", &b), PMAP_ERR_INVALID_ARGUMENT,
              "no parameter block \"99.dense.w\"");
  CHECK(unchanged(&b, 0xab, sizeof b), "a refused call wrote *out");

  pmap_optimizer opt = pmap_adam(1e-3f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, &opt, 0, &p));
  float dst[32];
  memset(dst, 0xab, sizeof dst);
  const char *rv = "8.batchnorm.running_var";
  CHECK_FAILS(pmap_params_read_named(NULL, 0, rv, dst, 2), PMAP_ERR_INVALID_ARGUMENT,
              "params is NULL");
  CHECK_FAILS(pmap_params_read_named(p, 0, NULL, dst, 2), PMAP_ERR_INVALID_ARGUMENT,
              "name is NULL");
  CHECK_FAILS(pmap_params_read_named(p, 0, rv, NULL, 2), PMAP_ERR_INVALID_ARGUMENT, "dst is NULL");
  CHECK_FAILS(pmap_params_read_named(p, -1, rv, dst, 4), PMAP_ERR_INVALID_ARGUMENT,
              "device -1 is outside [0, 2)");
  CHECK_FAILS(pmap_params_read_named(p, 2, rv, dst, 4), PMAP_ERR_INVALID_ARGUMENT,
              "device 2 is outside [0, 2)");
  CHECK_FAILS(pmap_params_read_named(p, 0, "8.batchnorm.running", dst, 4),
              PMAP_ERR_INVALID_ARGUMENT, "8.batchnorm.gamma, 8.batchnorm.beta");
  CHECK_FAILS(pmap_params_read_named(p, 0, rv, dst, 5), PMAP_ERR_INVALID_ARGUMENT,
              "count 5 is not the 4 elements of 8.batchnorm.running_var (4)");
  CHECK_FAILS(pmap_params_read_named(p, 0, "0.dense.w", dst, 31), PMAP_ERR_INVALID_ARGUMENT,
              "count 31 is not the 30 elements of 0.dense.w (6, 5)");
  CHECK_FAILS(pmap_params_read_named(p, 0, "0.dense.w", dst, 0), PMAP_ERR_INVALID_ARGUMENT,
              "count 0");
  char long_name[300];
  memset(long_name, 'x', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = 0;
  CHECK_FAILS(pmap_params_read_named(p, 0, long_name, dst, 4), PMAP_ERR_INVALID_ARGUMENT,
              "xxx...\" (the model has 14");
  CHECK(unchanged(dst, 0xab, sizeof dst), "a refused read wrote dst");
  CHECK_OK(pmap_params_read_named(p, 1, rv, dst, 4));
  for (int j = 0; j < 4; j++)
    CHECK(dst[j] == 1.0f, "running_var[%d] starts at %g", j, (double)dst[j]);
  pmap_params_destroy(p);
  pmap_model_destroy(m);

  float init[3] = {1, 2, 3};
  pmap_params *custom = NULL;
  opt = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_params_create_custom(ctx, 3, init, no_grad, NULL, &opt, &custom));
  if (custom) {
    memset(dst, 0xab, sizeof dst);
    CHECK_FAILS(pmap_params_read_named(custom, 0, "0.dense.w", dst, 3), PMAP_ERR_INVALID_ARGUMENT,
                "have no named blocks");
    CHECK(unchanged(dst, 0xab, sizeof dst), "a refused read wrote dst");
    pmap_params_destroy(custom);
  }
}

int main(void) {
  check_classes();
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  for (int c = 0; c < N_CASES && ctx; c++) {
    pmap_model *m = make(c);
    if (!m) continue;
    check_model(cases[c].name, m);
    check_reads(cases[c].name, m, ctx);
    printf("  %-12s %2d layers, %2zu blocks, %zu parameters\n", cases[c].name, m->n_layers,
           pmap_model_num_param_blocks(m), m->n_params);
    pmap_model_destroy(m);
  }
  if (ctx) {
    check_meaning(ctx);
    check_refusals(ctx);
  }
  pmap_ctx_destroy(ctx);
  return test_exit("test_blocks");
}
