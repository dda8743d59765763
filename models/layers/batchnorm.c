/* batchnorm.c: batch normalisation per feature (F) or per channel (C, H, W) over the batch,
 * with gamma and beta (C) and the running mean and variance (C each) as state that is not
 * trained. cross_replica: the statistics of the global batch (all-reduced inside forward and
 * backward); else of each device's shard, the running statistics still moving with the global
 * batch's. Scratch: three statistics buffers of 3C + 1 floats (ops bn_stats) and the backward
 * sums (2C). */
#include "models/model.h"
#include "runtime/runtime.h"
#include "base/error.h"

#define BATCHNORM_EPS 1e-5f /* flax.linen.BatchNorm's default */
#define BATCHNORM_MOMENTUM 0.9f

typedef struct batchnorm_settings {
  int64_t channels, inner; /* C and H*W (1 for rank-1 input) */
  float eps, momentum;
  int cross_replica; /* statistics over the global batch */
} batchnorm_settings;
LAYER_SETTINGS_FIT(batchnorm_settings);

static const batchnorm_settings *settings_of(const layer *l) {
  return LAYER_SETTINGS_CONST(batchnorm_settings, l);
}

/* Statistics buffer k (0: the normalisation's, read by backward; 1: a first pass's; 2: the
 * global batch's without cross_replica; 3: the backward sums). */
static float *buf(const replica *r, const layer *l, int i, int k) {
  return r->aux[i] + (size_t)k * (3 * (size_t)settings_of(l)->channels + 1);
}

/* Statistics in two passes, the second around the first's mean: a + (all-reduce) -> b (+
 * all-reduce); only the sums and the count travel, the shifts agree already. */
static pmap_status two_pass(pmap_device *dev, replica *r, const layer *l, const float *in,
                            int64_t bd, int reduce, float *a, float *b) {
  const batchnorm_settings *s = settings_of(l);
  const pmap_ops *ops = r->ops;
  size_t sums = 2 * (size_t)s->channels + 1;
  PMAP_TRY(ops->bn_stats(r->q, in, bd, s->channels, s->inner, NULL, a));
  if (reduce) PMAP_TRY(model_exchange(dev, r, "batch norm's statistics", a, sums));
  PMAP_TRY(ops->bn_stats(r->q, in, bd, s->channels, s->inner, a, b));
  if (reduce) PMAP_TRY(model_exchange(dev, r, "batch norm's statistics", b, sums));
  return PMAP_SUCCESS;
}

/* Training: the statistics of this device's shard, all-reduced when cross_replica; the running
 * statistics always move with the global batch's, so every replica keeps the same values. */
static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)out;
  const batchnorm_settings *s = settings_of(l);
  const pmap_ops *ops = r->ops;
  float *stats = buf(r, l, i, 0), *first = buf(r, l, i, 1), *global = stats;
  const float *gamma = r->w + l->w_off, *beta = r->w + l->b_off;
  if (r->inference)
    return ops->bn_forward(r->q, in, NULL, NULL, r->w + l->s_off, gamma, beta, bd, s->channels,
                           s->inner, s->eps, s->momentum, 0, y);
  /* The new running statistics go to the step's pending state, which the step commits once its
   * verdict is in (models/model.h replica.pending). */
  float *running = r->pending ? r->pending + l->st_off : NULL;
  PMAP_TRY(two_pass(dev, r, l, in, bd, s->cross_replica, first, stats));
  if (!s->cross_replica) {
    global = buf(r, l, i, 2);
    PMAP_TRY(two_pass(dev, r, l, in, bd, 1, first, global));
  }
  return ops->bn_forward(r->q, in, stats, global, running, gamma, beta, bd, s->channels, s->inner,
                         s->eps, s->momentum, 1, y);
}

/* Parameter gradients from this shard's sums (the step's all-reduce averages them); dx from
 * the sums over the same batch the statistics came from. */
static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dx_out;
  const batchnorm_settings *s = settings_of(l);
  const pmap_ops *ops = r->ops;
  int64_t c = s->channels;
  float *stats = buf(r, l, i, 0), *sums = buf(r, l, i, 3);
  PMAP_TRY(ops->bn_backward_sums(r->q, r->in[i], dy, stats, bd, c, s->inner, s->eps, sums));
  PMAP_TRY(ops->add(r->q, layer_grad(r, l->w_off), sums + c, layer_grad(r, l->w_off), (size_t)c));
  PMAP_TRY(ops->add(r->q, layer_grad(r, l->b_off), sums, layer_grad(r, l->b_off), (size_t)c));
  if (!dx) return PMAP_SUCCESS;
  if (s->cross_replica)
    PMAP_TRY(model_exchange(dev, r, "batch norm's backward", sums, 2 * (size_t)c));
  return ops->bn_backward_dx(r->q, r->in[i], dy, stats, r->w + l->w_off, sums, bd, c, s->inner,
                             s->eps, dx);
}

/* Scale 1, shift 0, running mean 0, running var 1. */
static void init(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  (void)gain, (void)rng;
  size_t c = (size_t)settings_of(l)->channels;
  for (size_t j = 0; j < c; j++) w[l->s_off + j] = 0.0f, w[l->s_off + c + j] = 1.0f;
  layer_init_affine(l, w);
}

/* The state (2C after beta) follows from the code and C. */
static void geometry(const layer *l, uint32_t g[4]) {
  g[0] = (uint32_t)settings_of(l)->cross_replica;
}

static void describe(const layer *l, FILE *f) {
  const batchnorm_settings *s = settings_of(l);
  fprintf(f, ", \"channels\": %lld, \"eps\": %.9g, \"momentum\": %.9g, \"cross_replica\": %d",
          (long long)s->channels, (double)s->eps, (double)s->momentum, s->cross_replica);
}

/* gamma, beta, then the running statistics: state that is not trained. */
static int blocks(const layer *l, layer_block *b) {
  int64_t c = settings_of(l)->channels;
  b[0] = LAYER_BLOCK("gamma", LAYER_WEIGHTS, c);
  b[1] = LAYER_BLOCK("beta", LAYER_BIAS, c);
  b[2] = LAYER_BLOCK("running_mean", LAYER_STATE, c);
  b[3] = LAYER_BLOCK("running_var", LAYER_STATE, c);
  return 4;
}

static const layer_class batchnorm_class = {
    .name = "batchnorm",
    .code = 12,
    .collectives = 1,
    .forward = forward,
    .backward = backward,
    .init = init,
    .geometry = geometry,
    .describe = describe,
    .blocks = blocks,
};

pmap_status pmap_model_add_batchnorm(pmap_model *m, int cross_replica) {
  const char *call = "pmap_model_add_batchnorm";
  layer l;
  PMAP_TRY(layer_start(m, &batchnorm_class, call, &l));
  batchnorm_settings *s = LAYER_SETTINGS(batchnorm_settings, &l);
  s->channels = l.out_rank == 3 ? l.out_shape[0] : l.out_size;
  s->inner = l.out_rank == 3 ? l.out_shape[1] * l.out_shape[2] : 1;
  s->eps = BATCHNORM_EPS;
  s->momentum = BATCHNORM_MOMENTUM;
  s->cross_replica = cross_replica != 0;
  l.w_size = l.b_size = (size_t)s->channels;
  l.s_size = 2 * (size_t)s->channels;
  l.aux_fixed = 11 * (size_t)s->channels + 3; /* buffers 0..2 (3C + 1 each), the sums (2C) */
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(batchnorm, &batchnorm_class);
