/* model.c: the sequential model, whatever its layers: creation, copies, the shape so far, the
 * flat parameter layout (model_push), the trained spans and the initial parameters. The kinds
 * of layer and their builders are in models/layers/. */
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "rng.h"
#include "base/error.h"

pmap_status pmap_model_create(int rank, const int64_t *shape, pmap_model **out) {
  if (!out || !shape)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_model_create: %s is NULL",
                    out ? "input_shape" : "out");
  if (rank != 1 && rank != 3)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_model_create: input rank %d is not 1 (features) or 3 (C, H, W)", rank);
  int64_t size = 1;
  for (int i = 0; i < rank; i++)
    if (shape[i] <= 0 || shape[i] > PMAP_MAX_EXTENT)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "pmap_model_create: input extent %lld on axis %d is outside 1..%d",
                      (long long)shape[i], i, PMAP_MAX_EXTENT);
  /* Each factor is at most 2^24 and the product is checked after each, so it never passes
   * 2^52: no wrap. */
  for (int i = 0; i < rank && size <= PMAP_MAX_FEATURES; i++) size *= shape[i];
  if (size > PMAP_MAX_FEATURES)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_model_create: input shape %s has more than %d values per example",
                    rank == 1 ? "(F)" : "(C, H, W)", PMAP_MAX_FEATURES);
  pmap_model *m = calloc(1, sizeof *m);
  if (!m) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_model_create: out of memory");
  m->in_rank = rank;
  memcpy(m->in_shape, shape, (size_t)rank * sizeof *shape);
  m->in_size = size;
  m->loss = PMAP_LOSS_MSE;
  m->in_dtype = PMAP_F32;
  *out = m;
  return PMAP_SUCCESS;
}

void pmap_model_destroy(pmap_model *m) {
  if (!m) return;
  free(m->layers);
  free(m);
}

pmap_status model_clone(const pmap_model *m, const char *call, pmap_model **out) {
  if (m->n_open)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the model has %d residual block%s open: close each with "
                    "pmap_model_end_residual",
                    call, m->n_open, m->n_open > 1 ? "s" : "");
  pmap_model *c = malloc(sizeof *c);
  layer *l = malloc(sizeof *l * (size_t)(m->n_layers ? m->n_layers : 1));
  if (!c || !l) {
    free(c);
    free(l);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory copying a model", call);
  }
  *c = *m;
  memcpy(l, m->layers, sizeof *l * (size_t)m->n_layers);
  c->layers = l;
  c->cap = m->n_layers;
  *out = c;
  return PMAP_SUCCESS;
}

pmap_status model_push(pmap_model *m, layer l, const char *call) {
  model_current_shape(m, &l.in_rank, l.in_shape, &l.in_size);
  /* Builders compute out_size from extents each within these limits, without wrapping; every
   * later count (a weight block, an arena, a batch's bytes) is then an exact product. */
  if (l.out_size < 1 || l.out_size > PMAP_MAX_FEATURES)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the layer's output would hold %lld values per example; at most %d", call,
                    (long long)l.out_size, PMAP_MAX_FEATURES);
  if (l.w_size > PMAP_MAX_PARAMS || l.b_size > PMAP_MAX_PARAMS ||
      m->n_params + l.w_size + l.b_size + l.s_size > PMAP_MAX_PARAMS)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: the model would exceed %zu parameters (it has %zu, the layer adds %zu)",
                    call, PMAP_MAX_PARAMS, m->n_params, l.w_size + l.b_size + l.s_size);
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
  /* A layer whose class takes activations folds an activation pushed right after it. */
  layer *prev = m->n_layers ? &m->layers[m->n_layers - 1] : NULL;
  if (prev && prev->cls->takes_act && l.cls->act_epilogue && !prev->epilogue) {
    prev->epilogue = l.cls->act_epilogue;
    l.folded = 1;
  }
  m->layers[m->n_layers++] = l;
  return PMAP_SUCCESS;
}

static pmap_status check_model(const pmap_model *m, const char *call) {
  if (!m) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: model is NULL", call);
  return PMAP_SUCCESS;
}

pmap_status pmap_model_set_loss(pmap_model *m, pmap_loss loss) {
  PMAP_TRY(check_model(m, "pmap_model_set_loss"));
  if (loss != PMAP_LOSS_MSE && loss != PMAP_LOSS_SOFTMAX_XENT && loss != PMAP_LOSS_TOKEN_XENT)
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
  for (int i = 0; m && i < m->n_layers; i++) macs += layer_macs(&m->layers[i]);
  return macs;
}

size_t model_col_size(const pmap_model *m) {
  size_t best = 0;
  for (int i = 0; i < m->n_layers; i++)
    best = m->layers[i].col_size > best ? m->layers[i].col_size : best;
  return best;
}

