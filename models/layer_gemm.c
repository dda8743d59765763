/* layer_gemm.c: the layers' side of the bf16 policy (docs/precision.md): what a layer calls to
 * run its GEMMs under either policy (its input and weights as float or bfloat16 operands, an
 * output gradient rounded for them, the GEMMs themselves and their shapes for the workspace),
 * and each step's bfloat16 copy of the float master weights. The parameters' side (setting the
 * policy) is precision.c's. */
#include <string.h>

#include "base/error.h"
#include "model.h"

layer_mat layer_input(const replica *r, int i, const float *in) {
  return r->w16 ? (layer_mat){NULL, r->in16[i]} : (layer_mat){in, NULL};
}

layer_mat layer_weights(const replica *r, size_t off) {
  return r->w16 ? (layer_mat){NULL, r->w16 + off} : (layer_mat){r->w + off, NULL};
}

pmap_status layer_operand(const replica *r, const float *x, size_t n, pmap_bf16 *at,
                          layer_mat *out) {
  if (!r->w16) {
    *out = (layer_mat){x, NULL};
    return PMAP_SUCCESS;
  }
  *out = (layer_mat){NULL, at};
  return r->ops->round_bf16(r->q, x, at, NULL, n);
}

pmap_status layer_gemm(const replica *r, int ta, int tb, int64_t m, int64_t n, int64_t k,
                       layer_mat a, int64_t lda, layer_mat b, int64_t ldb, float beta, float *c,
                       int64_t ldc) {
  if (a.h) return r->ops->gemm_bf16(r->q, ta, tb, m, n, k, 1.0f, a.h, lda, b.h, ldb, beta, c, ldc);
  return r->ops->gemm(r->q, ta, tb, m, n, k, 1.0f, a.f, lda, b.f, ldb, beta, c, ldc);
}

pmap_status layer_gemm_strided(const replica *r, int ta, int tb, int64_t m, int64_t n, int64_t k,
                               layer_mat a, int64_t lda, int64_t sa, layer_mat b, int64_t ldb,
                               int64_t sb, float beta, float *c, int64_t ldc, int64_t sc,
                               int64_t batch) {
  if (a.h)
    return r->ops->gemm_strided_bf16(r->q, ta, tb, m, n, k, 1.0f, a.h, lda, sa, b.h, ldb, sb, beta,
                                     c, ldc, sc, batch, 1, 0, 0, 0);
  return r->ops->gemm_strided(r->q, ta, tb, m, n, k, 1.0f, a.f, lda, sa, b.f, ldb, sb, beta, c, ldc,
                              sc, batch);
}

ops_gemm16 layer_gemm16(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                        float beta, int64_t ldc) {
  ops_gemm16 g;
  memset(&g, 0, sizeof g);
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.batch = g.groups = 1, g.alpha = 1.0f, g.beta = beta;
  return g;
}

ops_gemm16 layer_gemm16_strided(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t lda,
                                int64_t sa, int64_t ldb, int64_t sb, float beta, int64_t ldc,
                                int64_t sc, int64_t batch, int64_t groups, int64_t ga, int64_t gb,
                                int64_t gc) {
  ops_gemm16 g = layer_gemm16(ta, tb, m, n, k, lda, ldb, beta, ldc);
  g.sa = sa, g.sb = sb, g.sc = sc, g.batch = batch;
  g.ga = ga, g.gb = gb, g.gc = gc, g.groups = groups;
  return g;
}

pmap_status model_weights16(const pmap_model *m, replica *r) {
  if (!r->w16) return PMAP_SUCCESS;
  if (r->w16_fresh) { /* the last step's optimizer wrote it in its own pass */
    r->w16_fresh = 0;
    return PMAP_SUCCESS;
  }
  return r->ops->round_bf16(r->q, r->w, r->w16, NULL, m->n_params);
}
