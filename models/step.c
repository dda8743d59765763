/* step.c: the data-parallel step. pmap_update validates at the boundary, then every device
 * runs: its rows (in micro-batches) -> forward, loss, backward (or the user's gradient function)
 * -> one all-reduce (mean) of [gradients | loss | guard flags] -> the numeric guard and clipping
 * -> the same optimizer step on every replica. With a sharded optimizer the all-reduce is a
 * reduce-scatter, each device steps its own part of the parameters (holding only that part's
 * optimizer state), and an all-gather of the parameters follows; a small all-gather of each
 * device's [part norm | loss | flags] gives every device what the guard and clipping read.
 * pmap_predict is the sharded forward pass. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "params.h"
#include "runtime/backend.h"
#include "base/error.h"
#include "runtime/fault.h"
#include "step_fast.h"

static const char *dtype_name(pmap_dtype t) {
  switch (t) {
  case PMAP_F32: return "f32";
  case PMAP_I32: return "i32";
  }
  return "unknown";
}

/* Elements of a's axes [first, rank): -1 unless every extent is >= 1 and the product fits. */
static int64_t numel_from(const pmap_array *a, int first_axis) {
  int64_t n = 1;
  for (int i = first_axis; i < a->rank; i++)
    if (a->shape[i] < 1 || __builtin_mul_overflow(n, a->shape[i], &n)) return -1;
  return n;
}

/* "(4, -1, 7)" into buf. */
static const char *shape_str(const pmap_array *a, char *buf, size_t size) {
  size_t len = (size_t)snprintf(buf, size, "(");
  for (int i = 0; i < a->rank && i < PMAP_MAX_RANK && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
  if (len < size) snprintf(buf + len, size - len, ")");
  return buf;
}

static pmap_status check_ys(pmap_params *p, const pmap_array *ys, int64_t b, const char *call) {
  const pmap_model *m = p->model;
  char sh[160];
  if (!ys->data) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys->data is NULL", call);
  int64_t k = m->layers[m->n_layers - 1].out_size;
  if (ys->rank < 1 || ys->rank > PMAP_MAX_RANK)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys has rank %d; it must be 1..%d", call,
                    ys->rank, PMAP_MAX_RANK);
  if (ys->shape[0] != b)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: ys has leading extent %lld (shape %s); it must match xs's batch %lld",
                    call, (long long)ys->shape[0], shape_str(ys, sh, sizeof sh), (long long)b);
  if (numel_from(ys, 1) < 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: ys has shape %s; every extent must be positive and their product must "
                    "fit in 64 bits",
                    call, shape_str(ys, sh, sizeof sh));
  if (m->loss == PMAP_LOSS_MSE) {
    if (ys->dtype != PMAP_F32 || ys->rank != 2 || ys->shape[1] != k)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: MSE needs ys f32 of shape (%lld, %lld); got %s %s", call, (long long)b,
                      (long long)k, dtype_name(ys->dtype), shape_str(ys, sh, sizeof sh));
    return PMAP_SUCCESS;
  }
  if (ys->dtype != PMAP_I32 || numel_from(ys, 1) != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: softmax cross-entropy needs ys i32 labels of shape (%lld) or (%lld, 1); "
                    "got %s %s",
                    call, (long long)b, (long long)b, dtype_name(ys->dtype),
                    shape_str(ys, sh, sizeof sh));
  const int32_t *labels = ys->data;
  for (int64_t i = 0; i < b; i++)
    if (labels[i] < 0 || labels[i] >= k)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: label %d at row %lld is outside [0, %lld)",
                      call, (int)labels[i], (long long)i, (long long)k);
  return PMAP_SUCCESS;
}

/* A custom model's arrays: xs f32, ys f32 or i32, any rank, positive extents whose product
 * fits, the same leading extent. */
