/* exec.c: one device's forward, loss and backward over its shard, through the op table only.
 * Forward overwrites activations; backward overwrites activation gradients and accumulates
 * parameter gradients (see ops/ops.h). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "model.h"
#include "runtime/runtime.h"
#include "base/error.h"
#include "base/trace.h"

/* Whether x (n, device memory) holds only finite values: read back to the host (a wait for the
 * device; only while the guard looks for a source). */
static pmap_status finite_on_host(pmap_device *dev, const float *x, size_t n, int *finite) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  if (!h) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "out of memory reading %zu floats back", n);
  pmap_status st = backend_download(dev, h, x, n * sizeof *h);
  *finite = 1;
  for (size_t i = 0; !st && i < n; i++) *finite &= isfinite(h[i]) != 0;
  free(h);
  return st;
}

pmap_status model_exchange(pmap_device *dev, replica *r, const char *what, float *x, size_t n) {
  if (!dev)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s need collectives, which a replica without a device lacks", what);
  int watch = r->source.watch && !r->source.seen, sent = 1, got = 1;
  if (watch) PMAP_TRY(finite_on_host(dev, x, n, &sent));
  PMAP_TRY(backend_all_reduce(dev, what, x, x, n, PMAP_RED_SUM));
  if (watch) PMAP_TRY(finite_on_host(dev, x, n, &got));
  /* Every device gets back the same values, so every device stops at the same exchange. */
  if (watch && !got) {
    r->source.seen = 1;
    r->source.sent = !sent;
  }
  return PMAP_SUCCESS;
}

void replica_unplace(replica *r) {
  free(r->act);
  free(r->dact);
  free(r->aux);
  free(r->in);
  free(r->out);
  free(r->dout);
  free(r->in16);
  free(r->dplan);
  r->in16 = NULL;
  r->dplan = NULL;
  r->tmp = NULL;
  r->act = r->dact = r->aux = NULL;
  r->dpool = NULL;
  r->dpool_n = 0;
  r->in = r->out = r->dout = NULL;
  r->arena = NULL;
  r->rows = 0;
}

void replica_release(pmap_device *dev, replica *r) {
  if (r->arena && r->q && r->ob && r->ob->gemm16_set_workspace)
    r->ob->gemm16_set_workspace(r->q, NULL, 0);
  backend_free(dev, r->arena);
  replica_unplace(r);
}

/* The output gradients' pool. A layer's backward reads its output gradient dy, writes its input's
 * (dx, r->dact[i - 1]) and may use r->dact[i] as scratch (dense and conv2d: the gradient before
 * their folded activation); a residual block's start reads its end's (r->dout[end]) as well.
 * So at most 3 + the open blocks gradients are live at once. pool_walk goes through the
 * backward pass once, as the model's shape alone decides it, and gives each layer's dx and
 * scratch a buffer that holds no gradient still to be read (not dy, nor one an open block's
 * start will read): of the free buffers the smallest that is large enough, else the largest,
 * grown to fit, else a new one (a layer that passes dy on, and writes neither, gets dy's; the
 * first layer no dx). So a wide layer's gradient (a transformer's MLP) takes only as many
 * buffers of its width as are live at once, and the rest are as narrow as their layers.
 * Where the pool takes less than one buffer per layer, the layers take theirs from it as
 * planned (model_backward, which checks that each dy is where the plan has it). The values are
 * the same wherever they live, so the bits are too. */
typedef struct pool_plan {
  int n;                      /* buffers */
  size_t cap[MODEL_POOL_MAX]; /* floats per example of each */
} pool_plan;

/* A free buffer (not not1, not2, nor held) of at least need floats per example; -1 for none. */
static int pool_pick(pool_plan *p, const int *held, size_t need, int not1, int not2) {
  int fit = -1, big = -1;
  for (int k = 0; k < p->n; k++) {
    if (k == not1 || k == not2 || held[k]) continue;
    if (p->cap[k] >= need && (fit < 0 || p->cap[k] < p->cap[fit])) fit = k;
    if (big < 0 || p->cap[k] > p->cap[big]) big = k;
  }
  if (fit >= 0) return fit;
  if (big < 0) {
    if (p->n == MODEL_POOL_MAX) return -1;
    big = p->n++;
  }
  p->cap[big] = need;
  return big;
}

