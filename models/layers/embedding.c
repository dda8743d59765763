/* embedding.c: the layers of a language model that know its vocabulary: the token embedding
 * (the model's i32 token ids (T) -> (T, D) rows of a table (V, D)), the learned positional
 * embedding (T, D) + P (T, D), and the language-model head (T, D) -> (T, V) logits, either its
 * own weights or tied to the token table (one block of the flat parameter vector used twice). */
#include <string.h>

#include "models/model.h"
#include "models/rng.h"
#include "base/error.h"

#define EMBED_STD 0.02 /* the tables' initial spread (GPT-2's) */
#define MAX_VOCAB (1 << 24)

typedef struct embed_settings {
  int64_t vocab;
  int tied;         /* lm_head: 1 reads the token table (V, D) of layer 0 */
  size_t table_off; /* ... at this offset of the flat vector */
} embed_settings;
LAYER_SETTINGS_FIT(embed_settings);

static const embed_settings *cfg(const layer *l) { return LAYER_SETTINGS_CONST(embed_settings, l); }

static void init_normal(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  (void)gain;
  for (size_t j = 0; j < l->w_size; j++)
    w[l->w_off + j] = (float)(EMBED_STD * pmap_rng_normal(rng));
  memset(w + l->b_off, 0, l->b_size * sizeof *w);
}

/* ---- token embedding ---- */

/* The model's input is i32 token ids: the staged rows are read as int32. */
static const int32_t *ids_of(const float *in) { return (const int32_t *)(const void *)in; }

static pmap_status tok_forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                               float *y, const float **out, int64_t bd) {
  (void)dev, (void)i, (void)out;
  return r->ops->embedding_forward(r->q, ids_of(in), r->w + l->w_off, bd * l->in_size,
                                   cfg(l)->vocab, l->out_shape[1], y);
}

static pmap_status tok_backward(pmap_device *dev, const layer *l, replica *r, int i,
                                const float *dy, float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx, (void)dx_out; /* the input (token ids) takes no gradient */
  return r->ops->embedding_backward(r->q, ids_of(r->in[i]), dy, bd * l->in_size, cfg(l)->vocab,
                                    l->out_shape[1], layer_grad(r, l->w_off));
}

static void tok_geometry(const layer *l, uint32_t g[4]) { g[0] = (uint32_t)cfg(l)->vocab; }

static void tok_describe(const layer *l, FILE *f) {
  fprintf(f, ", \"vocab\": %lld, \"context\": %lld, \"dim\": %lld", (long long)cfg(l)->vocab,
          (long long)l->out_shape[0], (long long)l->out_shape[1]);
}

static int tok_blocks(const layer *l, layer_block *b) {
  b[0] = LAYER_BLOCK("table", LAYER_WEIGHTS, cfg(l)->vocab, l->out_shape[1]);
  return 1;
}

static const layer_class embedding_class = {
    .name = "embedding",
    .code = 15,
    .forward = tok_forward,
    .backward = tok_backward,
    .init = init_normal,
    .geometry = tok_geometry,
    .describe = tok_describe,
    .blocks = tok_blocks,
};

pmap_status pmap_model_add_embedding(pmap_model *m, int64_t vocab, int64_t dim) {
  const char *call = "pmap_model_add_embedding";
  layer l;
  PMAP_TRY(layer_start(m, &embedding_class, call, &l));
  if (m->n_layers != 0 || l.in_rank != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the token embedding must be the first layer of a model of input rank 1 "
                    "(T token ids); this model has %d layers and input rank %d",
                    call, m->n_layers, l.in_rank);
  if (vocab < 1 || vocab > MAX_VOCAB || dim < 1 || dim > (1 << 16))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: vocab %lld must be in 1..%d and dim %lld in 1..%d", call, (long long)vocab,
                    MAX_VOCAB, (long long)dim, 1 << 16);
  if (l.in_size * dim > (1 << 28))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: context %lld x dim %lld is too large", call,
                    (long long)l.in_size, (long long)dim);
  l.out_rank = 2;
  l.out_shape[0] = l.in_size;
  l.out_shape[1] = dim;
  l.out_size = l.in_size * dim;
  l.w_size = (size_t)(vocab * dim);
  LAYER_SETTINGS(embed_settings, &l)->vocab = vocab;
  PMAP_TRY(model_push(m, l, call));
  m->in_dtype = PMAP_I32;
  m->in_vocab = vocab;
  return PMAP_SUCCESS;
}

