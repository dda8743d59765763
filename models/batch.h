/* batch.h: the API boundary of the calls that take a batch (pmap_update, pmap_predict,
 * pmap_params_memory): the checks of xs and ys against the model and the devices, the split of
 * the rows over devices and micro-batches, and the staging of rows into a device (batch.c). */
#ifndef PMAP_MODELS_BATCH_H
#define PMAP_MODELS_BATCH_H

#include "params.h"

/* batch.c. Checks xs (and ys when not NULL) for a call on p: dtypes, ranks, extents against the
 * model (or, for a gradient function, any shape with the same leading extent), the batch
 * against the device count, labels in range, sizes that overflow, the activation memory of the
 * largest piece of a device's rows; *batch: the rows. Errors name `call` and the values. */
pmap_status batch_check(const pmap_params *p, const pmap_array *xs, const pmap_array *ys,
                        const char *call, int64_t *batch);
/* Rows [row0, row0 + rows) of a host array, staged into dev's memory where the backend needs it
 * (on CPU a view) in slot 0 (inputs) or 1 (labels). */
pmap_status batch_stage(pmap_device *dev, const pmap_array *a, int64_t row0, int64_t rows, int slot,
                        const void **out);
/* "f32", "i32". */
const char *batch_dtype_name(pmap_dtype t);
/* "(4, -1, 7)" into buf; returns buf. */
const char *batch_shape_str(const pmap_array *a, char *buf, size_t size);
/* Elements of a's axes [first, rank): -1 unless every extent is >= 1 and the product fits. */
int64_t batch_numel_from(const pmap_array *a, int first_axis);

/* Rows [*lo, *lo + *rows) of a global batch of `batch` rows belong to device d of n: the first
 * batch % n devices take one row more, so shards differ by at most one row (and are equal when
 * batch % n == 0). No product of batch can overflow. */
static inline void batch_device_rows(int64_t batch, int n, int d, int64_t *lo, int64_t *rows) {
  int64_t q = batch / n, r = batch % n;
  *lo = q * d + (d < r ? d : r);
  *rows = q + (d < r);
}

/* Micro-batch i of k (k <= 65536) of `rows` rows: [rows i / k, rows (i + 1) / k), computed as
 * q i + r i / k (rows = q k + r) so that nothing wraps for any row count (r i < k^2 <= 2^32). */
static inline void batch_piece_rows(int64_t rows, int64_t k, int64_t i, int64_t *lo, int64_t *len) {
  int64_t q = rows / k, r = rows % k;
  *lo = q * i + r * i / k;
  *len = q * (i + 1) + r * (i + 1) / k - *lo;
}

#endif