/* The pool's buffers into p and, where plan is not NULL, each layer's three (replica.dplan);
 * -1 where more than MODEL_POOL_MAX would be needed (blocks nest at most MODEL_MAX_NESTING deep,
 * so never). */
static int pool_walk(const pmap_model *m, pool_plan *p, int *plan) {
  int held[MODEL_POOL_MAX] = {0}, stack[MODEL_MAX_NESTING], open = 0, at = 0, L = m->n_layers;
  p->n = 1;
  p->cap[0] = (size_t)m->layers[L - 1].out_size; /* the loss's gradient */
  for (int i = L - 1; i >= 0; i--) {
    const layer *l = &m->layers[i];
    int dx = -1, scratch = -1;
    if (!l->folded) { /* a folded layer passes dy on and writes nothing */
      int b = l->cls->block_start ? l->cls->block_start(l) : -1;
      if (b >= 0 && b < i) { /* a block's end: its start reads this dy */
        if (open == MODEL_MAX_NESTING) return -1;
        stack[open++] = at;
        held[at]++;
      }
      if (l->cls->passes_dy && l->cls->passes_dy(l)) {
        dx = i > 0 ? at : -1; /* it writes neither: should it, it would write dy's own buffer */
        scratch = i < L - 1 ? at : -1;
      } else {
        if (i > 0 && (dx = pool_pick(p, held, (size_t)l->in_size, at, -1)) < 0) return -1;
        if (i < L - 1 && (scratch = pool_pick(p, held, (size_t)l->out_size, at, dx)) < 0) return -1;
      }
      int e = l->cls->block_end ? l->cls->block_end(l) : -1;
      if (e > i && e < L && open > 0) held[stack[--open]]--; /* a block's start has read it */
    }
    if (plan) plan[3 * i] = at, plan[3 * i + 1] = dx, plan[3 * i + 2] = scratch;
    if (!l->folded && !(l->cls->passes_dy && l->cls->passes_dy(l))) at = dx;
  }
  return 0;
}

/* Floats per example of layer l's own part of the arena: its output (unless a view or, under
 * bf16, transient), its output gradient (unless pooled), its scratch and its input's bfloat16
 * copy. */
static size_t layer_rows(const pmap_model *m, const layer *l, int pooled) {
  size_t copies = (layer_is_view(l) || l->transient ? 0 : 1) + !pooled;
  size_t in16 = l->in16 ? ((size_t)l->in_size + 1) / 2 : 0;
  return (size_t)l->out_size * copies + layer_aux_rows(l, m->bf16) + in16;
}

/* Floats of layer l's own part of the arena over bd examples; -1 on overflow. */
static int layer_floats(const pmap_model *m, const layer *l, int64_t bd, int pooled, size_t *out) {
  size_t per = 0;
  if (__builtin_mul_overflow(layer_rows(m, l, pooled), (size_t)bd, &per) ||
      __builtin_add_overflow(per, layer_aux_fixed(l, m->bf16), out))
    return -1;
  return 0;
}

/* Whether layer i, not shared itself, has its input's bfloat16 copy in the region of a
 * recomputed block: the layer whose output it reads is shared and wrote the copy in its own
 * pass (or its epilogue's), so that computing it again writes the copy again. */
static int in16_in_region(const pmap_model *m, int i) {
  const layer *l = &m->layers[i];
  return !l->shared && l->in16 && l->in16_made && i > 0 && m->layers[i - 1].shared;
}

/* Layer i's floats over bd examples in its own part of the arena and in the region of the
 * recomputed blocks (all of a shared layer's; of another, the input copy in16_in_region puts
 * there); -1 on overflow. */
static int layer_parts(const pmap_model *m, int i, int64_t bd, int pooled, size_t *own,
                       size_t *region) {
  const layer *l = &m->layers[i];
  size_t f = 0;
  if (layer_floats(m, l, bd, pooled, &f)) return -1;
  *own = l->shared ? 0 : f, *region = l->shared ? f : 0;
  if (in16_in_region(m, i)) {
    *region = ((size_t)l->in_size + 1) / 2 * (size_t)bd; /* at most f, so no overflow */
    *own = f - *region;
  }
  return 0;
}

