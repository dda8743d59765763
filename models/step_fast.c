/* step_fast.c: the fast paths of pmap_update, over a backend's optional pmap_fast_i (CUDA):
 * - graphs: after a warm-up step at a batch size, every device captures its whole step
 *   (forward, loss, backward, all-reduce, guard and clipping, optimizer) into a graph and later
 *   steps of that size replay it; only the inputs and the step's values are copied before it;
 * - overlap: gradients are all-reduced in buckets, in reverse layer order, on a second queue as
 *   soon as backward has produced them.
 * The numeric guard and clipping are decided on the device in both, so a step needs no host
 * decision; the host reads back [loss | flags | norm] with the guard on, the loss when asked for,
 * and otherwise does not wait. The plain step stays in step.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ops/op_math.h"
#include "step_fast.h"

typedef enum fast_mode {
  FAST_OFF = 0, /* the plain step (step.c) */
  FAST_EAGER,   /* the fast step's work, queued as it runs (a warm-up, or buckets alone) */
  FAST_CAPTURE, /* captured into a graph, which is then launched */
  FAST_REPLAY   /* the graph captured before, launched */
} fast_mode;

/* What a captured graph depends on besides the model: the batch and every buffer's address
 * (any allocation on the context changes the generation). */
typedef struct fast_key {
  int64_t batch;
  uint64_t gen;
} fast_key;

typedef struct fast_dev {
  void *graph;   /* this device's captured step, NULL when none */
  int ok;        /* this device's vote at a capture */
  size_t hi;     /* buckets: gradients [hi, P) are issued */
  char why[384]; /* why its capture failed */
} fast_dev;

typedef struct step_fast {
  int graphs, overlap;
  size_t bucket_bytes;
  int broken;     /* a capture failed: these params step without graphs from now on */
  fast_mode mode; /* this step's */
  int buckets;    /* this step all-reduces in buckets */
  int want_loss;  /* this step's caller asked for the loss */
  fast_key warm;  /* the last eager step's, the one a capture needs before it */
  fast_key live;  /* the captured graphs' */
  int have_warm, have_live;
  size_t *lo;    /* (L) step_fast_bucket_starts */
  fast_dev *dev; /* (N) */
} step_fast;

void step_fast_bucket_starts(const pmap_model *m, size_t *lo) {
  size_t next = m->n_params;
  for (int i = m->n_layers - 1; i >= 0; i--) {
    const layer *l = &m->layers[i];
    if (l->w_size + l->b_size + l->s_size > 0) next = l->w_off;
    lo[i] = next;
  }
}

/* The fast state of p, created on its first step; NULL (the plain step) where the backend has
 * no fast path, nothing is switched on, or memory is short. */
static step_fast *fast_of(pmap_params *p) {
  if (p->fast) return p->fast;
  if (!p->ob->step_values || !p->ob->decide) return NULL;
  int graphs = 0, overlap = 0;
  size_t bucket_bytes = 0;
  runtime_fast_modes(p->ctx, &graphs, &overlap, &bucket_bytes);
  if (!graphs && !overlap) return NULL;
  step_fast *f = calloc(1, sizeof *f);
  size_t L = (size_t)p->model->n_layers;
  if (f) f->lo = calloc(L ? L : 1, sizeof *f->lo);
  if (f) f->dev = calloc((size_t)p->n, sizeof *f->dev);
  if (!f || !f->lo || !f->dev) {
    if (f) free(f->lo);
    free(f);
    return NULL;
  }
  *f = (step_fast){.graphs = graphs,
                   .overlap = overlap,
                   .bucket_bytes = bucket_bytes,
                   .lo = f->lo,
                   .dev = f->dev};
  step_fast_bucket_starts(p->model, f->lo);
  p->fast = f;
  p->fast_free = step_fast_free;
  return f;
}

int step_fast_graphs_live(const pmap_params *p) {
  return p->fast && p->fast->have_live && !p->fast->broken;
}

