/* dropout.c: inverted dropout, any shape. The mask is a pure function of the step, the layer's
 * position and each element's index in the global batch (ops/op_math.h pmap_dropout_factor),
 * so it does not depend on how the batch is split; backward recomputes it. pmap_predict (and a
 * rate of 0) passes x through. */
#include <string.h>

#include "models/model.h"
#include "ops/op_math.h"
#include "base/error.h"

typedef struct dropout_settings {
  float rate;
} dropout_settings;
LAYER_SETTINGS_FIT(dropout_settings);

static float rate_of(const layer *l) { return LAYER_SETTINGS_CONST(dropout_settings, l)->rate; }

/* Layer i's key at step r->step. */
static uint64_t key_of(const replica *r, int i) {
  return pmap_dropout_key((uint64_t)r->step, (uint64_t)i * 0x9e3779b97f4a7c15ull);
}

/* The global index of the call's first element: the rows before it in the global batch. */
static uint64_t first_of(pmap_device *dev, const replica *r, const layer *l, int64_t bd) {
  int64_t row0 = r->has_row0 ? r->row0 : (int64_t)pmap_local_index(dev) * bd;
  return (uint64_t)row0 * (uint64_t)l->out_size;
}

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  float rate = rate_of(l);
  if (r->inference || rate == 0.0f) {
    *out = in;
    return PMAP_SUCCESS;
  }
  return r->ops->dropout_forward(r->q, in, y, (size_t)(bd * l->out_size), rate, key_of(r, i),
                                 first_of(dev, r, l, bd));
}

static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  float rate = rate_of(l);
  if (!dx) return PMAP_SUCCESS;
  if (rate == 0.0f) {
    *dx_out = dy;
    return PMAP_SUCCESS;
  }
  return r->ops->dropout_backward(r->q, dy, dx, (size_t)(bd * l->out_size), rate, key_of(r, i),
                                  first_of(dev, r, l, bd));
}

static void geometry(const layer *l, uint32_t g[4]) {
  float rate = rate_of(l);
  memcpy(&g[0], &rate, sizeof g[0]);
}

static void describe(const layer *l, FILE *f) {
  fprintf(f, ", \"rate\": %.9g", (double)rate_of(l));
}

static int passes(const layer *l) { return rate_of(l) == 0.0f; }

static const layer_class dropout_class = {
    .name = "dropout",
    .code = 11,
    .forward = forward,
    .backward = backward,
    .geometry = geometry,
    .describe = describe,
    .passes_dy = passes,
};

pmap_status pmap_model_add_dropout(pmap_model *m, float rate) {
  const char *call = "pmap_model_add_dropout";
  layer l;
  PMAP_TRY(layer_start(m, &dropout_class, call, &l));
  if (!(rate >= 0.0f && rate < 1.0f))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: rate %g is outside [0, 1)", call, (double)rate);
  LAYER_SETTINGS(dropout_settings, &l)->rate = rate;
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(dropout, &dropout_class);