/* The layers' part of the arena: every layer's own, except that the layers of recomputed blocks
 * (layer.shared) take one region that each such block uses in turn, sized for the largest; then
 * the pool of output gradients, where pooled. */
static int layers_floats(const pmap_model *m, int64_t bd, int pooled, size_t *out) {
  size_t total = 0, run = 0, region = 0, pool = 0;
  for (int i = 0; i < m->n_layers; i++) {
    size_t own = 0, shared = 0;
    if (layer_parts(m, i, bd, pooled, &own, &shared)) return -1;
    if (m->layers[i].region_start) run = 0; /* a recomputed block's first shared layer */
    if (__builtin_add_overflow(total, own, &total) || __builtin_add_overflow(run, shared, &run))
      return -1;
    region = run > region ? run : region;
  }
  if (pooled) {
    pool_plan p;
    size_t per = 0;
    if (pool_walk(m, &p, NULL)) return -1;
    for (int k = 0; k < p.n; k++) per += p.cap[k]; /* each at most PMAP_MAX_FEATURES */
    if (__builtin_mul_overflow(per, (size_t)bd, &pool)) return -1;
  }
  if (__builtin_add_overflow(total, region, out) || __builtin_add_overflow(*out, pool, out))
    return -1;
  return 0;
}

/* Whether the output gradients of bd examples are pooled: where that takes less (at bd itself:
 * a recomputed block's region is sized for the largest block, which one that is can change with
 * the rows, since some layers' scratch does not grow with them). */
static int dact_pooled(const pmap_model *m, int64_t bd) {
  size_t own = 0, pool = 0;
  if (m->n_layers < 2 || layers_floats(m, bd, 0, &own) || layers_floats(m, bd, 1, &pool)) return 0;
  return pool < own;
}

int model_arena_floats(const pmap_model *m, int64_t bd, size_t *out) {
  size_t total = 0, per = 0, layers = 0, col = model_col_size(m);
  if (bd < 0 || __builtin_mul_overflow(col, (size_t)2, &total) ||
      __builtin_mul_overflow(model_tmp_rows(m), (size_t)bd, &per) ||
      __builtin_add_overflow(total, per, &total) ||
      layers_floats(m, bd, dact_pooled(m, bd), &layers) ||
      __builtin_add_overflow(total, layers, &total))
    return -1;
  *out = total;
  return 0;
}

pmap_status model_gemm16_workspace(const pmap_model *m, const op_backend *ob, int64_t bd,
                                   size_t *bytes) {
  *bytes = 0;
  if (!m->bf16 || !ob || !ob->gemm16_workspace || bd < 1) return PMAP_SUCCESS;
  size_t most = 0;
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    if (!l->cls->gemms16) continue;
    ops_gemm16 g[LAYER_MAX_GEMMS16];
    int n = l->cls->gemms16(l, bd, g);
    for (int j = 0; j < n; j++) {
      size_t b = 0;
      PMAP_TRY(ob->gemm16_workspace(&g[j], &b));
      most = b > most ? b : most;
    }
  }
  /* Rounded up to whole floats and 64-byte lines, and a line more to align it in the arena. */
  if (most) *bytes = (most + 63) / 64 * 64 + 64;
  return PMAP_SUCCESS;
}

/* The per-layer pointer arrays of r (device: its index for the message, -1 for none). A device
 * allocates them before its arena: where the arena lands in the heap shows in step times (the
 * CPU step of convnet took 0.6 or 0.8 ms with the two orders, all in its im2col). */