int step_fast_prepare(step_call *c) {
  pmap_params *p = c->p;
  const pmap_ctx *ctx = p->ctx;
  /* Steps whose shape the fast path does not cover stay plain: a user's gradient function,
   * micro-batches (one input buffer per slot), injected faults, several processes, a sharded
   * optimizer. */
  int eligible = !p->grad_fn && p->micro_batches == 1 && !runtime_faults(ctx) &&
                 !runtime_distributed(ctx) && !p->shard;
  step_fast *f = eligible ? fast_of(p) : p->fast;
  if (!f) return 0;
  f->mode = FAST_OFF;
  if (!eligible) return 0;
  f->want_loss = c->want_loss;
  /* Layers with collectives of their own (cross-replica batch norm) would share the
   * communicator with the buckets from another queue: those models reduce in one piece. */
  f->buckets = f->overlap && !model_has_collectives(p->model) && p->n_params > 0;
  if (!f->graphs || f->broken) {
    f->mode = f->buckets ? FAST_EAGER : FAST_OFF;
    return f->mode != FAST_OFF;
  }
  fast_key key = {.batch = c->batch, .gen = runtime_generation(ctx)};
  if (f->have_live && key.batch == f->live.batch && key.gen == f->live.gen) {
    f->mode = FAST_REPLAY;
  } else if (f->have_warm && key.batch == f->warm.batch && key.gen == f->warm.gen) {
    f->mode = FAST_CAPTURE;
    f->live = key;
  } else {
    f->mode = FAST_EAGER;
    f->warm = key;
    f->have_warm = 1;
  }
  return 1;
}

/* Device d's rows of xs and ys into the backend's input slots, as step_grads.c's pieces take them. */
static pmap_status stage_inputs(pmap_device *dev, const step_call *c) {
  int64_t lo = 0, rows = 0;
  batch_device_rows(c->batch, c->p->n, pmap_local_index(dev), &lo, &rows);
  const pmap_array *a[2] = {c->xs, c->ys};
  for (int slot = 0; slot < 2; slot++) {
    size_t row = 4; /* f32 and i32 */
    for (int k = 1; k < a[slot]->rank; k++) row *= (size_t)a[slot]->shape[k];
    const void *out = NULL;
    PMAP_TRY(backend_stage(dev, slot, (const char *)a[slot]->data + (size_t)lo * row,
                           (size_t)rows * row, &out));
  }
  return PMAP_SUCCESS;
}

/* Issues the bucket of gradients [lo, hi): with the guard on, this device's flag first gains the
 * bucket's norm (the sum of the buckets' norms is non-finite exactly when one of them is, and
 * only finiteness counts), then its mean all-reduce starts on the second queue. */
static pmap_status issue_bucket(pmap_device *dev, pmap_params *p, replica *r, size_t lo, size_t hi,
                                const char *call) {
  if (p->guard) {
    float *tmp = r->g + p->gl.parts; /* the norm's slot, written after the all-reduce */
    PMAP_TRY(r->ops->norm2(r->q, r->g + lo, hi - lo, tmp));
    PMAP_TRY(r->ops->axpy(r->q, 1.0f, tmp, r->g + p->gl.flags + pmap_local_index(dev), 1));
  }
  return backend_bucket_reduce(dev, call, r->g + lo, hi - lo);
}

/* The backward hook: after layer i, the gradients from p->fast->lo[i] up are complete; they go
 * out once they make a bucket (layer 0: whatever is left). */
static pmap_status bucket_hook(pmap_device *dev, replica *r, int i, void *user) {
  pmap_params *p = user;
  step_fast *f = p->fast;
  fast_dev *fd = &f->dev[pmap_local_index(dev)];
  size_t lo = f->lo[i];
  if (lo >= fd->hi) return PMAP_SUCCESS;
  if (i > 0 && (fd->hi - lo) * sizeof(float) < f->bucket_bytes) return PMAP_SUCCESS;
  PMAP_TRY(issue_bucket(dev, p, r, lo, fd->hi, "pmap_update's gradient bucket"));
  fd->hi = lo;
  return PMAP_SUCCESS;
}

/* After backward with buckets: what is left of the gradients, then the loss and the guard
 * flags in one small all-reduce of their own, and the device's queue joins the buckets. */
