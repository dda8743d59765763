/* layer.c: the generic side of a layer: its class's members called with their defaults (the one
 * place an optional member is defaulted), and what the builders of models/layers/ share. */
#include <math.h>
#include <string.h>

#include "model.h"
#include "rng.h"
#include "base/error.h"
int layer_is_view(const layer *l) { return l->cls->is_view; }

size_t layer_aux_rows(const layer *l, int bf16) {
  size_t aux = l->aux_rows, fixed = l->aux_fixed, tmp = 0;
  if (bf16 && l->cls->bf16_rows) l->cls->bf16_rows(l, &aux, &fixed, &tmp);
  return aux;
}

size_t layer_aux_fixed(const layer *l, int bf16) {
  size_t aux = l->aux_rows, fixed = l->aux_fixed, tmp = 0;
  if (bf16 && l->cls->bf16_rows) l->cls->bf16_rows(l, &aux, &fixed, &tmp);
  return fixed;
}

void layer_init(const layer *l, const layer *next, pmap_rng *rng, float *w) {
  double gain = next && next->cls->init_gain > 0.0 ? next->cls->init_gain : 1.0;
  if (l->cls->init) l->cls->init(l, gain, rng, w);
}

void layer_geometry(const layer *l, uint32_t g[4]) {
  memset(g, 0, 4 * sizeof *g);
  if (l->cls->geometry) l->cls->geometry(l, g);
}

double layer_macs(const layer *l) { return l->cls->macs ? l->cls->macs(l) : 0.0; }

void layer_describe(const layer *l, FILE *f) {
  fprintf(f, "{\"kind\": \"%s\"", l->cls->name);
  if (l->cls->describe) l->cls->describe(l, f);
  fprintf(f, "}");
}

layer_block layer_block_shaped(const char *name, layer_region region, int rank,
                               const int64_t *shape) {
  layer_block b = {.name = name, .region = region, .rank = rank};
  memcpy(b.shape, shape, (size_t)rank * sizeof *shape);
  return b;
}

int layer_blocks(const layer *l, layer_block *b) {
  int n = l->cls->blocks ? l->cls->blocks(l, b) : 0;
  size_t next[3] = {l->w_off, l->b_off, l->s_off}; /* by layer_region */
  for (int k = 0; k < n; k++) {
    b[k].count = 1;
    for (int a = 0; a < b[k].rank; a++) b[k].count *= (size_t)b[k].shape[a];
    b[k].off = next[b[k].region];
    next[b[k].region] += b[k].count;
  }
  return n;
}

pmap_status layer_forward(pmap_device *dev, const pmap_model *m, replica *r, int i, const float *in,
                          int64_t bd) {
  const layer *l = &m->layers[i];
  if (l->folded) { /* the layer before wrote r->act[i] */
    r->out[i] = r->act[i];
    return PMAP_SUCCESS;
  }
  /* bf16: the input's bfloat16 copy, kept for backward (the input may be transient), unless the
   * layer that made the input wrote it in its own pass. */
  if (l->in16 && !l->in16_made)
    PMAP_TRY(r->ops->round_bf16(r->q, in, r->in16[i], NULL, (size_t)(bd * l->in_size)));
  const float *out = r->act[i];
  PMAP_TRY(l->cls->forward(dev, l, r, i, in, r->act[i], &out, bd));
  r->out[i] = out;
  return PMAP_SUCCESS;
}

pmap_status layer_backward(pmap_device *dev, const pmap_model *m, replica *r, int i,
                           const float *dy, float *dx, const float **dx_out, int64_t bd) {
  const layer *l = &m->layers[i];
  *dx_out = dx;
  if (l->folded) { /* the layer before takes dy as it is */
    if (dx) *dx_out = dy;
    return PMAP_SUCCESS;
  }
  return l->cls->backward(dev, l, r, i, dy, dx, dx_out, bd);
}

void model_current_shape(const pmap_model *m, int *rank, int64_t shape[3], int64_t *size) {
  if (m->n_layers == 0) {
    *rank = m->in_rank;
    memcpy(shape, m->in_shape, sizeof m->in_shape);
    *size = m->in_size;
  } else {
    const layer *l = &m->layers[m->n_layers - 1];
    *rank = l->out_rank;
    memcpy(shape, l->out_shape, sizeof l->out_shape);
    *size = l->out_size;
  }
}

pmap_status layer_start(pmap_model *m, const layer_class *cls, const char *call, layer *l) {
  if (!m) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: model is NULL", call);
  memset(l, 0, sizeof *l);
  l->cls = cls;
  model_current_shape(m, &l->in_rank, l->in_shape, &l->in_size);
  l->out_rank = l->in_rank;
  memcpy(l->out_shape, l->in_shape, sizeof l->out_shape);
  l->out_size = l->in_size;
  return PMAP_SUCCESS;
}

void layer_init_fan_in(const layer *l, int64_t fan_in, double gain, pmap_rng *rng, float *w) {
  double std = sqrt(gain / (double)fan_in);
  for (size_t j = 0; j < l->w_size; j++) w[l->w_off + j] = (float)(std * pmap_rng_normal(rng));
  memset(w + l->b_off, 0, l->b_size * sizeof *w);
}

void layer_init_affine(const layer *l, float *w) {
  for (size_t j = 0; j < l->w_size; j++) w[l->w_off + j] = 1.0f;
  memset(w + l->b_off, 0, l->b_size * sizeof *w);
}