static pmap_status place_arrays(const pmap_model *m, replica *r, int device) {
  size_t L = (size_t)m->n_layers;
  r->act = calloc(L, sizeof *r->act);
  r->dact = calloc(L, sizeof *r->dact);
  r->aux = calloc(L, sizeof *r->aux);
  r->in = calloc(L, sizeof *r->in);
  r->out = calloc(L, sizeof *r->out);
  r->dout = calloc(L, sizeof *r->dout);
  r->in16 = calloc(L, sizeof *r->in16);
  r->dplan = calloc(3 * L, sizeof *r->dplan);
  if (r->act && r->dact && r->aux && r->in && r->out && r->dout && r->in16 && r->dplan)
    return PMAP_SUCCESS;
  replica_unplace(r);
  if (device < 0)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "out of memory for %zu layer pointers", L);
  return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "device %d: out of memory for %zu layer pointers", device,
                  L);
}

/* Each layer's output, output gradient, scratch and bfloat16 input (those of recomputed blocks
 * in their shared region, after the others', each block from its start), then the pool of output
 * gradients where pooled, the shared conv scratch and the shared scratch of the bf16 policy
 * (where transient outputs live), in arena. */
static void place_arena(const pmap_model *m, replica *r, float *arena, int64_t bd) {
  size_t B = (size_t)bd, layers = 0;
  int pooled = dact_pooled(m, bd);
  (void)layers_floats(m, bd, pooled, &layers); /* checked by model_arena_floats before */
  float *own = arena, *region = arena, *tmp = arena + model_col_size(m) * 2 + layers;
  for (int i = 0; i < m->n_layers; i++) {
    size_t f = 0, shared = 0;
    (void)layer_parts(m, i, bd, pooled, &f, &shared);
    region += f;
  }
  r->dpool = NULL, r->dpool_n = 0;
  pool_plan pp;
  if (pooled && !pool_walk(m, &pp, r->dplan)) { /* checked by model_arena_floats before */
    size_t per = 0;
    for (int k = 0; k < pp.n; k++) per += pp.cap[k];
    r->dpool = arena + layers - per * B;
    r->dpool_n = pp.n;
    size_t at = 0;
    for (int k = 0; k < pp.n; at += pp.cap[k], k++) r->dslot[k] = r->dpool + at * B;
  }
  float *p = own, *run = region;
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    size_t per = (size_t)l->out_size * B;
    if (l->region_start) run = region; /* a recomputed block's first shared layer */
    float **at = l->shared ? &run : &own;
    p = *at;
    if (l->transient) {
      r->act[i] = tmp;
    } else if (!layer_is_view(l)) {
      r->act[i] = p;
      p += per;
    }
    if (r->dpool) {
      r->dact[i] = r->dpool; /* the loss's gradient; the others' are set in the backward */
    } else {
      r->dact[i] = p;
      p += per;
    }
    r->aux[i] = p;
    p += layer_aux_rows(l, m->bf16) * B + layer_aux_fixed(l, m->bf16);
    *at = p;
    if (in16_in_region(m, i)) at = &run;
    r->in16[i] = l->in16 ? (pmap_bf16 *)(void *)*at : NULL;
    *at += l->in16 ? ((size_t)l->in_size + 1) / 2 * B : 0;
  }
  p = arena + layers;
  r->col = p;
  r->dcol = p + model_col_size(m);
  r->tmp = model_tmp_rows(m) ? tmp : NULL;
  r->arena = arena;
  r->rows = bd;
}

pmap_status replica_place(const pmap_model *m, replica *r, float *arena, int64_t bd) {
  PMAP_TRY(place_arrays(m, r, -1));
  place_arena(m, r, arena, bd);
  return PMAP_SUCCESS;
}

/* The arena of a device replica: the activations (model_arena_floats), then the bf16 GEMMs'
 * workspace (model_gemm16_workspace), which the queue's GEMMs are given. */
