/* param_blocks.c: the names of the flat parameter vector. Each layer's class declares its blocks
 * (models/layers/); here they are numbered through the model and named "<layer>.<kind>.<block>"
 * for pmap_model_param_block, pmap_model_find_param_block and pmap_params_read_named. */
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "base/error.h"

/* The public form of block b of layer i. */
static void public_block(const pmap_model *m, int i, const layer_block *b, pmap_param_block *out) {
  const layer *l = &m->layers[i];
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%d.%s.%s", i, l->cls->name, b->name);
  out->kind = l->cls->name;
  out->block = b->name;
  out->layer = i;
  out->trained = b->region != LAYER_STATE;
  out->rank = b->rank;
  memcpy(out->shape, b->shape, sizeof out->shape);
  out->offset = b->off;
  out->count = b->count;
}

void model_block_shape(const pmap_param_block *b, char *text, size_t cap) {
  size_t at = (size_t)snprintf(text, cap, "(");
  for (int a = 0; a < b->rank && at < cap; a++)
    at += (size_t)snprintf(text + at, cap - at, "%s%lld", a ? ", " : "", (long long)b->shape[a]);
  if (at < cap) snprintf(text + at, cap - at, ")");
}

size_t pmap_model_num_param_blocks(const pmap_model *m) {
  size_t n = 0;
  layer_block b[LAYER_MAX_BLOCKS];
  for (int i = 0; m && i < m->n_layers; i++) n += (size_t)layer_blocks(&m->layers[i], b);
  return n;
}

pmap_status pmap_model_param_block(const pmap_model *m, size_t index, pmap_param_block *out) {
  const char *call = "pmap_model_param_block";
  if (!m || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call, m ? "out" : "model");
  size_t k = index;
  layer_block b[LAYER_MAX_BLOCKS];
  for (int i = 0; i < m->n_layers; i++) {
    size_t n = (size_t)layer_blocks(&m->layers[i], b);
    if (k < n) {
      public_block(m, i, &b[k], out);
      return PMAP_SUCCESS;
    }
    k -= n;
  }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: index %zu is outside [0, %zu), the model's parameter blocks", call, index,
                  index - k);
}

/* What the model holds near a name that is not one of its blocks: the blocks of the layer the
 * name's number points at, else the model's first ones. */
static void describe_near(const pmap_model *m, const char *name, char *msg, size_t cap) {
  char *end;
  long i = strtol(name, &end, 10);
  layer_block b[LAYER_MAX_BLOCKS];
  size_t at = 0;
  if (end != name && *end == '.' && i >= 0 && i < m->n_layers) {
    const layer *l = &m->layers[i];
    int n = layer_blocks(l, b);
    at += (size_t)snprintf(msg, cap, "layer %ld is %s, with %s", i, l->cls->name,
                           n ? "the blocks" : "no blocks");
    for (int k = 0; k < n && at < cap; k++)
      at += (size_t)snprintf(msg + at, cap - at, "%s %ld.%s.%s", k ? "," : "", i, l->cls->name,
                             b[k].name);
    return;
  }
  size_t total = pmap_model_num_param_blocks(m);
  if (!total) {
    snprintf(msg, cap, "the model has no parameter blocks");
    return;
  }
  at += (size_t)snprintf(msg, cap, "the model has %zu: ", total);
  pmap_param_block pb;
  for (size_t k = 0; k < total && k < 4 && at < cap; k++) {
    pmap_model_param_block(m, k, &pb);
    at += (size_t)snprintf(msg + at, cap - at, "%s%s", k ? ", " : "", pb.name);
  }
  if (total > 4 && at < cap) snprintf(msg + at, cap - at, ", ...");
}

pmap_status model_find_block(const pmap_model *m, const char *call, const char *name,
                             pmap_param_block *out) {
  layer_block b[LAYER_MAX_BLOCKS];
  pmap_param_block pb;
  for (int i = 0; i < m->n_layers; i++) {
    int n = layer_blocks(&m->layers[i], b);
    for (int k = 0; k < n; k++) {
      public_block(m, i, &b[k], &pb);
      if (strcmp(pb.name, name) == 0) {
        *out = pb;
        return PMAP_SUCCESS;
      }
    }
  }
  char near[256];
  describe_near(m, name, near, sizeof near);
  size_t len = strlen(name);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: no parameter block \"%.*s%s\" (%s)", call,
                  len > 80 ? 80 : (int)len, name, len > 80 ? "..." : "", near);
}

pmap_status pmap_model_find_param_block(const pmap_model *m, const char *name,
                                        pmap_param_block *out) {
  const char *call = "pmap_model_find_param_block";
  if (!m || !name || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !m      ? "model"
                    : !name ? "name"
                            : "out");
  return model_find_block(m, call, name, out);
}
