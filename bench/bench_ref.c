/* bench_ref.c: the reference measurements of pmap-bench: the GEMMs of one step alone (the raw
 * GEMM rate at the model's shapes), the gradient all-reduce alone, and a hand-written
 * single-device training loop over the CPU op table, which is pmap_update without the runtime. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "models/model.h"
#include "models/params.h"
#include "ops/cpu/cpu_ops.h"
#include "runtime/backend.h"
#include "base/error.h"

/* ------------------------------------------------------------------------------------------ */
/* The GEMMs of a step                                                                        */

static int push_gemm(bench_gemm *out, int n, int max, int ta, int tb, int beta1, int64_t m,
                     int64_t nn, int64_t k, int64_t repeat) {
  if (n < max) out[n] = (bench_gemm){ta, tb, beta1, m, nn, k, repeat};
  return n + 1;
}

int bench_step_gemms(const pmap_model *model, int64_t bd, bench_gemm *out, int max) {
  int n = 0;
  for (int i = 0; i < model->n_layers; i++) { /* forward */
    const layer *l = &model->layers[i];
    const pmap_conv_shape *s = &l->conv;
    if (l->kind == LAYER_DENSE)
      n = push_gemm(out, n, max, 0, 0, 0, bd, l->out_size, l->in_size, 1);
    else if (l->kind == LAYER_CONV2D)
      n = push_gemm(out, n, max, 0, 0, 0, s->oc, s->oh * s->ow, s->c * s->kh * s->kw, bd);
  }
  for (int i = model->n_layers - 1; i >= 0; i--) { /* backward: the first layer needs no dx */
    const layer *l = &model->layers[i];
    const pmap_conv_shape *s = &l->conv;
    int64_t ckk = s->c * s->kh * s->kw, ohw = s->oh * s->ow;
    if (l->kind == LAYER_DENSE) {
      n = push_gemm(out, n, max, 1, 0, 1, l->in_size, l->out_size, bd, 1);
      if (i > 0) n = push_gemm(out, n, max, 0, 1, 0, bd, l->in_size, l->out_size, 1);
    } else if (l->kind == LAYER_CONV2D) {
      n = push_gemm(out, n, max, 0, 1, 1, s->oc, ckk, ohw, bd);
      if (i > 0) n = push_gemm(out, n, max, 1, 0, 0, ckk, ohw, s->oc, bd);
    }
  }
  return n < max ? n : max;
}

double bench_gemm_flops(const bench_gemm *g, int n) {
  double f = 0.0;
  for (int i = 0; i < n; i++)
    f += 2.0 * (double)g[i].m * (double)g[i].n * (double)g[i].k * (double)g[i].repeat;
  return f;
}

/* ------------------------------------------------------------------------------------------ */
/* Probes: the step's GEMMs and its all-reduce, alone, on every device of a context at once    */

enum { PROBE_ALLOC, PROBE_FREE, PROBE_GEMMS, PROBE_ALLREDUCE, PROBE_OPTIMIZER };

struct bench_probe {
  pmap_ctx *ctx;
  bench_gemm g[BENCH_MAX_GEMMS];
  int ng;
  int64_t inner; /* passes over the GEMMs per timed rep, so that tiny shapes time well */
  size_t count;  /* all-reduce floats, or the sharded step's padded buffer */
  const pmap_params *params;          /* the step's settings: optimizer, sharding, parts */
  float *(*ops)[3 * BENCH_MAX_GEMMS]; /* (N) a, b, c of each GEMM */
  float **grad;                       /* (N) */
  float **w, **state;                 /* (N) the optimizer probe's parameters and state */
  float *host;                        /* random operand values, the largest operand's size */
  /* The current job. */
  int mode, reps;
  double *t;
  int *nt;
};

static size_t gemm_size(const bench_gemm *g, int which) {
  return (size_t)(which == 0 ? g->m * g->k : which == 1 ? g->k * g->n : g->m * g->n);
}

