/* model.c: the sequential model builder: layers, their shapes, the flat parameter layout and
 * the initial parameters. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "rng.h"
#include "base/error.h"

#define MAX_PARAMS ((size_t)1 << 31) /* keeps every count an exact int64 product */

pmap_status pmap_model_create(int rank, const int64_t *shape, pmap_model **out) {
  if (!out || !shape)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_model_create: %s is NULL",
                    out ? "input_shape" : "out");
  if (rank != 1 && rank != 3)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_model_create: input rank %d is not 1 (features) or 3 (C, H, W)", rank);
  int64_t size = 1;
  for (int i = 0; i < rank; i++) {
    if (shape[i] <= 0 || shape[i] > (1 << 24))
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "pmap_model_create: input extent %lld on axis %d is outside 1..%d",
                      (long long)shape[i], i, 1 << 24);
    size *= shape[i];
  }
  if (size > (1 << 28))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_model_create: %lld inputs per example is too many", (long long)size);
  pmap_model *m = calloc(1, sizeof *m);
  if (!m) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_model_create: out of memory");
  m->in_rank = rank;
  memcpy(m->in_shape, shape, (size_t)rank * sizeof *shape);
  m->in_size = size;
  m->loss = PMAP_LOSS_MSE;
  *out = m;
  return PMAP_SUCCESS;
}

void pmap_model_destroy(pmap_model *m) {
  if (!m) return;
  free(m->layers);
  free(m);
}

pmap_status model_clone(const pmap_model *m, pmap_model **out) {
  if (m->n_open)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "the model has %d residual block%s open: close each with "
                    "pmap_model_end_residual",
                    m->n_open, m->n_open > 1 ? "s" : "");
  pmap_model *c = malloc(sizeof *c);
  layer *l = malloc(sizeof *l * (size_t)(m->n_layers ? m->n_layers : 1));
  if (!c || !l) {
    free(c);
    free(l);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "out of memory copying a model");
  }
  *c = *m;
  memcpy(l, m->layers, sizeof *l * (size_t)m->n_layers);
  c->layers = l;
  c->cap = m->n_layers;
  *out = c;
  return PMAP_SUCCESS;
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

pmap_status model_push(pmap_model *m, layer l, const char *call) {
  model_current_shape(m, &l.in_rank, l.in_shape, &l.in_size);
  if (m->n_params + l.w_size + l.b_size + l.s_size > MAX_PARAMS)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: the model would exceed %zu parameters", call,
                    MAX_PARAMS);
  if (m->n_layers == m->cap) {
    int cap = m->cap ? 2 * m->cap : 8;
    layer *nl = realloc(m->layers, sizeof *nl * (size_t)cap);
    if (!nl) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
    m->layers = nl;
    m->cap = cap;
  }
  l.w_off = m->n_params;
  l.b_off = l.w_off + l.w_size;
  l.s_off = l.b_off + l.b_size;
  l.st_off = m->n_state;
  m->n_params += l.w_size + l.b_size + l.s_size;
  m->n_state += l.s_size;
  m->layers[m->n_layers++] = l;
  return PMAP_SUCCESS;
}

static pmap_status check_model(const pmap_model *m, const char *call) {
  if (!m) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: model is NULL", call);
  return PMAP_SUCCESS;
}

pmap_status pmap_model_add_dense(pmap_model *m, int64_t units) {
  const char *call = "pmap_model_add_dense";
  PMAP_TRY(check_model(m, call));
  int rank;
  int64_t shape[3], size;
  model_current_shape(m, &rank, shape, &size);
  if (rank != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: input of rank %d (%lld x %lld x %lld); add a flatten layer first", call,
                    rank, (long long)shape[0], (long long)shape[1], (long long)shape[2]);
  if (units <= 0 || units > (1 << 24))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: units %lld is outside 1..%d", call,
                    (long long)units, 1 << 24);
  layer l = {.kind = LAYER_DENSE, .out_rank = 1, .out_shape = {units}, .out_size = units};
  l.w_size = (size_t)(size * units);
  l.b_size = (size_t)units;
  l.fan_in = size;
  return model_push(m, l, call);
}

