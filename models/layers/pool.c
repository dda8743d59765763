/* pool.c: max and average pooling over windows of NCHW examples (no padding; windows may
 * overlap), and the global average pool (the whole plane, output (C)): one class each for max
 * and average, sharing forward, backward and the checkpoint record (kernel, stride). */
#include "models/model.h"
#include "base/error.h"

typedef struct pool_settings {
  pmap_pool_shape pool;
  int is_max;
} pool_settings;
LAYER_SETTINGS_FIT(pool_settings);

static const pool_settings *settings_of(const layer *l) {
  return LAYER_SETTINGS_CONST(pool_settings, l);
}

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)dev, (void)i, (void)out;
  const pool_settings *s = settings_of(l);
  return r->ops->pool2d_forward(r->q, s->is_max, &s->pool, bd, in, y);
}

static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  const pool_settings *s = settings_of(l);
  if (!dx) return PMAP_SUCCESS;
  return r->ops->pool2d_backward(r->q, s->is_max, &s->pool, bd, r->in[i], dy, dx);
}

static void geometry(const layer *l, uint32_t g[4]) {
  const pmap_pool_shape *p = &settings_of(l)->pool;
  g[0] = (uint32_t)p->kh, g[1] = (uint32_t)p->kw, g[2] = (uint32_t)p->stride;
}

static void describe(const layer *l, FILE *f) {
  const pmap_pool_shape *p = &settings_of(l)->pool;
  fprintf(f, ", \"kh\": %d, \"kw\": %d, \"stride\": %d, \"global\": %d", p->kh, p->kw, p->stride,
          l->out_rank == 1);
}

static const layer_class maxpool2d_class = {
    .name = "maxpool2d",
    .code = 9,
    .forward = forward,
    .backward = backward,
    .geometry = geometry,
    .describe = describe,
};

/* Also the global average pool (output rank 1). */
static const layer_class avgpool2d_class = {
    .name = "avgpool2d",
    .code = 10,
    .forward = forward,
    .backward = backward,
    .geometry = geometry,
    .describe = describe,
};

/* Pooling over windows kh x kw; global: the whole plane, output rank 1 (C). */
static pmap_status add_pool(pmap_model *m, const layer_class *cls, int kh, int kw, int stride,
                            int global, const char *call) {
  layer l;
  PMAP_TRY(layer_start(m, cls, call, &l));
  const int64_t *s = l.in_shape;
  if (l.in_rank != 3)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: input of rank %d; pooling needs (C, H, W)",
                    call, l.in_rank);
  if (global) {
    if (s[1] > (1 << 16) || s[2] > (1 << 16))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: plane %lldx%lld is too large", call,
                      (long long)s[1], (long long)s[2]);
    kh = (int)s[1], kw = (int)s[2], stride = 1;
  }
  if (!global && (kh <= 0 || kw <= 0 || stride <= 0 || kh > 64 || kw > 64 || stride > 64))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: window %dx%d, stride %d: need window 1..64 and stride 1..64", call, kh, kw,
                    stride);
  if (kh > s[1] || kw > s[2])
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: window %dx%d does not fit input %lldx%lld",
                    call, kh, kw, (long long)s[1], (long long)s[2]);
  int64_t oh = (s[1] - kh) / stride + 1, ow = (s[2] - kw) / stride + 1;
  pool_settings *ps = LAYER_SETTINGS(pool_settings, &l);
  ps->pool = (pmap_pool_shape){s[0], s[1], s[2], oh, ow, kh, kw, stride};
  ps->is_max = cls == &maxpool2d_class;
  l.out_size = s[0] * oh * ow;
  if (global)
    l.out_rank = 1, l.out_shape[1] = l.out_shape[2] = 0;
  else
    l.out_shape[1] = oh, l.out_shape[2] = ow;
  return model_push(m, l, call);
}

pmap_status pmap_model_add_maxpool2d(pmap_model *m, int kernel_h, int kernel_w, int stride) {
  return add_pool(m, &maxpool2d_class, kernel_h, kernel_w, stride, 0, "pmap_model_add_maxpool2d");
}

pmap_status pmap_model_add_avgpool2d(pmap_model *m, int kernel_h, int kernel_w, int stride) {
  return add_pool(m, &avgpool2d_class, kernel_h, kernel_w, stride, 0, "pmap_model_add_avgpool2d");
}

pmap_status pmap_model_add_global_avgpool(pmap_model *m) {
  return add_pool(m, &avgpool2d_class, 0, 0, 0, 1, "pmap_model_add_global_avgpool");
}

LAYER_FILE_CLASSES(pool, &maxpool2d_class, &avgpool2d_class);
