/* bench_ref.c: the reference measurements of pmap-bench: the GEMMs of one step alone (the raw
 * GEMM rate at the model's shapes), the gradient all-reduce alone, and a hand-written
 * single-device training loop over the models' own forward and backward on the CPU op table,
 * which is pmap_update without the runtime. Neither repeats a layer: both run models/exec.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "ops/op_math.h"
#include "models/model.h"
#include "models/params.h"
#include "ops/cpu/cpu_ops.h"
#include "runtime/backend.h"
#include "base/error.h"

/* ------------------------------------------------------------------------------------------ */
/* The GEMMs of a step                                                                        */

static int push_gemm(bench_gemm *out, int n, int max, int ta, int tb, int beta1, int64_t m,
                     int64_t nn, int64_t k, int64_t repeat) {
  if (n < max) out[n] = (bench_gemm){ta, tb, beta1, m, nn, k, repeat, BENCH_GEMM, 0, {0}, 0};
  return n + 1;
}

static int push_conv(bench_gemm *out, int n, int max, bench_conv conv, int relu,
                     const pmap_conv_shape *s, int64_t bd) {
  if (n < max) out[n] = (bench_gemm){.conv = conv, .relu = relu, .cs = *s, .bd = bd};
  return n + 1;
}

/* bench_step_gemms runs one forward, loss and backward of the model (models/exec.c itself) over
 * the CPU op table with its GEMM-shaped ops wrapped to note each they run: dense's through
 * gemm, conv2d's as convolution ops. The run takes place on the one device of a context of its
 * own, so layers with collectives run too; the recorder is this file's, one recording at a
 * time. */
static struct {
  bench_gemm *out;
  int n, max;
} recorded;

static pmap_status rec_gemm(op_queue *q, int ta, int tb, int64_t m, int64_t n, int64_t k,
                            float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                            float beta, float *c, int64_t ldc) {
  recorded.n = push_gemm(recorded.out, recorded.n, recorded.max, ta, tb, beta != 0.0f, m, n, k, 1);
  return pmap_cpu_ops.gemm(q, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static pmap_status rec_conv_forward(op_queue *q, const pmap_conv_shape *s, int64_t bd,
                                    const float *x, const float *w, const float *b, int relu,
                                    float *y, float *col) {
  recorded.n = push_conv(recorded.out, recorded.n, recorded.max, BENCH_CONV_FORWARD, relu, s, bd);
  return pmap_cpu_ops.conv2d_forward(q, s, bd, x, w, b, relu, y, col);
}

static pmap_status rec_conv_backward(op_queue *q, const pmap_conv_shape *s, int64_t bd,
                                     const float *x, const float *w, const float *y,
                                     const float *dy, float *dx, float *dw, float *db, float *col,
                                     float *dcol) {
  recorded.n = push_conv(recorded.out, recorded.n, recorded.max,
                         dx ? BENCH_CONV_BACKWARD : BENCH_CONV_BACKWARD_DW, y != NULL, s, bd);
  return pmap_cpu_ops.conv2d_backward(q, s, bd, x, w, y, dy, dx, dw, db, col, dcol);
}

typedef struct record_arg {
  const pmap_model *m;
  int64_t bd;
} record_arg;

/* One step's forward, loss and backward over bd examples of zeros (labels 0), parameters as
 * pmap_params_create draws them; the optimizer step has no GEMM. */
static pmap_status record_job(pmap_device *dev, void *arg) {
  const record_arg *a = arg;
  const pmap_model *m = a->m;
  size_t P = m->n_params, out = (size_t)m->layers[m->n_layers - 1].out_size;
  pmap_ops ops = pmap_cpu_ops;
  ops.gemm = rec_gemm;
  ops.conv2d_forward = rec_conv_forward;
  ops.conv2d_backward = rec_conv_backward;
  replica r = {.ops = &ops, .q = NULL, .has_row0 = 1}; /* CPU kernels need no queue */
  float *w = calloc(P ? P : 1, sizeof *w), *g = calloc(P + 1, sizeof *g);
  float *x = calloc((size_t)(a->bd * m->in_size) + 1, sizeof *x);
  float *y = calloc((size_t)a->bd * out + 1, sizeof *y); /* 0.0f and label 0 alike */
  pmap_status st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "out of memory recording the GEMMs");
  if (w && g && x && y) {
    model_init_params(m, 1, w);
    r.w = w;
    r.g = g;
    st = replica_reserve(dev, m, &r, a->bd);
    if (!st) st = model_forward(dev, m, &r, x, a->bd);
    if (!st) st = model_loss(m, &r, y, a->bd, g + P);
    if (!st) st = model_backward(dev, m, &r, a->bd);
    replica_release(dev, &r);
  }
  free(w);
  free(g);
  free(x);
  free(y);
  return st;
}

int bench_step_gemms(const pmap_model *model, int64_t bd, bench_gemm *out, int max) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1, .dist = PMAP_DIST_NONE};
  pmap_ctx *ctx = NULL;
  record_arg arg = {model, bd};
  recorded.out = out;
  recorded.n = 0;
  recorded.max = max;
  pmap_status st = model->n_layers ? pmap_ctx_create(&cfg, &ctx) : PMAP_SUCCESS;
  if (!st && ctx) st = pmap_run(ctx, record_job, &arg);
  pmap_ctx_destroy(ctx);
  if (st) {
    fprintf(stderr, "pmap-bench: cannot list the GEMMs of a step: %s\n", pmap_last_error());
    return -1;
  }
  return recorded.n < max ? recorded.n : max;
}

