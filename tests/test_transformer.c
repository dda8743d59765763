/* test_transformer.c: the transformer layers in whole models on CPU virtual devices: the
 * gradient of a training step against finite differences of the model's per-token loss (tied
 * and untied heads, two heads of attention); the causal mask (changing a later token changes no
 * earlier logit); token ids and targets checked at the boundary with nothing changed (an f32
 * xs, ids and targets out of range, the wrong target shape); the builders' refusals; the same
 * bits on every run and identical replicas on 3 devices. */
#include "pmap_examples.h"
#include "testutil.h"

#define V 11
#define T 5
#define D 8

static pmap_status build(int tied, pmap_model **out) {
  pmap_gpt_config c = {.vocab = V, .context = T, .width = D, .depth = 1, .heads = 2, .tied = tied};
  return pmap_gpt_model(&c, out);
}

/* rows of random ids (xs) and their targets (ys). */
static void token_data(int64_t rows, uint64_t seed, pmap_array *xs, pmap_array *ys) {
  int32_t *x = malloc((size_t)(rows * T) * sizeof *x), *y = malloc((size_t)(rows * T) * sizeof *y);
  for (int64_t i = 0; i < rows * T; i++) {
    x[i] = (int32_t)(test_rand_u64(&seed) % V);
    y[i] = (int32_t)(test_rand_u64(&seed) % V);
  }
  *xs = (pmap_array){x, PMAP_I32, 2, {rows, T, 0, 0}};
  *ys = (pmap_array){y, PMAP_I32, 2, {rows, T, 0, 0}};
}

typedef struct run {
  pmap_ctx *ctx;
  pmap_params *params;
} run;

static int run_open(run *r, pmap_model *m, int devices, const pmap_optimizer *opt) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  memset(r, 0, sizeof *r);
  if (pmap_ctx_create(&cfg, &r->ctx) || pmap_params_create(r->ctx, m, opt, 5, &r->params)) {
    fprintf(stderr, "FAIL setting up %d devices: %s\n", devices, pmap_last_error());
    test_failures++;
    pmap_ctx_destroy(r->ctx);
    return 0;
  }
  return 1;
}

static void run_close(run *r) {
  pmap_params_destroy(r->params);
  pmap_ctx_destroy(r->ctx);
}

static float *read_params(run *r, int device) {
  size_t p = pmap_params_count(r->params);
  float *w = malloc(p * sizeof *w);
  CHECK_OK(pmap_params_read(r->params, device, w, p));
  return w;
}

/* The mean per-token cross-entropy of the predicted logits, in double. */
static double token_loss(run *r, const pmap_array *xs, const pmap_array *ys, float *logits) {
  int64_t rows = xs->shape[0];
  pmap_array o = {logits, PMAP_F32, 3, {rows, T, V, 0}};
  CHECK_OK(pmap_predict(r->params, xs, &o));
  const int32_t *y = ys->data;
  double s = 0.0;
  for (int64_t t = 0; t < rows * T; t++) {
    const float *z = logits + t * V;
    double mx = z[0], se = 0.0;
    for (int k = 1; k < V; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < V; k++) se += exp(z[k] - mx);
    s += log(se) + mx - z[y[t]];
  }
  return s / (double)(rows * T);
}

/* One SGD step of lr 1 on 2 devices moves the parameters by minus the gradient; central
 * differences of the predicted loss must agree at sampled parameters (and at every one of the
 * first 40: the token table, used twice when tied). */
static void model_gradient(int tied) {
  pmap_model *m = NULL;
  CHECK_OK(build(tied, &m));
  if (!m) return;
  pmap_array xs, ys;
  token_data(6, 3, &xs, &ys);
  pmap_optimizer opt = pmap_sgd(1.0f, 0.0f);
  run r;
  if (!run_open(&r, m, 2, &opt)) return;
  size_t p = pmap_params_count(r.params);
  float *w0 = read_params(&r, 0), *w = malloc(p * sizeof *w);
  float *logits = malloc((size_t)(6 * T * V) * sizeof *logits);
  float loss;
  CHECK_OK(pmap_update(r.params, &xs, &ys, &loss));
  float *w1 = read_params(&r, 0);
  enum { SAMPLES = 120 };
  float got[SAMPLES];
  /* The layer norm behind the embedding divides by the spread of its input (0.02 at the
   * start), so the loss curves on the scale of that spread: h / 2 = 2e-3 with Richardson's
   * extrapolation. */
  double want[SAMPLES], h = 4e-3;
  uint64_t s = 17;
  for (int j = 0; j < SAMPLES; j++) {
    size_t i = j < 40 ? (size_t)j : (size_t)(test_rand_u64(&s) % p);
    double d[2];
    for (int k = 0; k < 2; k++) { /* central differences at h and h / 2 */
      float up = w0[i] + (float)(h / (1 + k)), down = w0[i] - (float)(h / (1 + k));
      memcpy(w, w0, p * sizeof *w);
      w[i] = up;
      CHECK_OK(pmap_params_write(r.params, w, p));
      double lp = token_loss(&r, &xs, &ys, logits);
      w[i] = down;
      CHECK_OK(pmap_params_write(r.params, w, p));
      double lm = token_loss(&r, &xs, &ys, logits);
      d[k] = (lp - lm) / ((double)up - (double)down);
    }
    want[j] = (4.0 * d[1] - d[0]) / 3.0; /* Richardson: the h^2 terms cancel */
    got[j] = w0[i] - w1[i];
  }
  char what[96];
  snprintf(what, sizeof what, "%s head: gradient of a step vs finite differences",
           tied ? "tied" : "untied");
  test_close(what, got, want, SAMPLES, 2e-3);
  free(w0), free(w1), free(w), free(logits), free(xs.data), free(ys.data);
  run_close(&r);
  pmap_model_destroy(m);
}

