/* train_data.c: pmap-train's real data (train_data.h). Row orders come from a small seeded
 * generator, so the split and every epoch's order are the same for any device count. */
#include "train_data.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FILE ((size_t)8 << 30) /* 8 GiB per .npy file */

static int fail(char *msg, size_t size, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, size, fmt, ap);
  va_end(ap);
  return -1;
}

static uint64_t mix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* A Fisher-Yates shuffle of idx (n) from the stream seeded with seed. */
static void shuffle(int64_t *idx, int64_t n, uint64_t seed) {
  uint64_t s = seed;
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)(mix(&s) % (uint64_t)(i + 1));
    int64_t t = idx[i];
    idx[i] = idx[j];
    idx[j] = t;
  }
}

static int check_pair(train_data *d, const char *y_path, char *msg, size_t size) {
  const npy_array *x = &d->x, *y = &d->y;
  if (x->dtype != PMAP_F32)
    return fail(msg, size, "--data: features must be f4 or f8, got %s", x->descr);
  if (x->rank != 2 && x->rank != 4)
    return fail(msg, size, "--data: features of rank %d; need (rows, features) or (rows, C, H, W)",
                x->rank);
  d->rows = x->shape[0];
  if (d->rows < 1) return fail(msg, size, "--data: no rows");
  if (y->shape[0] != d->rows)
    return fail(msg, size, "--labels %s: %lld rows, the features have %lld", y_path,
                (long long)y->shape[0], (long long)d->rows);
  d->x_row = npy_numel(x) / d->rows;
  d->y_row = npy_numel(y) / d->rows;
  d->classify = y->dtype == PMAP_I32;
  if (d->classify) {
    if (d->y_row != 1 || y->rank > 2)
      return fail(msg, size, "--labels: integer labels must be (rows) or (rows, 1); got rank %d",
                  y->rank);
    int32_t most = -1;
    for (int64_t i = 0; i < d->rows; i++) {
      int32_t l = ((const int32_t *)y->data)[i];
      if (l < 0)
        return fail(msg, size, "--labels: label %d at row %lld is negative", l, (long long)i);
      most = l > most ? l : most;
    }
    if (most < 1) return fail(msg, size, "--labels: every label is %d; need two classes", most);
    d->outputs = (int64_t)most + 1;
    return 0;
  }
  if (y->rank != 1 && y->rank != 2)
    return fail(msg, size, "--labels: float targets must be (rows) or (rows, targets)");
  d->outputs = d->y_row;
  return 0;
}

int train_data_load(const char *x_path, const char *y_path, double eval_fraction, uint64_t seed,
                    train_data *d, char *msg, size_t size) {
  memset(d, 0, sizeof *d);
  d->epoch = -1;
  d->seed = seed;
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0))
    return fail(msg, size, "--eval-fraction %g is outside [0, 1)", eval_fraction);
  char inner[512];
  if (npy_load(x_path, MAX_FILE, &d->x, inner, sizeof inner))
    return fail(msg, size, "--data %s", inner);
  if (npy_load(y_path, MAX_FILE, &d->y, inner, sizeof inner))
    return fail(msg, size, "--labels %s", inner);
  if (check_pair(d, y_path, msg, size)) return -1;
  int64_t *all = malloc(sizeof *all * (size_t)d->rows);
  d->order = malloc(sizeof *d->order * (size_t)d->rows);
  if (!all || !d->order) {
    free(all);
    return fail(msg, size, "out of memory for %lld rows", (long long)d->rows);
  }
  for (int64_t i = 0; i < d->rows; i++) all[i] = i;
  shuffle(all, d->rows, seed ^ 0x5eed5eedull);
  d->eval_rows = (int64_t)floor(eval_fraction * (double)d->rows);
  d->train_rows = d->rows - d->eval_rows;
  d->train = all;
  d->eval = all + d->train_rows;
  if (d->train_rows < 1) return fail(msg, size, "--eval-fraction leaves no training rows");
  return 0;
}

void train_data_free(train_data *d) {
  npy_free(&d->x);
  npy_free(&d->y);
  free(d->train);
  free(d->order);
  free(d->xb);
  free(d->yb);
  memset(d, 0, sizeof *d);
}

int train_data_model(const train_data *d, const int64_t *hidden, int n_hidden, pmap_model **out,
                     char *msg, size_t size) {
  pmap_model *m = NULL;
  int64_t in[3] = {0, 0, 0};
  int rank = d->x.rank - 1;
  for (int i = 0; i < rank; i++) in[i] = d->x.shape[i + 1];
  if (pmap_model_create(rank, in, &m) || (rank == 3 && pmap_model_add_flatten(m))) goto fail;
  for (int i = 0; i < n_hidden; i++)
    if (pmap_model_add_dense(m, hidden[i]) || pmap_model_add_relu(m)) goto fail;
  if (pmap_model_add_dense(m, d->outputs) ||
      pmap_model_set_loss(m, d->classify ? PMAP_LOSS_SOFTMAX_XENT : PMAP_LOSS_MSE))
    goto fail;
  *out = m;
  return 0;
fail:
  pmap_model_destroy(m);
  return fail(msg, size, "cannot build the model: %s", pmap_last_error());
}