static pmap_status probe_alloc(pmap_device *dev, bench_probe *p) {
  int d = pmap_local_index(dev); /* per-process arrays */
  for (int i = 0; i < p->ng; i++)
    for (int w = 0; w < 3; w++) {
      float **slot = &p->ops[d][3 * i + w];
      size_t n = gemm_size(&p->g[i], w);
      PMAP_TRY(pmap_device_alloc(dev, n, slot));
      PMAP_TRY(pmap_device_upload(dev, *slot, p->host, n));
    }
  PMAP_TRY(pmap_device_alloc(dev, p->count, &p->grad[d]));
  PMAP_TRY(pmap_device_upload(dev, p->grad[d], p->host, p->count));
  size_t P = p->params->n_params, slots = (size_t)p->params->opt_slots;
  PMAP_TRY(pmap_device_alloc(dev, P, &p->w[d]));
  PMAP_TRY(pmap_device_upload(dev, p->w[d], p->host, P));
  if (slots) {
    PMAP_TRY(pmap_device_alloc(dev, slots * p->params->state_len, &p->state[d]));
    const replica *rp = &p->params->rep[d];
    PMAP_TRY(rp->ops->fill(rp->q, p->state[d], 0.0f, slots * p->params->state_len));
  }
  return PMAP_SUCCESS;
}

static pmap_status probe_free(pmap_device *dev, bench_probe *p) {
  int d = pmap_local_index(dev); /* per-process arrays */
  for (int i = 0; i < 3 * p->ng; i++) pmap_device_free(dev, p->ops[d][i]);
  pmap_device_free(dev, p->grad[d]);
  pmap_device_free(dev, p->w[d]);
  pmap_device_free(dev, p->state[d]);
  return PMAP_SUCCESS;
}

static pmap_status probe_gemms(pmap_device *dev, bench_probe *p) {
  int d = pmap_local_index(dev); /* per-process arrays */
  const replica *rp = &p->params->rep[d];
  float sink = 0.0f;
  for (int r = 0; r < p->reps; r++) {
    PMAP_TRY(pmap_barrier(dev));
    double t0 = cli_now();
    for (int64_t pass = 0; pass < p->inner; pass++)
      for (int i = 0; i < p->ng; i++) {
        const bench_gemm *g = &p->g[i];
        float *a = p->ops[d][3 * i], *b = p->ops[d][3 * i + 1], *c = p->ops[d][3 * i + 2];
        for (int64_t k = 0; k < g->repeat; k++)
          PMAP_TRY(rp->ops->gemm(rp->q, g->ta, g->tb, g->m, g->n, g->k, 1.0f, a,
                                 g->ta ? g->m : g->k, b, g->tb ? g->k : g->n,
                                 g->beta1 ? 1.0f : 0.0f, c, g->n));
      }
    /* A download completes the device's queued work (CUDA); on CPU it is a 4-byte copy. */
    PMAP_TRY(pmap_device_download(dev, &sink, p->ops[d][3 * (p->ng - 1) + 2], 1));
    PMAP_TRY(pmap_barrier(dev));
    if (d == 0) p->t[(*p->nt)++] = (cli_now() - t0) / (double)p->inner;
  }
  return PMAP_SUCCESS;
}

/* The step's collectives alone: the all-reduce of [gradients | loss], or sharded the
 * reduce-scatter, the exchange of norms and the all-gather of the parameters. */
static pmap_status probe_allreduce(pmap_device *dev, bench_probe *p) {
  int d = pmap_local_index(dev); /* per-process arrays */
  const pmap_params *pp = p->params;
  float sink = 0.0f, *g = p->grad[d];
  size_t rec = params_record_len(pp), at = (size_t)params_global(pp, d);
  for (int r = 0; r < p->reps; r++) {
    PMAP_TRY(pmap_barrier(dev));
    double t0 = cli_now();
    if (pp->shard) {
      PMAP_TRY(backend_reduce_scatter(dev, "probe", g, pp->chunk, PMAP_RED_MEAN));
      PMAP_TRY(backend_all_gather(dev, "probe", g + at * rec, g, rec));
      PMAP_TRY(backend_all_gather(dev, "probe", g + at * pp->chunk, g, pp->chunk));
    } else {
      PMAP_TRY(pmap_pmean(dev, g, g, p->count));
    }
    PMAP_TRY(pmap_device_download(dev, &sink, g, 1));
    if (d == 0) p->t[(*p->nt)++] = cli_now() - t0;
  }
  return PMAP_SUCCESS;
}