/* Logits at positions before t do not move when the token at t changes. */
static void causal_mask(void) {
  pmap_model *m = NULL;
  CHECK_OK(build(1, &m));
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  run r;
  if (!m || !run_open(&r, m, 1, &opt)) return;
  pmap_array xs, ys;
  token_data(2, 9, &xs, &ys);
  float a[2 * T * V], b[2 * T * V];
  pmap_array oa = {a, PMAP_F32, 3, {2, T, V, 0}}, ob = {b, PMAP_F32, 3, {2, T, V, 0}};
  CHECK_OK(pmap_predict(r.params, &xs, &oa));
  int32_t *x = xs.data;
  x[3] = (x[3] + 1) % V; /* example 0, position 3 */
  CHECK_OK(pmap_predict(r.params, &xs, &ob));
  test_same_bits("logits before the changed token", a, b, 3 * V);
  test_same_bits("the other example's logits", a + T * V, b + T * V, T * V);
  int moved = 0;
  for (int i = 3 * V; i < T * V; i++) moved |= a[i] != b[i];
  CHECK(moved, "the logits at and after the changed token did not change");
  free(xs.data), free(ys.data);
  run_close(&r);
  pmap_model_destroy(m);
}

/* Bad token ids and targets: refused, naming the value and its place, with nothing changed. */
static void boundary(void) {
  pmap_model *m = NULL;
  CHECK_OK(build(1, &m));
  pmap_optimizer opt = pmap_adam(0.01f);
  run r;
  if (!m || !run_open(&r, m, 2, &opt)) return;
  pmap_array xs, ys;
  token_data(4, 5, &xs, &ys);
  float loss = 0.0f;
  CHECK_OK(pmap_update(r.params, &xs, &ys, &loss));
  float *before = read_params(&r, 0);
  int32_t *x = xs.data, *y = ys.data;
  x[T + 2] = V;
  CHECK_FAILS(pmap_update(r.params, &xs, &ys, &loss), PMAP_ERR_INVALID_ARGUMENT,
              "token id 11 at example 1 position 2 is outside [0, 11)");
  float out[4 * T * V];
  pmap_array o = {out, PMAP_F32, 3, {4, T, V, 0}};
  CHECK_FAILS(pmap_predict(r.params, &xs, &o), PMAP_ERR_INVALID_ARGUMENT, "token id 11");
  /* An out of the right size but the wrong shape is refused naming the shape it must have. */
  pmap_array flat_out = {out, PMAP_F32, 2, {4, T * V, 0, 0}};
  x[T + 2] = 1;
  CHECK_FAILS(pmap_predict(r.params, &xs, &flat_out), PMAP_ERR_INVALID_ARGUMENT,
              "out must be f32 (4, 5, 11)");
  x[T + 2] = -3;
  CHECK_FAILS(pmap_update(r.params, &xs, &ys, &loss), PMAP_ERR_INVALID_ARGUMENT, "token id -3");
  x[T + 2] = 0;
  y[3 * T + 4] = V;
  CHECK_FAILS(pmap_update(r.params, &xs, &ys, &loss), PMAP_ERR_INVALID_ARGUMENT,
              "target 11 at example 3 position 4");
  y[3 * T + 4] = 0;
  pmap_array flat = ys;
  flat.rank = 1;
  flat.shape[1] = 0;
  CHECK_FAILS(pmap_update(r.params, &xs, &flat, &loss), PMAP_ERR_INVALID_ARGUMENT,
              "i32 targets of shape (4, 5)");
  float fx[4 * T] = {0};
  pmap_array xf = {fx, PMAP_F32, 2, {4, T, 0, 0}};
  CHECK_FAILS(pmap_update(r.params, &xf, &ys, &loss), PMAP_ERR_INVALID_ARGUMENT,
              "xs must be i32 token ids");
  float *after = read_params(&r, 0);
  test_same_bits("parameters after refused calls", before, after, pmap_params_count(r.params));
  CHECK(pmap_params_step(r.params) == 1, "step %lld after refused calls",
        (long long)pmap_params_step(r.params));
  free(before), free(after), free(xs.data), free(ys.data);
  run_close(&r);
  pmap_model_destroy(m);
}

