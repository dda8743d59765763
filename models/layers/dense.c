/* dense.c: the fully connected layer, y (bd, units) = x (bd, F) W (F, units) + b: its builder,
 * shape rule, parameters, initialiser, forward, backward and checkpoint record. */
#include "models/model.h"
#include "base/error.h"

/* Under a GELU in training, the forward keeps the activation's slope where the sum before it
 * was (y: read by nothing but the activation's backward), which then multiplies by it instead
 * of computing it again; the same bits (ops/op_list.h). Where the activation's output is made
 * again from that sum (selective recomputation: layer.epilogue_redone), the forward keeps the
 * sum, and the pass that makes the output again leaves the slope there for the backward. */
static float *kept_slope(const layer *l, const replica *r, float *y, int backward) {
  if (l->epilogue != PMAP_ACT_GELU + 1 || r->inference) return NULL;
  return !l->epilogue_redone || backward ? y : NULL;
}

pmap_status dense_rows_forward(const layer *l, replica *r, int i, const float *in, float *y,
                               int64_t rows, int64_t f, int64_t u) {
  const pmap_ops *ops = r->ops;
  PMAP_TRY(layer_gemm(r, 0, 0, rows, u, f, layer_input(r, i, in), f, layer_weights(r, l->w_off), u,
                      0.0f, y, u));
  if (l->epilogue) /* the activation after it, into that layer's output (and its bf16 copy) */
    return ops->bias_act_forward(r->q, (pmap_act)(l->epilogue - 1), y, r->w + l->b_off, rows, u,
                                 r->act[i + 1], l->out16_at ? r->in16[l->out16_at] : NULL,
                                 kept_slope(l, r, y, 0));
  return ops->bias_forward(r->q, y, r->w + l->b_off, rows, u, 1);
}

pmap_status dense_rows_backward(const layer *l, replica *r, int i, const float *dy, float *dx,
                                int64_t rows, int64_t f, int64_t u) {
  const pmap_ops *ops = r->ops;
  layer_mat d;
  pmap_bf16 *dy16 = (pmap_bf16 *)(void *)r->tmp;
  if (l->epilogue) { /* dy is the activation's output gradient: its backward first, with db */
    const float *x = r->out[i]; /* the sum before the activation, or its kept slope */
    PMAP_TRY(ops->act_bias_backward(r->q, (pmap_act)(l->epilogue - 1), x, r->out[i + 1], dy,
                                    r->dact[i], layer_grad(r, l->b_off), rows, u,
                                    r->w16 ? dy16 : NULL, kept_slope(l, r, (float *)x, 1)));
    dy = r->dout[i] = r->dact[i];
    d = r->w16 ? (layer_mat){NULL, dy16} : (layer_mat){dy, NULL}; /* bf16: rounded in that pass */
  } else {
    PMAP_TRY(ops->bias_backward(r->q, dy, layer_grad(r, l->b_off), rows, u, 1)); /* db */
    PMAP_TRY(layer_operand(r, dy, (size_t)(rows * u), dy16, &d));
  }
  /* dW (f, u) += in^T (f, rows) dy (rows, u) */
  PMAP_TRY(layer_gemm(r, 1, 0, f, u, rows, layer_input(r, i, r->in[i]), f, d, u, 1.0f,
                      layer_grad(r, l->w_off), u));
  /* dx (rows, f) = dy (rows, u) W^T (u, f) */
  if (!dx) return PMAP_SUCCESS;
  return layer_gemm(r, 0, 1, rows, f, u, d, u, layer_weights(r, l->w_off), u, 0.0f, dx, f);
}

int dense_rows_gemms16(int64_t rows, int64_t f, int64_t u, ops_gemm16 *g) {
  g[0] = layer_gemm16(0, 0, rows, u, f, f, u, 0.0f, u);
  g[1] = layer_gemm16(1, 0, f, u, rows, f, u, 1.0f, u);
  g[2] = layer_gemm16(0, 1, rows, f, u, u, u, 0.0f, f);
  return 3;
}

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)dev, (void)out;
  return dense_rows_forward(l, r, i, in, y, bd, l->in_size, l->out_size);
}

static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  return dense_rows_backward(l, r, i, dy, dx, bd, l->in_size, l->out_size);
}

static void init(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  layer_init_fan_in(l, l->in_size, gain, rng, w);
}

static int gemms16(const layer *l, int64_t bd, ops_gemm16 *g) {
  return dense_rows_gemms16(bd, l->in_size, l->out_size, g);
}

static double macs(const layer *l) { return (double)l->w_size; }

static void describe(const layer *l, FILE *f) {
  fprintf(f, ", \"in\": %lld, \"out\": %lld", (long long)l->in_size, (long long)l->out_size);
}

static int blocks(const layer *l, layer_block *b) {
  b[0] = LAYER_BLOCK("w", LAYER_WEIGHTS, l->in_size, l->out_size);
  b[1] = LAYER_BLOCK("b", LAYER_BIAS, l->out_size);
  return 2;
}

static const layer_class dense_class = {
    .name = "dense",
    .code = 1,
    .takes_act = 1,
    .gemm_in = 1,
    .writes16 = 1,
    .redo_epilogue = 1, /* y keeps the sum before the activation unless it holds GELU's slope */
    .gemms16 = gemms16,
    .forward = forward,
    .backward = backward,
    .init = init,
    .macs = macs,
    .describe = describe,
    .blocks = blocks,
};

pmap_status pmap_model_add_dense(pmap_model *m, int64_t units) {
  const char *call = "pmap_model_add_dense";
  layer l;
  PMAP_TRY(layer_start(m, &dense_class, call, &l));
  if (l.in_rank != 1) {
    char shape[80];
    int n = snprintf(shape, sizeof shape, "%lld", (long long)l.in_shape[0]);
    for (int i = 1; i < l.in_rank && i < 3 && n > 0 && (size_t)n < sizeof shape; i++)
      n += snprintf(shape + n, sizeof shape - (size_t)n, " x %lld", (long long)l.in_shape[i]);
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: input of rank %d (%s); add a flatten layer first (or token_dense for "
                    "(T, F) tokens)",
                    call, l.in_rank, shape);
  }
  if (units <= 0 || units > (1 << 24))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: units %lld is outside 1..%d", call,
                    (long long)units, 1 << 24);
  l.out_rank = 1;
  l.out_shape[0] = l.out_size = units;
  l.out_shape[1] = l.out_shape[2] = 0;
  l.w_size = (size_t)(l.in_size * units);
  l.b_size = (size_t)units;
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(dense, &dense_class);