static pmap_status check_custom(const pmap_array *a, const char *name, int64_t b,
                                const char *call) {
  char sh[160];
  if (!a->data) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s->data is NULL", call, name);
  if (a->rank < 1 || a->rank > PMAP_MAX_RANK)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s has rank %d; it must be 1..%d", call, name,
                    a->rank, PMAP_MAX_RANK);
  if (a->shape[0] != b || numel_from(a, 0) < 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: %s has shape %s; it needs leading extent %lld and positive extents whose "
                    "product fits in 64 bits",
                    call, name, shape_str(a, sh, sizeof sh), (long long)b);
  if (numel_from(a, 0) > PTRDIFF_MAX / 4)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: %s of shape %s holds more bytes than the address space", call, name,
                    shape_str(a, sh, sizeof sh));
  if (a->dtype != PMAP_F32 && (a->dtype != PMAP_I32 || !strcmp(name, "xs")))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s must be f32%s, got %s", call, name,
                    strcmp(name, "xs") ? " or i32" : "", dtype_name(a->dtype));
  return PMAP_SUCCESS;
}

/* The global batch b against the device count: a positive multiple of it, or with uneven
 * batches at least one row per device. Sets p->batch and p->bd (most rows of a device). */
static pmap_status check_rows(pmap_params *p, int64_t b, const char *call) {
  int n = p->ctx->n;
  if (p->ctx->uneven) {
    if (b < n)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: global batch %lld is smaller than the %d devices (uneven batches need "
                      "at least one row per device)",
                      call, (long long)b, n);
  } else if (b <= 0 || b % n != 0) {
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: global batch %lld is not divisible by %d devices (it must be a positive "
                    "multiple of the device count, or set pmap_config.uneven_batches)",
                    call, (long long)b, n);
  }
  p->batch = b;
  p->bd = b / n + (b % n != 0);
  return PMAP_SUCCESS;
}

/* Validates xs (and ys when non-NULL) against the model and the device count, and that the
 * activation memory of the largest piece of a device's rows is addressable. */
static pmap_status check_batch(pmap_params *p, const pmap_array *xs, const pmap_array *ys,
                               const char *call) {
  const pmap_model *m = p->model;
  char sh[160];
  if (!xs || !xs->data)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: xs%s is NULL", call, xs ? "->data" : "");
  if (p->grad_fn) {
    PMAP_TRY(check_custom(xs, "xs", xs->shape[0], call));
    PMAP_TRY(check_rows(p, xs->shape[0], call));
    return ys ? check_custom(ys, "ys", xs->shape[0], call) : PMAP_SUCCESS;
  }
  if (xs->dtype != PMAP_F32)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: xs must be f32, got %s", call,
                    dtype_name(xs->dtype));
  if (xs->rank != m->in_rank + 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: xs has rank %d; the model takes rank %d (batch axis + %d example axes)",
                    call, xs->rank, m->in_rank + 1, m->in_rank);
  for (int i = 0; i < m->in_rank; i++)
    if (xs->shape[i + 1] != m->in_shape[i])
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: xs axis %d has extent %lld; the model's input needs %lld", call, i + 1,
                      (long long)xs->shape[i + 1], (long long)m->in_shape[i]);
  int64_t b = xs->shape[0];
  PMAP_TRY(check_rows(p, b, call));
  if (b > PTRDIFF_MAX / 4 / m->in_size)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: xs of shape %s holds more bytes than the address space", call,
                    shape_str(xs, sh, sizeof sh));
  int64_t piece = (p->bd + p->micro_batches - 1) / p->micro_batches;
  size_t floats = 0;
  if (model_arena_floats(m, piece, &floats) || floats > PTRDIFF_MAX / sizeof(float))
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "%s: the activations of %lld examples per device would take more than the "
                    "address space (the model has %d layers)",
                    call, (long long)piece, m->n_layers);
  return ys ? check_ys(p, ys, b, call) : PMAP_SUCCESS;
}

/* Rows [row0, row0 + rows) of a host array, staged into device memory where the backend needs
 * it (on CPU a view). */
static pmap_status shard(pmap_device *dev, const pmap_array *a, int64_t row0, int64_t rows,
                         int slot, const void **out) {
  size_t row = (size_t)numel_from(a, 1) * 4; /* f32 and i32 */
  const char *host = (const char *)a->data + (size_t)row0 * row;
  return backend_stage(dev, slot, host, (size_t)rows * row, out);
}

/* Device `dev` waits as if hung, until another device gives up on it (or 10 timeouts pass). */
static void stall(pmap_device *dev) {
  pmap_ctx *ctx = dev->ctx;
  int64_t limit = ctx->wait.timeout_ns >= 0 ? 10 * ctx->wait.timeout_ns : 1000000000;
  int64_t start = pmap_now_ns();
  struct timespec ms = {0, 1000000};
  while (!atomic_load(&ctx->abort) && pmap_now_ns() - start < limit) nanosleep(&ms, NULL);
}

