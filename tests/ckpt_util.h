/* ckpt_util.h: what the checkpoint and verify tests share: a training state on N CPU devices
 * for an example model, its snapshot (every replica's parameters, the step and the bytes of a
 * save, which cover the optimizer state), training on the example's data, and file helpers. */
#ifndef PMAP_TESTS_CKPT_UTIL_H
#define PMAP_TESTS_CKPT_UTIL_H

#include <unistd.h>

#include "pmap_examples.h"
#include "testutil.h"

typedef struct state {
  pmap_ctx *ctx;
  pmap_model *model;
  pmap_params *params;
  pmap_array xs, ys;
  int64_t rows, batch;
} state;

/* An example model on n CPU devices with optimizer opt (NULL: the example's) and `rows` rows of
 * its data (seed 1). Returns 0 on success. */
static inline int state_open(state *s, const char *name, int n, const pmap_optimizer *opt,
                             uint64_t seed, int64_t batch, int64_t rows) {
  memset(s, 0, sizeof *s);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
  pmap_example_info info;
  CHECK_OK(pmap_example_info_get(name, &info));
  if (opt) info.opt = *opt;
  CHECK_OK(pmap_ctx_create(&cfg, &s->ctx));
  CHECK_OK(pmap_example_model(name, &s->model));
  if (!s->ctx || !s->model) return -1;
  CHECK_OK(pmap_params_create(s->ctx, s->model, &info.opt, seed, &s->params));
  CHECK_OK(pmap_example_data(name, 1, rows, &s->xs, &s->ys));
  s->rows = rows;
  s->batch = batch;
  return s->params && s->xs.data ? 0 : -1;
}

static inline void state_close(state *s) {
  pmap_example_data_free(&s->xs, &s->ys);
  pmap_params_destroy(s->params);
  pmap_model_destroy(s->model);
  CHECK_OK(pmap_ctx_destroy(s->ctx));
  memset(s, 0, sizeof *s);
}

/* Steps [from, to) of training: step t takes batch t % (rows / batch) of the data, as pmap-train
 * does, so a resumed run sees the same batches. The last loss goes to *loss. */
static inline int state_train(state *s, int64_t from, int64_t to, float *loss) {
  int64_t batches = s->rows / s->batch;
  size_t xrow = (size_t)(pmap_array_numel(&s->xs) / s->rows);
  size_t yrow = (size_t)(pmap_array_numel(&s->ys) / s->rows);
  for (int64_t t = from; t < to; t++) {
    int64_t first = (t % batches) * s->batch;
    pmap_array xb = s->xs, yb = s->ys;
    xb.data = (float *)s->xs.data + (size_t)first * xrow;
    yb.data = (char *)s->ys.data + (size_t)first * yrow * 4;
    xb.shape[0] = yb.shape[0] = s->batch;
    pmap_status st = pmap_update(s->params, &xb, &yb, loss);
    CHECK(st == PMAP_SUCCESS, "step %lld: %s", (long long)t, pmap_last_error());
    if (st) return -1;
  }
  return 0;
}

/* The whole content of a file into a malloc'ed buffer (NULL when it cannot be read). */
static inline unsigned char *file_read(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  size_t cap = 0, len = 0, r;
  do {
    if (len == cap) {
      cap = cap ? 2 * cap : 65536;
      unsigned char *nb = realloc(buf, cap);
      if (!nb) break;
      buf = nb;
    }
    r = fread(buf + len, 1, cap - len, f);
    len += r;
  } while (r > 0);
  fclose(f);
  *n = len;
  return buf;
}

static inline int file_write(const char *path, const unsigned char *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int ok = fwrite(buf, 1, n, f) == n;
  return fclose(f) == 0 && ok ? 0 : -1;
}

/* A snapshot of the training state: every replica's parameters, the step, and a save's bytes
 * (the only public view of the optimizer state). */
typedef struct snapshot {
  int n;
  size_t count, bytes;
  float *w; /* (n, count) */
  int64_t step;
  unsigned char *file;
} snapshot;

static inline void snapshot_take(const state *s, const char *scratch, snapshot *out) {
  memset(out, 0, sizeof *out);
  out->n = pmap_ctx_num_devices(s->ctx);
  out->count = pmap_params_count(s->params);
  out->w = malloc((size_t)out->n * out->count * sizeof *out->w);
  for (int d = 0; out->w && d < out->n; d++)
    CHECK_OK(pmap_params_read(s->params, d, out->w + (size_t)d * out->count, out->count));
  out->step = pmap_params_step(s->params);
  CHECK_OK(pmap_params_save(s->params, scratch));
  out->file = file_read(scratch, &out->bytes);
  CHECK(out->w && out->file, "snapshot: out of memory or %s unreadable", scratch);
}

static inline void snapshot_free(snapshot *s) {
  free(s->w);
  free(s->file);
  memset(s, 0, sizeof *s);
}

/* Whether a and b are the same state, bit for bit. */
static inline int snapshot_same(const char *what, const snapshot *a, const snapshot *b) {
  int ok = a->n == b->n && a->count == b->count && a->step == b->step && a->bytes == b->bytes &&
           a->w && b->w && a->file && b->file;
  ok = ok && memcmp(a->w, b->w, (size_t)a->n * a->count * sizeof *a->w) == 0;
  ok = ok && memcmp(a->file, b->file, a->bytes) == 0;
  CHECK(ok, "%s: the training state changed (step %lld vs %lld, %zu vs %zu file bytes)", what,
        (long long)a->step, (long long)b->step, a->bytes, b->bytes);
  return ok;
}

#endif