static void builders(void) {
  int64_t in1[1] = {T}, in3[3] = {1, 4, 4};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, in1, &m));
  CHECK_FAILS(pmap_model_add_causal_attention(m, 2, 4), PMAP_ERR_INVALID_ARGUMENT, "(T, D)");
  CHECK_FAILS(pmap_model_add_lm_head(m, 1), PMAP_ERR_INVALID_ARGUMENT, "token embedding");
  CHECK_FAILS(pmap_model_add_embedding(m, 0, 8), PMAP_ERR_INVALID_ARGUMENT, "vocab 0");
  CHECK_OK(pmap_model_add_embedding(m, V, D));
  CHECK_FAILS(pmap_model_add_embedding(m, V, D), PMAP_ERR_INVALID_ARGUMENT, "first layer");
  CHECK_FAILS(pmap_model_add_causal_attention(m, 0, 4), PMAP_ERR_INVALID_ARGUMENT, "heads 0");
  CHECK_OK(pmap_model_add_token_dense(m, 6));
  CHECK_FAILS(pmap_model_add_lm_head(m, 1), PMAP_ERR_INVALID_ARGUMENT, "token embedding's width");
  CHECK_FAILS(pmap_model_add_lm_head(m, 2), PMAP_ERR_INVALID_ARGUMENT, "tied is 2");
  CHECK_OK(pmap_model_add_lm_head(m, 0));
  int rank;
  int64_t shape[PMAP_MAX_RANK];
  pmap_model_output_shape(m, &rank, shape);
  CHECK(rank == 2 && shape[0] == T && shape[1] == V, "lm_head output rank %d (%lld, %lld)", rank,
        (long long)shape[0], (long long)shape[1]);
  pmap_model_destroy(m);
  CHECK_OK(pmap_model_create(3, in3, &m));
  CHECK_FAILS(pmap_model_add_embedding(m, V, D), PMAP_ERR_INVALID_ARGUMENT, "input rank 3");
  CHECK_FAILS(pmap_model_add_pos_embedding(m), PMAP_ERR_INVALID_ARGUMENT, "(T, D)");
  CHECK_FAILS(pmap_model_add_token_layernorm(m), PMAP_ERR_INVALID_ARGUMENT, "(T, F)");
  pmap_model_destroy(m);
  pmap_gpt_config c = pmap_gpt_mini();
  c.heads = 3;
  CHECK_FAILS(pmap_gpt_model(&c, &m), PMAP_ERR_INVALID_ARGUMENT, "multiple of heads 3");
  CHECK_FAILS(pmap_gpt_model(NULL, &m), PMAP_ERR_INVALID_ARGUMENT, "config is NULL");
  /* A builder's refusal inside it is reported under pmap_gpt_model's name. */
  c = pmap_gpt_mini();
  c.vocab = 0;
  CHECK_FAILS(pmap_gpt_model(&c, &m), PMAP_ERR_INVALID_ARGUMENT, "vocab 0");
  CHECK(!strncmp(pmap_last_error(), "pmap_gpt_model: ", 16), "message \"%s\"", pmap_last_error());
}

/* Two runs of 5 steps on 3 devices: the same bits, and every replica holds them. */
static void reproducible(void) {
  float *w[2] = {NULL, NULL};
  size_t p = 0;
  for (int k = 0; k < 2; k++) {
    pmap_model *m = NULL;
    CHECK_OK(build(1, &m));
    pmap_optimizer opt = pmap_adam(0.01f);
    run r;
    if (!m || !run_open(&r, m, 3, &opt)) return;
    pmap_array xs, ys;
    token_data(6, 21, &xs, &ys);
    for (int s = 0; s < 5; s++) CHECK_OK(pmap_update(r.params, &xs, &ys, NULL));
    p = pmap_params_count(r.params);
    w[k] = read_params(&r, 0);
    float *w2 = read_params(&r, 2);
    test_same_bits("replicas 0 and 2", w[k], w2, p);
    free(w2), free(xs.data), free(ys.data);
    run_close(&r);
    pmap_model_destroy(m);
  }
  test_same_bits("two runs", w[0], w[1], p);
  free(w[0]), free(w[1]);
}

int main(void) {
  builders();
  model_gradient(1);
  model_gradient(0);
  causal_mask();
  boundary();
  reproducible();
  return test_exit("transformer");
}
