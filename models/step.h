/* step.h: one call of pmap_update or pmap_predict as its jobs see it (the arguments travel with
 * the job, never on the params), and the pieces the step's files share: the batch's checks and
 * staging (batch.c), the processes' agreement on a step (step_procs.c), the fast paths
 * (step_fast.c). */
#ifndef PMAP_MODELS_STEP_H
#define PMAP_MODELS_STEP_H

#include <stdatomic.h>

#include "params.h"

/* One pmap_update. */
typedef struct step_call {
  pmap_params *p;
  const pmap_array *xs, *ys; /* this process's rows */
  int64_t batch;             /* their count */
  int64_t t;                 /* the step being taken: the params' step + 1 */
  pmap_step_hyper hyper;     /* its optimizer settings after the schedule */
  int want_loss;             /* the caller asked for the loss */
  float loss;                /* out: the averaged loss (device 0) */
  int skipped;               /* out: the numeric guard skipped the step (device 0) */
  float over_norm;           /* out: with skipped, the finite norm over params_norm_max, else 0 */
  _Atomic int stepped;       /* out, sharded: a device stepped its part (the gather may follow) */
} step_call;

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

/* step_procs.c. Across processes, before any device works: every process passes as many rows,
 * at the same step, with the same optimizer settings and, where the devices exchange values
 * inside the step, as many micro-batches (else PMAP_ERR_INVALID_ARGUMENT naming each process's
 * value, nothing changed). refused: this process's own refusal of the call (its message the
 * thread's), which it brings to the exchange all the same, so that every process refuses the
 * step (pmap_ctx_exchange). One process: returns refused. */
pmap_status step_check_processes(const step_call *c, pmap_status refused);

#endif