static pmap_status buckets_finish(pmap_device *dev, pmap_params *p, replica *r) {
  fast_dev *fd = &p->fast->dev[pmap_local_index(dev)];
  size_t P = p->n_params;
  if (fd->hi > 0) PMAP_TRY(issue_bucket(dev, p, r, 0, fd->hi, "pmap_update's gradient bucket"));
  fd->hi = 0;
  if (p->guard) {
    float *tmp = r->g + p->gl.parts;
    PMAP_TRY(r->ops->norm2(r->q, r->g + p->gl.loss, 1, tmp));
    PMAP_TRY(r->ops->axpy(r->q, 1.0f, tmp, r->g + p->gl.flags + pmap_local_index(dev), 1));
  }
  /* [part (0) | loss | flags]: the end of the plain step's reduction. */
  PMAP_TRY(
      backend_bucket_reduce(dev, "pmap_update's loss all-reduce", r->g + P, p->gl.reduced - P));
  return backend_bucket_join(dev);
}

/* The step's device work, queued (or captured) as it runs: the plain step's, with the guard
 * and clipping decided on the device. */
static pmap_status step_body(pmap_device *dev, step_call *c, replica *r, step_grads_fn grads) {
  pmap_params *p = c->p;
  step_fast *f = p->fast;
  const pmap_ops *ops = r->ops;
  int n = p->n;
  size_t P = p->n_params;
  PMAP_TRY(ops->fill(r->q, r->g, 0.0f, p->gl.len));
  if (f->buckets) {
    f->dev[pmap_local_index(dev)].hi = P;
    r->layer_grads_done = bucket_hook;
    r->layer_grads_user = p;
  }
  pmap_status st = grads(dev, c, r);
  r->layer_grads_done = NULL;
  r->layer_grads_user = NULL;
  PMAP_TRY(st);
  runtime_trace_keep(dev, 1); /* the reduction's end on: kept past a trace's span limit */
  if (f->buckets) {
    PMAP_TRY(buckets_finish(dev, p, r));
  } else {
    if (p->guard)
      PMAP_TRY(ops->norm2(r->q, r->g, p->gl.flags, r->g + p->gl.flags + pmap_local_index(dev)));
    PMAP_TRY(backend_all_reduce(dev, "pmap_update's all-reduce", r->g, r->g, p->gl.reduced,
                                PMAP_RED_MEAN));
  }
  float clip = p->opt.clip_norm;
  if (p->guard || clip > 0.0f) {
    /* One norm over every gradient (the plain step sums it from the parts: the two may differ
     * in the last bit), in the slot after the flags: [loss | flags | norm] contiguous. */
    PMAP_TRY(ops->norm2(r->q, r->g, P, r->g + p->gl.parts));
    PMAP_TRY(
        p->ob->decide(r->q, r->g, P, r->g + p->gl.loss, n, p->guard, clip, params_norm_max(p)));
  }
  /* After the device's verdict: a skipped step commits no state and steps nothing (copy and
   * the optimizer kernels read it). */
  PMAP_TRY(model_state_commit(p->model, r));
  return optimizer_step_range(p, r, &c->hyper, 0, P, 1.0f);
}

/* Meets the other devices and says whether every one voted yes. */
static pmap_status vote(pmap_device *dev, pmap_params *p, int yes, int *all) {
  step_fast *f = p->fast;
  f->dev[pmap_local_index(dev)].ok = yes;
  PMAP_TRY(backend_meet(dev, "pmap_update's CUDA graph capture"));
  *all = 1;
  for (int k = 0; k < p->n; k++) *all &= f->dev[k].ok;
  return backend_meet(dev, "pmap_update's CUDA graph capture");
}

/* One line on stderr, once per params, from device 0: why these params step without graphs. */
static void note_fallback(pmap_device *dev, pmap_params *p) {
  step_fast *f = p->fast;
  if (pmap_local_index(dev) != 0) return;
  f->broken = 1;
  f->have_live = 0;
  for (int k = 0; k < p->n; k++)
    if (!f->dev[k].ok) {
      fprintf(stderr,
              "pmap: CUDA graphs off for these params, which step without them: device %d: "
              "%s\n",
              k, f->dev[k].why);
      return;
    }
}

/* Captures the step and launches it; where any device's capture fails, every device drops its
 * graph and runs the step eagerly instead (nothing captured has run). */
