/* train_data.h: pmap-train's real data: features and labels (or targets) from .npy files,
 * checked against each other, an MLP sized from them, a held-out split, a shuffled epoch order
 * that depends on the seed only (not on the device count), and the held-out loss and accuracy. */
#ifndef PMAP_TOOLS_TRAIN_DATA_H
#define PMAP_TOOLS_TRAIN_DATA_H

#include "npy.h"
#include "pmap.h"

typedef struct train_data {
  npy_array x, y;        /* as loaded: x f32 (n, features...), y i32 (n) / (n, 1) or f32 (n, k) */
  int64_t rows;          /* n */
  int64_t x_row, y_row;  /* elements per row */
  int classify;          /* integer labels: softmax cross-entropy over `outputs` classes */
  int64_t outputs;       /* classes (max label + 1) or targets per row */
  int64_t *train, *eval; /* row indices of the two splits, after a seeded shuffle */
  int64_t train_rows, eval_rows;
  uint64_t seed;
  int64_t *order; /* (train_rows) the current epoch's order */
  int64_t epoch;  /* of `order`; -1 before the first */
  float *xb;      /* one batch, gathered */
  void *yb;
  int64_t cap; /* rows xb and yb hold */
} train_data;

/* Loads and checks both files; eval_fraction in [0, 1) of the rows (after a shuffle from seed)
 * are held out. -1 with a message on any error. */
int train_data_load(const char *x_path, const char *y_path, double eval_fraction, uint64_t seed,
                    train_data *d, char *msg, size_t size);
void train_data_free(train_data *d);

/* The model for the data: input (features) -> dense(h) -> ReLU for each hidden width ->
 * dense(outputs), with softmax cross-entropy for labels, else MSE. */
int train_data_model(const train_data *d, const int64_t *hidden, int n_hidden, pmap_model **out,
                     char *msg, size_t size);

/* The global batch of step `step` (batch rows of the epoch order; an epoch is the whole batches
 * of the training split, reshuffled from the seed and the epoch number) into xs and ys, which
 * point into d's buffers until the next call. */
int train_data_batch(train_data *d, int64_t step, int64_t batch, pmap_array *xs, pmap_array *ys,
                     char *msg, size_t size);

/* Loss (and for labels the accuracy, else NaN) of params on the held-out rows, predicted at
 * most `piece` rows a call (the training batch, so that the prediction stays inside the step's
 * plan); devices is the context's device count. NaN and NaN without held-out rows. */
int train_data_eval(train_data *d, pmap_params *params, int devices, int64_t piece, double *loss,
                    double *accuracy, char *msg, size_t size);

#endif