/* Gathers rows idx (n) into d's batch buffers. */
static int gather(train_data *d, const int64_t *idx, int64_t n, char *msg, size_t size) {
  if (n > d->cap) {
    free(d->xb);
    free(d->yb);
    d->xb = malloc(sizeof(float) * (size_t)(n * d->x_row));
    d->yb = malloc(4 * (size_t)(n * d->y_row));
    d->cap = d->xb && d->yb ? n : 0;
    if (!d->cap) return fail(msg, size, "out of memory for a batch of %lld rows", (long long)n);
  }
  for (int64_t r = 0; r < n; r++) {
    memcpy(d->xb + r * d->x_row, (const float *)d->x.data + idx[r] * d->x_row,
           sizeof(float) * (size_t)d->x_row);
    memcpy((char *)d->yb + r * d->y_row * 4, (const char *)d->y.data + idx[r] * d->y_row * 4,
           4 * (size_t)d->y_row);
  }
  return 0;
}

static void describe(const train_data *d, int64_t n, pmap_array *xs, pmap_array *ys) {
  memset(xs, 0, sizeof *xs);
  memset(ys, 0, sizeof *ys);
  xs->data = d->xb;
  xs->dtype = PMAP_F32;
  xs->rank = d->x.rank;
  xs->shape[0] = n;
  for (int i = 1; i < d->x.rank; i++) xs->shape[i] = d->x.shape[i];
  ys->data = d->yb;
  ys->dtype = d->y.dtype;
  ys->rank = d->classify ? 1 : 2;
  ys->shape[0] = n;
  ys->shape[1] = d->y_row;
}

int train_data_batch(train_data *d, int64_t step, int64_t batch, pmap_array *xs, pmap_array *ys,
                     char *msg, size_t size) {
  int64_t per_epoch = d->train_rows / batch;
  if (per_epoch < 1)
    return fail(msg, size, "--batch %lld is larger than the %lld training rows", (long long)batch,
                (long long)d->train_rows);
  int64_t epoch = step / per_epoch, first = (step % per_epoch) * batch;
  if (epoch != d->epoch) {
    memcpy(d->order, d->train, sizeof *d->order * (size_t)d->train_rows);
    shuffle(d->order, d->train_rows, d->seed + 0x100000001b3ull * (uint64_t)(epoch + 1));
    d->epoch = epoch;
  }
  if (gather(d, d->order + first, batch, msg, size)) return -1;
  describe(d, batch, xs, ys);
  return 0;
}

int train_data_eval(train_data *d, pmap_params *params, int devices, int64_t piece, double *loss,
                    double *accuracy, char *msg, size_t size) {
  *loss = *accuracy = NAN;
  if (d->eval_rows == 0) return 0;
  int64_t k = d->outputs, chunk = piece / devices * devices;
  if (chunk < devices) chunk = devices;
  if (chunk > (d->eval_rows + devices - 1) / devices * devices)
    chunk = (d->eval_rows + devices - 1) / devices * devices;
  float *out = malloc(sizeof *out * (size_t)(chunk * k));
  int64_t *idx = malloc(sizeof *idx * (size_t)chunk);
  if (!out || !idx) {
    free(out);
    free(idx);
    return fail(msg, size, "out of memory for the evaluation");
  }
  double sum = 0.0;
  int64_t right = 0;
  int rc = 0;
  for (int64_t a = 0; a < d->eval_rows && !rc; a += chunk) {
    int64_t n = d->eval_rows - a < chunk ? d->eval_rows - a : chunk;
    int64_t padded = (n + devices - 1) / devices * devices; /* pad with row a's copies */
    for (int64_t r = 0; r < padded; r++) idx[r] = d->eval[a + (r < n ? r : 0)];
    pmap_array xs, ys, o;
    if ((rc = gather(d, idx, padded, msg, size))) break;
    describe(d, padded, &xs, &ys);
    int64_t oshape[2] = {padded, k};
    o = pmap_array_f32(out, 2, oshape);
    if (pmap_predict(params, &xs, &o)) {
      rc = fail(msg, size, "%s", pmap_last_error());
      break;
    }
    for (int64_t r = 0; r < n; r++) {
      const float *z = out + r * k;
      if (d->classify) {
        int32_t label = ((const int32_t *)d->yb)[r];
        int64_t best = 0;
        double zmax = z[0], se = 0.0;
        for (int64_t j = 1; j < k; j++)
          if (z[j] > z[best]) best = j;
        zmax = z[best];
        for (int64_t j = 0; j < k; j++) se += exp((double)z[j] - zmax);
        sum += log(se) + zmax - z[label];
        right += best == label;
      } else {
        const float *t = (const float *)d->yb + r * k;
        for (int64_t j = 0; j < k; j++)
          sum += ((double)z[j] - t[j]) * ((double)z[j] - t[j]) / (double)k;
      }
    }
  }
  free(out);
  free(idx);
  if (rc) return rc;
  *loss = sum / (double)d->eval_rows;
  if (d->classify) *accuracy = (double)right / (double)d->eval_rows;
  return 0;
}