/* The fault hooks of a step before its all-reduce (runtime/fault.h). */
static pmap_status inject_before_reduce(pmap_device *dev, pmap_params *p, replica *r) {
  pmap_fault *f = dev->ctx->fault;
  int d = dev->index;
  if (pmap_fault_fires(f, FAULT_NAN, d, p->step))
    PMAP_TRY(r->ops->fill(r->q, r->g, NAN, p->n_params));
  if (pmap_fault_fires(f, FAULT_COLLECTIVE, d, p->step))
    return PMAP_ERR(PMAP_ERR_DEVICE,
                    "device %d: the gradient all-reduce of step %lld failed (injected by "
                    "PMAP_FAULT)",
                    d, (long long)p->step);
  if (pmap_fault_fires(f, FAULT_STALL, d, p->step)) stall(dev);
  return PMAP_SUCCESS;
}

/* Moves one parameter of this replica by one ulp (runtime/fault.h: drift). */
static pmap_status drift(pmap_device *dev, replica *r) {
  float w0 = 0.0f;
  PMAP_TRY(backend_download(dev, &w0, r->w, sizeof w0));
  w0 = nextafterf(w0, INFINITY);
  PMAP_TRY(backend_upload(dev, r->w, &w0, sizeof w0));
  return backend_sync(dev);
}

/* [loss | flags (N) | parts (G)] of this device's host tail, from the averaged buffer. Replicated:
 * every device has every part of the averaged gradients and computes every part norm. Sharded:
 * each device has only its own part, so it computes its part norm into its part slot and the
 * devices all-gather [part | loss | flags]; each value of the loss and flags is taken from the
 * record of the device whose part held it averaged. */
static pmap_status gather_tail(pmap_device *dev, pmap_params *p, replica *r, int norms, float *h) {
  int n = p->ng, ng = p->ng; /* flags: one per global device */
  float *parts = r->g + params_off_parts(p);
  if (!p->shard) {
    if (norms)
      for (int k = 0; k < ng; k++) {
        size_t lo = 0, len = 0;
        params_part(p, k, &lo, &len);
        PMAP_TRY(r->ops->norm2(r->q, r->g + lo, len, parts + k));
      }
    return backend_download(dev, h, r->g + params_off_loss(p),
                            ((size_t)n + 1 + (size_t)ng) * sizeof *h);
  }
  size_t lo = 0, len = 0, rec = params_record_len(p);
  params_part(p, params_global(p, dev->index), &lo, &len);
  if (norms) PMAP_TRY(r->ops->norm2(r->q, r->g + lo, len, r->g + params_off_part(p)));
  float *records = r->g + params_off_records(p);
  PMAP_TRY(backend_all_gather(dev, "pmap_update's exchange of norms", r->g + params_off_part(p),
                              records, rec));
  float *hr = h + n + 1 + ng;
  PMAP_TRY(backend_download(dev, hr, records, (size_t)ng * rec * sizeof *h));
  for (size_t j = 0; j <= (size_t)n; j++) { /* loss, then the flags */
    size_t at = params_off_loss(p) + j;
    size_t owner = at < p->reduced ? at / p->chunk : 0;
    h[j] = hr[owner * rec + 1 + j];
  }
  for (int k = 0; k < ng; k++) h[n + 1 + k] = hr[(size_t)k * rec];
  return PMAP_SUCCESS;
}

/* After the reduction: the numeric guard and the clipping scale. Every device reads the same
 * [loss | flags | parts], so every device decides the same. The norm is summed from the G part
 * norms in order, in double, alike on both paths. *scale: for the gradients; *skip: the guard
 * skips the step. */