/* The bf16 policy's layout (docs/precision.md). */
void model_set_precision(pmap_model *m, int bf16) {
  m->bf16 = bf16;
  for (int i = 0; i < m->n_layers; i++) {
    layer *l = &m->layers[i];
    const layer *next = i + 1 < m->n_layers ? &m->layers[i + 1] : NULL;
    l->in16 = bf16 && l->cls->gemm_in;
    /* Read by nothing but the next layer's bfloat16 copy of it: its float form need not be
     * kept (the last layer's output is the model's, always kept). */
    l->transient = bf16 && next && next->cls->gemm_in && !next->folded && !layer_is_view(l) &&
                   l->cls->out_unused;
    size_t aux = 0, fixed = 0, own = l->in16 ? ((size_t)l->out_size + 1) / 2 : 0; /* dy's copy */
    if (bf16 && l->cls->bf16_rows) l->cls->bf16_rows(l, &aux, &fixed, &own);
    size_t held = l->transient ? (size_t)l->out_size : 0;
    l->tmp_rows = held > own ? held : own;
    l->out16_at = l->in16_made = 0;
  }
  /* A producer that writes its consumer's bfloat16 input: its output's next reader, past the
   * activation folded into it. */
  for (int i = 0; i < m->n_layers; i++) {
    layer *l = &m->layers[i];
    int at = i + 1 + (l->epilogue != 0);
    /* A class that takes an activation writes the copy in its epilogue's pass alone. */
    if (!l->cls->writes16 || (l->cls->takes_act && !l->epilogue) || at >= m->n_layers) continue;
    layer *use = &m->layers[at];
    if (use->in16 && !use->folded && (!l->epilogue || m->layers[i + 1].folded)) {
      l->out16_at = at;
      use->in16_made = 1;
    }
  }
}

/* Whether layer j is computed again under SELECTIVE: an element-wise class, and for an
 * activation folded into the layer before, a layer that keeps the sum it is made from. */
static int redo_selective(const pmap_model *m, int j) {
  const layer *l = &m->layers[j];
  if (!l->cls->redo_cheap) return 0;
  return !l->folded || (j > 0 && m->layers[j - 1].cls->redo_epilogue);
}

void model_set_recompute(pmap_model *m, int mode) {
  m->recompute = 0;
  for (int i = 0; i < m->n_layers; i++) {
    layer *l = &m->layers[i];
    l->shared = l->region_start = l->epilogue_redone = l->recompute_from = 0;
  }
  if (mode != PMAP_RECOMPUTE_FULL && mode != PMAP_RECOMPUTE_SELECTIVE) return;
  int blocks = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    int e = l->cls->block_end ? l->cls->block_end(l) : -1;
    if (e <= i || e >= m->n_layers) continue;
    /* Computed again, a layer of state would update it twice, and one with collectives would
     * call them more often than the devices' other layers (a block inside may still qualify). */
    int plain = 1;
    for (int j = i; j <= e; j++) plain &= !m->layers[j].cls->collectives && !m->layers[j].s_size;
    if (!plain) continue;
    int first = -1;
    for (int j = i; j < e; j++) {
      if (mode == PMAP_RECOMPUTE_SELECTIVE && !redo_selective(m, j)) continue;
      m->layers[j].shared = 1;
      if (first < 0) first = j;
      if (mode == PMAP_RECOMPUTE_SELECTIVE && m->layers[j].folded)
        m->layers[j - 1].epilogue_redone = 1;
    }
    if (first >= 0) { /* something in it to compute again */
      m->layers[first].region_start = 1;
      m->layers[e].recompute_from = i + 1;
      m->recompute = mode;
      blocks++;
    }
    i = e; /* the outermost block only: the blocks inside it are computed again with it */
  }
  /* One block saves nothing (the region holds all of it); under SELECTIVE it would still be
   * computed again (its GELUs' slopes are made in that pass), so it is stored instead. */
  if (mode == PMAP_RECOMPUTE_SELECTIVE && blocks < 2) model_set_recompute(m, PMAP_RECOMPUTE_NONE);
}

size_t model_tmp_rows(const pmap_model *m) {
  size_t most = 0;
  for (int i = 0; i < m->n_layers; i++)
    most = m->layers[i].tmp_rows > most ? m->layers[i].tmp_rows : most;
  return most;
}

int model_has_collectives(const pmap_model *m) {
  for (int i = 0; i < m->n_layers; i++)
    if (m->layers[i].cls->collectives) return 1;
  return 0;
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
  for (int i = 0; i < m->n_layers; i++)
    layer_init(&m->layers[i], i + 1 < m->n_layers ? &m->layers[i + 1] : NULL, &rng, w);
}
