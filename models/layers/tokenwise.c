/* tokenwise.c: layers applied to each token of a (T, F) sequence on its own: the position-wise
 * dense layer (T, F) -> (T, units), y = x W + b per token, and layer normalisation of each
 * token's F features (a transformer's norms; pmap_model_add_layernorm normalises the whole
 * example). */
#include "models/model.h"
#include "base/error.h"

#define TOKEN_NORM_EPS 1e-5f /* torch.nn.LayerNorm's default */

static pmap_status dense_forward(pmap_device *dev, const layer *l, replica *r, int i,
                                 const float *in, float *y, const float **out, int64_t bd) {
  (void)dev, (void)out;
  return dense_rows_forward(l, r, i, in, y, bd * l->in_shape[0], l->in_shape[1], l->out_shape[1]);
}

static pmap_status dense_backward(pmap_device *dev, const layer *l, replica *r, int i,
                                  const float *dy, float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  return dense_rows_backward(l, r, i, dy, dx, bd * l->in_shape[0], l->in_shape[1], l->out_shape[1]);
}

static int dense_gemms16(const layer *l, int64_t bd, ops_gemm16 *g) {
  return dense_rows_gemms16(bd * l->in_shape[0], l->in_shape[1], l->out_shape[1], g);
}

static void dense_init(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  layer_init_fan_in(l, l->in_shape[1], gain, rng, w);
}

static double dense_macs(const layer *l) { return (double)l->in_shape[0] * (double)l->w_size; }

static void dense_describe(const layer *l, FILE *f) {
  fprintf(f, ", \"tokens\": %lld, \"in\": %lld, \"out\": %lld", (long long)l->in_shape[0],
          (long long)l->in_shape[1], (long long)l->out_shape[1]);
}

static int dense_blocks(const layer *l, layer_block *b) {
  b[0] = LAYER_BLOCK("w", LAYER_WEIGHTS, l->in_shape[1], l->out_shape[1]);
  b[1] = LAYER_BLOCK("b", LAYER_BIAS, l->out_shape[1]);
  return 2;
}

static const layer_class token_dense_class = {
    .name = "token_dense",
    .code = 18,
    .takes_act = 1,
    .gemm_in = 1,
    .writes16 = 1,
    .redo_epilogue = 1, /* as dense's (dense.c) */
    .gemms16 = dense_gemms16,
    .forward = dense_forward,
    .backward = dense_backward,
    .init = dense_init,
    .macs = dense_macs,
    .describe = dense_describe,
    .blocks = dense_blocks,
};

pmap_status pmap_model_add_token_dense(pmap_model *m, int64_t units) {
  const char *call = "pmap_model_add_token_dense";
  layer l;
  PMAP_TRY(layer_start(m, &token_dense_class, call, &l));
  if (l.in_rank != 2)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: input of rank %d; it takes (T, F) token vectors", call, l.in_rank);
  if (units <= 0 || units > (1 << 20) || l.in_shape[0] * units > (1 << 28))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: units %lld is outside 1..%d (or %lld tokens x units is too many)", call,
                    (long long)units, 1 << 20, (long long)l.in_shape[0]);
  l.out_shape[1] = units;
  l.out_size = l.in_shape[0] * units;
  l.w_size = (size_t)(l.in_shape[1] * units);
  l.b_size = (size_t)units;
  return model_push(m, l, call);
}

static pmap_status norm_forward(pmap_device *dev, const layer *l, replica *r, int i,
                                const float *in, float *y, const float **out, int64_t bd) {
  (void)dev, (void)out;
  return r->ops->layernorm_forward(r->q, in, r->w + l->w_off, r->w + l->b_off, bd * l->in_shape[0],
                                   l->in_shape[1], TOKEN_NORM_EPS, y, r->aux[i],
                                   l->out16_at ? r->in16[l->out16_at] : NULL);
}

static pmap_status norm_backward(pmap_device *dev, const layer *l, replica *r, int i,
                                 const float *dy, float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  return r->ops->layernorm_backward(r->q, r->in[i], r->w + l->w_off, r->aux[i], dy,
                                    bd * l->in_shape[0], l->in_shape[1], dx,
                                    layer_grad(r, l->w_off), layer_grad(r, l->b_off));
}

static void norm_init(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  (void)gain, (void)rng;
  layer_init_affine(l, w);
}

static void norm_describe(const layer *l, FILE *f) {
  fprintf(f, ", \"tokens\": %lld, \"size\": %lld, \"eps\": %.9g", (long long)l->in_shape[0],
          (long long)l->in_shape[1], (double)TOKEN_NORM_EPS);
}

static int norm_blocks(const layer *l, layer_block *b) {
  b[0] = LAYER_BLOCK("gamma", LAYER_WEIGHTS, l->in_shape[1]);
  b[1] = LAYER_BLOCK("beta", LAYER_BIAS, l->in_shape[1]);
  return 2;
}

static const layer_class token_norm_class = {
    .name = "token_layernorm",
    .code = 19,
    .out_unused = 1, /* its backward reads its input and statistics */
    .writes16 = 1,
    .redo_cheap = 1, /* its output and statistics again from its kept input */
    .forward = norm_forward,
    .backward = norm_backward,
    .init = norm_init,
    .describe = norm_describe,
    .blocks = norm_blocks,
};

pmap_status pmap_model_add_token_layernorm(pmap_model *m) {
  const char *call = "pmap_model_add_token_layernorm";
  layer l;
  PMAP_TRY(layer_start(m, &token_norm_class, call, &l));
  if (l.in_rank != 2)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: input of rank %d; it takes (T, F) token vectors", call, l.in_rank);
  l.w_size = l.b_size = (size_t)l.in_shape[1];
  l.aux_rows = (size_t)(2 * l.in_shape[0]); /* mean, rstd per token */
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(tokenwise, &token_dense_class, &token_norm_class);
