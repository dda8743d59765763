/* predict.c: pmap_predict, the sharded forward pass: each device runs its rows through the model
 * in inference mode (batch norm's running statistics, dropout the identity) in pieces of at most
 * the micro-batch size and of at most the rows its arena holds already, and writes its outputs at
 * their rows of out. */
#include <stdio.h>

#include "base/error.h"
#include "runtime/runtime.h"
#include "batch.h"

typedef struct predict_call {
  pmap_params *p;
  const pmap_array *xs;
  pmap_array *out;
  int64_t batch;
} predict_call;

static pmap_status predict_job(pmap_device *dev, void *arg) {
  const predict_call *c = arg;
  pmap_params *p = c->p;
  const pmap_model *m = p->model;
  int d = pmap_local_index(dev);
  replica *r = &p->rep[d];
  int64_t lo = 0, rows = 0;
  batch_device_rows(c->batch, p->n, d, &lo, &rows);
  size_t k = (size_t)m->layers[m->n_layers - 1].out_size;
  int64_t piece = (rows + p->micro_batches - 1) / p->micro_batches;
  /* Never more rows at a time than the arena was sized for (a step's micro-batch, also after a
   * change of precision or a shrink released it): a prediction after a step allocates nothing
   * beyond that step's memory plan, however many rows it takes. */
  if (r->sized_rows > 0 && piece > r->sized_rows) piece = r->sized_rows;
  PMAP_TRY(replica_reserve(dev, m, r, piece));
  PMAP_TRY(model_weights16(m, r));
  r->inference = 1; /* batch norm: running statistics; dropout: the identity */
  for (int64_t a = 0; a < rows; a += piece) {
    int64_t len = rows - a < piece ? rows - a : piece;
    const void *x = NULL;
    PMAP_TRY(batch_stage(dev, c->xs, lo + a, len, 0, &x));
    PMAP_TRY(model_forward(dev, m, r, x, len));
    float *dst = (float *)c->out->data + (size_t)(lo + a) * k;
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
  predict_call c = {p, xs, out, 0};
  pmap_status st = batch_check(p, xs, NULL, call, &c.batch);
  if (!st) st = params_mend(p, call);
  const layer *last = &p->model->layers[p->model->n_layers - 1];
  char sh[160], want[160];
  int same = !st && out->dtype == PMAP_F32 && out->rank == 1 + last->out_rank &&
             out->shape[0] == xs->shape[0];
  for (int i = 0; same && i < last->out_rank; i++) same = out->shape[1 + i] == last->out_shape[i];
  if (!st && !same) {
    size_t len = (size_t)snprintf(want, sizeof want, "(%lld", (long long)xs->shape[0]);
    for (int i = 0; i < last->out_rank && len < sizeof want; i++)
      len +=
          (size_t)snprintf(want + len, sizeof want - len, ", %lld", (long long)last->out_shape[i]);
    if (len < sizeof want) snprintf(want + len, sizeof want - len, ")");
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: out must be f32 %s; got %s %s", call, want,
                  batch_dtype_name(out->dtype),
                  out->rank >= 1 && out->rank <= PMAP_MAX_RANK ? batch_shape_str(out, sh, sizeof sh)
                                                               : "of a bad rank");
  }
  /* After every check (a refused call changes nothing). Under PMAP_RECOMPUTE_AUTO, before
   * anything sized the activations: the layout a step of this many rows would take (the
   * recomputed one where the stored plan is over the limit), so that the prediction's pieces fit
   * the plan pmap_params_memory gives for them. Later predictions run in pieces of what is
   * sized. */
  if (!st && p->recompute == PMAP_RECOMPUTE_AUTO && p->rep[0].sized_rows == 0 && c.batch > 0)
    st = params_fit_recompute(p, c.batch < p->n ? p->n : c.batch, call);
  if (!st) st = params_dispatch(p, predict_job, &c);
  pmap_ctx_unlock(p->ctx);
  return st;
}