/* The step's optimizer alone on every device at once: over every parameter, or sharded over
 * the device's part. The gradients are the probe's fixed values, the learning rate tiny. */
static pmap_status probe_optimizer(pmap_device *dev, bench_probe *p) {
  int d = pmap_local_index(dev); /* per-process arrays */
  const pmap_params *pp = p->params;
  size_t lo = 0, len = pp->n_params;
  if (pp->shard) params_part(pp, params_global(pp, d), &lo, &len);
  pmap_step_hyper h = optimizer_hyper(&pp->opt, 1);
  h.lr = 1e-12f;
  float sink = 0.0f;
  for (int r = 0; r < p->reps; r++) {
    PMAP_TRY(pmap_barrier(dev));
    double t0 = cli_now();
    if (len)
      PMAP_TRY(optimizer_apply(&pp->rep[d], &pp->opt, &h, p->w[d] + lo, p->grad[d] + lo,
                               p->state[d], len, len));
    PMAP_TRY(pmap_device_download(dev, &sink, p->w[d], 1));
    PMAP_TRY(pmap_barrier(dev));
    if (d == 0) p->t[(*p->nt)++] = cli_now() - t0;
  }
  return PMAP_SUCCESS;
}

static pmap_status probe_job(pmap_device *dev, void *arg) {
  bench_probe *p = arg;
  switch (p->mode) {
  case PROBE_ALLOC: return probe_alloc(dev, p);
  case PROBE_FREE: return probe_free(dev, p);
  case PROBE_GEMMS: return p->ng ? probe_gemms(dev, p) : PMAP_SUCCESS;
  case PROBE_ALLREDUCE: return probe_allreduce(dev, p);
  case PROBE_OPTIMIZER: return probe_optimizer(dev, p);
  }
  return PMAP_ERR(PMAP_ERR_INTERNAL, "probe mode %d", p->mode);
}

int bench_probe_open(pmap_ctx *ctx, const bench_gemm *g, int n, const pmap_params *params,
                     bench_probe **out) {
  int nd = pmap_ctx_num_devices(ctx);
  bench_probe *p = calloc(1, sizeof *p);
  /* The reduction's count, or sharded its padded buffer and the records after it. */
  size_t count = params->shard ? params->g_len : params->reduced;
  size_t largest = count;
  *out = NULL;
  if (!p) goto oom;
  p->ctx = ctx;
  p->params = params;
  p->ng = n < BENCH_MAX_GEMMS ? n : BENCH_MAX_GEMMS;
  memcpy(p->g, g, (size_t)p->ng * sizeof *g);
  p->count = count;
  for (int i = 0; i < p->ng; i++)
    for (int w = 0; w < 3; w++)
      if (gemm_size(&g[i], w) > largest) largest = gemm_size(&g[i], w);
  /* Enough passes for about 2e7 FLOPs or 20000 calls per rep, whichever comes first. */
  double flops = bench_gemm_flops(p->g, p->ng), calls = 0.0;
  for (int i = 0; i < p->ng; i++) calls += (double)p->g[i].repeat;
  double by_flops = ceil(2e7 / (flops > 1.0 ? flops : 1.0));
  double by_calls = ceil(2e4 / (calls > 1.0 ? calls : 1.0));
  p->inner = (int64_t)(by_flops < by_calls ? by_flops : by_calls);
  p->ops = calloc((size_t)nd, sizeof *p->ops);
  p->grad = calloc((size_t)nd, sizeof *p->grad);
  p->w = calloc((size_t)nd, sizeof *p->w);
  p->state = calloc((size_t)nd, sizeof *p->state);
  p->host = malloc(largest * sizeof *p->host);
  if (!p->ops || !p->grad || !p->w || !p->state || !p->host) goto oom;
  for (size_t i = 0; i < largest; i++) /* small, varied, never denormal */
    p->host[i] = (float)((int)(i * 2654435761u % 2001u) - 1000) / 1000.0f;
  p->mode = PROBE_ALLOC;
  if (params_dispatch((pmap_params *)p->params, probe_job, p)) {
    fprintf(stderr, "pmap-bench: cannot allocate the probe buffers: %s\n", pmap_last_error());
    bench_probe_close(p);
    return -1;
  }
  *out = p;
  return 0;
oom:
  fprintf(stderr, "pmap-bench: out of memory\n");
  bench_probe_close(p);
  return -1;
}

