/* fuzz_update.c: libFuzzer target for the array and shape validation of pmap_update and
 * pmap_predict. The input picks a model (dense + MSE, or conv + softmax cross-entropy), a device
 * count (1 or 2), and the dtype, rank, extents and labels of xs and ys. The harness never hands
 * the library a shape whose data it has not allocated: it counts the elements with overflow
 * checks, allocates exactly that many when the count is small, passes a tiny buffer and requires
 * a failure when the count overflows or an extent is negative or the rank is out of range, and
 * skips counts that are valid but large. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmap.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ELEMS (1 << 16)

static pmap_ctx *ctx[2];
static pmap_params *params[2][2]; /* [devices - 1][model] */

static pmap_model *make_model(int which) {
  pmap_model *m = NULL;
  pmap_status st;
  if (which == 0) {
    int64_t in[1] = {3};
    st = pmap_model_create(1, in, &m);
    if (!st) st = pmap_model_add_dense(m, 4);
    if (!st) st = pmap_model_add_relu(m);
    if (!st) st = pmap_model_add_dense(m, 2);
  } else {
    int64_t in[3] = {1, 4, 4};
    st = pmap_model_create(3, in, &m);
    if (!st) st = pmap_model_add_conv2d(m, 2, 3, 3, 1, 1);
    if (!st) st = pmap_model_add_flatten(m);
    if (!st) st = pmap_model_add_dense(m, 3);
    if (!st) st = pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT);
  }
  if (st) abort();
  return m;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  for (int n = 1; n <= 2; n++) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
    if (pmap_ctx_create(&cfg, &ctx[n - 1])) abort();
    for (int which = 0; which < 2; which++) {
      pmap_model *m = make_model(which);
      pmap_optimizer opt = which ? pmap_adam(1e-3f) : pmap_sgd(1e-3f, 0.9f);
      if (pmap_params_create(ctx[n - 1], m, &opt, 7, &params[n - 1][which])) abort();
      pmap_model_destroy(m);
    }
  }
  return 0;
}

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader;

static uint8_t u8(reader *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}

/* Mostly small extents (-2..13), sometimes any 64-bit value. */
static int64_t extent(reader *r) {
  uint8_t b = u8(r);
  if (b < 0xF0) return (int64_t)(b % 16) - 2;
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)u8(r) << (8 * i);
  return (int64_t)v;
}

/* Element count of a: -1 when an extent is negative, the rank is out of range or the product
 * overflows; else the product (0 allowed). */
static int64_t count(const pmap_array *a) {
  if (a->rank < 1 || a->rank > PMAP_MAX_RANK) return -1;
  int64_t c = 1;
  for (int i = 0; i < a->rank; i++) {
    if (a->shape[i] < 0) return -1;
    if (a->shape[i] && c > INT64_MAX / a->shape[i]) return -1;
    c *= a->shape[i];
  }
  return c;
}

/* Fills a's dtype, rank and shape from the input; *buf receives its data (the caller frees):
 * exactly the elements when the count is valid, 4 bytes when it is not. Returns 0 to go on,
 * 1 to skip (valid but large), and sets *invalid. */
static int make_array(reader *r, pmap_array *a, void **buf, int *invalid) {
  memset(a, 0, sizeof *a);
  a->dtype = (pmap_dtype)(u8(r) % 3); /* 2 is no dtype at all */
  a->rank = (int)(u8(r) % 7) - 1;     /* -1..5 */
  int axes = a->rank < 0 ? 0 : a->rank > PMAP_MAX_RANK ? PMAP_MAX_RANK : a->rank;
  for (int i = 0; i < axes; i++) a->shape[i] = extent(r);
  int64_t c = count(a);
  *invalid = c < 0;
  if (c > MAX_ELEMS) return 1;
  size_t bytes = c < 0 ? 4 : (size_t)c * 4;
  *buf = calloc(1, bytes ? bytes : 1);
  if (!*buf) abort();
  a->data = *buf;
  if (c > 0 && a->dtype == PMAP_I32) {
    int32_t *l = *buf;
    for (int64_t i = 0; i < c; i++) l[i] = (int32_t)(u8(r) % 5) - 1; /* -1..3 */
  } else if (c > 0) {
    float *x = *buf;
    for (int64_t i = 0; i < c; i++) x[i] = (float)((i * 7) % 11) * 0.1f - 0.5f;
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  uint8_t sel = u8(&r);
  pmap_params *p = params[sel & 1][(sel >> 1) & 1];
  int predict = (sel >> 2) & 1;
  pmap_array xs, ys;
  void *xbuf = NULL, *ybuf = NULL;
  int xbad = 0, ybad = 0;
  if (make_array(&r, &xs, &xbuf, &xbad) || make_array(&r, &ys, &ybuf, &ybad)) {
    free(xbuf);
    free(ybuf);
    return 0;
  }
  if (sel & 8) xs.data = NULL; /* NULL data with any shape */
  pmap_status st;
  if (predict) {
    /* ys plays the output array of pmap_predict. */
    if (ys.dtype == PMAP_I32) ys.dtype = PMAP_F32;
    st = pmap_predict(p, &xs, &ys);
  } else {
    float loss = 0.0f;
    st = pmap_update(p, &xs, &ys, &loss);
  }
  if (st != PMAP_SUCCESS && st != PMAP_ERR_INVALID_ARGUMENT && st != PMAP_ERR_NUMERIC) {
    fprintf(stderr, "unexpected status %s: %s\n", pmap_status_string(st), pmap_last_error());
    __builtin_trap();
  }
  if ((xbad || ybad || (sel & 8)) && st == PMAP_SUCCESS) {
    fprintf(stderr, "accepted an invalid array: xs rank %d, ys rank %d\n", xs.rank, ys.rank);
    __builtin_trap();
  }
  free(xbuf);
  free(ybuf);
  return 0;
}