/* ---- positional embedding: y = x + P, P (T, D) broadcast over the batch ---- */

static pmap_status pos_forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                               float *y, const float **out, int64_t bd) {
  (void)dev, (void)i, (void)out;
  PMAP_TRY(r->ops->copy(r->q, in, y, (size_t)(bd * l->out_size)));
  return r->ops->bias_forward(r->q, y, r->w + l->w_off, bd, l->out_size, 1);
}

static pmap_status pos_backward(pmap_device *dev, const layer *l, replica *r, int i,
                                const float *dy, float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)i;
  PMAP_TRY(r->ops->bias_backward(r->q, dy, layer_grad(r, l->w_off), bd, l->out_size, 1));
  if (dx) *dx_out = dy; /* the gradient passes unchanged */
  return PMAP_SUCCESS;
}

static int pos_blocks(const layer *l, layer_block *b) {
  b[0] = LAYER_BLOCK("table", LAYER_WEIGHTS, l->in_shape[0], l->in_shape[1]);
  return 1;
}

static int pos_passes(const layer *l) {
  (void)l;
  return 1;
}

static const layer_class pos_class = {
    .name = "pos_embedding",
    .code = 16,
    .forward = pos_forward,
    .backward = pos_backward,
    .init = init_normal,
    .blocks = pos_blocks,
    .passes_dy = pos_passes,
};

pmap_status pmap_model_add_pos_embedding(pmap_model *m) {
  const char *call = "pmap_model_add_pos_embedding";
  layer l;
  PMAP_TRY(layer_start(m, &pos_class, call, &l));
  if (l.in_rank != 2)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: input of rank %d; it takes (T, D) token vectors", call, l.in_rank);
  l.w_size = (size_t)l.in_size;
  return model_push(m, l, call);
}

/* ---- language-model head: logits (T, V) = x (T, D) W (D, V) + b, or x E^T when tied ---- */

static pmap_status head_forward(pmap_device *dev, const layer *l, replica *r, int i,
                                const float *in, float *y, const float **out, int64_t bd) {
  (void)dev, (void)out;
  const embed_settings *s = cfg(l);
  int64_t rows = bd * l->in_shape[0], d = l->in_shape[1], v = s->vocab;
  layer_mat x = layer_input(r, i, in);
  if (s->tied)
    return layer_gemm(r, 0, 1, rows, v, d, x, d, layer_weights(r, s->table_off), d, 0.0f, y, v);
  PMAP_TRY(layer_gemm(r, 0, 0, rows, v, d, x, d, layer_weights(r, l->w_off), v, 0.0f, y, v));
  return r->ops->bias_forward(r->q, y, r->w + l->b_off, rows, v, 1);
}

/* Tied: the table's gradient gains this use's share here and the embedding's at layer 0, both
 * += into the one block, so the optimizer, checkpoints and the all-reduce see it once. */
static pmap_status head_backward(pmap_device *dev, const layer *l, replica *r, int i,
                                 const float *dy, float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  const embed_settings *s = cfg(l);
  const pmap_ops *ops = r->ops;
  int64_t rows = bd * l->in_shape[0], d = l->in_shape[1], v = s->vocab;
  layer_mat g, x = layer_input(r, i, r->in[i]);
  PMAP_TRY(layer_operand(r, dy, (size_t)(rows * v), (pmap_bf16 *)(void *)r->tmp, &g));
  if (s->tied) {
    /* dE (V, D) += dy^T (V, rows) x (rows, D); dx (rows, D) = dy (rows, V) E (V, D) */
    PMAP_TRY(layer_gemm(r, 1, 0, v, d, rows, g, v, x, d, 1.0f, layer_grad(r, s->table_off), d));
    if (!dx) return PMAP_SUCCESS;
    return layer_gemm(r, 0, 0, rows, d, v, g, v, layer_weights(r, s->table_off), d, 0.0f, dx, d);
  }
  PMAP_TRY(layer_gemm(r, 1, 0, d, v, rows, x, d, g, v, 1.0f, layer_grad(r, l->w_off), v));
  PMAP_TRY(ops->bias_backward(r->q, dy, layer_grad(r, l->b_off), rows, v, 1));
  if (!dx) return PMAP_SUCCESS;
  return layer_gemm(r, 0, 1, rows, d, v, g, v, layer_weights(r, l->w_off), v, 0.0f, dx, d);
}