pmap_status replica_reserve(pmap_device *dev, const pmap_model *m, replica *r, int64_t bd) {
  if (bd <= r->rows) return PMAP_SUCCESS;
  replica_release(dev, r);
  size_t total = 0, ws = 0;
  if (model_arena_floats(m, bd, &total) || total > PTRDIFF_MAX / sizeof(float) / 2)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "device %d: the activations of %lld examples take more than the address space",
                    dev ? pmap_local_index(dev) : 0, (long long)bd);
  PMAP_TRY(model_gemm16_workspace(m, r->ob, bd, &ws));
  pmap_status st = place_arrays(m, r, dev ? pmap_local_index(dev) : 0);
  void *arena = NULL;
  if (!st) st = backend_alloc(dev, total * sizeof(float) + ws, &arena);
  if (st) {
    replica_unplace(r);
    return st;
  }
  place_arena(m, r, arena, bd);
  r->sized_rows = bd;
  if (ws && r->q) { /* after the activations, on a 64-byte line */
    uintptr_t at = ((uintptr_t)((float *)arena + total) + 63) / 64 * 64;
    r->ob->gemm16_set_workspace(r->q, (void *)at, ws - 64);
  }
  return PMAP_SUCCESS;
}

pmap_status model_forward(pmap_device *dev, const pmap_model *m, replica *r, const float *x,
                          int64_t bd) {
  const float *in = x;
  trace_rec *tr = dev ? runtime_trace(runtime_ctx_of(dev)) : NULL;
  for (int i = 0; i < m->n_layers; i++) {
    r->in[i] = in;
    runtime_span sp = tr ? runtime_span_begin(dev) : (runtime_span){0, -1};
    PMAP_TRY(layer_forward(dev, m, r, i, in, bd));
    if (tr) runtime_span_end(dev, sp, "forward", m->layers[i].cls->name, i, "layer", -1);
    in = r->out[i];
  }
  return PMAP_SUCCESS;
}

pmap_status model_loss(const pmap_model *m, replica *r, const void *y, int64_t bd, float *loss) {
  const layer *last = &m->layers[m->n_layers - 1];
  if (m->loss == PMAP_LOSS_MSE)
    PMAP_TRY(r->ops->mse(r->q, r->out[m->n_layers - 1], y, (size_t)(bd * last->out_size),
                         r->dact[m->n_layers - 1], loss));
  else if (m->loss == PMAP_LOSS_TOKEN_XENT) /* each of the bd x T tokens is a row */
    PMAP_TRY(r->ops->softmax_xent(r->q, r->out[m->n_layers - 1], y, bd * last->out_shape[0],
                                  last->out_shape[1], r->dact[m->n_layers - 1], loss));
  else
    PMAP_TRY(r->ops->softmax_xent(r->q, r->out[m->n_layers - 1], y, bd, last->out_size,
                                  r->dact[m->n_layers - 1], loss));
  return PMAP_SUCCESS;
}

/* Copies every layer's state between w (at s_off) and pending (at st_off). */
static pmap_status state_copy(const pmap_model *m, replica *r, int commit) {
  if (!r->pending) return PMAP_SUCCESS;
  for (int i = 0; i < m->n_layers; i++) {
    const layer *l = &m->layers[i];
    if (!l->s_size) continue;
    float *w = r->w + l->s_off, *pend = r->pending + l->st_off;
    PMAP_TRY(commit ? r->ops->copy(r->q, pend, w, l->s_size)
                    : r->ops->copy(r->q, w, pend, l->s_size));
  }
  return PMAP_SUCCESS;
}

pmap_status model_state_begin(const pmap_model *m, replica *r) { return state_copy(m, r, 0); }

pmap_status model_state_commit(const pmap_model *m, replica *r) { return state_copy(m, r, 1); }

/* An activation folded into the layer before (redo_epilogue, which kept the sum it is made
 * from in its output), made again from that sum with its bfloat16 copy: bias_act_forward
 * without a bias, the bits the epilogue's pass left (ops/op_list.h). A GELU's slope replaces
 * the sum in the same pass, as the backward of a layer with epilogue_redone expects. */
static pmap_status redo_epilogue(const pmap_model *m, replica *r, int j, int64_t bd) {
  const layer *d = &m->layers[j - 1];
  pmap_act act = (pmap_act)(d->epilogue - 1);
  float *y = (float *)r->out[j - 1];
  r->out[j] = r->act[j];
  return r->ops->bias_act_forward(r->q, act, y, NULL, bd, d->out_size, r->act[j],
                                  d->out16_at ? r->in16[d->out16_at] : NULL,
                                  act == PMAP_ACT_GELU ? y : NULL);
}

