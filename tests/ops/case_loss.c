/* case_loss.c: the op harness's cases for the losses: mean squared error and softmax
 * cross-entropy (random logits, rows where a naive exp overflows or underflows, ties, labels on
 * the smallest logit), each with its loss against a float64 sum and its gradient against finite
 * differences; no rows at all give a loss of 0. */
#include "harness.h"

/* ------------------------------------------------------------------------------------------ */
/* mse                                                                                        */

typedef struct mse_args {
  size_t n;
  hx_buf *p, *t, *dp, *loss;
  const double *pd, *td;
} mse_args;

static pmap_status call_mse(const pmap_ops *o, op_queue *q, void *arg) {
  mse_args *a = arg;
  return o->mse(q, HX_F(a->p), HX_F(a->t), a->n, HX_F(a->dp), HX_F(a->loss));
}

/* The term of element i of 1/n sum (p - t)^2. */
static double mse_term(const void *ctx, size_t i) {
  const mse_args *a = ctx;
  return (a->pd[i] - a->td[i]) * (a->pd[i] - a->td[i]) / (double)a->n;
}

void opcase_mse(hx *h) {
  static const size_t fixed[] = {0, 1, 37, 1000, 3000, 200003};
  const int nfixed = h->large ? 6 : 4;
  for (int r = 0; r < nfixed + hx_rounds(h, 3); r++, hx_release(h)) {
    mse_args a = {.n = r < nfixed ? fixed[r] : (size_t)hx_int(h, 1, 500)};
    hx_trial(h, "n=%zu", a.n);
    a.p = hx_in(h, a.n, -2.0f, 2.0f, "pred");
    a.t = hx_in(h, a.n, -2.0f, 2.0f, "target");
    a.dp = hx_out(h, a.n, "dpred");
    a.loss = hx_out(h, 1, "loss");
    HX_RUN(h, call_mse, &a, a.p, a.t, a.dp, a.loss);
    a.pd = hx_to_double(h, a.p->init, a.n);
    a.td = hx_to_double(h, a.t->init, a.n);
    double loss = 0.0, *want = hx_doubles(h, a.n);
    for (size_t i = 0; i < a.n; i++) {
      loss += mse_term(&a, i);
      want[i] = 2.0 * (a.pd[i] - a.td[i]) / (double)a.n;
    }
    /* The terms summed in double and rounded once; 2 (p - t) / n: three roundings (u each). */
    hx_close(h, "loss", a.loss->got, &loss, 1, 1e-6);
    hx_close(h, "dpred", a.dp->got, want, a.n, 1e-6);
    hx_fd(h, "dpred", mse_term, &a, (double *)a.pd, a.n, a.dp->got, NULL, 1e-3, HX_TOL_GRAD);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* softmax cross-entropy                                                                      */

typedef struct xent_args {
  int64_t rows, k;
  hx_buf *z, *labels, *dz, *loss;
  const double *zd;
} xent_args;

static pmap_status call_xent(const pmap_ops *o, op_queue *q, void *arg) {
  xent_args *a = arg;
  return o->softmax_xent(q, HX_F(a->z), HX_I(a->labels), a->rows, a->k, HX_F(a->dz), HX_F(a->loss));
}

static const int32_t *labels_of(const xent_args *a) {
  return (const int32_t *)(const void *)a->labels->init;
}

/* Row r's loss, log sum exp(z - max) + max - z[label], over rows. */
static double xent_row(const xent_args *a, int64_t r) {
  const double *z = a->zd + r * a->k;
  double m = z[0], se = 0.0;
  for (int64_t j = 1; j < a->k; j++) m = z[j] > m ? z[j] : m;
  for (int64_t j = 0; j < a->k; j++) se += exp(z[j] - m);
  return (log(se) + m - z[labels_of(a)[r]]) / (double)a->rows;
}

/* The loss terms of the row holding logit `moved`. */
static double xent_loss(const void *ctx, size_t moved) {
  const xent_args *a = ctx;
  return xent_row(a, (int64_t)moved / a->k);
}

static void xent_trial(hx *h, int64_t rows, int64_t k, const float *given,
                       const int32_t *given_labels) {
  hx_trial(h, "%s rows=%" PRId64 " k=%" PRId64, given ? "extreme" : "random", rows, k);
  size_t n = (size_t)(rows * k);
  xent_args a = {.rows = rows, .k = k};
  a.z = hx_in(h, n, -4.0f, 4.0f, "logits");
  a.labels = hx_labels(h, (size_t)rows, k, "labels");
  if (given) {
    memcpy(a.z->init, given, n * sizeof(float));
    memcpy(a.labels->init, given_labels, (size_t)rows * sizeof(int32_t));
  }
  a.dz = hx_out(h, n, "dlogits");
  a.loss = hx_out(h, 1, "loss");
  /* Held to the scale of their terms: the loss's logits (~1), dlogits' 1 / rows (softmax - 1
   * at a dominant label cancels). expf and logf may be another library's, a few ulps apart
   * (HX_TOL_FWD's argument); the loss's terms are summed in double and rounded once. */
  double scale = rows ? 1.0 / ((double)rows * sqrt((double)k)) : 0.0;
  a.dz->tol_cpu = a.loss->tol_cpu = 1e-5;
  a.loss->scale_cpu = 1.0;
  a.dz->scale_cpu = scale;
  HX_RUN(h, call_xent, &a, a.z, a.labels, a.dz, a.loss);
  a.zd = hx_to_double(h, a.z->init, n);
  double loss = 0.0, *want = hx_doubles(h, n);
  for (int64_t r = 0; r < rows; r++) {
    loss += xent_row(&a, r);
    const double *z = a.zd + r * k;
    double m = z[0], se = 0.0;
    for (int64_t j = 1; j < k; j++) m = z[j] > m ? z[j] : m;
    for (int64_t j = 0; j < k; j++) se += exp(z[j] - m);
    for (int64_t j = 0; j < k; j++)
      want[r * k + j] = (exp(z[j] - m) / se - (j == labels_of(&a)[r] ? 1.0 : 0.0)) / (double)rows;
  }
  hx_close_scale(h, "loss", a.loss->got, &loss, 1, 1e-6, 1.0);
  hx_close_scale(h, "dlogits", a.dz->got, want, n, HX_TOL_FWD, scale);
  hx_fd_scale(h, "dlogits", xent_loss, &a, (double *)a.zd, n, a.dz->got, NULL, 1e-4, HX_TOL_GRAD,
              scale);
}

void opcase_softmax_xent(hx *h) {
  static const int64_t fixed[][2] = {{7, 10},  {1, 2},      {33, 100}, {0, 5},
                                     {300, 2}, {70000, 10}, {5, 1000}};
  const int nfixed = h->large ? 7 : 4;
  for (int r = 0; r < nfixed; r++, hx_release(h))
    xent_trial(h, fixed[r][0], fixed[r][1], NULL, NULL);
  /* Rows where a naive exp overflows float (exp(88.8) > FLT_MAX; five exp(88.5) sum past it)
   * or underflows to a zero sum; some labels sit on the smallest logit. */
  static const float extreme[] = {
      1000.0f,  -1000.0f, 0.0f,     3.0f,     -3.0f,    /* label 1: loss about 2000 */
      -1000.0f, -1000.0f, -1000.0f, -1000.0f, -1000.0f, /* all underflow naively */
      88.0f,    87.0f,    89.0f,    100.0f,   -88.0f,   /* exp(100) overflows */
      1000.0f,  1000.0f,  999.0f,   -1000.0f, 0.5f,     /* label on -1000 */
      88.5f,    88.5f,    88.5f,    88.5f,    88.5f,    /* ties */
      -88.0f,   -103.0f,  -1000.0f, 50.0f,    1.0f,
  };
  static const int32_t extreme_labels[] = {1, 2, 0, 3, 4, 1};
  xent_trial(h, 6, 5, extreme, extreme_labels);
  hx_release(h);
  for (int r = 0; r < hx_rounds(h, 3); r++, hx_release(h))
    xent_trial(h, hx_int(h, 1, 20), hx_int(h, 2, 40), NULL, NULL);
}
