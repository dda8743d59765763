/* step.c: pmap_update, the data-parallel step. After the checks at the boundary (batch.c) every
 * device runs the stages of step_stages.h in order: its gradients (step_grads.c), then reduce,
 * decide and apply on the replicated or the sharded path (step_paths.c), with the injected
 * faults between them (step_faults.c). The CUDA fast paths take over the whole step where they
 * are on (step_fast.c). Here too: the messages of a refused or skipped step (where the values
 * that were not finite came from). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/trace.h"
#include "runtime/runtime.h"
#include "step_fast.h"
#include "step_stages.h"

/* ------------------------------------------------------------------------------------------ */

static pmap_status update_steps(pmap_device *dev, step_call *c) {
  pmap_params *p = c->p;
  replica *r = &p->rep[pmap_local_index(dev)];
  int fast = 0;
  PMAP_TRY(step_fast_update(dev, c, r, step_grads, &fast));
  if (fast) return PMAP_SUCCESS;
  PMAP_TRY(r->ops->fill(r->q, r->g, 0.0f, p->gl.len));
  r->source.injected = 0; /* a nan fault of this call only (a refused call's step comes again) */
  if (p->shard_grads) PMAP_TRY(grad_window_begin(p, r, 0));
  PMAP_TRY(step_grads(dev, c, r));
  if (p->shard_grads) PMAP_TRY(grad_window_finish(dev, p, r));
  PMAP_TRY(step_inject(dev, c, r, BEFORE_REDUCE));
  runtime_trace_keep(dev, 1); /* the reduction on: spans a trace keeps past its span limit */
  return p->shard ? step_sharded(dev, c, r) : step_replicated(dev, c, r);
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

/* Which devices' own values made a step skip, for its message. Each device's flag (the norm of
 * its own gradients and loss) is computed before the reduction only where the step cannot be
 * computed again (a user's gradient function) or the fast path computes it anyway; otherwise
 * (c->flags_late) the skipped step's gradients are computed once more here, into scratch (the
 * step is not taken; dropout's masks and batch norm's pending state come out the same), and
 * each device's flag from them.
 * Without layers that exchange values between devices, a device's flag says whether its own
 * loss or gradients were non-finite. With them, a device's values also hold what the others
 * sent it: the recomputation watches every exchange (model_exchange) up to the first one that
 * returns a value that is not finite; the devices that sent one into it are the sources, the
 * others only got it (and if none sent one, their finite values overflowed there). */
typedef struct sources {
  step_call *c;
  int watch;         /* in: look for the sources (a model with exchanges, no gradient function) */
  int exchanged;     /* out (device 0): an exchange returned a value that is not finite */
  const float *sent; /* (G) nonzero for a source, in device 0's host tail; NULL: not searched */
  char unknown[512]; /* why the search failed ("" when it did not) */
} sources;

static pmap_status search_sources(pmap_device *dev, sources *s) {
  step_call *c = s->c;
  pmap_params *p = c->p;
  replica *r = &p->rep[pmap_local_index(dev)];
  const grad_layout *gl = &p->gl;
  int G = gl->G, g = pmap_axis_index(dev);
  r->source.watch = s->watch;
  r->source.seen = r->source.sent = 0;
  pmap_status st = r->ops->fill(r->q, r->g, 0.0f, gl->len);
  /* With sharded gradients no device holds its own whole gradient: its flag is summed from
   * the norms of the pieces it adds up, layer by layer, before each is reduced. */
  if (!st && p->shard_grads) st = grad_window_begin(p, r, c->flags_late);
  if (!st) st = step_grads(dev, c, r); /* into scratch only: the step is not taken */
  if (!st && p->shard_grads) st = grad_window_finish(dev, p, r);
  r->source.watch = 0;
  PMAP_TRY(st);
  int nan = r->source.injected == c->t;
  if (nan && !p->shard_grads) PMAP_TRY(r->ops->fill(r->q, r->g, NAN, p->n_params));
  /* [flags (G) | sources (G)], one slot each per global device (the flags' and the part norms'
   * places), averaged across the devices as the step's flags are: a slot is non-finite, or
   * nonzero, exactly when its device's value was. */
  float *slots = replica_g(r, gl->flags);
  PMAP_TRY(r->ops->fill(r->q, slots, 0.0f, 2 * (size_t)G));
  if (c->flags_late && p->shard_grads) {
    float flag = nan ? NAN : grad_window_flag(r);
    PMAP_TRY(backend_upload(dev, slots + g, &flag, sizeof flag));
  } else if (c->flags_late) {
    PMAP_TRY(r->ops->norm2(r->q, r->g, gl->flags, slots + g));
  }
  if (r->source.sent) PMAP_TRY(r->ops->fill(r->q, slots + G + g, 1.0f, 1));
  PMAP_TRY(backend_all_reduce(dev, "pmap_update's search for non-finite values", slots, slots,
                              2 * (size_t)G, PMAP_RED_MEAN));
  if (pmap_local_index(dev) == 0) {
    s->exchanged = r->source.seen;
    float *h = step_host_tail(p, dev);
    if (c->flags_late) PMAP_TRY(backend_download(dev, h + 1, slots, G * sizeof(float)));
    if (s->watch) PMAP_TRY(backend_download(dev, h + 1 + G, slots + G, G * sizeof(float)));
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
  if (s->c->flags_late && s->unknown[0]) /* the flags were to come from the search */
    return PMAP_ERR(PMAP_ERR_NUMERIC,
                    "pmap_update: step %lld: the loss or gradients were non-finite (averaged loss "
                    "%g; which devices' own values were is not known: %s); the step was skipped "
                    "on every replica: parameters, optimizer state and step count are unchanged",
                    (long long)p->step + 1, (double)h[0], s->unknown);
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
static pmap_status norm_error(const pmap_params *p, float norm, const sources *s) {
  const float *h = p->guard_host;
  int G = p->gl.G, dist = runtime_distributed(p->ctx);
  float max = params_norm_max(p);
  int *own = s->c->flags_late && s->unknown[0] ? NULL : calloc((size_t)G, sizeof *own);
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

/* A skipped step's error, after computing the devices' flags (c->flags_late) and looking for
 * the sources where layers exchange values. */
static pmap_status skipped_error(pmap_params *p, step_call *c) {
  sources s = {.c = c,
               .watch = !(c->over_norm > 0.0f) && model_has_collectives(p->model) && !p->grad_fn};
  if (s.watch || c->flags_late) {
    if (params_dispatch(p, sources_job, &s))
      snprintf(s.unknown, sizeof s.unknown, "%s", pmap_last_error());
    else if (s.watch)
      s.sent = p->guard_host + 1 + p->gl.G;
  }
  if (c->over_norm > 0.0f) return norm_error(p, c->over_norm, &s);
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
  if (!st) st = params_fit_recompute(p, c.batch, call);
  /* A refusal here is this process's alone: it still takes part in the step check, so every
   * process refuses the step and the next calls pair with each other. */
  st = step_check_processes(&c, st);
  if (!st) {
    c.t = p->step + 1;
    c.hyper = optimizer_hyper(&p->opt, c.t);
    int fast = step_fast_prepare(&c);
    c.flags_late = p->guard && p->gl.G > 1 && !p->grad_fn && !fast;
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
