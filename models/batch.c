/* batch.c: a call's arrays checked at the boundary against the model and the devices (every
 * failure names the call and the values, and nothing has changed), and each device's rows of
 * them staged where it reads them. */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "runtime/runtime.h"
#include "batch.h"

const char *batch_dtype_name(pmap_dtype t) {
  switch (t) {
  case PMAP_F32: return "f32";
  case PMAP_I32: return "i32";
  }
  return "unknown";
}

/* Elements of a's axes [first, rank): -1 unless every extent is >= 1 and the product fits. */
int64_t batch_numel_from(const pmap_array *a, int first_axis) {
  int64_t n = 1;
  for (int i = first_axis; i < a->rank; i++)
    if (a->shape[i] < 1 || __builtin_mul_overflow(n, a->shape[i], &n)) return -1;
  return n;
}

/* "(4, -1, 7)" into buf. */
const char *batch_shape_str(const pmap_array *a, char *buf, size_t size) {
  size_t len = (size_t)snprintf(buf, size, "(");
  for (int i = 0; i < a->rank && i < PMAP_MAX_RANK && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
  if (len < size) snprintf(buf + len, size - len, ")");
  return buf;
}

/* Every id of a (n) in [0, v), else the first that is not, with its example and position. */
static pmap_status check_ids(const int32_t *a, int64_t n, int64_t per, int64_t v, const char *what,
                             const char *call) {
  for (int64_t i = 0; i < n; i++)
    if (a[i] < 0 || a[i] >= v)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: %s %d at example %lld position %lld is outside [0, %lld)", call, what,
                      (int)a[i], (long long)(i / per), (long long)(i % per), (long long)v);
  return PMAP_SUCCESS;
}

static pmap_status check_ys(const pmap_params *p, const pmap_array *ys, int64_t b,
                            const char *call) {
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
                    call, (long long)ys->shape[0], batch_shape_str(ys, sh, sizeof sh),
                    (long long)b);
  if (batch_numel_from(ys, 1) < 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: ys has shape %s; every extent must be positive and their product must "
                    "fit in 64 bits",
                    call, batch_shape_str(ys, sh, sizeof sh));
  if (m->loss == PMAP_LOSS_TOKEN_XENT) {
    const layer *last = &m->layers[m->n_layers - 1];
    int64_t t = last->out_shape[0], v = last->out_shape[1];
    if (ys->dtype != PMAP_I32 || ys->rank != 2 || ys->shape[1] != t)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: the per-token cross-entropy needs ys i32 targets of shape (%lld, %lld); "
                      "got %s %s",
                      call, (long long)b, (long long)t, batch_dtype_name(ys->dtype),
                      batch_shape_str(ys, sh, sizeof sh));
    return check_ids(ys->data, b * t, t, v, "target", call);
  }
  if (m->loss == PMAP_LOSS_MSE) {
    if (ys->dtype != PMAP_F32 || ys->rank != 2 || ys->shape[1] != k)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s: MSE needs ys f32 of shape (%lld, %lld); got %s %s", call, (long long)b,
                      (long long)k, batch_dtype_name(ys->dtype),
                      batch_shape_str(ys, sh, sizeof sh));
    return PMAP_SUCCESS;
  }
  if (ys->dtype != PMAP_I32 || batch_numel_from(ys, 1) != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: softmax cross-entropy needs ys i32 labels of shape (%lld) or (%lld, 1); "
                    "got %s %s",
                    call, (long long)b, (long long)b, batch_dtype_name(ys->dtype),
                    batch_shape_str(ys, sh, sizeof sh));
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
  if (a->shape[0] != b || batch_numel_from(a, 0) < 0)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: %s has shape %s; it needs leading extent %lld and positive extents whose "
                    "product fits in 64 bits",
                    call, name, batch_shape_str(a, sh, sizeof sh), (long long)b);
  if (batch_numel_from(a, 0) > PTRDIFF_MAX / 4)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: %s of shape %s holds more bytes than the address space", call, name,
                    batch_shape_str(a, sh, sizeof sh));
  if (a->dtype != PMAP_F32 && (a->dtype != PMAP_I32 || !strcmp(name, "xs")))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s must be f32%s, got %s", call, name,
                    strcmp(name, "xs") ? " or i32" : "", batch_dtype_name(a->dtype));
  return PMAP_SUCCESS;
}

/* The global batch b against the device count: a positive multiple of it, or with uneven
 * batches at least one row per device. *bd: the most rows a device takes. */
static pmap_status check_rows(const pmap_params *p, int64_t b, const char *call, int64_t *bd) {
  int n = p->n;
  if (runtime_uneven(p->ctx)) {
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
  *bd = b / n + (b % n != 0);
  return PMAP_SUCCESS;
}

pmap_status batch_check(const pmap_params *p, const pmap_array *xs, const pmap_array *ys,
                        const char *call, int64_t *batch) {
  const pmap_model *m = p->model;
  char sh[160];
  if (!xs || !xs->data)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: xs%s is NULL", call, xs ? "->data" : "");
  int64_t bd = 0;
  if (p->grad_fn) {
    PMAP_TRY(check_custom(xs, "xs", xs->shape[0], call));
    PMAP_TRY(check_rows(p, xs->shape[0], call, &bd));
    *batch = xs->shape[0];
    return ys ? check_custom(ys, "ys", xs->shape[0], call) : PMAP_SUCCESS;
  }
  if (xs->dtype != m->in_dtype)
    return PMAP_ERR(
        PMAP_ERR_INVALID_ARGUMENT, "%s: xs must be %s%s, got %s", call,
        batch_dtype_name(m->in_dtype),
        m->in_dtype == PMAP_I32 ? " token ids (the model starts with an embedding)" : "",
        batch_dtype_name(xs->dtype));
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
  PMAP_TRY(check_rows(p, b, call, &bd));
  *batch = b;
  if (b > PTRDIFF_MAX / 4 / m->in_size)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: xs of shape %s holds more bytes than the address space", call,
                    batch_shape_str(xs, sh, sizeof sh));
  int64_t piece = (bd + p->micro_batches - 1) / p->micro_batches;
  size_t floats = 0;
  if (model_arena_floats(m, piece, &floats) || floats > PTRDIFF_MAX / sizeof(float))
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "%s: the activations of %lld examples per device would take more than the "
                    "address space (the model has %d layers)",
                    call, (long long)piece, m->n_layers);
  if (m->in_dtype == PMAP_I32)
    PMAP_TRY(check_ids(xs->data, b * m->in_size, m->in_size, m->in_vocab, "token id", call));
  return ys ? check_ys(p, ys, b, call) : PMAP_SUCCESS;
}

pmap_status batch_stage(pmap_device *dev, const pmap_array *a, int64_t row0, int64_t rows, int slot,
                        const void **out) {
  size_t row = (size_t)batch_numel_from(a, 1) * 4; /* f32 and i32 */
  const char *host = (const char *)a->data + (size_t)row0 * row;
  return backend_stage(dev, slot, host, (size_t)rows * row, out);
}
