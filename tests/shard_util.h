/* shard_util.h: what the sharding tests (test_shard.c, test_shard_grads.c) share: a run (a
 * context, an example model and its params), rows of the example's data as arrays, the
 * comparison of two runs' whole training state as checkpoint files, and a gradient function. */
#ifndef PMAP_TESTS_SHARD_UTIL_H
#define PMAP_TESTS_SHARD_UTIL_H

#include "pmap_examples.h"
#include "testutil.h"

typedef struct run {
  pmap_ctx *ctx;
  pmap_model *model;
  pmap_params *params;
} run;

static inline void close_run(run *r) {
  pmap_params_destroy(r->params);
  pmap_model_destroy(r->model);
  if (r->ctx) CHECK_OK(pmap_ctx_destroy(r->ctx));
  memset(r, 0, sizeof *r);
}

/* Rows [at, at + b) of xs, ys as arrays. */
static inline void rows_of(const pmap_array *xs, const pmap_array *ys, int64_t at, int64_t b,
                           pmap_array *x, pmap_array *y) {
  *x = *xs;
  *y = *ys;
  size_t xr = (size_t)(pmap_array_numel(xs) / xs->shape[0]);
  size_t yr = (size_t)(pmap_array_numel(ys) / ys->shape[0]);
  x->data = (float *)xs->data + (size_t)at * xr;
  y->data = (char *)ys->data + (size_t)at * yr * 4;
  x->shape[0] = y->shape[0] = b;
}

/* The whole file at path into a malloc'ed buffer; *len its size. */
static inline unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc(size > 0 ? (size_t)size : 1);
  *len = buf ? fread(buf, 1, (size_t)size, f) : 0;
  fclose(f);
  return buf;
}

/* a and b hold bitwise the same training state: their checkpoints (a.ckpt and b.ckpt in dir)
 * are byte-identical. */
static inline void same_state(const char *dir, const char *what, run *a, run *b) {
  char pa[128], pb[128];
  snprintf(pa, sizeof pa, "%s/a.ckpt", dir);
  snprintf(pb, sizeof pb, "%s/b.ckpt", dir);
  CHECK_OK(pmap_params_save(a->params, pa));
  CHECK_OK(pmap_params_save(b->params, pb));
  size_t la = 0, lb = 0;
  unsigned char *fa = slurp(pa, &la), *fb = slurp(pb, &lb);
  size_t at = 0;
  while (fa && fb && at < la && at < lb && fa[at] == fb[at]) at++;
  CHECK(fa && fb && la == lb && at == la,
        "%s: the checkpoints differ (%zu and %zu bytes, first difference at byte %zu)", what, la,
        lb, at);
  free(fa);
  free(fb);
}

/* A user's gradient function: least squares on y = x . w, any N. */
static inline pmap_status lsq(const pmap_grad_args *a, void *user) {
  (void)user;
  int64_t rows = a->xs.shape[0];
  size_t P = a->num_params;
  const float *x = a->xs.data, *y = a->ys.data;
  double loss = 0.0;
  for (int64_t i = 0; i < rows; i++) {
    float e = -y[i];
    for (size_t j = 0; j < P; j++) e += x[(size_t)i * P + j] * a->params[j];
    loss += (double)e * e;
    for (size_t j = 0; j < P; j++)
      a->grads[j] += a->scale * 2.0f * e * x[(size_t)i * P + j] / (float)rows;
  }
  *a->loss = (float)(loss / (double)rows);
  return PMAP_SUCCESS;
}

#endif
