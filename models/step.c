/* step.c: pmap_update, the data-parallel step. After the checks at the boundary (batch.c) every
 * device computes the gradients of its rows (in micro-batches; forward, loss, backward, or the
 * user's gradient function), then takes one of two paths, each in three stages:
 *   replicated: reduce (one all-reduce, mean, of [gradients | loss | guard flags]) -> decide
 *               (the numeric guard and clipping, alike on every device) -> apply (the pending
 *               state, the optimizer over every parameter);
 *   sharded:    reduce (a reduce-scatter: each device holds its own part averaged) -> decide
 *               (a small all-gather of every device's [part norm | loss | flags]) -> apply (the
 *               pending state, the optimizer over the device's part, an all-gather of the
 *               parameters).
 * The CUDA fast paths take over the whole step where they are on (step_fast.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/trace.h"
#include "ops/op_math.h"
#include "runtime/runtime.h"
#include "step.h"
#include "step_fast.h"

/* ------------------------------------------------------------------------------------------ */
/* Gradients                                                                                  */

/* The loss and gradient of one piece: rows [row0, row0 + rows) of the call's arrays, weighted
 * by `weight` (1: the device's whole share). The gradient accumulates into r->g; the loss goes
 * to its slot directly when the weight is 1 and the piece is the device's only one, else
 * through the micro-batch slot, weighted, into the loss slot. */
static pmap_status piece_grads(pmap_device *dev, step_call *c, replica *r, int64_t row0,
                               int64_t rows, float weight, int direct) {
  pmap_params *p = c->p;
  const pmap_model *m = p->model;
  const grad_layout *gl = &p->gl;
  float *loss = r->g + (direct ? gl->loss : gl->micro);
  const void *x = NULL, *y = NULL;
  PMAP_TRY(batch_stage(dev, c->xs, row0, rows, 0, &x));
  PMAP_TRY(batch_stage(dev, c->ys, row0, rows, 1, &y));
  /* The row's index in the global batch: across processes, this process's rows come after
   * those of the processes before it (each passes c->batch). */
  int64_t global_row0 = row0 + (int64_t)pmap_ctx_process_index(p->ctx) * c->batch;
  if (p->grad_fn) {
    pmap_grad_args a = {dev,    r->w,   r->g,        loss,    weight,
                        *c->xs, *c->ys, global_row0, p->step, p->n_params};
    a.xs.data = (void *)x;
    a.ys.data = (void *)y;
    a.xs.shape[0] = a.ys.shape[0] = rows;
    PMAP_TRY(p->grad_fn(&a, p->grad_user));
  } else {
    int L = m->n_layers;
    /* Dropout's masks are keyed by the step and the example's row in the global batch (across
     * processes too), so they do not depend on how the batch is split. */
    r->inference = 0;
    r->step = p->step;
    r->has_row0 = 1;
    r->row0 = global_row0;
    PMAP_TRY(model_forward(dev, m, r, x, rows));
    trace_rec *tr = runtime_trace(p->ctx);
    runtime_span sp = tr ? runtime_span_begin(dev) : (runtime_span){0, -1};
    PMAP_TRY(model_loss(m, r, y, rows, loss));
    if (tr) runtime_span_end(dev, sp, "loss", NULL, -1, "layer", -1);
    if (weight != 1.0f)
      PMAP_TRY(
          r->ops->scale(r->q, r->dact[L - 1], weight, (size_t)(rows * m->layers[L - 1].out_size)));
    PMAP_TRY(model_backward(dev, m, r, rows));
  }
  if (!direct) PMAP_TRY(r->ops->axpy(r->q, weight, loss, r->g + gl->loss, 1));
  return PMAP_SUCCESS;
}

/* Every piece of this device's rows. Its share of the mean weighs rows * N / B (1 for an even
 * batch), split over the pieces by their rows. */
