/* step_grads.c: the first stage of a step on a device (step_stages.h): the loss and gradients
 * of its rows, piece by piece (micro-batches), through the model's forward, loss and backward
 * or the user's gradient function. */
#include "base/error.h"
#include "base/trace.h"
#include "runtime/runtime.h"
#include "step_stages.h"

/* The loss and gradient of one piece: rows [row0, row0 + rows) of the call's arrays, weighted
 * by `weight` (1: the device's whole share). The gradient accumulates into r->g; the loss goes
 * to its slot directly when the weight is 1 and the piece is the device's only one, else
 * through the micro-batch slot, weighted, into the loss slot. */
static pmap_status piece_grads(pmap_device *dev, step_call *c, replica *r, int64_t row0,
                               int64_t rows, float weight, int direct) {
  pmap_params *p = c->p;
  const pmap_model *m = p->model;
  const grad_layout *gl = &p->gl;
  float *loss = replica_g(r, direct ? gl->loss : gl->micro);
  const void *x = NULL, *y = NULL;
  PMAP_TRY(batch_stage(dev, c->xs, row0, rows, 0, &x));
  PMAP_TRY(batch_stage(dev, c->ys, row0, rows, 1, &y));
  /* The row's index in the global batch: across processes, this process's rows come after
   * those of the processes before it (each passes c->batch). */
  int64_t global_row0 = row0 + (int64_t)pmap_ctx_process_index(p->ctx) * c->batch;
  if (p->grad_fn) {
    pmap_grad_args a = {dev,    r->w,   r->g,        loss,    weight,
                        *c->xs, *c->ys, global_row0, p->step, p->n_params};
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
    trace_rec *tr = runtime_trace(p->ctx);
    runtime_span sp = tr ? runtime_span_begin(dev) : (runtime_span){0, -1};
    PMAP_TRY(model_loss(m, r, y, rows, loss));
    if (tr) runtime_span_end(dev, sp, "loss", NULL, -1, "layer", -1);
    if (weight != 1.0f)
      PMAP_TRY(
          r->ops->scale(r->q, r->dact[L - 1], weight, (size_t)(rows * m->layers[L - 1].out_size)));
    PMAP_TRY(model_backward(dev, m, r, rows));
  }
  if (!direct) PMAP_TRY(r->ops->axpy(r->q, weight, loss, replica_g(r, gl->loss), 1));
  return PMAP_SUCCESS;
}

pmap_status step_grads(pmap_device *dev, step_call *c, replica *r) {
  pmap_params *p = c->p;
  int n = p->n;
  int64_t lo = 0, rows = 0;
  batch_device_rows(c->batch, n, pmap_local_index(dev), &lo, &rows);
  /* Layers with collectives inside (cross-replica batch norm), and a user's gradient function
   * (which may call collectives), need every device to run as many pieces: at most the fewest
   * rows any device has. */
  int64_t fewest = c->batch / n;
  int64_t limit = p->grad_fn || model_has_collectives(p->model) ? fewest : rows;
  int64_t k = p->micro_batches < limit ? p->micro_batches : limit;
  double share = runtime_uneven(p->ctx) ? (double)rows * n / (double)c->batch : 1.0;
  if (!p->grad_fn) PMAP_TRY(replica_reserve(dev, p->model, r, (rows + k - 1) / k));
  PMAP_TRY(model_weights16(p->model, r));
  PMAP_TRY(model_state_begin(p->model, r));
  for (int64_t i = 0; i < k; i++) {
    int64_t a = 0, len = 0;
    batch_piece_rows(rows, k, i, &a, &len);
    float weight = (float)(share * (double)len / (double)rows);
    PMAP_TRY(piece_grads(dev, c, r, lo + a, len, weight, k == 1 && weight == 1.0f));
  }
  return PMAP_SUCCESS;
}