static double conv_flops(const bench_gemm *g) {
  const pmap_conv_shape *s = &g->cs;
  double pass = 2.0 * (double)g->bd * (double)s->oc * (double)(s->oh * s->ow) *
                (double)(s->c * s->kh * s->kw);
  return g->conv == BENCH_CONV_BACKWARD ? 2.0 * pass : pass;
}

double bench_gemm_flops(const bench_gemm *g, int n) {
  double f = 0.0;
  for (int i = 0; i < n; i++)
    f += g[i].conv ? conv_flops(&g[i])
                   : 2.0 * (double)g[i].m * (double)g[i].n * (double)g[i].k * (double)g[i].repeat;
  return f;
}

/* ------------------------------------------------------------------------------------------ */
/* Probes: the step's GEMMs and its all-reduce, alone, on every device of a context at once    */

enum { PROBE_ALLOC, PROBE_FREE, PROBE_GEMMS, PROBE_ALLREDUCE, PROBE_OPTIMIZER };

/* The operands' slots: a GEMM's a, b, c; a convolution's x, w, y, dy, dx, dw, db, col, dcol. */
enum { SLOT_X, SLOT_W, SLOT_Y, SLOT_DY, SLOT_DX, SLOT_DW, SLOT_DB, SLOT_COL, SLOT_DCOL, SLOTS };

struct bench_probe {
  pmap_ctx *ctx;
  bench_gemm g[BENCH_MAX_GEMMS];
  int ng;
  int64_t inner; /* passes over the GEMMs per timed rep, so that tiny shapes time well */
  int bf16;      /* the params' policy is bf16: the GEMMs take bfloat16 operands */
  size_t count;  /* all-reduce floats, or the sharded step's padded buffer */
  const pmap_params *params;              /* the step's settings: optimizer, sharding, parts */
  float *(*ops)[SLOTS * BENCH_MAX_GEMMS]; /* (N) each GEMM's or convolution's operands */
  float **grad;                           /* (N) */
  float **w, **state;                     /* (N) the optimizer probe's parameters and state */
  float *host;                            /* random operand values, the largest operand's size */
  /* The current job. */
  int mode, reps;
  double *t;
  int *nt;
};

static size_t gemm_size(const bench_gemm *g, int which) {
  if (!g->conv)
    return which > 2 ? 0
                     : (size_t)(which == 0   ? g->m * g->k
                                : which == 1 ? g->k * g->n
                                             : g->m * g->n);
  const pmap_conv_shape *s = &g->cs;
  int64_t ckk = s->c * s->kh * s->kw, ohw = s->oh * s->ow;
  const int64_t n[SLOTS] = {g->bd * s->c * s->h * s->w,
                            s->oc * ckk,
                            g->bd * s->oc * ohw,
                            g->bd * s->oc * ohw,
                            g->bd * s->c * s->h * s->w,
                            s->oc * ckk,
                            s->oc,
                            ckk * ohw,
                            ckk * ohw};
  return (size_t)n[which];
}

/* One GEMM or convolution of the probe on its operands o; bf16: a GEMM on bfloat16 operands (the
 * first halves of o[0] and o[1]), as the step's under the bf16 policy (its convolutions run the
 * float kernels). */