static pmap_status device_grads(pmap_device *dev, step_call *c, replica *r) {
  pmap_params *p = c->p;
  int n = p->n;
  int64_t lo = 0, rows = 0;
  batch_device_rows(c->batch, n, pmap_local_index(dev), &lo, &rows);
  /* Layers with collectives inside (cross-replica batch norm), and a user's gradient function
   * (which may call collectives), need every device to run as many pieces: at most the fewest
   * rows any device has. */
  int64_t fewest = c->batch / n;
  int64_t limit = p->grad_fn || model_has_collectives(p->model) ? fewest : rows;
  int64_t k = p->micro_batches < limit ? p->micro_batches : limit;
  double share = runtime_uneven(p->ctx) ? (double)rows * n / (double)c->batch : 1.0;
  if (!p->grad_fn) PMAP_TRY(replica_reserve(dev, p->model, r, (rows + k - 1) / k));
  PMAP_TRY(model_weights16(p->model, r));
  PMAP_TRY(model_state_begin(p->model, r));
  for (int64_t i = 0; i < k; i++) {
    int64_t a = 0, len = 0;
    batch_piece_rows(rows, k, i, &a, &len);
    float weight = (float)(share * (double)len / (double)rows);
    PMAP_TRY(piece_grads(dev, c, r, lo + a, len, weight, k == 1 && weight == 1.0f));
  }
  return PMAP_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Injected faults (PMAP_FAULT, runtime/fault.h): every hook of the step behind this one call.  */

typedef enum fault_point {
  BEFORE_REDUCE, /* nan, collective, stall: the device's own gradients are complete */
  AFTER_APPLY    /* drift: the replica is stepped */
} fault_point;

/* Device `dev` waits as if hung, until another device gives up on it (or 10 timeouts pass). */
static void stall(pmap_device *dev) {
  const pmap_ctx *ctx = runtime_ctx_of(dev);
  int64_t timeout = runtime_timeout_ns(ctx);
  int64_t limit = timeout >= 0 ? 10 * timeout : 1000000000;
  int64_t start = pmap_now_ns();
  struct timespec ms = {0, 1000000};
  while (!runtime_aborting(ctx) && pmap_now_ns() - start < limit) nanosleep(&ms, NULL);
}

/* Moves one parameter of this replica by one ulp. */
static pmap_status drift(pmap_device *dev, replica *r) {
  float w0 = 0.0f;
  PMAP_TRY(backend_download(dev, &w0, r->w, sizeof w0));
  w0 = nextafterf(w0, INFINITY);
  PMAP_TRY(backend_upload(dev, r->w, &w0, sizeof w0));
  replica_w_changed(r);
  return backend_sync(dev);
}

static pmap_status inject(pmap_device *dev, const step_call *c, replica *r, fault_point at) {
  int64_t step = c->t;
  if (at == AFTER_APPLY)
    return runtime_fault(dev, FAULT_DRIFT, step) ? drift(dev, r) : PMAP_SUCCESS;
  if (runtime_fault(dev, FAULT_NAN, step)) PMAP_TRY(r->ops->fill(r->q, r->g, NAN, c->p->n_params));
  if (runtime_fault(dev, FAULT_COLLECTIVE, step))
    return PMAP_ERR(PMAP_ERR_DEVICE,
                    "device %d: the gradient all-reduce of step %lld failed (injected by "
                    "PMAP_FAULT)",
                    pmap_axis_index(dev), (long long)step);
  if (runtime_fault(dev, FAULT_STALL, step)) stall(dev);
  return PMAP_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* Decide: the numeric guard and the clipping scale                                           */

typedef struct verdict {
  int skip;    /* the guard skips the step on every replica */
  float scale; /* the gradients' clipping scale (1: none) */
  float over;  /* with skip: the finite norm over params_norm_max (0: a value was not finite) */
} verdict;

/* From this device's host tail h = [loss | flags (G) | part norms (G)], which every device
 * holds alike: the norm summed from the G part norms in order, in double (alike on both paths),
 * the guard's test and the clipping scale. */
static verdict decide(const pmap_params *p, const float *h) {
  int G = p->gl.G;
  verdict v = {0, 1.0f, 0.0f};
  if (!p->guard && !(p->opt.clip_norm > 0.0f)) return v;
  double sum = 0.0;
  for (int k = 0; k < G; k++) sum += (double)h[G + 1 + k] * (double)h[G + 1 + k];
  float norm = (float)sqrt(sum);
  if (p->guard) {
    int finite = isfinite(norm) != 0;
    for (int i = 0; i < G + 1; i++) finite &= isfinite(h[i]) != 0;
    if (!finite) {
      v.skip = 1;
      return v;
    }
  }
  float clip = p->opt.clip_norm;
  if (pmap_guard_norm_over(norm, clip, params_norm_max(p))) {
    v.skip = 1;
    v.over = norm;
    return v;
  }
  /* In double: clip / norm may underflow float (a tiny clip, a huge norm); the step still takes
   * its (tiny, or with the guard off and an infinite norm, NaN-making) scale. */
  if (clip > 0.0f && !(norm <= clip)) v.scale = (float)((double)clip / (double)norm);
  return v;
}

/* This device's host tail (device 0's is what the call reports). */
static float *host_tail(const pmap_params *p, pmap_device *dev) {
  return p->guard_host + (size_t)pmap_local_index(dev) * p->gl.host_len;
}

/* The guard's flag of this device: the norm of its own gradients and loss, in the slot of its
 * global index; the others' slots are 0, so after the mean a slot is non-finite exactly when
 * its device's values were. One device's own values are the averaged ones: its flag is the norm
 * the decision computes anyway (replicated_step), not a pass of its own. */
static pmap_status guard_flag(pmap_device *dev, const pmap_params *p, replica *r) {
  if (!p->guard || p->gl.G == 1) return PMAP_SUCCESS;
  const grad_layout *gl = &p->gl;
  return r->ops->norm2(r->q, r->g, gl->flags, r->g + gl->flags + pmap_axis_index(dev));
}

/* The optimizer over [lo, lo + len), a span of the device's track. */
static pmap_status traced_optimizer(pmap_device *dev, pmap_params *p, replica *r,
                                    const step_call *c, size_t lo, size_t len, float scale) {
  trace_rec *tr = runtime_trace(p->ctx);
  runtime_span sp = tr ? runtime_span_begin(dev) : (runtime_span){0, -1};
  PMAP_TRY(optimizer_step_range(p, r, &c->hyper, lo, len, scale));
  if (tr)
    runtime_span_end(dev, sp, "optimizer", NULL, -1, "optimizer", (int64_t)(len * sizeof(float)));
  return PMAP_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* The replicated path                                                                        */

/* Every device holds every averaged gradient: it computes every part norm itself and reads
 * [loss | flags | parts] back. */
static pmap_status replicated_step(pmap_device *dev, step_call *c, replica *r) {
  pmap_params *p = c->p;
  const grad_layout *gl = &p->gl;
  /* Reduce. */
  PMAP_TRY(guard_flag(dev, p, r));
  PMAP_TRY(
      backend_all_reduce(dev, "pmap_update's all-reduce", r->g, r->g, gl->reduced, PMAP_RED_MEAN));
  /* Decide. */
  verdict v = {0, 1.0f, 0.0f};
  int tail = p->guard || p->opt.clip_norm > 0.0f;
  float *h = host_tail(p, dev);
  if (tail) {
    for (int k = 0; k < gl->G; k++) {
      size_t lo = 0, len = 0;
      params_part(p, k, &lo, &len);
      PMAP_TRY(r->ops->norm2(r->q, r->g + lo, len, r->g + gl->parts + k));
    }
    PMAP_TRY(backend_download(dev, h, r->g + gl->loss, (2 * (size_t)gl->G + 1) * sizeof *h));
    if (gl->G == 1 && p->guard) h[1] = h[2]; /* one device: its flag is the part norm */
    v = decide(p, h);
  }
  if (v.skip) {
    if (pmap_local_index(dev) == 0) c->skipped = 1, c->over_norm = v.over;
    return PMAP_SUCCESS; /* nothing changes on any replica */
  }
  /* Apply. */
  PMAP_TRY(model_state_commit(p->model, r));
  PMAP_TRY(traced_optimizer(dev, p, r, c, 0, p->n_params, v.scale));
  r->w16_fresh = r->w16 != NULL; /* the optimizer's pass wrote the next forward's weights */
  PMAP_TRY(inject(dev, c, r, AFTER_APPLY));
  if (pmap_local_index(dev) != 0) return backend_sync(dev);
  if (tail) {
    c->loss = h[0];
    return backend_sync(dev);
  }
  return backend_download(dev, &c->loss, r->g + gl->loss, sizeof c->loss);
}

/* ------------------------------------------------------------------------------------------ */
/* The sharded path                                                                           */

/* Each device holds only its own part averaged: it computes its part norm, and the devices
 * all-gather [part | loss | flags]; each value of the loss and flags is taken from the record
 * of the device whose part held it averaged. */
static pmap_status sharded_tail(pmap_device *dev, const pmap_params *p, replica *r, float *h) {
  const grad_layout *gl = &p->gl;
  int G = gl->G;
  size_t lo = 0, len = 0, rec = gl->record_len;
  params_part(p, pmap_axis_index(dev), &lo, &len);
  if (p->guard || p->opt.clip_norm > 0.0f)
    PMAP_TRY(r->ops->norm2(r->q, r->g + lo, len, r->g + gl->part));
  float *records = r->g + gl->records;
  PMAP_TRY(
      backend_all_gather(dev, "pmap_update's exchange of norms", r->g + gl->part, records, rec));
  float *hr = h + G + 1 + G;
  PMAP_TRY(backend_download(dev, hr, records, (size_t)G * rec * sizeof *h));
  for (size_t j = 0; j <= (size_t)G; j++) { /* loss, then the flags */
    size_t at = gl->loss + j;
    size_t owner = at < gl->reduced ? at / gl->chunk : 0;
    h[j] = hr[owner * rec + 1 + j];
  }
  for (int k = 0; k < G; k++) h[G + 1 + k] = hr[(size_t)k * rec];
  return PMAP_SUCCESS;
}

/* Under bf16, after the gather: the optimizer's pass rounded this device's part [lo, lo + len)
 * into w16; the parts the others stepped are rounded here, and w16 is then the next forward's. */
static pmap_status weights16_around(const pmap_params *p, replica *r, size_t lo, size_t len) {
  if (!r->w16) return PMAP_SUCCESS;
  size_t end = lo + len;
  if (lo) PMAP_TRY(r->ops->round_bf16(r->q, r->w, r->w16, NULL, lo));
  if (end < p->n_params)
    PMAP_TRY(r->ops->round_bf16(r->q, r->w + end, r->w16 + end, NULL, p->n_params - end));
  r->w16_fresh = 1;
  return PMAP_SUCCESS;
}

static pmap_status sharded_step(pmap_device *dev, step_call *c, replica *r) {
  pmap_params *p = c->p;
  const grad_layout *gl = &p->gl;
  /* Reduce. */
  PMAP_TRY(guard_flag(dev, p, r));
  PMAP_TRY(
      backend_reduce_scatter(dev, "pmap_update's reduce-scatter", r->g, gl->chunk, PMAP_RED_MEAN));
  /* Decide. */
  float *h = host_tail(p, dev);
  PMAP_TRY(sharded_tail(dev, p, r, h));
  verdict v = decide(p, h);
  if (v.skip) {
    if (pmap_local_index(dev) == 0) c->skipped = 1, c->over_norm = v.over;
    return PMAP_SUCCESS;
  }
  /* Apply. Every device passed the exchange (one verdict), so every device steps its part now:
   * a failure from here on leaves the step taken (pmap_update then completes the gather). Every
   * device says so itself (on CUDA the verdicts of a collective are per device). */
  atomic_store(&c->stepped, 1);
  if (pmap_local_index(dev) == 0) c->loss = h[0];
  /* The state its forward passes computed replaces the old (the same on every device, so each
   * commits its own copy of all of it). */
  PMAP_TRY(model_state_commit(p->model, r));
  size_t lo = 0, len = 0;
  params_part(p, pmap_axis_index(dev), &lo, &len);
  PMAP_TRY(traced_optimizer(dev, p, r, c, lo, len, v.scale));
  PMAP_TRY(params_gather(dev, p, c->t));
  PMAP_TRY(weights16_around(p, r, lo, len));
  PMAP_TRY(inject(dev, c, r, AFTER_APPLY));
  return backend_sync(dev);
}

/* ------------------------------------------------------------------------------------------ */

static pmap_status update_steps(pmap_device *dev, step_call *c) {
  pmap_params *p = c->p;
  replica *r = &p->rep[pmap_local_index(dev)];
  int fast = 0;
  PMAP_TRY(step_fast_update(dev, c, r, device_grads, &fast));
  if (fast) return PMAP_SUCCESS;
  PMAP_TRY(r->ops->fill(r->q, r->g, 0.0f, p->gl.len));
  PMAP_TRY(device_grads(dev, c, r));
  PMAP_TRY(inject(dev, c, r, BEFORE_REDUCE));
  runtime_trace_keep(dev, 1); /* the reduction on: spans a trace keeps past its span limit */
  return p->shard ? sharded_step(dev, c, r) : replicated_step(dev, c, r);
}

/* A device's step; with a recording on, a span of its track that the others nest in. */
static pmap_status update_job(pmap_device *dev, void *arg) {
  step_call *c = arg;
  trace_rec *tr = runtime_trace(c->p->ctx);
  int64_t t0 = tr ? pmap_now_ns() : 0;
  pmap_status st = update_steps(dev, c);
  runtime_trace_keep(dev, 0);
  if (tr)
    trace_span_kept(tr, pmap_local_index(dev), "step", NULL, -1, "step", t0, pmap_now_ns(), -1);
  return st;
}

/* Where the non-finite values of a skipped step came from, for its message. Without layers that
 * exchange values between devices, a device's flag says whether its own loss or gradients were
 * non-finite. With them, a device's values also hold what the others sent it: the step's
 * gradients are computed once more (sources_job), watching every exchange (model_exchange) up
 * to the first one that returns a value that is not finite; the devices that sent one into it
 * are the sources, the others only got it (and if none sent one, their finite values overflowed
 * there). */
typedef struct sources {
  step_call *c;
  int exchanged;     /* out (device 0): an exchange returned a value that is not finite */
  const float *sent; /* (G) nonzero for a source, in device 0's host tail; NULL: not searched */
  char unknown[512]; /* why the search failed ("" when it did not) */
} sources;

static pmap_status search_sources(pmap_device *dev, sources *s) {
  pmap_params *p = s->c->p;
  replica *r = &p->rep[pmap_local_index(dev)];
  const grad_layout *gl = &p->gl;
  r->source.watch = 1;
  r->source.seen = r->source.sent = 0;
  pmap_status st = r->ops->fill(r->q, r->g, 0.0f, gl->len);
  if (!st) st = device_grads(dev, s->c, r); /* into scratch only: the step is not taken */
  r->source.watch = 0;
  PMAP_TRY(st);
  /* One slot per global device (the flags' place, free now), summed across the devices. */
  float *slots = r->g + gl->flags;
  PMAP_TRY(r->ops->fill(r->q, slots, 0.0f, (size_t)gl->G));
  if (r->source.sent) PMAP_TRY(r->ops->fill(r->q, slots + pmap_axis_index(dev), 1.0f, 1));
  PMAP_TRY(backend_all_reduce(dev, "pmap_update's search for non-finite values", slots, slots,
                              (size_t)gl->G, PMAP_RED_SUM));
  if (pmap_local_index(dev) == 0) {
    s->exchanged = r->source.seen;
    PMAP_TRY(backend_download(dev, host_tail(p, dev) + 1 + gl->G, slots, gl->G * sizeof(float)));
  }
  return backend_sync(dev);
}

/* The search, in a span of its own on the device's track that its layers nest in. */
static pmap_status sources_job(pmap_device *dev, void *arg) {
  sources *s = arg;
  trace_rec *tr = runtime_trace(s->c->p->ctx);
  int64_t t0 = tr ? pmap_now_ns() : 0;
  pmap_status st = search_sources(dev, s);
  if (tr)
    trace_span_kept(tr, pmap_local_index(dev), "guard's search", NULL, -1, "step", t0,
                    pmap_now_ns(), -1);
  return st;
}

/* "1, 3" or "device 1 (process 0, host a), ..." of the global devices with set[g], into buf;
 * returns their count. */
static int device_list(const pmap_params *p, const int *set, char *buf, size_t size) {
  int dist = runtime_distributed(p->ctx), count = 0;
  size_t len = 0;
  buf[0] = '\0';
  for (int g = 0; g < p->gl.G && len < size; g++) {
    if (!set[g]) continue;
    if (dist)
      len += (size_t)snprintf(buf + len, size - len, "%sdevice %d (process %d, host %s)",
                              count ? ", " : "", g, g / p->n, pmap_proc_host(p->ctx, g / p->n));
    else
      len += (size_t)snprintf(buf + len, size - len, "%s%d", count ? ", " : "", g);
    count++;
  }
  return count;
}

/* The message of a step the numeric guard skipped, naming the devices whose own values were
 * non-finite (device 0's copy of the flags, one per global device; every device holds the same)
 * by their global index and, across processes, process and host; s: where they came from. */
static pmap_status numeric_error(const pmap_params *p, const sources *s) {
  const float *h = p->guard_host;
  int G = p->gl.G, dist = runtime_distributed(p->ctx), from = s->sent && s->exchanged;
  int *own = calloc(2 * (size_t)G, sizeof *own), *got = own ? own + G : NULL;
  if (!own)
    return PMAP_ERR(PMAP_ERR_NUMERIC,
                    "pmap_update: step %lld: the loss or gradients were non-finite (averaged loss "
                    "%g; out of memory naming the devices); the step was skipped on every replica: "
                    "parameters, optimizer state and step count are unchanged",
                    (long long)p->step + 1, (double)h[0]);
  for (int g = 0; g < G; g++) {
    own[g] = from ? s->sent[g] != 0.0f : !isfinite(h[1 + g]);
    got[g] = !own[g] && !isfinite(h[1 + g]);
  }
  char devs[600], others[600], seq[48] = "", what[1800];
  int n_own = device_list(p, own, devs, sizeof devs);
  int n_got = device_list(p, got, others, sizeof others);
  free(own);
  const char *one = dist ? "" : "device ", *many = dist ? "" : "devices ";
  if (dist)
    snprintf(seq, sizeof seq, " (collective #%llu)", (unsigned long long)runtime_coll_seq(p->ctx));
  size_t len = 0;
  if (n_own)
    len = (size_t)snprintf(what, sizeof what, "the local loss or gradients of %s%s were non-finite",
                           n_own > 1 ? many : one, devs);
  else if (from)
    len = (size_t)snprintf(what, sizeof what,
                           "every device's own values were finite; their sums in a layer's "
                           "exchange between the devices (such as batch norm's statistics) were "
                           "not (overflow)");
  else
    len = (size_t)snprintf(what, sizeof what,
                           "every device's own loss and gradients were finite, their average "
                           "was not (overflow)");
  if (from && n_own && n_got && len < sizeof what)
    len += (size_t)snprintf(what + len, sizeof what - len,
                            "; %s%s only received non-finite values from %s in a layer's "
                            "exchange between the devices (such as batch norm's statistics)",
                            n_got > 1 ? many : one, others, n_own > 1 ? "them" : "it");
  if (s->unknown[0] && len < sizeof what)
    snprintf(what + len, sizeof what - len,
             " (whether that is their own or only what another device sent them in a layer's "
             "exchange is not known: %s)",
             s->unknown);
  return PMAP_ERR(PMAP_ERR_NUMERIC,
                  "pmap_update: step %lld%s: %s (averaged loss %g); the step was skipped on every "
                  "replica: parameters, optimizer state and step count are unchanged",
                  (long long)p->step + 1, seq, what, (double)h[0]);
}

/* The message of a step the guard skipped for a finite gradient norm too large for its
 * optimizer, naming the devices whose own norm (their flags) exceeds the limit too. */
static pmap_status norm_error(const pmap_params *p, float norm) {
  const float *h = p->guard_host;
  int G = p->gl.G, dist = runtime_distributed(p->ctx);
  float max = params_norm_max(p);
  int *own = calloc((size_t)G, sizeof *own);
  char devs[600] = "", what[700] = "";
  int n_own = 0;
  if (own) {
    for (int g = 0; g < G; g++) own[g] = h[1 + g] * (float)G > max; /* a flag is a mean */
    n_own = device_list(p, own, devs, sizeof devs);
    free(own);
  }
  if (n_own)
    snprintf(what, sizeof what, "; the local gradients of %s%s exceed it",
             n_own > 1 ? (dist ? "" : "devices ") : (dist ? "" : "device "), devs);
  return PMAP_ERR(PMAP_ERR_NUMERIC,
                  "pmap_update: step %lld: the averaged gradient's L2 norm %g exceeds %g, the "
                  "largest %s takes with the numeric guard on (the squares of its values could "
                  "overflow the second moment to infinity)%s (averaged loss %g); the step was "
                  "skipped on every replica: parameters, optimizer state and step count are "
                  "unchanged",
                  (long long)p->step + 1, (double)norm, (double)max,
                  p->opt.kind == PMAP_OPT_ADAMW ? "AdamW" : "Adam", what, (double)h[0]);
}

/* A skipped step's error, after looking for the sources where layers exchange values. */
static pmap_status skipped_error(pmap_params *p, step_call *c) {
  if (c->over_norm > 0.0f) return norm_error(p, c->over_norm);
  sources s = {.c = c};
  if (model_has_collectives(p->model) && !p->grad_fn) {
    if (params_dispatch(p, sources_job, &s))
      snprintf(s.unknown, sizeof s.unknown, "%s", pmap_last_error());
    else
      s.sent = p->guard_host + 1 + p->gl.G;
  }
  return numeric_error(p, &s);
}

/* A sharded step failed after every device stepped its part (only its final all-gather can):
 * the step is taken (step count, optimizer state, each device's own part). Its all-gather runs
 * once more at once; if that fails too the params are torn until a later call completes it. */
static pmap_status finish_stepped(pmap_params *p, pmap_status st, int64_t t) {
  char first[1024];
  snprintf(first, sizeof first, "%s", pmap_last_error());
  p->step = t;
  p->torn = 1;
  if (params_mend(p, "pmap_update") == PMAP_SUCCESS) return PMAP_SUCCESS;
  return pmap_error_set(st,
                        "pmap_update: step %lld was taken (each device stepped its part of the "
                        "parameters) but their all-gather failed twice (%s); the next call on "
                        "these params completes it",
                        (long long)t, first);
}

pmap_status pmap_update(pmap_params *p, const pmap_array *xs, const pmap_array *ys, float *loss) {
  const char *call = "pmap_update";
  if (!p) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: params is NULL", call);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  step_call c = {.p = p, .xs = xs, .ys = ys, .want_loss = loss != NULL};
  atomic_init(&c.stepped, 0);
  pmap_status st = ys ? batch_check(p, xs, ys, call, &c.batch)
                      : PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys is NULL", call);
  if (!st && p->step >= PARAMS_STEP_MAX)
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: the step count %lld is the highest a checkpoint holds (2^63 - 2); it "
                  "cannot grow any further (nothing was changed)",
                  call, (long long)p->step);
  if (!st) st = params_mend(p, call);
  /* A refusal here is this process's alone: it still takes part in the step check, so every
   * process refuses the step and the next calls pair with each other. */
  st = step_check_processes(&c, st);
  if (!st) {
    c.t = p->step + 1;
    c.hyper = optimizer_hyper(&p->opt, c.t);
    step_fast_prepare(&c);
    trace_rec *tr = runtime_trace(p->ctx);
    int64_t t0 = 0;
    if (tr) {
      trace_set_step(tr, c.t);
      t0 = pmap_now_ns();
    }
    st = params_dispatch(p, update_job, &c);
    if (tr)
      trace_span_kept(tr, runtime_trace_caller(p->ctx), "pmap_update", NULL, -1, "step", t0,
                      pmap_now_ns(), -1);
    int stepped = atomic_load(&c.stepped);
    if (st && stepped)
      st = finish_stepped(p, st, c.t);
    else if (!st && c.skipped)
      st = skipped_error(p, &c);
    else if (!st)
      p->step = c.t;
    if ((!st || stepped) && loss) *loss = c.loss; /* a step taken has its loss */
  }
  pmap_ctx_unlock(p->ctx);
  return st;
}
