/* conv2d.c: 2-D convolution over NCHW examples with a bias per output channel, (C, H, W) ->
 * (OC, OH, OW): its builder, shape rule, parameters, initialiser, forward, backward and
 * checkpoint record (kernel, stride, padding). */
#include "models/model.h"
#include "base/error.h"

typedef struct conv_settings {
  pmap_conv_shape conv;
} conv_settings;
LAYER_SETTINGS_FIT(conv_settings);

static const pmap_conv_shape *shape_of(const layer *l) {
  return &LAYER_SETTINGS_CONST(conv_settings, l)->conv;
}

static int64_t fan_in(const pmap_conv_shape *s) { return s->c * s->kh * s->kw; }

/* A ReLU after it is applied by the convolution itself (bias and ReLU in its epilogue), writing
 * the ReLU layer's output alone: nothing reads the value before the ReLU, whose gradient needs
 * only its output. Another activation after it runs as its own op on the convolution's output.
 *
 * The bf16 policy (docs/precision.md): the convolution's operands (input, weights, output
 * gradient) rounded to bfloat16 values held as floats, through the float kernels, whose
 * products of such values are exact: bfloat16 semantics, float speed. The input and weights so
 * rounded stay in r->aux[i] (bd x C H W, then the weights) from forward to backward; dy's
 * rounding takes the shared scratch. The bias gradient is no GEMM operand: it sums the float dy
 * (bias_backward, before the rounding), as dense's does, and the kernel is given no db. */
static void rows16(const layer *l, size_t *aux, size_t *fixed, size_t *tmp) {
  *aux = (size_t)l->in_size;
  *fixed = l->w_size;
  *tmp = (size_t)l->out_size;
}

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)dev;
  const pmap_conv_shape *s = shape_of(l);
  const float *w = r->w + l->w_off, *b = r->w + l->b_off;
  if (r->w16) {
    float *x16 = r->aux[i], *w16 = x16 + (size_t)(bd * l->in_size);
    PMAP_TRY(r->ops->round_bf16(r->q, in, NULL, x16, (size_t)(bd * l->in_size)));
    PMAP_TRY(r->ops->widen_bf16(r->q, r->w16 + l->w_off, w16, l->w_size));
    in = x16, w = w16;
  }
  if (l->epilogue == PMAP_ACT_RELU + 1) {
    *out = r->act[i + 1];
    return r->ops->conv2d_forward(r->q, s, bd, in, w, b, 1, r->act[i + 1], r->col);
  }
  PMAP_TRY(r->ops->conv2d_forward(r->q, s, bd, in, w, b, 0, y, r->col));
  if (!l->epilogue) return PMAP_SUCCESS;
  return r->ops->act_forward(r->q, (pmap_act)(l->epilogue - 1), y, r->act[i + 1],
                             (size_t)(bd * l->out_size));
}

/* dy: the gradient of the activation's output where one is folded in. */
static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  const pmap_conv_shape *s = shape_of(l);
  const float *relu_out = NULL;
  if (l->epilogue == PMAP_ACT_RELU + 1) {
    relu_out = r->out[i + 1];
  } else if (l->epilogue) {
    PMAP_TRY(r->ops->act_backward(r->q, (pmap_act)(l->epilogue - 1), r->out[i], r->out[i + 1], dy,
                                  r->dact[i], (size_t)(bd * l->out_size)));
    dy = r->dout[i] = r->dact[i];
  }
  const float *x = r->in[i], *w = r->w + l->w_off;
  float *db = layer_grad(r, l->b_off);
  if (r->w16) {
    /* The bias gradient from the float dy (through the ReLU first where it is folded), as
     * dense's; the convolution then takes the rounded dy alone. Rounding commutes with the
     * ReLU's mask, so the kernels' gradients are those of the rounded dy through it. */
    size_t n = (size_t)(bd * l->out_size);
    x = r->aux[i], w = x + (size_t)(bd * l->in_size);
    if (relu_out) {
      PMAP_TRY(r->ops->relu_backward(r->q, relu_out, dy, r->tmp, n));
      dy = r->tmp, relu_out = NULL;
    }
    PMAP_TRY(r->ops->bias_backward(r->q, dy, db, bd, s->oc, s->oh * s->ow));
    PMAP_TRY(r->ops->round_bf16(r->q, dy, NULL, r->tmp, n));
    dy = r->tmp, db = NULL;
  }
  return r->ops->conv2d_backward(r->q, s, bd, x, w, relu_out, dy, dx, layer_grad(r, l->w_off), db,
                                 r->col, r->dcol);
}