static pmap_status guard_and_clip(pmap_device *dev, pmap_params *p, replica *r, float *scale,
                                  int *skip) {
  int n = p->ng, ng = p->ng; /* flags: one per global device */
  float *h = p->guard_host + (size_t)dev->index * params_host_len(p);
  int norms = p->guard || p->opt.clip_norm > 0.0f;
  *scale = 1.0f;
  *skip = 0;
  PMAP_TRY(gather_tail(dev, p, r, norms, h));
  if (!norms) return PMAP_SUCCESS;
  double sum = 0.0;
  for (int k = 0; k < ng; k++) sum += (double)h[n + 1 + k] * (double)h[n + 1 + k];
  float norm = (float)sqrt(sum);
  if (p->guard) {
    int finite = isfinite(norm) != 0;
    for (int i = 0; i < n + 1; i++) finite &= isfinite(h[i]) != 0;
    if (!finite) {
      if (dev->index == 0) p->numeric_bad = 1;
      *skip = 1;
      return PMAP_SUCCESS;
    }
  }
  /* In double: clip / norm may underflow float (a tiny clip, a huge norm); the step still takes
   * its (tiny, or with the guard off and an infinite norm, NaN-making) scale. */
  float clip = p->opt.clip_norm;
  if (clip > 0.0f && !(norm <= clip)) *scale = (float)((double)clip / (double)norm);
  return PMAP_SUCCESS;
}

/* The loss and gradient of one piece: rows [row0, row0 + rows) of the call's arrays, weighted
 * by `weight` (1: the device's whole share). The gradient accumulates into r->g; the loss goes
 * to its slot directly when the weight is 1 and the piece is the device's only one, else
 * through the micro-batch slot, weighted, into the loss slot. */
static pmap_status piece_grads(pmap_device *dev, pmap_params *p, replica *r, int64_t row0,
                               int64_t rows, float weight, int direct) {
  const pmap_model *m = p->model;
  size_t P = p->n_params;
  float *loss = r->g + (direct ? params_off_loss(p) : params_off_micro(p));
  const void *x = NULL, *y = NULL;
  PMAP_TRY(shard(dev, p->xs, row0, rows, 0, &x));
  PMAP_TRY(shard(dev, p->ys, row0, rows, 1, &y));
  /* The row's index in the global batch: across processes, this process's rows come after
   * those of the processes before it (each passes p->batch). */
  int64_t global_row0 = row0 + (int64_t)p->ctx->proc * p->batch;
  if (p->grad_fn) {
    pmap_grad_args a = {dev, r->w, r->g, loss, weight, *p->xs, *p->ys, global_row0, p->step, P};
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
    PMAP_TRY(model_loss(m, r, y, rows, loss));
    if (weight != 1.0f)
      PMAP_TRY(
          r->ops->scale(r->q, r->dact[L - 1], weight, (size_t)(rows * m->layers[L - 1].out_size)));
    PMAP_TRY(model_backward(dev, m, r, rows));
  }
  if (!direct) PMAP_TRY(r->ops->axpy(r->q, weight, loss, r->g + params_off_loss(p), 1));
  return PMAP_SUCCESS;
}

/* Every piece of this device's rows. Its share of the mean weighs rows * N / B (1 for an even
 * batch), split over the pieces by their rows. */
static pmap_status device_grads(pmap_device *dev, pmap_params *p, replica *r) {
  int n = dev->ctx->n;
  int64_t lo = 0, rows = 0;
  params_device_rows(p->batch, n, dev->index, &lo, &rows);
  /* Layers with collectives inside (cross-replica batch norm), and a user's gradient function
   * (which may call collectives), need every device to run as many pieces: at most the fewest
   * rows any device has. */
  int64_t fewest = p->batch / n;
  int64_t limit = p->grad_fn || model_has_collectives(p->model) ? fewest : rows;
  int64_t k = p->micro_batches < limit ? p->micro_batches : limit;
  double share = p->ctx->uneven ? (double)rows * n / (double)p->batch : 1.0;
  if (!p->grad_fn) PMAP_TRY(replica_reserve(dev, p->model, r, (rows + k - 1) / k));
  PMAP_TRY(model_state_begin(p->model, r));
  for (int64_t i = 0; i < k; i++) {
    int64_t a = rows * i / k, b = rows * (i + 1) / k;
    float weight = (float)(share * (double)(b - a) / (double)rows);
    PMAP_TRY(piece_grads(dev, p, r, lo + a, b - a, weight, k == 1 && weight == 1.0f));
  }
  return PMAP_SUCCESS;
}