void bench_probe_close(bench_probe *p) {
  if (!p) return;
  if (p->ops && p->grad && p->w && p->state) {
    p->mode = PROBE_FREE;
    params_dispatch((pmap_params *)p->params, probe_job, p);
  }
  free(p->ops);
  free(p->grad);
  free(p->w);
  free(p->state);
  free(p->host);
  free(p);
}

static int probe_run(bench_probe *p, int mode, int reps, double *t, int *nt) {
  p->mode = mode;
  p->reps = reps;
  p->t = t;
  p->nt = nt;
  if (params_dispatch((pmap_params *)p->params, probe_job, p) == PMAP_SUCCESS) return 0;
  fprintf(stderr, "pmap-bench: %s probe: %s\n",
          mode == PROBE_GEMMS       ? "GEMM"
          : mode == PROBE_OPTIMIZER ? "optimizer"
                                    : "collective",
          pmap_last_error());
  return -1;
}

int bench_probe_gemms(bench_probe *p, int reps, double *t, int *nt) {
  return probe_run(p, PROBE_GEMMS, reps, t, nt);
}

int bench_probe_allreduce(bench_probe *p, int reps, double *t, int *nt) {
  return probe_run(p, PROBE_ALLREDUCE, reps, t, nt);
}

int bench_probe_optimizer(bench_probe *p, int reps, double *t, int *nt) {
  return probe_run(p, PROBE_OPTIMIZER, reps, t, nt);
}

/* ------------------------------------------------------------------------------------------ */
/* The hand-written single-device loop                                                        */

struct bench_loop {
  const pmap_model *m;
  pmap_optimizer opt;
  int64_t bd;
  const float *x;         /* (bd, input...) */
  const void *y;          /* (bd, K) f32 or (bd) i32 */
  float *w, *g, *s1, *s2; /* (P), (P + 1: the loss last), optimizer slots (P) each */
  float **act, **dact;    /* (n_layers) outputs and output gradients */
  const float **in, **out;
  float *col, *dcol;
  int64_t t;
  int saved_threads; /* the GEMM library's thread count on this thread before the loop */
  void *block[6];
};

/* Host memory placed as the CPU backend places device memory (16 bytes past a cache line), so
 * the GEMM library takes the same code paths on both sides of the comparison. */
static float *loop_alloc(bench_loop *l, int slot, size_t floats) {
  size_t bytes = (floats * sizeof(float) + 64 + 63) / 64 * 64;
  char *raw = aligned_alloc(64, bytes);
  l->block[slot] = raw;
  if (raw) memset(raw, 0, bytes);
  return raw ? (float *)(raw + 16) : NULL;
}

int bench_loop_supports(const pmap_model *m) {
  for (int i = 0; i < m->n_layers; i++) {
    switch (m->layers[i].kind) {
    case LAYER_DENSE:
    case LAYER_RELU:
    case LAYER_CONV2D:
    case LAYER_FLATTEN: break;
    /* The normalisations need the runtime's collectives (batch norm) or exec's scratch; the
     * loop stays the plain baseline of the original four kinds. */
    case LAYER_TANH:
    case LAYER_SIGMOID:
    case LAYER_GELU:
    case LAYER_LAYERNORM:
    case LAYER_MAXPOOL2D:
    case LAYER_AVGPOOL2D:
    case LAYER_DROPOUT:
    case LAYER_BATCHNORM:
    case LAYER_RES_BEGIN:
    case LAYER_RES_END: return 0;
    }
  }
  return 1;
}

