/* examples.c: the example models and their deterministic synthetic data (see pmap_examples.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pmap_examples.h"
#include "rng.h"
#include "base/error.h"

#define NAMES "linear, mlp, convnet, mlp-1024, cifar-cnn, res-mlp, cifar-bn, gpt-mini"
#define TEACHER_SEED 0x7eac4e2ull
#define MLP_TEACHER_UNITS 16

typedef enum {
  EX_LINEAR,
  EX_MLP,
  EX_CONVNET,
  EX_MLP1024,
  EX_CIFAR,
  EX_RESMLP,
  EX_CIFAR_BN,
  EX_GPT_MINI
} example_id;

static const char *const names[] = {"linear",    "mlp",     "convnet",  "mlp-1024",
                                    "cifar-cnn", "res-mlp", "cifar-bn", "gpt-mini"};

static pmap_status find(const char *name, example_id *id, const char *call) {
  for (int i = 0; name && i < (int)(sizeof names / sizeof *names); i++)
    if (strcmp(name, names[i]) == 0) {
      *id = (example_id)i;
      return PMAP_SUCCESS;
    }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: unknown model \"%s\" (expected one of: " NAMES ")", call,
                  name ? name : "(null)");
}

pmap_status pmap_example_info_get(const char *name, pmap_example_info *out) {
  example_id id = EX_LINEAR;
  PMAP_TRY(find(name, &id, "pmap_example_info_get"));
  if (!out) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_example_info_get: out is NULL");
  pmap_example_info i = {names[id], 0, 0, 0, pmap_sgd(0.005f, 0.0f)};
  switch (id) {
  case EX_LINEAR: i.steps = 1000, i.batch = 128, i.samples = 128; break;
  case EX_MLP: i.steps = 1000, i.batch = 256, i.samples = 1024, i.opt = pmap_adam(0.001f); break;
  case EX_CONVNET: i.steps = 200, i.batch = 16, i.samples = 256, i.opt = pmap_adam(0.001f); break;
  case EX_MLP1024:
    i.steps = 20, i.batch = 512, i.samples = 512, i.opt = pmap_sgd(0.01f, 0.9f);
    break;
  case EX_CIFAR: i.steps = 100, i.batch = 64, i.samples = 512, i.opt = pmap_sgd(0.01f, 0.9f); break;
  case EX_RESMLP: i.steps = 500, i.batch = 256, i.samples = 1024, i.opt = pmap_adam(0.001f); break;
  case EX_CIFAR_BN:
    i.steps = 100, i.batch = 64, i.samples = 512, i.opt = pmap_sgd(0.05f, 0.9f);
    break;
  case EX_GPT_MINI: i.steps = 150, i.batch = 32, i.samples = 2048, i.opt = pmap_adam(0.003f); break;
  }
  *out = i;
  return PMAP_SUCCESS;
}

pmap_status pmap_example_model(const char *name, pmap_model **out) {
  example_id id = EX_LINEAR;
  PMAP_TRY(find(name, &id, "pmap_example_model"));
  if (!out) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_example_model: out is NULL");
  pmap_model *m = NULL;
  pmap_status st = PMAP_SUCCESS;
  switch (id) {
  case EX_LINEAR: {
    int64_t in[1] = {1};
    PMAP_TRY_GOTO(st, pmap_model_create(1, in, &m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 1), fail);
    break;
  }
  case EX_MLP: {
    int64_t in[1] = {10};
    PMAP_TRY_GOTO(st, pmap_model_create(1, in, &m), fail);
    for (int i = 0; i < 2; i++) {
      PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 32), fail);
      PMAP_TRY_GOTO(st, pmap_model_add_relu(m), fail);
    }
    PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 1), fail);
    break;
  }
  case EX_CONVNET: {
    int64_t in[3] = {1, 32, 32};
    PMAP_TRY_GOTO(st, pmap_model_create(3, in, &m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_conv2d(m, 1, 3, 3, 1, 1), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_flatten(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 2), fail);
    PMAP_TRY_GOTO(st, pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT), fail);
    break;
  }
  case EX_MLP1024: {
    int64_t in[1] = {1024};
    PMAP_TRY_GOTO(st, pmap_model_create(1, in, &m), fail);
    for (int i = 0; i < 3; i++) {
      PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 1024), fail);
      PMAP_TRY_GOTO(st, pmap_model_add_relu(m), fail);
    }
    PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 10), fail);
    PMAP_TRY_GOTO(st, pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT), fail);
    break;
  }
  case EX_CIFAR: {
    /* (3, 32, 32) -> (16, 32, 32) -> (32, 16, 16) -> (32, 7, 7) -> 10 */
    static const int conv[3][3] = {{16, 1, 1}, {32, 2, 1}, {32, 2, 0}}; /* channels, stride, pad */
    int64_t in[3] = {3, 32, 32};
    PMAP_TRY_GOTO(st, pmap_model_create(3, in, &m), fail);
    for (int i = 0; i < 3; i++) {
      PMAP_TRY_GOTO(st, pmap_model_add_conv2d(m, conv[i][0], 3, 3, conv[i][1], conv[i][2]), fail);
      PMAP_TRY_GOTO(st, pmap_model_add_relu(m), fail);
    }
    PMAP_TRY_GOTO(st, pmap_model_add_flatten(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 10), fail);
    PMAP_TRY_GOTO(st, pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT), fail);
    break;
  }
  case EX_RESMLP: {
    /* 10 -> 32, two pre-norm blocks x + W2 gelu(W1 layernorm(x)), layernorm -> 1 */
    int64_t in[1] = {10};
    PMAP_TRY_GOTO(st, pmap_model_create(1, in, &m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 32), fail);
    for (int i = 0; i < 2; i++) {
      PMAP_TRY_GOTO(st, pmap_model_begin_residual(m), fail);
      PMAP_TRY_GOTO(st, pmap_model_add_layernorm(m), fail);
      PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 64), fail);
      PMAP_TRY_GOTO(st, pmap_model_add_gelu(m), fail);
      PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 32), fail);
      PMAP_TRY_GOTO(st, pmap_model_end_residual(m), fail);
    }
    PMAP_TRY_GOTO(st, pmap_model_add_layernorm(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 1), fail);
    break;
  }
  case EX_CIFAR_BN: {
    /* (3, 32, 32) -> conv 16 -> BN -> ReLU -> maxpool 2 -> (16, 16, 16) -> conv 32 -> BN ->
     * ReLU -> average pool 2 -> (32, 8, 8) -> 10; batch norm across replicas. (A global average
     * pool here would average away the phase of the class's plane wave.) */
    int64_t in[3] = {3, 32, 32};
    PMAP_TRY_GOTO(st, pmap_model_create(3, in, &m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_conv2d(m, 16, 3, 3, 1, 1), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_batchnorm(m, 1), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_relu(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_maxpool2d(m, 2, 2, 2), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_conv2d(m, 32, 3, 3, 1, 1), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_batchnorm(m, 1), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_relu(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_avgpool2d(m, 2, 2, 2), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_flatten(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_dense(m, 10), fail);
    PMAP_TRY_GOTO(st, pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT), fail);
    break;
  }
  case EX_GPT_MINI: {
    pmap_gpt_config c = pmap_gpt_mini();
    return pmap_gpt_model(&c, out);
  }
  }
  *out = m;
  return PMAP_SUCCESS;
fail:
  pmap_model_destroy(m);
  return st;
}

void pmap_example_data_free(pmap_array *xs, pmap_array *ys) {
  if (xs) {
    free(xs->data);
    xs->data = NULL;
  }
  if (ys) {
    free(ys->data);
    ys->data = NULL;
  }
}

/* The mlp's target: a fixed random one-hidden-layer tanh network of the 10 inputs. */
static double mlp_teacher(const float *x) {
  pmap_rng t = pmap_rng_seed(TEACHER_SEED);
  double y = 0.0;
  for (int u = 0; u < MLP_TEACHER_UNITS; u++) {
    double s = 0.0;
    for (int j = 0; j < 10; j++) s += pmap_rng_normal(&t) * x[j];
    y += pmap_rng_normal(&t) * tanh(s / sqrt(10.0)) / sqrt((double)MLP_TEACHER_UNITS) * 2.0;
  }
  return y;
}

/* The cifar-cnn class signal at pixel p of (3, 32, 32): a plane wave whose frequencies and phase
 * depend on the class and the channel, so that 3x3 convolutions pick the class out of the noise. */
static double cifar_pattern(int label, int p) {
  int ch = p / 1024, y = p % 1024 / 32, x = p % 32;
  double fy = 1 + label % 4, fx = 1 + (label / 4 + ch) % 3, phase = 0.7 * (label + 2 * ch);
  return 0.1 * cos(6.283185307179586 * (fy * y + fx * x) / 32.0 + phase);
}

pmap_status pmap_example_data(const char *name, uint64_t seed, int64_t n, pmap_array *xs,
                              pmap_array *ys) {
  example_id id = EX_LINEAR;
  PMAP_TRY(find(name, &id, "pmap_example_data"));
  if (!xs || !ys)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_example_data: %s is NULL", xs ? "ys" : "xs");
  if (n <= 0 || n > (1 << 24))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_example_data: row count %lld is outside 1..%d",
                    (long long)n, 1 << 24);
  if (id == EX_GPT_MINI) return pmap_copy_task_data(seed, n, pmap_gpt_mini().context, xs, ys);
  /* res-mlp trains on the mlp's data, cifar-bn on cifar-cnn's. */
  int cifar = id == EX_CIFAR || id == EX_CIFAR_BN, mlp = id == EX_MLP || id == EX_RESMLP;
  int64_t in = id == EX_LINEAR ? 1 : mlp ? 10 : cifar ? 3 * 1024 : 1024;
  int xs_rank = id == EX_CONVNET || cifar ? 4 : 2;
  int64_t xshape[4] = {n, in, 0, 0};
  if (id == EX_CONVNET) xshape[1] = 1, xshape[2] = 32, xshape[3] = 32;
  if (cifar) xshape[1] = 3, xshape[2] = 32, xshape[3] = 32;
  int classes = id == EX_CONVNET ? 2 : id == EX_MLP1024 || cifar ? 10 : 0;
  float *x = malloc((size_t)(n * in) * sizeof *x);
  void *y = malloc((size_t)n * 4);
  if (!x || !y) {
    free(x);
    free(y);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_example_data: out of memory for %lld rows",
                    (long long)n);
  }
  pmap_rng r = pmap_rng_seed(seed);
  float *yf = y;
  int32_t *yi = y;
  for (int64_t i = 0; i < n; i++) {
    float *xi = x + i * in;
    switch (id) {
    case EX_LINEAR:
      xi[0] = (float)pmap_rng_normal(&r);
      yf[i] = (float)(2.0 * xi[0] - 1.0 + 0.5 * pmap_rng_normal(&r));
      break;
    case EX_MLP:
    case EX_RESMLP:
      for (int j = 0; j < 10; j++) xi[j] = (float)pmap_rng_normal(&r);
      yf[i] = (float)(mlp_teacher(xi) + 0.1 * pmap_rng_normal(&r));
      break;
    case EX_CONVNET: {
      int label = (int)(pmap_rng_next(&r) >> 63);
      for (int p = 0; p < 1024; p++) {
        int left = (p % 32) < 16;
        xi[p] = (float)(pmap_rng_uniform(&r) + (left == label ? 0.25 : 0.0));
      }
      yi[i] = label;
      break;
    }
    case EX_MLP1024: {
      /* Labels from a fixed random linear teacher: learnable, not trivial. */
      for (int j = 0; j < 1024; j++) xi[j] = (float)pmap_rng_normal(&r);
      pmap_rng t = pmap_rng_seed(TEACHER_SEED);
      double best = -INFINITY;
      int arg = 0;
      for (int c = 0; c < classes; c++) {
        double s = 0.0;
        for (int j = 0; j < 1024; j += 8) s += pmap_rng_normal(&t) * xi[j];
        if (s > best) best = s, arg = c;
      }
      yi[i] = arg;
      break;
    }
    case EX_CIFAR:
    case EX_CIFAR_BN: {
      int label = (int)(pmap_rng_next(&r) % 10);
      for (int p = 0; p < 3 * 1024; p++)
        xi[p] = (float)(cifar_pattern(label, p) + pmap_rng_normal(&r));
      yi[i] = label;
      break;
    }
    case EX_GPT_MINI: break; /* pmap_copy_task_data above */
    }
  }
  *xs = (pmap_array){x, PMAP_F32, xs_rank, {xshape[0], xshape[1], xshape[2], xshape[3]}};
  if (classes)
    *ys = (pmap_array){y, PMAP_I32, 1, {n, 0, 0, 0}};
  else
    *ys = (pmap_array){y, PMAP_F32, 2, {n, 1, 0, 0}};
  return PMAP_SUCCESS;
}

