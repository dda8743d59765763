/* relu.c: y = max(x, 0), any shape; the layer before it draws its weights with He's gain, and a
 * dense or conv2d layer before it applies it in its own pass (layer.h, epilogue). */
#include "models/model.h"
#include "base/error.h"

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)dev, (void)i, (void)out;
  return r->ops->relu_forward(r->q, in, y, (size_t)(bd * l->out_size));
}

static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  if (!dx) return PMAP_SUCCESS;
  return r->ops->relu_backward(r->q, r->out[i], dy, dx, (size_t)(bd * l->out_size));
}

static const layer_class relu_class = {
    .name = "relu",
    .code = 2,
    .init_gain = 2.0, /* He normal in front of a ReLU */
    .act_epilogue = PMAP_ACT_RELU + 1,
    .redo_cheap = 1,
    .forward = forward,
    .backward = backward,
};

pmap_status pmap_model_add_relu(pmap_model *m) {
  const char *call = "pmap_model_add_relu";
  layer l;
  PMAP_TRY(layer_start(m, &relu_class, call, &l));
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(relu, &relu_class);
