/* act.c: the element-wise activations beside relu (tanh, sigmoid, gelu: ops/op_math.h), any
 * shape; one class each, sharing forward and backward through the act_* ops. */
#include "models/model.h"
#include "base/error.h"

typedef struct act_settings {
  pmap_act act;
} act_settings;
LAYER_SETTINGS_FIT(act_settings);

static pmap_act act_of(const layer *l) { return LAYER_SETTINGS_CONST(act_settings, l)->act; }

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)dev, (void)i, (void)out;
  return r->ops->act_forward(r->q, act_of(l), in, y, (size_t)(bd * l->out_size));
}

static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  if (!dx) return PMAP_SUCCESS;
  return r->ops->act_backward(r->q, act_of(l), r->in[i], r->out[i], dy, dx,
                              (size_t)(bd * l->out_size));
}

static const layer_class tanh_class = {.name = "tanh",
                                       .act_epilogue = PMAP_ACT_TANH + 1,
                                       .redo_cheap = 1,
                                       .code = 5,
                                       .forward = forward,
                                       .backward = backward};
static const layer_class sigmoid_class = {.name = "sigmoid",
                                          .act_epilogue = PMAP_ACT_SIGMOID + 1,
                                          .redo_cheap = 1,
                                          .code = 6,
                                          .forward = forward,
                                          .backward = backward};
/* GELU's gradient is a function of its input alone (tanh's and sigmoid's read the output). */
static const layer_class gelu_class = {.name = "gelu",
                                       .act_epilogue = PMAP_ACT_GELU + 1,
                                       .out_unused = 1,
                                       .redo_cheap = 1,
                                       .code = 7,
                                       .forward = forward,
                                       .backward = backward};

static pmap_status add_act(pmap_model *m, const layer_class *cls, pmap_act act, const char *call) {
  layer l;
  PMAP_TRY(layer_start(m, cls, call, &l));
  LAYER_SETTINGS(act_settings, &l)->act = act;
  return model_push(m, l, call);
}

pmap_status pmap_model_add_tanh(pmap_model *m) {
  return add_act(m, &tanh_class, PMAP_ACT_TANH, "pmap_model_add_tanh");
}

pmap_status pmap_model_add_sigmoid(pmap_model *m) {
  return add_act(m, &sigmoid_class, PMAP_ACT_SIGMOID, "pmap_model_add_sigmoid");
}

pmap_status pmap_model_add_gelu(pmap_model *m) {
  return add_act(m, &gelu_class, PMAP_ACT_GELU, "pmap_model_add_gelu");
}

LAYER_FILE_CLASSES(act, &tanh_class, &sigmoid_class, &gelu_class);