static pmap_status probe_one(const replica *rp, const bench_gemm *g, float *const *o, int bf16) {
  if (g->conv == BENCH_CONV_FORWARD)
    return rp->ops->conv2d_forward(rp->q, &g->cs, g->bd, o[SLOT_X], o[SLOT_W], o[SLOT_DB], g->relu,
                                   o[SLOT_Y], o[SLOT_COL]);
  if (g->conv)
    return rp->ops->conv2d_backward(rp->q, &g->cs, g->bd, o[SLOT_X], o[SLOT_W],
                                    g->relu ? o[SLOT_Y] : NULL, o[SLOT_DY],
                                    g->conv == BENCH_CONV_BACKWARD ? o[SLOT_DX] : NULL, o[SLOT_DW],
                                    o[SLOT_DB], o[SLOT_COL], o[SLOT_DCOL]);
  int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
  float beta = g->beta1 ? 1.0f : 0.0f;
  for (int64_t k = 0; k < g->repeat; k++)
    PMAP_TRY(bf16 ? rp->ops->gemm_bf16(rp->q, g->ta, g->tb, g->m, g->n, g->k, 1.0f,
                                       (const pmap_bf16 *)(void *)o[0], lda,
                                       (const pmap_bf16 *)(void *)o[1], ldb, beta, o[2], g->n)
                  : rp->ops->gemm(rp->q, g->ta, g->tb, g->m, g->n, g->k, 1.0f, o[0], lda, o[1], ldb,
                                  beta, o[2], g->n));
  return PMAP_SUCCESS;
}