static void init(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  layer_init_fan_in(l, fan_in(shape_of(l)), gain, rng, w);
}

static void geometry(const layer *l, uint32_t g[4]) {
  const pmap_conv_shape *s = shape_of(l);
  g[0] = (uint32_t)s->kh, g[1] = (uint32_t)s->kw, g[2] = (uint32_t)s->stride;
  g[3] = (uint32_t)s->pad;
}

static double macs(const layer *l) {
  const pmap_conv_shape *s = shape_of(l);
  return (double)l->w_size * (double)(s->oh * s->ow);
}

static void describe(const layer *l, FILE *f) {
  const pmap_conv_shape *s = shape_of(l);
  fprintf(f, ", \"c\": %lld, \"oc\": %lld, \"kh\": %d, \"kw\": %d, \"stride\": %d, \"pad\": %d",
          (long long)s->c, (long long)s->oc, s->kh, s->kw, s->stride, s->pad);
}

static int blocks(const layer *l, layer_block *b) {
  const pmap_conv_shape *s = shape_of(l);
  b[0] = LAYER_BLOCK("w", LAYER_WEIGHTS, s->oc, s->c, s->kh, s->kw);
  b[1] = LAYER_BLOCK("b", LAYER_BIAS, s->oc);
  return 2;
}

static const layer_class conv2d_class = {
    .name = "conv2d",
    .code = 3,
    .takes_act = 1,
    .bf16_rows = rows16,
    .forward = forward,
    .backward = backward,
    .init = init,
    .geometry = geometry,
    .macs = macs,
    .describe = describe,
    .blocks = blocks,
};

pmap_status pmap_model_add_conv2d(pmap_model *m, int64_t oc, int kh, int kw, int stride, int pad) {
  const char *call = "pmap_model_add_conv2d";
  layer l;
  PMAP_TRY(layer_start(m, &conv2d_class, call, &l));
  const int64_t *s = l.in_shape;
  if (l.in_rank != 3)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: input of rank %d; conv2d needs (C, H, W)", call,
                    l.in_rank);
  if (oc <= 0 || oc > (1 << 16) || kh <= 0 || kw <= 0 || stride <= 0 || pad < 0 || kh > 64 ||
      kw > 64 || pad > 64)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: out_channels %lld, kernel %dx%d, stride %d, pad %d: need out_channels "
                    "1..65536, kernel 1..64, stride >= 1, pad 0..64",
                    call, (long long)oc, kh, kw, stride, pad);
  int64_t oh = (s[1] + 2 * pad - kh) / stride + 1, ow = (s[2] + 2 * pad - kw) / stride + 1;
  if (s[1] + 2 * pad < kh || s[2] + 2 * pad < kw)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: kernel %dx%d does not fit input %lldx%lld with pad %d", call, kh, kw,
                    (long long)s[1], (long long)s[2], pad);
  pmap_conv_shape c = {s[0], s[1], s[2], oc, oh, ow, kh, kw, stride, pad};
  LAYER_SETTINGS(conv_settings, &l)->conv = c;
  l.out_shape[0] = oc, l.out_shape[1] = oh, l.out_shape[2] = ow;
  l.out_size = oc * oh * ow;
  l.w_size = (size_t)(oc * fan_in(&c));
  l.b_size = (size_t)oc;
  l.col_size = (size_t)(fan_in(&c) * oh * ow);
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(conv2d, &conv2d_class);
