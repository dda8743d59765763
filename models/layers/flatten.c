/* flatten.c: (C, H, W) -> (C*H*W), a view: NCHW examples are already contiguous rows. */
#include "models/model.h"
#include "base/error.h"

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)dev, (void)l, (void)r, (void)i, (void)y, (void)bd;
  *out = in;
  return PMAP_SUCCESS;
}

static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)l, (void)r, (void)i, (void)bd;
  if (dx) *dx_out = dy;
  return PMAP_SUCCESS;
}

static int passes(const layer *l) {
  (void)l;
  return 1;
}

static const layer_class flatten_class = {
    .name = "flatten",
    .code = 4,
    .is_view = 1,
    .forward = forward,
    .backward = backward,
    .passes_dy = passes,
};

pmap_status pmap_model_add_flatten(pmap_model *m) {
  const char *call = "pmap_model_add_flatten";
  layer l;
  PMAP_TRY(layer_start(m, &flatten_class, call, &l));
  l.out_rank = 1;
  l.out_shape[0] = l.out_size;
  l.out_shape[1] = l.out_shape[2] = 0;
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(flatten, &flatten_class);
