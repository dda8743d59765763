/* case_attention.c: the op harness's cases for the ops of transformers: the strided batch of
 * GEMMs (every transpose, alpha and beta, gaps between the matrices that must stay untouched,
 * batch 0), the causal softmax (against float64, zeros above the diagonal, rows whose naive exp
 * overflows, in place) and its backward against finite differences of the float64 forward, and
 * the embedding's gather and scatter-add (the same bits as adding the tokens in order; ids out
 * of range give zero rows and are skipped). */
#include "harness.h"
#include "ops/op_math.h"

/* ------------------------------------------------------------------------------------------ */
/* gemm_strided                                                                               */

typedef struct gs_args {
  int ta, tb;
  int64_t m, n, k, batch, sa, sb, sc;
  float alpha, beta;
  hx_buf *a, *b, *c;
} gs_args;

static pmap_status call_gs(const pmap_ops *o, op_queue *q, void *arg) {
  gs_args *g = arg;
  int64_t lda = g->ta ? g->m : g->k, ldb = g->tb ? g->k : g->n;
  return o->gemm_strided(q, g->ta, g->tb, g->m, g->n, g->k, g->alpha, HX_F(g->a), lda, g->sa,
                         HX_F(g->b), ldb, g->sb, g->beta, HX_F(g->c), g->n, g->sc, g->batch);
}