static pmap_status update_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  replica *r = &p->rep[dev->index];
  const pmap_ops *ops = r->ops;
  size_t P = p->n_params;
  int fast = 0;
  PMAP_TRY(step_fast_update(dev, p, r, device_grads, &fast));
  if (fast) return PMAP_SUCCESS;
  PMAP_TRY(ops->fill(r->q, r->g, 0.0f, params_grad_len(p)));
  PMAP_TRY(device_grads(dev, p, r));
  if (dev->ctx->fault) PMAP_TRY(inject_before_reduce(dev, p, r));
  /* The guard's flag of this device: the norm of its own gradients and loss, in the slot of its
   * global index; the others' slots are 0, so after the mean a slot is non-finite exactly when
   * its device's values were. */
  if (p->guard)
    PMAP_TRY(ops->norm2(r->q, r->g, params_off_flags(p),
                        r->g + params_off_flags(p) + params_global(p, dev->index)));
  /* The one reduction of the step: gradients, the loss and the guard flags after them. */
  if (p->shard)
    PMAP_TRY(
        backend_reduce_scatter(dev, "pmap_update's reduce-scatter", r->g, p->chunk, PMAP_RED_MEAN));
  else
    PMAP_TRY(
        backend_all_reduce(dev, "pmap_update's all-reduce", r->g, r->g, p->reduced, PMAP_RED_MEAN));
  float scale = 1.0f;
  int skip = 0;
  if (p->shard || p->guard || p->opt.clip_norm > 0.0f)
    PMAP_TRY(guard_and_clip(dev, p, r, &scale, &skip));
  if (skip) return PMAP_SUCCESS; /* the guard: nothing changes on any replica */
  if (p->shard) {
    size_t lo = 0, len = 0;
    params_part(p, params_global(p, dev->index), &lo, &len);
    /* Every device passed the exchange (one verdict), so every device steps its part now: a
     * failure from here on leaves the step taken (pmap_update then completes the gather). */
    /* Every device says so itself (on CUDA the verdicts of a collective are per device). */
    atomic_store(&p->stepped, 1);
    if (dev->index == 0) p->loss = p->guard_host[0]; /* device 0's host tail: the averaged loss */
    /* The step is taken: the state its forward passes computed replaces the old (the same on
     * every device, so each commits its own copy of all of it). */
    PMAP_TRY(model_state_commit(p->model, r));
    PMAP_TRY(optimizer_step_range(p, r, lo, len, scale));
    PMAP_TRY(params_gather(dev, p, p->step));
  } else {
    PMAP_TRY(model_state_commit(p->model, r));
    PMAP_TRY(optimizer_step_range(p, r, 0, P, scale));
  }
  if (pmap_fault_fires(dev->ctx->fault, FAULT_DRIFT, dev->index, p->step)) PMAP_TRY(drift(dev, r));
  if (dev->index != 0) return backend_sync(dev);
  if (p->shard || p->guard || p->opt.clip_norm > 0.0f) {
    if (!p->shard) p->loss = p->guard_host[0]; /* device 0's host tail: the averaged loss */
    return backend_sync(dev);
  }
  return backend_download(dev, &p->loss, r->g + params_off_loss(p), sizeof p->loss);
}

/* The message of a step the numeric guard skipped, naming the devices whose own loss or
 * gradients were non-finite (device 0's copy of the flags, one per global device; every device
 * holds the same) by their global index and, across processes, process and host. */
static pmap_status numeric_error(const pmap_params *p) {
  const pmap_ctx *ctx = p->ctx;
  const float *h = p->guard_host;
  char devs[600], seq[48] = "";
  size_t len = 0;
  int bad = 0;
  devs[0] = '\0';
  for (int g = 0; g < p->ng && len < sizeof devs; g++) {
    if (isfinite(h[1 + g])) continue;
    if (ctx->dist)
      len += (size_t)snprintf(devs + len, sizeof devs - len, "%sdevice %d (process %d, host %s)",
                              bad ? ", " : "", g, g / ctx->n, pmap_proc_host(ctx, g / ctx->n));
    else
      len += (size_t)snprintf(devs + len, sizeof devs - len, "%s%d", bad ? ", " : "", g);
    bad++;
  }
  if (ctx->dist)
    snprintf(seq, sizeof seq, " (collective #%llu)", (unsigned long long)ctx->dev[0].xseq);
  char what[680];
  if (bad)
    snprintf(what, sizeof what, "the local loss or gradients of %s%s were non-finite",
             ctx->dist ? "" : (bad > 1 ? "devices " : "device "), devs);
  else
    snprintf(what, sizeof what,
             "every device's own loss and gradients were finite, their average was not "
             "(overflow)");
  return PMAP_ERR(PMAP_ERR_NUMERIC,
                  "pmap_update: step %lld%s: %s (averaged loss %g); the step was skipped on every "
                  "replica: parameters, optimizer state and step count are unchanged",
                  (long long)p->step, seq, what, (double)h[0]);
}