pmap_status pmap_model_add_relu(pmap_model *m) {
  const char *call = "pmap_model_add_relu";
  PMAP_TRY(check_model(m, call));
  layer l = {.kind = LAYER_RELU};
  model_current_shape(m, &l.out_rank, l.out_shape, &l.out_size);
  return model_push(m, l, call);
}

pmap_status pmap_model_add_flatten(pmap_model *m) {
  const char *call = "pmap_model_add_flatten";
  PMAP_TRY(check_model(m, call));
  layer l = {.kind = LAYER_FLATTEN, .out_rank = 1};
  int rank;
  int64_t shape[3];
  model_current_shape(m, &rank, shape, &l.out_size);
  l.out_shape[0] = l.out_size;
  return model_push(m, l, call);
}

pmap_status pmap_model_add_conv2d(pmap_model *m, int64_t oc, int kh, int kw, int stride, int pad) {
  const char *call = "pmap_model_add_conv2d";
  PMAP_TRY(check_model(m, call));
  int rank;
  int64_t s[3], size;
  model_current_shape(m, &rank, s, &size);
  if (rank != 3)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: input of rank %d; conv2d needs (C, H, W)", call,
                    rank);
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
  layer l = {.kind = LAYER_CONV2D, .out_rank = 3, .out_shape = {oc, oh, ow}};
  l.out_size = oc * oh * ow;
  l.conv = (pmap_conv_shape){s[0], s[1], s[2], oc, oh, ow, kh, kw, stride, pad};
  l.fan_in = s[0] * kh * kw;
  l.w_size = (size_t)(oc * l.fan_in);
  l.b_size = (size_t)oc;
  return model_push(m, l, call);
}

pmap_status pmap_model_set_loss(pmap_model *m, pmap_loss loss) {
  PMAP_TRY(check_model(m, "pmap_model_set_loss"));
  if (loss != PMAP_LOSS_MSE && loss != PMAP_LOSS_SOFTMAX_XENT)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_model_set_loss: unknown loss %d", (int)loss);
  m->loss = loss;
  return PMAP_SUCCESS;
}

size_t pmap_model_num_params(const pmap_model *m) { return m ? m->n_params : 0; }

void pmap_model_output_shape(const pmap_model *m, int *rank, int64_t shape[PMAP_MAX_RANK]) {
  int64_t s[3] = {0, 0, 0}, size;
  int r = 0;
  if (m) model_current_shape(m, &r, s, &size);
  if (rank) *rank = r;
  if (shape) {
    memset(shape, 0, sizeof(int64_t) * PMAP_MAX_RANK);
    memcpy(shape, s, sizeof s);
  }
}

double pmap_model_forward_macs(const pmap_model *m) {
  double macs = 0.0;
  for (int i = 0; m && i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    if (l->kind == LAYER_DENSE) macs += (double)l->w_size;
    if (l->kind == LAYER_CONV2D) macs += (double)l->w_size * (double)(l->conv.oh * l->conv.ow);
  }
  return macs;
}

size_t model_col_size(const pmap_model *m) {
  size_t best = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    if (l->kind != LAYER_CONV2D) continue;
    size_t s = (size_t)(l->fan_in * l->conv.oh * l->conv.ow);
    best = s > best ? s : best;
  }
  return best;
}

int model_trained_spans(const pmap_model *m, model_span *spans) {
  int n = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    size_t len = l->w_size + l->b_size;
    if (!len) continue;
    if (n && spans[n - 1].off + spans[n - 1].len == l->w_off)
      spans[n - 1].len += len;
    else
      spans[n++] = (model_span){l->w_off, len};
  }
  /* A model of no layers (a gradient function's): every parameter is trained. */
  if (m->n_layers == 0 && m->n_params) spans[n++] = (model_span){0, m->n_params};
  return n;
}

void model_init_params(const pmap_model *m, uint64_t seed, float *w) {
  pmap_rng rng = pmap_rng_seed(seed);
  for (int i = 0; i < m->n_layers; i++) layer_init(m, i, &rng, w);
}
