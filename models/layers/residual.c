/* residual.c: residual blocks, y = x + f(x): a start layer (a view of its input, whose output
 * gradient also receives that of the block's end) and an end layer adding the start's output
 * to f's. Each holds the index of the other; blocks nest (pmap_model.open). */
#include <string.h>

#include "models/model.h"
#include "base/error.h"

typedef struct residual_settings {
  int other; /* the start's end, the end's start */
} residual_settings;
LAYER_SETTINGS_FIT(residual_settings);

static int other_of(const layer *l) { return LAYER_SETTINGS_CONST(residual_settings, l)->other; }

static pmap_status begin_forward(pmap_device *dev, const layer *l, replica *r, int i,
                                 const float *in, float *y, const float **out, int64_t bd) {
  (void)dev, (void)l, (void)r, (void)i, (void)y, (void)bd;
  *out = in;
  return PMAP_SUCCESS;
}

/* The gradient of f's input plus that of the skip path. */
static pmap_status begin_backward(pmap_device *dev, const layer *l, replica *r, int i,
                                  const float *dy, float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)i, (void)dx_out;
  if (!dx) return PMAP_SUCCESS;
  return r->ops->add(r->q, dy, r->dout[other_of(l)], dx, (size_t)(bd * l->out_size));
}

static pmap_status end_forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                               float *y, const float **out, int64_t bd) {
  (void)dev, (void)i, (void)out;
  return r->ops->add(r->q, in, r->out[other_of(l)], y, (size_t)(bd * l->out_size));
}

/* dy flows into f unchanged; the skip path picks it up at the block's start (r->dout). */
static pmap_status end_backward(pmap_device *dev, const layer *l, replica *r, int i,
                                const float *dy, float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)l, (void)r, (void)i, (void)bd;
  if (dx) *dx_out = dy;
  return PMAP_SUCCESS;
}

static int passes(const layer *l) {
  (void)l;
  return 1;
}

static void geometry(const layer *l, uint32_t g[4]) { g[0] = (uint32_t)other_of(l); }

static void end_describe(const layer *l, FILE *f) { fprintf(f, ", \"begin\": %d", other_of(l)); }

static const layer_class begin_class = {
    .name = "res_begin",
    .code = 13,
    .is_view = 1,
    .forward = begin_forward,
    .backward = begin_backward,
    .geometry = geometry,
    .block_end = other_of,
};

static const layer_class end_class = {
    .name = "res_end",
    .code = 14,
    .forward = end_forward,
    .backward = end_backward,
    .geometry = geometry,
    .describe = end_describe,
    .block_start = other_of,
    .passes_dy = passes,
};

pmap_status pmap_model_begin_residual(pmap_model *m) {
  const char *call = "pmap_model_begin_residual";
  layer l;
  PMAP_TRY(layer_start(m, &begin_class, call, &l));
  if (m->n_open == MODEL_MAX_NESTING)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: more than %d residual blocks open at once",
                    call, MODEL_MAX_NESTING);
  PMAP_TRY(model_push(m, l, call));
  m->open[m->n_open++] = m->n_layers - 1;
  return PMAP_SUCCESS;
}

pmap_status pmap_model_end_residual(pmap_model *m) {
  const char *call = "pmap_model_end_residual";
  layer l;
  PMAP_TRY(layer_start(m, &end_class, call, &l));
  if (m->n_open == 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: no residual block is open", call);
  int b = m->open[m->n_open - 1];
  const layer *begin = &m->layers[b];
  if (l.out_rank != begin->out_rank ||
      memcmp(l.out_shape, begin->out_shape, sizeof l.out_shape) != 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the block maps (%lld, %lld, %lld) to (%lld, %lld, %lld); y = x + f(x) "
                    "needs f to keep the shape",
                    call, (long long)begin->out_shape[0], (long long)begin->out_shape[1],
                    (long long)begin->out_shape[2], (long long)l.out_shape[0],
                    (long long)l.out_shape[1], (long long)l.out_shape[2]);
  LAYER_SETTINGS(residual_settings, &l)->other = b;
  PMAP_TRY(model_push(m, l, call));
  LAYER_SETTINGS(residual_settings, &m->layers[b])->other = m->n_layers - 1;
  m->n_open--;
  return PMAP_SUCCESS;
}

LAYER_FILE_CLASSES(residual, &begin_class, &end_class);