/* What every process must pass alike to a step: as many rows (the mean weighs every global
 * device alike, which is the global mean only then), the same step number and the same
 * optimizer settings (replicas stepped differently would drift apart silently). */
typedef struct step_record {
  int64_t rows, step;
  uint64_t opt; /* a hash of the optimizer's settings */
  float lr;     /* the step's learning rate, for the message */
  int32_t kind;
} step_record;

static uint64_t hash_bytes(uint64_t h, const void *v, size_t n) {
  const unsigned char *b = v;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* Field by field, so that padding never counts. */
static uint64_t opt_hash(const pmap_optimizer *o) {
  uint64_t h = 1469598103934665603ull;
  int32_t k = o->kind, nest = o->nesterov, sched = o->schedule;
  const float f[] = {o->lr,  o->momentum,  o->beta1,        o->beta2,
                     o->eps, o->clip_norm, o->weight_decay, o->final_lr};
  const int64_t w[] = {o->warmup_steps, o->decay_steps};
  h = hash_bytes(h, &k, sizeof k);
  h = hash_bytes(h, &nest, sizeof nest);
  h = hash_bytes(h, &sched, sizeof sched);
  h = hash_bytes(h, f, sizeof f);
  return hash_bytes(h, w, sizeof w);
}

/* The list "process 0 (host a): 8; process 1 (host b): 16" of one field of every record. */
static void list_field(const pmap_ctx *ctx, const step_record *all, int field, char *buf,
                       size_t size) {
  size_t len = 0;
  char name[128];
  buf[0] = '\0';
  for (int r = 0; r < ctx->nproc && len < size; r++) {
    pmap_proc_name(ctx, r, name, sizeof name);
    const step_record *x = &all[r];
    if (field == 0)
      len += (size_t)snprintf(buf + len, size - len, "%s%s: %lld", r ? "; " : "", name,
                              (long long)x->rows);
    else if (field == 1)
      len += (size_t)snprintf(buf + len, size - len, "%s%s: step %lld", r ? "; " : "", name,
                              (long long)x->step);
    else
      len += (size_t)snprintf(buf + len, size - len, "%s%s: optimizer %d, lr %g (settings %016llx)",
                              r ? "; " : "", name, (int)x->kind, (double)x->lr,
                              (unsigned long long)x->opt);
  }
}

/* Every step of a distributed context runs the exchange, before any device works: whether to
 * run it must not depend on anything one process knows and another does not. */
static pmap_status check_processes(pmap_params *p) {
  pmap_ctx *ctx = p->ctx;
  if (!ctx->dist) return PMAP_SUCCESS;
  step_record mine = {p->batch, p->step, opt_hash(&p->opt), 0.0f, (int32_t)p->opt.kind};
  mine.lr = (float)pmap_optimizer_lr(&p->opt, p->step + 1);
  const void *got = NULL;
  PMAP_TRY(pmap_ctx_exchange(ctx, "pmap_update's step check", &mine, sizeof mine, &got));
  const step_record *all = got;
  int field = -1;
  for (int r = 0; r < ctx->nproc && field < 0; r++)
    field = all[r].rows != mine.rows   ? 0
            : all[r].step != mine.step ? 1
            : all[r].opt != mine.opt   ? 2
                                       : -1;
  if (field < 0) return PMAP_SUCCESS;
  static const char *const what[] = {
      "pass different numbers of rows (%s): each must pass the same number, so that the mean "
      "weighs every row alike",
      "are at different steps (%s): they resumed from different checkpoints or one skipped a "
      "step",
      "have different optimizer settings (%s): every replica must take the same step"};
  char list[700], why[900];
  list_field(ctx, all, field, list, sizeof list);
  snprintf(why, sizeof why, what[field], list);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_update: the processes %s (nothing was changed)",
                  why);
}