int bench_loop_open(const pmap_model *m, const pmap_optimizer *opt, uint64_t seed,
                    const pmap_array *xs, const pmap_array *ys, bench_loop **out) {
  bench_loop *l = calloc(1, sizeof *l);
  *out = NULL;
  if (!l) goto oom;
  size_t P = m->n_params, L = (size_t)m->n_layers, acts = 0, col = model_col_size(m);
  l->m = m;
  l->opt = *opt;
  l->bd = xs->shape[0];
  l->x = xs->data;
  l->y = ys->data;
  for (size_t i = 0; i < L; i++) acts += (size_t)(m->layers[i].out_size * l->bd);
  l->act = calloc(L, sizeof *l->act);
  l->dact = calloc(L, sizeof *l->dact);
  l->in = calloc(L, sizeof *l->in);
  l->out = calloc(L, sizeof *l->out);
  l->w = loop_alloc(l, 0, P);
  l->g = loop_alloc(l, 1, P + 1);
  l->s1 = loop_alloc(l, 2, P);
  l->s2 = loop_alloc(l, 3, P);
  float *a = loop_alloc(l, 4, 2 * acts), *c = loop_alloc(l, 5, 2 * col + 1);
  if (!l->act || !l->dact || !l->in || !l->out || !l->w || !l->g || !l->s1 || !l->s2 || !a || !c)
    goto oom;
  for (size_t i = 0; i < L; i++) {
    size_t per = (size_t)(m->layers[i].out_size * l->bd);
    l->act[i] = a;
    l->dact[i] = a + per;
    a += 2 * per;
  }
  l->col = c;
  l->dcol = c + col;
  model_init_params(m, seed, l->w);
  /* This thread runs the GEMM library single-threaded from now on, as every device thread does
   * (device 0 of a context runs on this thread too and sets the same). */
  l->saved_threads = cpu_gemm_threads_set(1);
  *out = l;
  return 0;
oom:
  fprintf(stderr, "pmap-bench: out of memory for the hand-written loop\n");
  bench_loop_close(l);
  return -1;
}

void bench_loop_close(bench_loop *l) {
  if (!l) return;
  if (l->saved_threads) cpu_gemm_threads_set(l->saved_threads);
  for (int i = 0; i < 6; i++) free(l->block[i]);
  free(l->act);
  free(l->dact);
  free(l->in);
  free(l->out);
  free(l);
}