/* A recomputed block's layers [b, e) forward again, before the backward of its end e: under
 * FULL all of them from the block's kept input r->in[b]; under SELECTIVE only its shared
 * (element-wise) layers, each from its own input, which a layer kept or one computed again
 * just before holds. The same operations on the same values, so the same bits (dropout's masks
 * are keyed by the step and the row). In a span of its own on the device's track. */
static pmap_status recompute_block(pmap_device *dev, const pmap_model *m, replica *r, int b, int e,
                                   int64_t bd, trace_rec *tr) {
  runtime_span sp = tr ? runtime_span_begin(dev) : (runtime_span){0, -1};
  if (m->recompute == PMAP_RECOMPUTE_SELECTIVE) {
    for (int j = b; j < e; j++) {
      if (!m->layers[j].shared) continue;
      if (m->layers[j].folded)
        PMAP_TRY(redo_epilogue(m, r, j, bd));
      else
        PMAP_TRY(layer_forward(dev, m, r, j, r->in[j], bd));
    }
  } else {
    const float *in = r->in[b];
    for (int j = b; j < e; j++) {
      r->in[j] = in;
      PMAP_TRY(layer_forward(dev, m, r, j, in, bd));
      in = r->out[j];
    }
  }
  if (tr) runtime_span_end(dev, sp, "recompute", m->layers[b].cls->name, b, "layer", -1);
  return PMAP_SUCCESS;
}

/* Pooled: layer i's dy where the plan has it (else the plan and the layers disagree on which
 * pass dy on: an error, not a write into a buffer planned for another gradient), and its input
 * gradient (r->dact[i - 1]) and scratch (r->dact[i]) in the buffers planned for them. */
static pmap_status pool_take(const pmap_model *m, replica *r, int i, const float *dy) {
  const int *plan = r->dplan + 3 * i;
  if (dy != r->dslot[plan[0]])
    return PMAP_ERR(PMAP_ERR_INTERNAL,
                    "layer %d (%s): its output gradient is not in buffer %d of the pool, where "
                    "the plan has it",
                    i, m->layers[i].cls->name, plan[0]);
  if (plan[1] >= 0 && i > 0) r->dact[i - 1] = r->dslot[plan[1]];
  if (plan[2] >= 0 && i < m->n_layers - 1) r->dact[i] = r->dslot[plan[2]];
  return PMAP_SUCCESS;
}

pmap_status model_backward(pmap_device *dev, const pmap_model *m, replica *r, int64_t bd) {
  const float *dy = r->dact[m->n_layers - 1];
  trace_rec *tr = dev ? runtime_trace(runtime_ctx_of(dev)) : NULL;
  /* The last recomputed block that the forward pass ran still holds its values in the shared
   * region (no layer after it writes there): backward meets it first and computes it again
   * only from the second on. */
  int fresh = 1;
  for (int i = m->n_layers - 1; i >= 0; i--) {
    float *dx = NULL;
    const float *next = NULL;
    /* Under SELECTIVE every block, the last too: its GELUs' slopes are made in that pass. */
    if (m->layers[i].recompute_from && (!fresh || m->recompute == PMAP_RECOMPUTE_SELECTIVE))
      PMAP_TRY(recompute_block(dev, m, r, m->layers[i].recompute_from - 1, i, bd, tr));
    if (m->layers[i].recompute_from) fresh = 0;
    if (r->dpool) PMAP_TRY(pool_take(m, r, i, dy));
    dx = i > 0 ? r->dact[i - 1] : NULL; /* the input needs no gradient */
    r->dout[i] = dy;
    runtime_span sp = tr ? runtime_span_begin(dev) : (runtime_span){0, -1};
    PMAP_TRY(layer_backward(dev, m, r, i, dy, dx, &next, bd));
    if (tr) runtime_span_end(dev, sp, "backward", m->layers[i].cls->name, i, "layer", -1);
    if (r->layer_grads_done) PMAP_TRY(r->layer_grads_done(dev, r, i, r->layer_grads_user));
    if (!next) break;
    dy = next;
  }
  return PMAP_SUCCESS;
}