/* A sharded step failed after every device stepped its part (only its final all-gather can):
 * the step is taken (step count, optimizer state, each device's own part). Its all-gather runs
 * once more at once; if that fails too the params are torn until a later call completes it. */
static pmap_status finish_stepped(pmap_params *p, pmap_status st, int64_t t) {
  char first[1024];
  snprintf(first, sizeof first, "%s", pmap_error_message());
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
  if (!ys) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ys is NULL", call);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_status st = check_batch(p, xs, ys, call);
  if (!st && p->step >= PARAMS_STEP_MAX)
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: the step count %lld is the highest a checkpoint holds (2^63 - 2); it "
                  "cannot grow any further (nothing was changed)",
                  call, (long long)p->step);
  if (!st) st = params_mend(p, call);
  if (!st) st = check_processes(p);
  if (!st) {
    int64_t t = p->step + 1;
    p->hyper = optimizer_hyper(&p->opt, t);
    p->xs = xs;
    p->ys = ys;
    p->numeric_bad = 0;
    atomic_store(&p->stepped, 0);
    step_fast_prepare(p, loss != NULL);
    st = params_dispatch(p, update_job, p);
    int stepped = atomic_load(&p->stepped);
    if (st && stepped)
      st = finish_stepped(p, st, t);
    else if (!st && p->numeric_bad)
      st = numeric_error(p);
    else if (!st)
      p->step = t;
    if ((!st || stepped) && loss) *loss = p->loss; /* a step taken has its loss */
  }
  pmap_ctx_unlock(p->ctx);
  return st;
}

static pmap_status predict_job(pmap_device *dev, void *arg) {
  pmap_params *p = arg;
  const pmap_model *m = p->model;
  replica *r = &p->rep[dev->index];
  int64_t lo = 0, rows = 0;
  params_device_rows(p->batch, dev->ctx->n, dev->index, &lo, &rows);
  size_t k = (size_t)m->layers[m->n_layers - 1].out_size;
  int64_t piece = (rows + p->micro_batches - 1) / p->micro_batches;
  PMAP_TRY(replica_reserve(dev, m, r, piece));
  r->inference = 1; /* batch norm: running statistics; dropout: the identity */
  for (int64_t a = 0; a < rows; a += piece) {
    int64_t len = rows - a < piece ? rows - a : piece;
    const void *x = NULL;
    PMAP_TRY(shard(dev, p->xs, lo + a, len, 0, &x));
    PMAP_TRY(model_forward(dev, m, r, x, len));
    float *dst = (float *)p->out->data + (size_t)(lo + a) * k;
    PMAP_TRY(backend_download(dev, dst, r->out[m->n_layers - 1], (size_t)len * k * sizeof(float)));
  }
  return PMAP_SUCCESS;
}

pmap_status pmap_predict(pmap_params *p, const pmap_array *xs, pmap_array *out) {
  const char *call = "pmap_predict";
  if (!p || !out || !out->data)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !p     ? "params"
                    : !out ? "out"
                           : "out->data");
  if (p->grad_fn)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: params made by pmap_params_create_custom have no forward pass the "
                    "runtime knows; compute predictions with your own pmap_run",
                    call);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_status st = check_batch(p, xs, NULL, call);
  if (!st) st = params_mend(p, call);
  const layer *last = &p->model->layers[p->model->n_layers - 1];
  char sh[160];
  if (!st && (out->dtype != PMAP_F32 || out->rank != 1 + last->out_rank ||
              out->shape[0] != xs->shape[0] || numel_from(out, 1) != last->out_size))
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: out must be f32 (%lld, %lld); got %s %s", call,
                  (long long)xs->shape[0], (long long)last->out_size, dtype_name(out->dtype),
                  out->rank >= 1 && out->rank <= PMAP_MAX_RANK ? shape_str(out, sh, sizeof sh)
                                                               : "of a bad rank");
  if (!st) {
    p->xs = xs;
    p->out = out;
    st = params_dispatch(p, predict_job, p);
  }
  pmap_ctx_unlock(p->ctx);
  return st;
}