void opcase_gemm_strided(hx *h) {
  for (int r = 0; r < 4 + hx_rounds(h, 8); r++, hx_release(h)) {
    gs_args g = {.ta = r & 1, .tb = (r >> 1) & 1, .alpha = r % 3 ? 1.0f : 0.5f};
    g.m = hx_int(h, 1, 17), g.n = hx_int(h, 1, 17), g.k = hx_int(h, 0, 19);
    g.batch = r == 3 ? 0 : hx_int(h, 1, 5);
    g.beta = r % 4 == 2 ? 0.75f : 0.0f;
    int64_t gap = hx_int(h, 0, 3);
    g.sa = g.m * g.k + gap, g.sb = g.k * g.n + gap, g.sc = g.m * g.n + gap;
    hx_trial(h,
             "ta=%d tb=%d m=%" PRId64 " n=%" PRId64 " k=%" PRId64 " batch=%" PRId64 " gap=%" PRId64
             " beta=%g",
             g.ta, g.tb, g.m, g.n, g.k, g.batch, gap, (double)g.beta);
    size_t na = (size_t)(g.sa * (g.batch ? g.batch : 1)),
           nb = (size_t)(g.sb * (g.batch ? g.batch : 1));
    size_t nc = (size_t)(g.sc * (g.batch ? g.batch : 1));
    g.a = hx_in(h, na, -1.0f, 1.0f, "a");
    g.b = hx_in(h, nb, -1.0f, 1.0f, "b");
    g.c = hx_new(h, HX_INOUT, nc, "c");
    for (size_t i = 0; i < nc; i++) { /* the gaps hold a sentinel; beta 0 must not read c */
      int64_t in = (int64_t)i % g.sc;
      g.c->init[i] = in >= g.m * g.n ? -777.0f : g.beta == 0.0f ? NAN : hx_uniform(h, -1, 1);
    }
    /* As case_dense.c's gemm: the rms of the sums, and k + 3 roundings (alpha, beta c, add). */
    double scale = sqrt((double)g.k) / 3.0 + 0.5;
    double kr = (double)g.k + 3.0, tol = hx_tol_gemm(h, kr);
    g.c->tol_cpu = hx_tol_vs_cpu(tol, kr);
    g.c->scale_cpu = scale;
    HX_RUN(h, call_gs, &g, g.a, g.b, g.c);
    size_t mn = (size_t)(g.m * g.n);
    double *want = hx_doubles(h, mn);
    float *got = hx_floats(h, mn);
    int64_t lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
    for (int64_t bi = 0; bi < g.batch; bi++) {
      const float *a = g.a->init + bi * g.sa, *b = g.b->init + bi * g.sb;
      const float *c0 = g.c->init + bi * g.sc, *c = g.c->got + bi * g.sc;
      for (int64_t i = 0; i < g.m; i++)
        for (int64_t j = 0; j < g.n; j++) {
          double s = 0.0;
          for (int64_t p = 0; p < g.k; p++)
            s += (double)(g.ta ? a[p * lda + i] : a[i * lda + p]) *
                 (g.tb ? b[j * ldb + p] : b[p * ldb + j]);
          want[i * g.n + j] = g.alpha * s + (g.beta != 0.0f ? g.beta * (double)c0[i * g.n + j] : 0);
          got[i * g.n + j] = c[i * g.n + j];
        }
      hx_close_scale(h, "c", got, want, mn, tol, scale);
    }
    size_t bad = 0;
    for (size_t i = 0; i < nc; i++)
      if ((int64_t)i % g.sc >= g.m * g.n || g.batch == 0)
        bad += g.c->got[i] != g.c->init[i] && !(isnan(g.c->got[i]) && isnan(g.c->init[i]));
    HX_CHECK(h, bad == 0, "%zu elements outside the matrices were written", bad);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* causal_softmax_forward, causal_softmax_backward                                            */

typedef struct cs_args {
  int64_t n, rows, t, first; /* n groups of `rows` rows of t, the first at position `first` */
  float scale;
  hx_buf *x, *y, *dy, *dx;
  hx_buf *y16, *dx16;     /* the bfloat16 copies (NULL: none); backward: y read from y16 */
  hx_buf *st_in, *st_out; /* forward: the rows' [max, reciprocal] read or written (NULL: none) */
  const double *xd, *rd;  /* the float64 loss sum r . softmax(x) */
} cs_args;

static pmap_status call_cs_forward(const pmap_ops *o, op_queue *q, void *arg) {
  cs_args *a = arg;
  return o->causal_softmax_forward(q, HX_F(a->x), HX_F(a->y), a->n, a->rows, a->t, a->first,
                                   a->scale, a->y16 ? HX_H(a->y16) : NULL,
                                   a->st_in ? HX_F(a->st_in) : NULL,
                                   a->st_out ? HX_F(a->st_out) : NULL);
}

static pmap_status call_cs_backward(const pmap_ops *o, op_queue *q, void *arg) {
  cs_args *a = arg;
  return o->causal_softmax_backward(q, a->y16 ? NULL : HX_F(a->y), HX_F(a->dy), HX_F(a->dx), a->n,
                                    a->rows, a->t, a->first, a->scale, a->y16 ? HX_H(a->y16) : NULL,
                                    a->dx16 ? HX_H(a->dx16) : NULL);
}

/* Trial r's rows: whole (t, t) matrices in the first trials and every other one after them,
 * else a block of rows from a drawn position (a blocked attention's, where first + rows = t, in
 * every other such trial). */
static void cs_block(hx *h, cs_args *a, int r) {
  a->rows = a->t, a->first = 0;
  if (r < 3 || r % 2 == 0) return;
  a->rows = hx_int(h, 1, a->t);
  a->first = r % 4 == 1 ? a->t - a->rows : hx_int(h, 0, a->t - a->rows);
}

/* b's bits are those of got rounded to bfloat16, every element. */
static void same_rounded(hx *h, const char *what, const hx_buf *b, const float *got, size_t n) {
  pmap_bf16 *want = (pmap_bf16 *)(void *)hx_floats(h, n / 2 + 1);
  for (size_t i = 0; i < n; i++) want[i] = pmap_bf16_round(got[i]);
  hx_same16(h, what, HX_H16(b->got), want, n);
}

/* The float64 causal softmax of row r (t entries) of a's x into y. */
static void ref_row(const cs_args *a, const double *x, int64_t r, double *y) {
  int64_t i = a->first + r % a->rows, t = a->t;
  double scale = a->scale;
  double mx = -INFINITY, s = 0.0;
  for (int64_t j = 0; j <= i; j++) mx = fmax(mx, scale * x[r * t + j]);
  for (int64_t j = 0; j <= i; j++) s += exp(scale * x[r * t + j] - mx);
  for (int64_t j = 0; j < t; j++) y[j] = j <= i ? exp(scale * x[r * t + j] - mx) / s : 0.0;
}

/* The loss terms of the row holding the moved element. */
static double cs_loss(const void *ctx, size_t moved) {
  const cs_args *a = ctx;
  int64_t r = (int64_t)moved / a->t;
  double y[64], s = 0.0;
  ref_row(a, a->xd, r, y);
  for (int64_t j = 0; j < a->t; j++) s += a->rd[r * a->t + j] * y[j];
  return s;
}

void opcase_causal_softmax_forward(hx *h) {
  for (int r = 0; r < 3 + hx_rounds(h, 6); r++, hx_release(h)) {
    cs_args a = {.n = r == 0 ? 0 : hx_int(h, 1, 6), .t = r == 1 ? 1 : hx_int(h, 2, 40)};
    a.scale = r == 2 ? 1.0f : hx_uniform(h, 0.1f, 1.0f);
    cs_block(h, &a, r);
    hx_trial(h, "n=%" PRId64 " rows=%" PRId64 " t=%" PRId64 " first=%" PRId64 " scale=%g%s", a.n,
             a.rows, a.t, a.first, (double)a.scale, r == 2 ? " (scores near 1e4)" : "");
    size_t total = (size_t)(a.n * a.rows * a.t);
    a.x = hx_in(h, total, -4.0f, 4.0f, "x");
    if (r == 2) /* exp of the raw scores overflows float */
      for (size_t i = 0; i < total; i++) a.x->init[i] += 1e4f;
    a.y = hx_out(h, total, "y");
    a.y->tol_cpu = 1e-6; /* op_math.h's exp on both, the sum in double: a few roundings */
    HX_RUN(h, call_cs_forward, &a, a.x, a.y);
    double *want = hx_doubles(h, total), *xd = hx_to_double(h, a.x->init, total);
    for (int64_t row = 0; row < a.n * a.rows; row++) ref_row(&a, xd, row, want + row * a.t);
    hx_close(h, "y", a.y->got, want, total, HX_TOL_FWD);
    size_t above = 0;
    for (int64_t row = 0; row < a.n * a.rows; row++)
      for (int64_t j = a.first + row % a.rows + 1; j < a.t; j++)
        above += a.y->got[row * a.t + j] != 0.0f;
    HX_CHECK(h, above == 0, "%zu entries above the diagonal are not 0", above);
    cs_args b = a; /* in place */
    b.x = b.y = hx_new(h, HX_INOUT, total, "x (in place)");
    memcpy(b.x->init, a.x->init, total * sizeof(float));
    b.x->tol_cpu = 1e-6;
    HX_RUN(h, call_cs_forward, &b, b.x);
    hx_same(h, "in place", b.x->got, a.y->got, total);
    if (total == 0) continue;
    /* With the bfloat16 copy, in place: the same floats, and the copy their rounding. */
    cs_args c = b;
    c.x = c.y = hx_new(h, HX_INOUT, total, "x (in place, bf16)");
    memcpy(c.x->init, a.x->init, total * sizeof(float));
    c.x->tol_cpu = 1e-6;
    c.y16 = hx_new16(h, HX_OUT, total, "y16");
    c.y16->tol_cpu = 1e-2; /* the CPU's and another backend's floats may round apart */
    HX_RUN(h, call_cs_forward, &c, c.x, c.y16);
    hx_same(h, "y with its copy", c.x->got, a.y->got, total);
    same_rounded(h, "y16", c.y16, c.x->got, total);
    /* With the statistics written: y the same; each row's max that of its scaled scores (a
     * maximum, exact) and its reciprocal within a few roundings of the float64 sum's; then read
     * back over the same x: y the same to the bit. */
    size_t ns = (size_t)(2 * a.n * a.rows);
    cs_args d = a;
    d.y = hx_out(h, total, "y (statistics out)");
    d.y->tol_cpu = 1e-6;
    d.st_out = hx_out(h, ns, "statistics");
    d.st_out->tol_cpu = 1e-6;
    HX_RUN(h, call_cs_forward, &d, d.x, d.y, d.st_out);
    hx_same(h, "y with the statistics out", d.y->got, a.y->got, total);
    double *want_st = hx_doubles(h, ns);
    float *got_st = hx_floats(h, ns);
    for (int64_t row = 0; row < a.n * a.rows; row++) {
      int64_t i = a.first + row % a.rows;
      double mx = -INFINITY, sum = 0.0;
      for (int64_t j = 0; j <= i; j++) mx = fmax(mx, (double)(a.scale * a.x->init[row * a.t + j]));
      for (int64_t j = 0; j <= i; j++)
        sum += exp((double)(a.scale * a.x->init[row * a.t + j]) - mx);
      want_st[2 * row] = mx, want_st[2 * row + 1] = 1.0 / sum;
      got_st[2 * row] = d.st_out->got[2 * row], got_st[2 * row + 1] = d.st_out->got[2 * row + 1];
    }
    hx_close(h, "statistics", got_st, want_st, ns, HX_TOL_FWD);
    cs_args e = a;
    e.y = hx_out(h, total, "y (statistics in)");
    e.y->tol_cpu = 1e-6;
    e.st_in = hx_new(h, HX_IN, ns, "statistics in");
    memcpy(e.st_in->init, d.st_out->got, ns * sizeof(float));
    HX_RUN(h, call_cs_forward, &e, e.x, e.y, e.st_in);
    hx_same(h, "y from the statistics", e.y->got, a.y->got, total);
  }
}

void opcase_causal_softmax_backward(hx *h) {
  for (int r = 0; r < 2 + hx_rounds(h, 6); r++, hx_release(h)) {
    cs_args a = {.n = r == 0 ? 0 : hx_int(h, 1, 5), .t = hx_int(h, 1, 24)};
    a.scale = hx_uniform(h, 0.2f, 1.0f);
    cs_block(h, &a, r);
    hx_trial(h, "n=%" PRId64 " rows=%" PRId64 " t=%" PRId64 " first=%" PRId64 " scale=%g", a.n,
             a.rows, a.t, a.first, (double)a.scale);
    size_t total = (size_t)(a.n * a.rows * a.t);
    hx_buf *x = hx_in(h, total, -3.0f, 3.0f, "x");
    a.xd = hx_to_double(h, x->init, total);
    a.y = hx_new(h, HX_IN, total, "y"); /* the forward's output, rounded from float64 */
    double *row = hx_doubles(h, (size_t)a.t);
    for (int64_t q = 0; q < a.n * a.rows; q++) {
      ref_row(&a, a.xd, q, row);
      for (int64_t j = 0; j < a.t; j++) a.y->init[q * a.t + j] = (float)row[j];
    }
    a.dy = hx_in(h, total, -1.0f, 1.0f, "dy");
    a.rd = hx_to_double(h, a.dy->init, total);
    a.dx = hx_out(h, total, "dx");
    a.dx->tol_cpu = 1e-5; /* y (dy - dot), dot in double: HX_TOL_FWD's few roundings */
    a.dx->scale_cpu = 0.01;
    HX_RUN(h, call_cs_backward, &a, a.y, a.dy, a.dx);
    hx_fd_scale(h, "dx", cs_loss, &a, (double *)a.xd, total, a.dx->got, NULL, 1e-4, HX_TOL_GRAD,
                0.01);
    cs_args b = a; /* in place: dx = dy */
    b.dy = b.dx = hx_new(h, HX_INOUT, total, "dy (in place)");
    memcpy(b.dy->init, a.dy->init, total * sizeof(float));
    b.dy->tol_cpu = 1e-5;
    b.dy->scale_cpu = 0.01;
    HX_RUN(h, call_cs_backward, &b, a.y, b.dy);
    hx_same(h, "in place", b.dy->got, a.dx->got, total);
    if (total == 0) continue;
    /* From bfloat16 probabilities (y NULL), in place, with the rounded dx: as from the widened
     * y in float, to the bit. */
    cs_args c = b;
    c.y16 = hx_new16(h, HX_IN, total, "y16");
    float *wide = hx_floats(h, total);
    pmap_bf16 *y16 = HX_H16(c.y16->init);
    for (size_t i = 0; i < total; i++) {
      y16[i] = pmap_bf16_round(a.y->init[i]);
      wide[i] = pmap_bf16_widen(y16[i]);
    }
    c.dy = c.dx = hx_new(h, HX_INOUT, total, "dy (in place, bf16)");
    memcpy(c.dy->init, a.dy->init, total * sizeof(float));
    c.dy->tol_cpu = 1e-5;
    c.dy->scale_cpu = 0.01;
    c.dx16 = hx_new16(h, HX_OUT, total, "dx16");
    c.dx16->tol_cpu = 1e-2;
    HX_RUN(h, call_cs_backward, &c, c.y16, c.dy, c.dx16);
    same_rounded(h, "dx16", c.dx16, c.dy->got, total);
    cs_args d = a; /* the float path on the widened probabilities */
    d.y = hx_new(h, HX_IN, total, "y (widened)");
    memcpy(d.y->init, wide, total * sizeof(float));
    d.dx = hx_out(h, total, "dx (from widened y)");
    d.dx->tol_cpu = 1e-5;
    d.dx->scale_cpu = 0.01;
    HX_RUN(h, call_cs_backward, &d, d.y, a.dy, d.dx);
    hx_same(h, "from y16 = from widened y", c.dy->got, d.dx->got, total);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* embedding_forward, embedding_backward                                                      */

typedef struct emb_args {
  int64_t n, v, d;
  hx_buf *ids, *table, *y, *dy, *dtable;
} emb_args;

static pmap_status call_emb_forward(const pmap_ops *o, op_queue *q, void *arg) {
  emb_args *a = arg;
  return o->embedding_forward(q, HX_I(a->ids), HX_F(a->table), a->n, a->v, a->d, HX_F(a->y));
}

static pmap_status call_emb_backward(const pmap_ops *o, op_queue *q, void *arg) {
  emb_args *a = arg;
  return o->embedding_backward(q, HX_I(a->ids), HX_F(a->dy), a->n, a->v, a->d, HX_F(a->dtable));
}

/* ids in [0, v), many repeated (a small vocabulary), one out of range on either side when bad. */
static hx_buf *emb_ids(hx *h, emb_args *a, int bad) {
  hx_buf *ids = hx_labels(h, (size_t)a->n, a->v, "ids");
  int32_t *p = (int32_t *)(void *)ids->init;
  if (bad && a->n >= 2) p[0] = -1, p[a->n - 1] = (int32_t)a->v;
  return ids;
}

void opcase_embedding_forward(hx *h) {
  for (int r = 0; r < 3 + hx_rounds(h, 5); r++, hx_release(h)) {
    emb_args a = {
        .n = r == 0 ? 0 : hx_int(h, 1, 300), .v = hx_int(h, 1, 40), .d = hx_int(h, 1, 33)};
    int bad = r == 2;
    hx_trial(h, "n=%" PRId64 " v=%" PRId64 " d=%" PRId64 "%s", a.n, a.v, a.d,
             bad ? " ids -1 and v" : "");
    a.ids = emb_ids(h, &a, bad);
    a.table = hx_in(h, (size_t)(a.v * a.d), -1.0f, 1.0f, "table");
    a.y = hx_out(h, (size_t)(a.n * a.d), "y");
    a.y->tol_cpu = 0.0;
    HX_RUN(h, call_emb_forward, &a, a.ids, a.table, a.y);
    const int32_t *ids = (const int32_t *)(const void *)a.ids->init;
    float *want = hx_floats(h, (size_t)(a.n * a.d));
    for (int64_t i = 0; i < a.n; i++)
      for (int64_t j = 0; j < a.d; j++)
        want[i * a.d + j] = ids[i] >= 0 && ids[i] < a.v ? a.table->init[ids[i] * a.d + j] : 0.0f;
    hx_same(h, "y", a.y->got, want, (size_t)(a.n * a.d));
  }
}

void opcase_embedding_backward(hx *h) {
  for (int r = 0; r < 3 + hx_rounds(h, 5); r++, hx_release(h)) {
    emb_args a = {
        .n = r == 0 ? 0 : hx_int(h, 1, 400), .v = hx_int(h, 1, 30), .d = hx_int(h, 1, 33)};
    int bad = r == 2;
    hx_trial(h, "n=%" PRId64 " v=%" PRId64 " d=%" PRId64 "%s", a.n, a.v, a.d,
             bad ? " ids -1 and v" : "");
    a.ids = emb_ids(h, &a, bad);
    a.dy = hx_in(h, (size_t)(a.n * a.d), -1.0f, 1.0f, "dy");
    a.dtable = hx_inout(h, (size_t)(a.v * a.d), -1.0f, 1.0f, "dtable");
    a.dtable->tol_cpu = 0.0; /* the order is the contract: the same bits everywhere */
    HX_RUN(h, call_emb_backward, &a, a.ids, a.dy, a.dtable);
    const int32_t *ids = (const int32_t *)(const void *)a.ids->init;
    size_t vd = (size_t)(a.v * a.d);
    float *inorder = hx_floats(h, vd);
    double *gain = hx_doubles(h, vd);
    memcpy(inorder, a.dtable->init, vd * sizeof(float));
    for (int64_t i = 0; i < a.n; i++)
      if (ids[i] >= 0 && ids[i] < a.v)
        for (int64_t j = 0; j < a.d; j++) {
          inorder[ids[i] * a.d + j] += a.dy->init[i * a.d + j];
          gain[ids[i] * a.d + j] += a.dy->init[i * a.d + j];
        }
    hx_same(h, "dtable (tokens added in order)", a.dtable->got, inorder, vd);
    /* A row's gain: a float sum of the rows of dy of its tokens, added to what it held. */
    int64_t most = 0;
    for (int64_t id = 0; id < a.v; id++) {
      int64_t count = 0;
      for (int64_t i = 0; i < a.n; i++) count += ids[i] == id;
      most = count > most ? count : most;
    }
    hx_gain(h, "dtable", a.dtable->got, a.dtable->init, gain, vd, hx_tol_sum((double)most + 1.0));
  }
}