/* The same calls in the same order as models/exec.c and update_job in models/params.c. */
static pmap_status loop_step(bench_loop *l, float *loss, double *t_opt) {
  const pmap_ops *o = &pmap_cpu_ops;
  const pmap_model *m = l->m;
  size_t P = m->n_params;
  int64_t bd = l->bd;
  int L = m->n_layers;
  PMAP_TRY(o->fill(NULL, l->g, 0.0f, P + 1));
  const float *in = l->x;
  for (int i = 0; i < L; i++) {
    const layer *ly = &m->layers[i];
    float *y = l->act[i];
    l->in[i] = in;
    switch (ly->kind) {
    case LAYER_DENSE:
      PMAP_TRY(o->gemm(NULL, 0, 0, bd, ly->out_size, ly->in_size, 1.0f, in, ly->in_size,
                       l->w + ly->w_off, ly->out_size, 0.0f, y, ly->out_size));
      PMAP_TRY(o->bias_forward(NULL, y, l->w + ly->b_off, bd, ly->out_size, 1));
      break;
    case LAYER_RELU: PMAP_TRY(o->relu_forward(NULL, in, y, (size_t)(bd * ly->out_size))); break;
    case LAYER_CONV2D:
      PMAP_TRY(o->conv2d_forward(NULL, &ly->conv, bd, in, l->w + ly->w_off, y, l->col));
      PMAP_TRY(
          o->bias_forward(NULL, y, l->w + ly->b_off, bd, ly->conv.oc, ly->conv.oh * ly->conv.ow));
      break;
    case LAYER_FLATTEN: y = (float *)in; break;
    case LAYER_TANH:
    case LAYER_SIGMOID:
    case LAYER_GELU:
    case LAYER_LAYERNORM:
    case LAYER_MAXPOOL2D:
    case LAYER_AVGPOOL2D:
    case LAYER_DROPOUT:
    case LAYER_BATCHNORM:
    case LAYER_RES_BEGIN:
    case LAYER_RES_END:
      /* bench_loop_supports says no for models with these */
      return PMAP_ERR(PMAP_ERR_INTERNAL, "hand-written loop: layer %d has no loop code", i);
    }
    l->out[i] = y;
    in = y;
  }
  const layer *last = &m->layers[L - 1];
  if (m->loss == PMAP_LOSS_MSE)
    PMAP_TRY(
        o->mse(NULL, l->out[L - 1], l->y, (size_t)(bd * last->out_size), l->dact[L - 1], l->g + P));
  else
    PMAP_TRY(
        o->softmax_xent(NULL, l->out[L - 1], l->y, bd, last->out_size, l->dact[L - 1], l->g + P));
  const float *dy = l->dact[L - 1];
  for (int i = L - 1; i >= 0; i--) {
    const layer *ly = &m->layers[i];
    float *dx = i > 0 ? l->dact[i - 1] : NULL;
    switch (ly->kind) {
    case LAYER_DENSE:
      PMAP_TRY(o->gemm(NULL, 1, 0, ly->in_size, ly->out_size, bd, 1.0f, l->in[i], ly->in_size, dy,
                       ly->out_size, 1.0f, l->g + ly->w_off, ly->out_size));
      PMAP_TRY(o->bias_backward(NULL, dy, l->g + ly->b_off, bd, ly->out_size, 1));
      if (dx)
        PMAP_TRY(o->gemm(NULL, 0, 1, bd, ly->in_size, ly->out_size, 1.0f, dy, ly->out_size,
                         l->w + ly->w_off, ly->out_size, 0.0f, dx, ly->in_size));
      break;
    case LAYER_RELU:
      if (dx) PMAP_TRY(o->relu_backward(NULL, l->out[i], dy, dx, (size_t)(bd * ly->out_size)));
      break;
    case LAYER_CONV2D:
      PMAP_TRY(o->conv2d_backward(NULL, &ly->conv, bd, l->in[i], l->w + ly->w_off, dy, dx,
                                  l->g + ly->w_off, l->col, l->dcol));
      PMAP_TRY(
          o->bias_backward(NULL, dy, l->g + ly->b_off, bd, ly->conv.oc, ly->conv.oh * ly->conv.ow));
      break;
    case LAYER_FLATTEN: dx = (float *)dy; break;
    case LAYER_TANH:
    case LAYER_SIGMOID:
    case LAYER_GELU:
    case LAYER_LAYERNORM:
    case LAYER_MAXPOOL2D:
    case LAYER_AVGPOOL2D:
    case LAYER_DROPOUT:
    case LAYER_BATCHNORM:
    case LAYER_RES_BEGIN:
    case LAYER_RES_END:
      /* bench_loop_supports says no for models with these */
      return PMAP_ERR(PMAP_ERR_INTERNAL, "hand-written loop: layer %d has no loop code", i);
    }
    if (!dx) break;
    dy = dx;
  }
  double t0 = t_opt ? cli_now() : 0.0;
  l->t++;
  const pmap_optimizer *op = &l->opt;
  pmap_step_hyper h = {.lr = op->lr,
                       .momentum = op->momentum,
                       .nesterov = op->nesterov,
                       .weight_decay = op->weight_decay,
                       .beta1 = op->beta1,
                       .beta2 = op->beta2,
                       .eps = op->eps};
  if (op->kind == PMAP_OPT_SGD) {
    PMAP_TRY(o->sgd_step(NULL, l->w, l->g, l->s1, P, &h));
  } else {
    h.bc1 = (float)(1.0 - pow((double)op->beta1, (double)l->t));
    h.bc2 = (float)(1.0 - pow((double)op->beta2, (double)l->t));
    PMAP_TRY(o->adam_step(NULL, l->w, l->g, l->s1, l->s2, P, &h));
  }
  if (t_opt) *t_opt = cli_now() - t0;
  *loss = l->g[P];
  return PMAP_SUCCESS;
}

int bench_loop_step(bench_loop *l, float *loss, double *t_opt) {
  if (loop_step(l, loss, t_opt) == PMAP_SUCCESS) return 0;
  fprintf(stderr, "pmap-bench: hand-written loop: %s\n", pmap_last_error());
  return -1;
}