static pmap_status capture_step(pmap_device *dev, step_call *c, replica *r, step_grads_fn grads) {
  pmap_params *p = c->p;
  step_fast *f = p->fast;
  fast_dev *fd = &f->dev[pmap_local_index(dev)];
  runtime_graph_free(dev, fd->graph);
  fd->graph = NULL;
  fd->why[0] = '\0';
  PMAP_TRY(stage_inputs(dev, c));
  pmap_status st = runtime_capture_begin(dev);
  if (st) snprintf(fd->why, sizeof fd->why, "%s", pmap_last_error());
  int all = 0;
  pmap_status vs = vote(dev, p, st == PMAP_SUCCESS, &all);
  if (vs || !all) {
    if (!st) { /* end this device's capture, which holds nothing */
      void *none = NULL;
      runtime_capture_end(dev, vs, &none, fd->why, sizeof fd->why);
      runtime_graph_free(dev, none);
    }
    PMAP_TRY(vs);
  } else {
    pmap_status body = step_body(dev, c, r, grads);
    runtime_capture_end(dev, body, &fd->graph, fd->why, sizeof fd->why);
    PMAP_TRY(vote(dev, p, fd->graph != NULL, &all));
  }
  if (all) {
    if (pmap_local_index(dev) == 0) f->have_live = 1;
    return runtime_launch(dev, fd->graph);
  }
  runtime_graph_free(dev, fd->graph);
  fd->graph = NULL;
  note_fallback(dev, p);
  return step_body(dev, c, r, grads);
}

/* After the step: device 0 reads back what the host needs ([loss | flags | norm] with the
 * guard, else the loss when asked for) and judges the guard as the device did; otherwise no
 * device waits for the step (its failure shows at the next wait). */
static pmap_status read_back(pmap_device *dev, step_call *c, replica *r) {
  pmap_params *p = c->p;
  step_fast *f = p->fast;
  int n = p->n;
  if (pmap_local_index(dev) != 0) return PMAP_SUCCESS;
  if (p->guard) {
    float *h = p->guard_host; /* device 0's row: loss, flags (n), norm */
    PMAP_TRY(backend_download(dev, h, r->g + p->gl.loss, ((size_t)n + 2) * sizeof *h));
    /* The averaged loss and norm decide (a device's own non-finite value makes them so); the
     * flags only name the devices. */
    int finite = isfinite(h[0]) && isfinite(h[n + 1]);
    if (finite && pmap_guard_norm_over(h[n + 1], p->opt.clip_norm, params_norm_max(p)))
      c->over_norm = h[n + 1], finite = 0; /* as the device decided (ops/cuda/step_vals.cu) */
    c->skipped = !finite;
    c->loss = h[0];
    return PMAP_SUCCESS;
  }
  if (f->want_loss) return backend_download(dev, &c->loss, r->g + p->gl.loss, sizeof c->loss);
  return PMAP_SUCCESS;
}

pmap_status step_fast_update(pmap_device *dev, step_call *c, replica *r, step_grads_fn grads,
                             int *handled) {
  pmap_params *p = c->p;
  step_fast *f = p->fast;
  *handled = f && f->mode != FAST_OFF;
  if (!*handled) return PMAP_SUCCESS;
  PMAP_TRY(p->ob->step_values(r->q, &c->hyper, p->step));
  pmap_status st = PMAP_SUCCESS;
  switch (f->mode) {
  case FAST_OFF: break;
  case FAST_EAGER: st = step_body(dev, c, r, grads); break;
  case FAST_CAPTURE: st = capture_step(dev, c, r, grads); break;
  case FAST_REPLAY:
    st = stage_inputs(dev, c);
    if (!st) st = runtime_launch(dev, f->dev[pmap_local_index(dev)].graph);
    break;
  }
  (void)p->ob->step_values(r->q, NULL, 0);
  return st ? st : read_back(dev, c, r);
}

static pmap_status free_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  fast_dev *fd = &p->fast->dev[pmap_local_index(dev)];
  runtime_graph_free(dev, fd->graph);
  fd->graph = NULL;
  return PMAP_SUCCESS;
}

void step_fast_free(pmap_params *p) {
  step_fast *f = p->fast;
  if (!f) return;
  int any = 0;
  for (int k = 0; k < p->n; k++) any |= f->dev[k].graph != NULL;
  if (any) (void)params_dispatch(p, free_job, p);
  free(f->lo);
  free(f->dev);
  free(f);
  p->fast = NULL;
}