pmap_gpt_config pmap_gpt_mini(void) { return (pmap_gpt_config){256, 64, 128, 4, 4, 1}; }

pmap_status pmap_gpt_model(const pmap_gpt_config *c, pmap_model **out) {
  const char *call = "pmap_gpt_model";
  if (!c || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, c ? "out" : "config");
  if (c->depth < 1 || c->depth > 64 || c->heads < 1 || c->width < 1 || c->width % c->heads != 0 ||
      (c->tied != 0 && c->tied != 1))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: depth %d must be in 1..64, width %lld a positive multiple of heads %d, "
                    "tied 0 or 1 (got %d)",
                    call, c->depth, (long long)c->width, c->heads, c->tied);
  pmap_model *m = NULL;
  pmap_status st = PMAP_SUCCESS;
  int64_t in[1] = {c->context};
  PMAP_TRY_GOTO(st, pmap_model_create(1, in, &m), fail);
  PMAP_TRY_GOTO(st, pmap_model_add_embedding(m, c->vocab, c->width), fail);
  PMAP_TRY_GOTO(st, pmap_model_add_pos_embedding(m), fail);
  for (int i = 0; i < c->depth; i++) { /* pre-norm blocks */
    PMAP_TRY_GOTO(st, pmap_model_begin_residual(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_token_layernorm(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_causal_attention(m, c->heads, (int)(c->width / c->heads)),
                  fail);
    PMAP_TRY_GOTO(st, pmap_model_end_residual(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_begin_residual(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_token_layernorm(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_token_dense(m, 4 * c->width), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_gelu(m), fail);
    PMAP_TRY_GOTO(st, pmap_model_add_token_dense(m, c->width), fail);
    PMAP_TRY_GOTO(st, pmap_model_end_residual(m), fail);
  }
  PMAP_TRY_GOTO(st, pmap_model_add_token_layernorm(m), fail);
  PMAP_TRY_GOTO(st, pmap_model_add_lm_head(m, c->tied), fail);
  *out = m;
  return PMAP_SUCCESS;
fail:
  pmap_model_destroy(m);
  { /* a builder's message, under the call that was made */
    char why[1024];
    pmap_error_save(why, sizeof why);
    return pmap_error_set(st, "%s: %s", call, why);
  }
}

pmap_status pmap_copy_task_data(uint64_t seed, int64_t n, int64_t t, pmap_array *xs,
                                pmap_array *ys) {
  const char *call = "pmap_copy_task_data";
  if (!xs || !ys)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, xs ? "ys" : "xs");
  if (n <= 0 || n > (1 << 24) || t < 2 || t > 4096 || n * t > (1 << 28))
    return PMAP_ERR(
        PMAP_ERR_INVALID_ARGUMENT,
        "%s: rows %lld must be in 1..%d and context %lld in 2..4096 (and rows x context "
        "at most 2^28)",
        call, (long long)n, 1 << 24, (long long)t);
  int32_t *x = malloc((size_t)(n * t) * sizeof *x), *y = malloc((size_t)(n * t) * sizeof *y);
  int32_t *s = malloc((size_t)(t + 1) * sizeof *s);
  if (!x || !y || !s) {
    free(x), free(y), free(s);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld rows", call, (long long)n);
  }
  pmap_rng r = pmap_rng_seed(seed);
  int64_t k = t / 2;
  for (int64_t i = 0; i < n; i++) {
    for (int64_t j = 0; j < k; j++) s[j] = s[k + 1 + j] = 'a' + (int32_t)(pmap_rng_next(&r) >> 60);
    s[k] = '|';
    for (int64_t j = 2 * k + 1; j <= t; j++) s[j] = '.';
    memcpy(x + i * t, s, (size_t)t * sizeof *s);
    memcpy(y + i * t, s + 1, (size_t)t * sizeof *s);
  }
  free(s);
  *xs = (pmap_array){x, PMAP_I32, 2, {n, t, 0, 0}};
  *ys = (pmap_array){y, PMAP_I32, 2, {n, t, 0, 0}};
  return PMAP_SUCCESS;
}