static pmap_status probe_alloc(pmap_device *dev, bench_probe *p) {
  int d = pmap_local_index(dev); /* per-process arrays */
  for (int i = 0; i < p->ng; i++)
    for (int w = 0; w < SLOTS; w++) {
      float **slot = &p->ops[d][SLOTS * i + w];
      size_t n = gemm_size(&p->g[i], w);
      if (!n) continue;
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
  for (int i = 0; i < SLOTS * p->ng; i++) pmap_device_free(dev, p->ops[d][i]);
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
      for (int i = 0; i < p->ng; i++)
        PMAP_TRY(probe_one(rp, &p->g[i], &p->ops[d][SLOTS * i], p->bf16));
    /* A download completes the device's queued work (CUDA); on CPU it is a 4-byte copy. */
    PMAP_TRY(pmap_device_download(dev, &sink, p->ops[d][SLOTS * (p->ng - 1)], 1));
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
  size_t rec = pp->gl.record_len, at = (size_t)params_global(pp, d);
  for (int r = 0; r < p->reps; r++) {
    PMAP_TRY(pmap_barrier(dev));
    double t0 = cli_now();
    if (pp->shard) {
      PMAP_TRY(backend_reduce_scatter(dev, "probe", g, pp->gl.chunk, PMAP_RED_MEAN));
      PMAP_TRY(backend_all_gather(dev, "probe", g + at * rec, g, rec));
      PMAP_TRY(backend_all_gather(dev, "probe", g + at * pp->gl.chunk, g, pp->gl.chunk));
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
                               p->state[d], len, NULL, len));
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
  size_t count = params->shard ? params->gl.len : params->gl.reduced;
  size_t largest = count;
  *out = NULL;
  if (!p) goto oom;
  p->ctx = ctx;
  p->params = params;
  p->ng = n < BENCH_MAX_GEMMS ? n : BENCH_MAX_GEMMS;
  memcpy(p->g, g, (size_t)p->ng * sizeof *g);
  p->count = count;
  for (int i = 0; i < p->ng; i++)
    for (int w = 0; w < SLOTS; w++)
      if (gemm_size(&g[i], w) > largest) largest = gemm_size(&g[i], w);
  /* Enough passes for about 2e7 FLOPs or 20000 calls per rep, whichever comes first. */
  double flops = bench_gemm_flops(p->g, p->ng), calls = 0.0;
  for (int i = 0; i < p->ng; i++) calls += p->g[i].conv ? 1.0 : (double)p->g[i].repeat;
  double by_flops = ceil(2e7 / (flops > 1.0 ? flops : 1.0));
  double by_calls = ceil(2e4 / (calls > 1.0 ? calls : 1.0));
  p->inner = (int64_t)(by_flops < by_calls ? by_flops : by_calls);
  p->ops = calloc((size_t)nd, sizeof *p->ops);
  p->grad = calloc((size_t)nd, sizeof *p->grad);
  p->w = calloc((size_t)nd, sizeof *p->w);
  p->state = calloc((size_t)nd, sizeof *p->state);
  p->host = malloc(largest * sizeof *p->host);
  if (!p->ops || !p->grad || !p->w || !p->state || !p->host) goto oom;
  p->bf16 = pmap_params_precision(params) == PMAP_PRECISION_BF16;
  for (size_t i = 0; i < largest; i++) { /* small, varied, never denormal */
    float v = (float)((int)(i * 2654435761u % 2001u) - 1000) / 1000.0f;
    /* bf16: both halves of each float the bfloat16 of v, so that the GEMMs' bfloat16 operands
     * hold the same values (the float is then v to within a bfloat16 step) */
    uint32_t h = pmap_bf16_round(v), u = (h << 16) | h;
    if (p->bf16) memcpy(&v, &u, sizeof v);
    p->host[i] = v;
  }
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
/* The hand-written loop                                                                       */

/* A host replica of the model over the CPU op table, stepped on the calling thread by the
 * models' own forward, loss and backward (models/exec.c) and optimizer (models/optimizer.c):
 * pmap_update on one device without the runtime (no context, no worker, no collective). */
struct bench_loop {
  const pmap_model *m;
  pmap_optimizer opt;
  int64_t bd;
  const float *x; /* (bd, input...) */
  const void *y;  /* (bd, K) f32 or (bd) i32 */
  replica r;      /* w (P), g (P + 1: the loss last), opt (slots x P), pending, the arena */
  model_span *spans;
  int n_spans;
  int64_t t;
  int saved_threads; /* the GEMM library's thread count on this thread before the loop */
  void *block[5];
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

/* Layers with collectives need the runtime: the loop is the runtime-free baseline. */
int bench_loop_supports(const pmap_model *m) { return !model_has_collectives(m); }

int bench_loop_open(const pmap_model *m, const pmap_optimizer *opt, uint64_t seed,
                    const pmap_array *xs, const pmap_array *ys, bench_loop **out) {
  bench_loop *l = calloc(1, sizeof *l);
  *out = NULL;
  if (!l) goto oom;
  size_t P = m->n_params, arena = 0;
  l->m = m;
  l->opt = *opt;
  l->bd = xs->shape[0];
  l->x = xs->data;
  l->y = ys->data;
  if (model_arena_floats(m, l->bd, &arena)) goto oom;
  l->spans = calloc((size_t)m->n_layers + 1, sizeof *l->spans);
  replica *r = &l->r;
  r->ops = &pmap_cpu_ops;
  r->q = NULL; /* CPU kernels need no queue */
  r->w = loop_alloc(l, 0, P);
  r->g = loop_alloc(l, 1, P + 1);
  r->opt = loop_alloc(l, 2, (size_t)optimizer_slots(opt) * P);
  r->pending = loop_alloc(l, 3, m->n_state);
  float *a = loop_alloc(l, 4, arena);
  if (!l->spans || !r->w || !r->g || !r->opt || !r->pending || !a) goto oom;
  if (replica_place(m, r, a, l->bd)) goto oom;
  l->n_spans = model_trained_spans(m, l->spans);
  model_init_params(m, seed, r->w);
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
  replica_unplace(&l->r);
  for (int i = 0; i < 5; i++) free(l->block[i]);
  free(l->spans);
  free(l);
}

/* update_job of models/step.c on one device: zero the gradients, forward, loss and backward
 * over the whole batch, then the optimizer over the trained spans and the state's commit. */
static pmap_status loop_step(bench_loop *l, float *loss, double *t_opt) {
  const pmap_model *m = l->m;
  replica *r = &l->r;
  size_t P = m->n_params;
  PMAP_TRY(r->ops->fill(r->q, r->g, 0.0f, P + 1));
  /* The step about to be taken keys dropout's masks, from the batch's first row. */
  r->inference = 0;
  r->step = l->t;
  r->has_row0 = 1;
  r->row0 = 0;
  PMAP_TRY(model_state_begin(m, r));
  PMAP_TRY(model_forward(NULL, m, r, l->x, l->bd));
  PMAP_TRY(model_loss(m, r, l->y, l->bd, r->g + P));
  PMAP_TRY(model_backward(NULL, m, r, l->bd));
  PMAP_TRY(model_state_commit(m, r));
  double t0 = t_opt ? cli_now() : 0.0;
  l->t++;
  pmap_step_hyper h = optimizer_hyper(&l->opt, l->t);
  for (int k = 0; k < l->n_spans; k++) {
    size_t a = l->spans[k].off, n = l->spans[k].len;
    PMAP_TRY(optimizer_apply(r, &l->opt, &h, r->w + a, r->g + a, r->opt + a, P, NULL, n));
  }
  if (t_opt) *t_opt = cli_now() - t0;
  *loss = r->g[P];
  return PMAP_SUCCESS;
}

int bench_loop_step(bench_loop *l, float *loss, double *t_opt) {
  if (loop_step(l, loss, t_opt) == PMAP_SUCCESS) return 0;
  fprintf(stderr, "pmap-bench: hand-written loop: %s\n", pmap_last_error());
  return -1;
}