/* head_forward's and head_backward's GEMMs, tied or not. */
static int head_gemms16(const layer *l, int64_t bd, ops_gemm16 *g) {
  const embed_settings *s = cfg(l);
  int64_t rows = bd * l->in_shape[0], d = l->in_shape[1], v = s->vocab;
  if (s->tied) {
    g[0] = layer_gemm16(0, 1, rows, v, d, d, d, 0.0f, v);
    g[1] = layer_gemm16(1, 0, v, d, rows, v, d, 1.0f, d);
    g[2] = layer_gemm16(0, 0, rows, d, v, v, d, 0.0f, d);
  } else {
    g[0] = layer_gemm16(0, 0, rows, v, d, d, v, 0.0f, v);
    g[1] = layer_gemm16(1, 0, d, v, rows, d, v, 1.0f, v);
    g[2] = layer_gemm16(0, 1, rows, d, v, v, v, 0.0f, d);
  }
  return 3;
}

static void head_init(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  if (!cfg(l)->tied) layer_init_fan_in(l, l->in_shape[1], gain, rng, w);
}

static void head_geometry(const layer *l, uint32_t g[4]) {
  g[0] = (uint32_t)cfg(l)->vocab;
  g[1] = (uint32_t)cfg(l)->tied;
}

static double head_macs(const layer *l) {
  return (double)l->in_shape[0] * (double)l->in_shape[1] * (double)cfg(l)->vocab;
}

static void head_describe(const layer *l, FILE *f) {
  fprintf(f, ", \"vocab\": %lld, \"tied\": %s", (long long)cfg(l)->vocab,
          cfg(l)->tied ? "true" : "false");
}

/* Tied: none of its own (it reads the token embedding's table, a block of layer 0). */
static int head_blocks(const layer *l, layer_block *b) {
  if (cfg(l)->tied) return 0;
  b[0] = LAYER_BLOCK("w", LAYER_WEIGHTS, l->in_shape[1], cfg(l)->vocab);
  b[1] = LAYER_BLOCK("b", LAYER_BIAS, cfg(l)->vocab);
  return 2;
}

static const layer_class head_class = {
    .name = "lm_head",
    .code = 20,
    .gemm_in = 1,
    .gemms16 = head_gemms16,
    .forward = head_forward,
    .backward = head_backward,
    .init = head_init,
    .geometry = head_geometry,
    .macs = head_macs,
    .describe = head_describe,
    .blocks = head_blocks,
};

pmap_status pmap_model_add_lm_head(pmap_model *m, int tied) {
  const char *call = "pmap_model_add_lm_head";
  layer l;
  PMAP_TRY(layer_start(m, &head_class, call, &l));
  if (m->n_layers == 0 || m->layers[0].cls != &embedding_class)
    return PMAP_ERR(
        PMAP_ERR_INVALID_ARGUMENT,
        "%s: the model does not start with a token embedding (pmap_model_add_embedding)", call);
  if (m->n_open)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %d residual block%s still open", call,
                    m->n_open, m->n_open > 1 ? "s are" : " is");
  if (tied != 0 && tied != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: tied is %d; it must be 0 or 1", call, tied);
  const layer *emb = &m->layers[0];
  int64_t v = cfg(emb)->vocab;
  if (l.in_rank != 2 || (tied && l.in_shape[1] != emb->out_shape[1]))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: input (%lld, %lld) of rank %d; it takes (T, D) token vectors%s", call,
                    (long long)l.in_shape[0], (long long)l.in_shape[1], l.in_rank,
                    tied ? " with D the token embedding's width" : "");
  if (l.in_shape[0] * v > (1 << 28))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %lld logits per example is too many", call,
                    (long long)(l.in_shape[0] * v));
  embed_settings *s = LAYER_SETTINGS(embed_settings, &l);
  s->vocab = v;
  s->tied = tied;
  s->table_off = emb->w_off;
  if (tied) {
    l.gshare_off = emb->w_off;
    l.gshare_len = emb->w_size;
  }
  l.out_shape[1] = v;
  l.out_size = l.in_shape[0] * v;
  if (!tied) {
    l.w_size = (size_t)(l.in_shape[1] * v);
    l.b_size = (size_t)v;
  }
  PMAP_TRY(model_push(m, l, call));
  m->loss = PMAP_LOSS_TOKEN_XENT;
  return PMAP_SUCCESS;
}

LAYER_FILE_CLASSES(embedding, &embedding_class, &pos_class, &head_class);
