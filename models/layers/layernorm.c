/* layernorm.c: layer normalisation of each example over its S elements, y = (x - mean) rstd
 * gamma + beta (biased variance), with gamma and beta (S) and per-row mean and rstd kept in
 * scratch from forward to backward. */
#include "models/model.h"
#include "base/error.h"

#define LAYERNORM_EPS 1e-6f /* flax.linen.LayerNorm's default */

typedef struct layernorm_settings {
  float eps;
} layernorm_settings;
LAYER_SETTINGS_FIT(layernorm_settings);

static float eps_of(const layer *l) { return LAYER_SETTINGS_CONST(layernorm_settings, l)->eps; }

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)dev, (void)out;
  return r->ops->layernorm_forward(r->q, in, r->w + l->w_off, r->w + l->b_off, bd, l->in_size,
                                   eps_of(l), y, r->aux[i],
                                   l->out16_at ? r->in16[l->out16_at] : NULL);
}

static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  return r->ops->layernorm_backward(r->q, r->in[i], r->w + l->w_off, r->aux[i], dy, bd, l->in_size,
                                    dx, layer_grad(r, l->w_off), layer_grad(r, l->b_off));
}

static void init(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  (void)gain, (void)rng;
  layer_init_affine(l, w);
}

static void describe(const layer *l, FILE *f) {
  fprintf(f, ", \"size\": %lld, \"eps\": %.9g", (long long)l->in_size, (double)eps_of(l));
}

/* gamma and beta in the shape of one example. */
static int blocks(const layer *l, layer_block *b) {
  b[0] = layer_block_shaped("gamma", LAYER_WEIGHTS, l->in_rank, l->in_shape);
  b[1] = layer_block_shaped("beta", LAYER_BIAS, l->in_rank, l->in_shape);
  return 2;
}

static const layer_class layernorm_class = {
    .name = "layernorm",
    .code = 8,
    .out_unused = 1, /* its backward reads its input and statistics */
    .writes16 = 1,
    .redo_cheap = 1, /* its output and statistics again from its kept input */
    .forward = forward,
    .backward = backward,
    .init = init,
    .describe = describe,
    .blocks = blocks,
};

pmap_status pmap_model_add_layernorm(pmap_model *m) {
  const char *call = "pmap_model_add_layernorm";
  layer l;
  PMAP_TRY(layer_start(m, &layernorm_class, call, &l));
  l.w_size = l.b_size = (size_t)l.out_size;
  LAYER_SETTINGS(layernorm_settings, &l)->eps = LAYERNORM_EPS;
  l.aux_rows = 2; /* mean, rstd */
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(layernorm, &layernorm_class);
