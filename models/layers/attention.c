/* attention.c: causal multi-head self-attention over (T, D) token vectors: qkv (T, 3E) = x Wqkv +
 * bqkv with E = heads x head_size, per head S = Q K^T (T, T), P = causal softmax(S / sqrt(hs)),
 * O = P V, then y (T, D) = O Wo + bo. The per-head products are strided GEMM batches.
 *
 * Up to ATTN_BLOCK tokens (ATTN_BLOCK16 under bf16), P stays in scratch from forward to
 * backward (O(B H T^2) floats, P and its gradient). Past it, the attention is blocked: the
 * queries go in blocks of attn_block_rows(T) rows, each block's scores taken only against the
 * keys up to its last row (the causal mask skips the rest), and only Q, K, V, O and each row's
 * softmax statistics (its max and the reciprocal of its sum) are kept: the backward pass takes
 * each block's scores again and its probabilities from them and the statistics, to the same
 * bits. The activations then grow linearly in T up to ATTN_BLOCK x ATTN_MAX_BLOCKS tokens (past
 * it the blocks grow with T: a block's scores take H T^2 / ATTN_MAX_BLOCKS), and the products
 * that the mask would zero are mostly not computed.
 *
 * Both paths share the projections (qkv = x Wqkv + bqkv, y = O Wo + bo and their backward); the
 * per-head products between them are the stored path's or the blocked one's, in fp32 or under
 * the bf16 policy. */
#include <math.h>
#include <string.h>

#include "models/model.h"
#include "base/error.h"

typedef struct attn_settings {
  int64_t heads, hs;
} attn_settings;
LAYER_SETTINGS_FIT(attn_settings);

/* The shapes of one layer and its scratch over bd examples. */
typedef struct attn_dims {
  int64_t t, d, h, hs, e, rows;
  float scale;
} attn_dims;

/* Past ATTN_BLOCK tokens (ATTN_BLOCK16 under bf16) the attention is blocked, in at most
 * ATTN_MAX_BLOCKS blocks of queries (so that a step's GEMM shapes stay few: the bf16 GEMMs keep
 * a primitive per shape). Under bf16 the second softmax pass of the blocked backward costs more
 * than the stored P saves up to 256 tokens (gpt-mini on an AMX Xeon: 6-12 % slower at 128 and
 * 256 tokens, 1.2x faster at 512; bench/README.md, "Long contexts"), so bf16 keeps P that far. */
#define ATTN_BLOCK 64
#define ATTN_BLOCK16 256
#define ATTN_MAX_BLOCKS 8

/* The query rows of a block at context t: ATTN_BLOCK, or t / ATTN_MAX_BLOCKS rounded up to 16. */
static int64_t attn_block_rows(int64_t t) {
  if (t <= ATTN_BLOCK * ATTN_MAX_BLOCKS) return ATTN_BLOCK;
  return ((t + ATTN_MAX_BLOCKS - 1) / ATTN_MAX_BLOCKS + 15) / 16 * 16;
}

static int blocked(int64_t t, int bf16) { return t > (bf16 ? ATTN_BLOCK16 : ATTN_BLOCK); }

/* Block j of the queries at context t: rows i0 .. i0 + *mb - 1, scored against keys 0 .. *kend - 1
 * (= i0 + *mb); *count the number of blocks. */
static int64_t block_at(int64_t t, int64_t j, int64_t *mb, int64_t *kend, int64_t *count) {
  int64_t qb = attn_block_rows(t), i0 = j * qb;
  *count = (t + qb - 1) / qb;
  *mb = t - i0 < qb ? t - i0 : qb;
  *kend = i0 + *mb;
  return i0;
}

static attn_dims dims_of(const layer *l, int64_t bd) {
  const attn_settings *s = LAYER_SETTINGS_CONST(attn_settings, l);
  attn_dims a = {.t = l->in_shape[0], .d = l->in_shape[1], .h = s->heads, .hs = s->hs};
  a.e = a.h * a.hs;
  a.rows = bd * a.t;
  a.scale = (float)(1.0 / sqrt((double)a.hs));
  return a;
}

/* r->aux[i] over bd examples: qkv (rows, 3E), P (bd, H, T, T), O (rows, E), then backward's
 * dO (rows, E), dP (bd, H, T, T), dqkv (rows, 3E). */
typedef struct attn_buf {
  float *qkv, *p, *o, *d_o, *dp, *dqkv;
  float *st; /* blocked: each row's softmax [max, reciprocal] (bd, H, T, 2) */
} attn_buf;

static attn_buf bufs_of(const attn_dims *a, float *aux, int64_t bd) {
  attn_buf b;
  b.qkv = aux;
  b.p = b.qkv + a->rows * 3 * a->e;
  b.o = b.p + bd * a->h * a->t * a->t;
  b.d_o = b.o + a->rows * a->e;
  b.dp = b.d_o + a->rows * a->e;
  b.dqkv = b.dp + bd * a->h * a->t * a->t;
  return b;
}

/* ---- fp32: the per-head products, stored or blocked ---- */

/* r->aux[i] over bd examples: qkv (rows, 3E), O (rows, E), dO (rows, E), dqkv (rows, 3E), the
 * softmax's row statistics (bd, H, T, 2: block j of an example at 2 H i0), then of its own
 * (aux_fixed): a block's P and dP, each (H, block rows, keys) of one example. */
static attn_buf blocked_bufs(const attn_dims *a, float *aux, int64_t bd) {
  attn_buf b;
  b.qkv = aux;
  b.o = b.qkv + a->rows * 3 * a->e;
  b.d_o = b.o + a->rows * a->e;
  b.dqkv = b.d_o + a->rows * a->e;
  b.st = b.dqkv + a->rows * 3 * a->e;
  b.p = b.st + 2 * a->h * a->rows;
  b.dp = b.p + a->h * attn_block_rows(a->t) * a->t;
  (void)bd;
  return b;
}

/* S = Q K^T of block j (first query i0, mb queries, kend keys) of one example (qn: its qkv) into
 * p, every head, and P = its causal softmax in place: the forward pass's, which writes the rows'
 * statistics to st (the example's, at the block's place), and again the backward's, which reads
 * them (again: 1). */
static pmap_status block_probs(replica *r, const attn_dims *a, const float *qn, int64_t i0,
                               int64_t mb, int64_t kend, float *p, float *st, int again) {
  int64_t e3 = 3 * a->e;
  PMAP_TRY(r->ops->gemm_strided(r->q, 0, 1, mb, kend, a->hs, 1.0f, qn + i0 * e3, e3, a->hs,
                                qn + a->e, e3, a->hs, 0.0f, p, kend, mb * kend, a->h));
  st += 2 * a->h * i0;
  return r->ops->causal_softmax_forward(r->q, p, p, a->h, mb, kend, i0, a->scale, NULL,
                                        again ? st : NULL, again ? NULL : st);
}

/* The stored path's per-head products between the projections: qkv to O, every example. */
static pmap_status heads_stored(replica *r, const attn_dims *a, const attn_buf *b, int64_t bd) {
  const pmap_ops *ops = r->ops;
  int64_t e3 = 3 * a->e, tt = a->t * a->t;
  for (int64_t n = 0; n < bd; n++) { /* S_h = Q_h K_h^T for the example's heads */
    const float *qn = b->qkv + n * a->t * e3;
    PMAP_TRY(ops->gemm_strided(r->q, 0, 1, a->t, a->t, a->hs, 1.0f, qn, e3, a->hs, qn + a->e, e3,
                               a->hs, 0.0f, b->p + n * a->h * tt, a->t, tt, a->h));
  }
  PMAP_TRY(ops->causal_softmax_forward(r->q, b->p, b->p, bd * a->h, a->t, a->t, 0, a->scale, NULL,
                                       NULL, NULL));
  for (int64_t n = 0; n < bd; n++) { /* O_h = P_h V_h */
    const float *qn = b->qkv + n * a->t * e3;
    PMAP_TRY(ops->gemm_strided(r->q, 0, 0, a->t, a->hs, a->t, 1.0f, b->p + n * a->h * tt, a->t, tt,
                               qn + 2 * a->e, e3, a->hs, 0.0f, b->o + n * a->t * a->e, a->e, a->hs,
                               a->h));
  }
  return PMAP_SUCCESS;
}

/* Their backward: dO to dqkv. */
static pmap_status heads_stored_back(replica *r, const attn_dims *a, const attn_buf *b,
                                     int64_t bd) {
  const pmap_ops *ops = r->ops;
  int64_t e3 = 3 * a->e, tt = a->t * a->t;
  for (int64_t n = 0; n < bd; n++) { /* dP_h = dO_h V_h^T, dV_h = P_h^T dO_h */
    const float *qn = b->qkv + n * a->t * e3, *don = b->d_o + n * a->t * a->e;
    float *dqn = b->dqkv + n * a->t * e3;
    PMAP_TRY(ops->gemm_strided(r->q, 0, 1, a->t, a->t, a->hs, 1.0f, don, a->e, a->hs, qn + 2 * a->e,
                               e3, a->hs, 0.0f, b->dp + n * a->h * tt, a->t, tt, a->h));
    PMAP_TRY(ops->gemm_strided(r->q, 1, 0, a->t, a->hs, a->t, 1.0f, b->p + n * a->h * tt, a->t, tt,
                               don, a->e, a->hs, 0.0f, dqn + 2 * a->e, e3, a->hs, a->h));
  }
  PMAP_TRY(ops->causal_softmax_backward(r->q, b->p, b->dp, b->dp, bd * a->h, a->t, a->t, 0,
                                        a->scale, NULL, NULL));
  for (int64_t n = 0; n < bd; n++) { /* dQ_h = dS_h K_h, dK_h = dS_h^T Q_h */
    const float *qn = b->qkv + n * a->t * e3, *dsn = b->dp + n * a->h * tt;
    float *dqn = b->dqkv + n * a->t * e3;
    PMAP_TRY(ops->gemm_strided(r->q, 0, 0, a->t, a->hs, a->t, 1.0f, dsn, a->t, tt, qn + a->e, e3,
                               a->hs, 0.0f, dqn, e3, a->hs, a->h));
    PMAP_TRY(ops->gemm_strided(r->q, 1, 0, a->t, a->hs, a->t, 1.0f, dsn, a->t, tt, qn, e3, a->hs,
                               0.0f, dqn + a->e, e3, a->hs, a->h));
  }
  return PMAP_SUCCESS;
}

/* The blocked path's: an example at a time, a block of queries at a time, every head in one
 * strided batch. */
static pmap_status heads_blocked(replica *r, const attn_dims *a, const attn_buf *b, int64_t bd) {
  int64_t e3 = 3 * a->e, mb, kend, count = 1;
  for (int64_t n = 0; n < bd; n++) {
    const float *qn = b->qkv + n * a->t * e3;
    for (int64_t j = 0; j < count; j++) { /* O_h = P_h V_h over the block's keys */
      int64_t i0 = block_at(a->t, j, &mb, &kend, &count);
      PMAP_TRY(block_probs(r, a, qn, i0, mb, kend, b->p, b->st + 2 * a->h * n * a->t, 0));
      PMAP_TRY(r->ops->gemm_strided(r->q, 0, 0, mb, a->hs, kend, 1.0f, b->p, kend, mb * kend,
                                    qn + 2 * a->e, e3, a->hs, 0.0f, b->o + (n * a->t + i0) * a->e,
                                    a->e, a->hs, a->h));
    }
  }
  return PMAP_SUCCESS;
}

static pmap_status heads_blocked_back(replica *r, const attn_dims *a, const attn_buf *b,
                                      int64_t bd) {
  const pmap_ops *ops = r->ops;
  int64_t e3 = 3 * a->e, mb, kend, count;
  block_at(a->t, 0, &mb, &kend, &count);
  for (int64_t n = 0; n < bd; n++) {
    const float *qn = b->qkv + n * a->t * e3, *don = b->d_o + n * a->t * a->e;
    float *dqn = b->dqkv + n * a->t * e3;
    /* The last block first: it sees every key, so its dK and dV set them (beta 0) and the
     * blocks before it add to their keys' rows. */
    for (int64_t j = count - 1; j >= 0; j--) {
      int64_t i0 = block_at(a->t, j, &mb, &kend, &count);
      float beta = j == count - 1 ? 0.0f : 1.0f;
      PMAP_TRY(block_probs(r, a, qn, i0, mb, kend, b->p, b->st + 2 * a->h * n * a->t, 1));
      /* dP_h = dO_h V_h^T, dV_h += P_h^T dO_h */
      PMAP_TRY(ops->gemm_strided(r->q, 0, 1, mb, kend, a->hs, 1.0f, don + i0 * a->e, a->e, a->hs,
                                 qn + 2 * a->e, e3, a->hs, 0.0f, b->dp, kend, mb * kend, a->h));
      PMAP_TRY(ops->gemm_strided(r->q, 1, 0, kend, a->hs, mb, 1.0f, b->p, kend, mb * kend,
                                 don + i0 * a->e, a->e, a->hs, beta, dqn + 2 * a->e, e3, a->hs,
                                 a->h));
      PMAP_TRY(ops->causal_softmax_backward(r->q, b->p, b->dp, b->dp, a->h, mb, kend, i0, a->scale,
                                            NULL, NULL));
      /* dQ_h = dS_h K_h, dK_h += dS_h^T Q_h */
      PMAP_TRY(ops->gemm_strided(r->q, 0, 0, mb, a->hs, kend, 1.0f, b->dp, kend, mb * kend,
                                 qn + a->e, e3, a->hs, 0.0f, dqn + i0 * e3, e3, a->hs, a->h));
      PMAP_TRY(ops->gemm_strided(r->q, 1, 0, kend, a->hs, mb, 1.0f, b->dp, kend, mb * kend,
                                 qn + i0 * e3, e3, a->hs, beta, dqn + a->e, e3, a->hs, a->h));
    }
  }
  return PMAP_SUCCESS;
}

/* ---- the bf16 policy: every product on bfloat16 operands, the softmax and sums in float ---- */

/* r->aux[i] keeps Q, K, V, P and O in bfloat16 from forward to backward, Q, K and V each a
 * dense (rows, E) matrix of its own (not the projection's interleaved (rows, 3E)), so that the
 * per-head products read plainly strided operands, which oneDNN's fast matmul kernels take;
 * the float intermediates and the rounded gradients live in the shared scratch (r->tmp), in
 * three regions: f1 (rows, 3E) qkv, then dQ, dK, dV, each dense (rows, E); f2 S and P, then O,
 * in backward dO, then dP and dS (the softmax's backward reads P from its bfloat16 copy); h4
 * the bfloat16 dy, dO, dS, dqkv (rows, 3E) in turn. */
typedef struct attn_buf16 {
  pmap_bf16 *qkv, *p, *o;
  float *f1, *f2;
  pmap_bf16 *h4;
} attn_buf16;

static int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

/* Blocked (past ATTN_BLOCK16 tokens), r->aux[i] keeps Q, K, V and O and the softmax's row
 * statistics (2 floats a row and head) only, and the scratch holds a
 * block's scores and probabilities for every example and head: f1 (rows, 3E) qkv, then O, then
 * dQ, dK, dV; fs a block's S and P; fdp dO (rows, E), then a block's dP and dS; h4 the bfloat16
 * dy, dO and dqkv in turn; p16 a block's P, ds16 its dS, in bfloat16. */
static void blocked_sizes16(const attn_dims *a, int64_t *hbt, int64_t *h4, int64_t *fdp) {
  int64_t te = a->t * a->e;
  *hbt = a->h * attn_block_rows(a->t) * a->t;
  *h4 = max2(a->t * a->d, 3 * te);
  *fdp = max2(*hbt, te);
}

static void rows16(const layer *l, size_t *aux, size_t *fixed, size_t *tmp) {
  attn_dims a = dims_of(l, 1);
  int64_t tt = a.h * a.t * a.t, te = a.t * a.e;
  if (blocked(a.t, 1)) {
    int64_t hbt, h4, fdp;
    blocked_sizes16(&a, &hbt, &h4, &fdp);
    *aux = (size_t)(2 * te + 2 * a.h * a.t);
    *fixed = 0;
    *tmp = (size_t)(3 * te + hbt + fdp + (h4 + 1) / 2 + 2 * ((hbt + 1) / 2));
    return;
  }
  *aux = (size_t)((4 * te + tt + 1) / 2);
  *fixed = 0; /* (fp32's blocked P and dP, past ATTN_BLOCK tokens) */
  int64_t h4 = max2(max2(a.t * a.d, 3 * te), tt);
  *tmp = (size_t)(3 * te + max2(tt, te) + (h4 + 1) / 2);
}

static attn_buf16 bufs16_of(const attn_dims *a, float *aux, float *tmp, int64_t bd) {
  int64_t tt = a->h * a->t * a->t, te = a->t * a->e;
  attn_buf16 b;
  b.qkv = (pmap_bf16 *)(void *)aux;
  b.p = b.qkv + bd * 3 * te;
  b.o = b.p + bd * tt;
  b.f1 = tmp;
  b.f2 = b.f1 + bd * 3 * te;
  b.h4 = (pmap_bf16 *)(void *)(b.f2 + bd * max2(tt, te));
  return b;
}

/* The blocked bf16 passes' buffers (blocked_sizes16) over bd examples. */
typedef struct attn_blk16 {
  pmap_bf16 *q16, *k16, *v16, *o16; /* r->aux[i]: each dense (rows, E) */
  float *st; /* r->aux[i] after them: the softmax's row statistics (block j's at 2 bd H i0) */
  float *f1, *fs, *fdp;
  pmap_bf16 *h4, *p16, *ds16;
} attn_blk16;

static attn_blk16 blocked_bufs16(const attn_dims *a, float *aux, float *tmp, int64_t bd) {
  int64_t hbt, h4, fdp, part = a->rows * a->e;
  blocked_sizes16(a, &hbt, &h4, &fdp);
  attn_blk16 b;
  b.q16 = (pmap_bf16 *)(void *)aux;
  b.k16 = b.q16 + part;
  b.v16 = b.k16 + part;
  b.o16 = b.v16 + part;
  b.st = aux + 2 * part;
  b.f1 = tmp;
  b.fs = b.f1 + 3 * part;
  b.fdp = b.fs + bd * hbt;
  float *at = b.fdp + bd * fdp;
  b.h4 = (pmap_bf16 *)(void *)at;
  at += bd * ((h4 + 1) / 2);
  b.p16 = (pmap_bf16 *)(void *)at;
  b.ds16 = (pmap_bf16 *)(void *)(at + bd * ((hbt + 1) / 2));
  return b;
}

/* Block j's S = Q K^T (every example's heads at once) into fs, and P = its causal softmax, in
 * float in place and rounded into p16: the forward pass's, which writes the rows' statistics,
 * and again the backward's, which reads them (again: 1). */
static pmap_status block_probs16(replica *r, const attn_dims *a, const attn_blk16 *b, int64_t bd,
                                 int64_t i0, int64_t mb, int64_t kend, int again) {
  int64_t go = a->t * a->e, gs = a->h * mb * kend;
  PMAP_TRY(r->ops->gemm_strided_bf16(r->q, 0, 1, mb, kend, a->hs, 1.0f, b->q16 + i0 * a->e, a->e,
                                     a->hs, b->k16, a->e, a->hs, 0.0f, b->fs, kend, mb * kend, a->h,
                                     bd, go, go, gs));
  float *st = b->st + 2 * bd * a->h * i0;
  return r->ops->causal_softmax_forward(r->q, b->fs, b->fs, bd * a->h, mb, kend, i0, a->scale,
                                        b->p16, again ? st : NULL, again ? NULL : st);
}

/* The stored path's per-head products under bf16: Q, K, V (bfloat16) to O (float, in f2). */
static pmap_status heads16_stored(replica *r, const attn_dims *a, const attn_buf16 *b, int64_t bd) {
  const pmap_ops *ops = r->ops;
  int64_t tt = a->t * a->t, part = a->rows * a->e;
  const pmap_bf16 *q16 = b->qkv, *k16 = q16 + part, *v16 = k16 + part;
  int64_t gp = a->h * tt, go = a->t * a->e; /* one example's P, and its Q, K, V or O */
  /* S_h = Q_h K_h^T, every example's heads at once */
  PMAP_TRY(ops->gemm_strided_bf16(r->q, 0, 1, a->t, a->t, a->hs, 1.0f, q16, a->e, a->hs, k16, a->e,
                                  a->hs, 0.0f, b->f2, a->t, tt, a->h, bd, go, go, gp));
  PMAP_TRY(ops->causal_softmax_forward(r->q, b->f2, b->f2, bd * a->h, a->t, a->t, 0, a->scale, b->p,
                                       NULL, NULL));
  /* O_h = P_h V_h */
  return ops->gemm_strided_bf16(r->q, 0, 0, a->t, a->hs, a->t, 1.0f, b->p, a->t, tt, v16, a->e,
                                a->hs, 0.0f, b->f2, a->e, a->hs, a->h, bd, gp, go, go);
}

/* Their backward: dO (bfloat16, in h4) to dQ, dK, dV (float, in f1). */
static pmap_status heads16_stored_back(replica *r, const attn_dims *a, const attn_buf16 *b,
                                       int64_t bd) {
  const pmap_ops *ops = r->ops;
  int64_t tt = a->t * a->t, part = a->rows * a->e;
  const pmap_bf16 *q16 = b->qkv, *k16 = q16 + part, *v16 = k16 + part;
  float *dq = b->f1, *dk = dq + part, *dv = dk + part;
  int64_t gp = a->h * tt, go = a->t * a->e;
  /* dP_h = dO_h V_h^T, dV_h = P_h^T dO_h, every example's heads at once */
  PMAP_TRY(ops->gemm_strided_bf16(r->q, 0, 1, a->t, a->t, a->hs, 1.0f, b->h4, a->e, a->hs, v16,
                                  a->e, a->hs, 0.0f, b->f2, a->t, tt, a->h, bd, go, go, gp));
  PMAP_TRY(ops->gemm_strided_bf16(r->q, 1, 0, a->t, a->hs, a->t, 1.0f, b->p, a->t, tt, b->h4, a->e,
                                  a->hs, 0.0f, dv, a->e, a->hs, a->h, bd, gp, go, go));
  /* The softmax's backward in float from the kept (bfloat16) probabilities, and dS rounded, in
   * one pass (over dO's copy, read by now). */
  PMAP_TRY(ops->causal_softmax_backward(r->q, NULL, b->f2, b->f2, bd * a->h, a->t, a->t, 0,
                                        a->scale, b->p, b->h4));
  /* dQ_h = dS_h K_h, dK_h = dS_h^T Q_h */
  PMAP_TRY(ops->gemm_strided_bf16(r->q, 0, 0, a->t, a->hs, a->t, 1.0f, b->h4, a->t, tt, k16, a->e,
                                  a->hs, 0.0f, dq, a->e, a->hs, a->h, bd, gp, go, go));
  return ops->gemm_strided_bf16(r->q, 1, 0, a->t, a->hs, a->t, 1.0f, b->h4, a->t, tt, q16, a->e,
                                a->hs, 0.0f, dk, a->e, a->hs, a->h, bd, gp, go, go);
}

/* The blocked path's under bf16: a block of queries at a time, every example's heads at once;
 * O (float) into f1. */
static pmap_status heads16_blocked(replica *r, const attn_dims *a, const attn_blk16 *b,
                                   int64_t bd) {
  int64_t go = a->t * a->e, mb, kend, count = 1;
  for (int64_t j = 0; j < count; j++) { /* O_h = P_h V_h over the block's keys */
    int64_t i0 = block_at(a->t, j, &mb, &kend, &count), gs = a->h * mb * kend;
    PMAP_TRY(block_probs16(r, a, b, bd, i0, mb, kend, 0));
    PMAP_TRY(r->ops->gemm_strided_bf16(r->q, 0, 0, mb, a->hs, kend, 1.0f, b->p16, kend, mb * kend,
                                       b->v16, a->e, a->hs, 0.0f, b->f1 + i0 * a->e, a->e, a->hs,
                                       a->h, bd, gs, go, go));
  }
  return PMAP_SUCCESS;
}

/* Their backward: dO (bfloat16, in h4) to dQ, dK, dV (float, in f1). */
static pmap_status heads16_blocked_back(replica *r, const attn_dims *a, const attn_blk16 *b,
                                        int64_t bd) {
  const pmap_ops *ops = r->ops;
  int64_t part = a->rows * a->e, go = a->t * a->e, mb, kend, count;
  const pmap_bf16 *do16 = b->h4;
  float *dq = b->f1, *dk = dq + part, *dv = dk + part;
  block_at(a->t, 0, &mb, &kend, &count);
  /* The last block first: it sees every key, so its dK and dV set them (beta 0) and the blocks
   * before it add to their keys' rows. */
  for (int64_t j = count - 1; j >= 0; j--) {
    int64_t i0 = block_at(a->t, j, &mb, &kend, &count), gs = a->h * mb * kend;
    float beta = j == count - 1 ? 0.0f : 1.0f;
    PMAP_TRY(block_probs16(r, a, b, bd, i0, mb, kend, 1));
    /* dP_h = dO_h V_h^T, dV_h += P_h^T dO_h */
    PMAP_TRY(ops->gemm_strided_bf16(r->q, 0, 1, mb, kend, a->hs, 1.0f, do16 + i0 * a->e, a->e,
                                    a->hs, b->v16, a->e, a->hs, 0.0f, b->fdp, kend, mb * kend, a->h,
                                    bd, go, go, gs));
    PMAP_TRY(ops->gemm_strided_bf16(r->q, 1, 0, kend, a->hs, mb, 1.0f, b->p16, kend, mb * kend,
                                    do16 + i0 * a->e, a->e, a->hs, beta, dv, a->e, a->hs, a->h, bd,
                                    gs, go, go));
    PMAP_TRY(ops->causal_softmax_backward(r->q, NULL, b->fdp, b->fdp, bd * a->h, mb, kend, i0,
                                          a->scale, b->p16, b->ds16));
    /* dQ_h = dS_h K_h, dK_h += dS_h^T Q_h */
    PMAP_TRY(ops->gemm_strided_bf16(r->q, 0, 0, mb, a->hs, kend, 1.0f, b->ds16, kend, mb * kend,
                                    b->k16, a->e, a->hs, 0.0f, dq + i0 * a->e, a->e, a->hs, a->h,
                                    bd, gs, go, go));
    PMAP_TRY(ops->gemm_strided_bf16(r->q, 1, 0, kend, a->hs, mb, 1.0f, b->ds16, kend, mb * kend,
                                    b->q16 + i0 * a->e, a->e, a->hs, beta, dk, a->e, a->hs, a->h,
                                    bd, gs, go, go));
  }
  return PMAP_SUCCESS;
}

/* What the bf16 projections use of either path's buffers: Q, K, V and O in bfloat16 (r->aux[i]),
 * the qkv projection's float output (then dQ, dK, dV), O's float before its rounding, dO's
 * float before its rounding, and the bfloat16 dy, dO and dqkv in turn. */
typedef struct attn_io16 {
  pmap_bf16 *q16, *o16, *h4;
  float *f1, *fo, *fdo;
  attn_buf16 s; /* the path's own (stored: s, blocked: b) */
  attn_blk16 b;
} attn_io16;

static attn_io16 io16_of(const attn_dims *a, replica *r, int i, int64_t bd, int blk) {
  attn_io16 io;
  memset(&io, 0, sizeof io);
  if (blk) {
    io.b = blocked_bufs16(a, r->aux[i], r->tmp, bd);
    io.q16 = io.b.q16, io.o16 = io.b.o16, io.h4 = io.b.h4;
    io.f1 = io.b.f1, io.fo = io.b.f1, io.fdo = io.b.fdp;
  } else {
    io.s = bufs16_of(a, r->aux[i], r->tmp, bd);
    io.q16 = io.s.qkv, io.o16 = io.s.o, io.h4 = io.s.h4;
    io.f1 = io.s.f1, io.fo = io.s.f2, io.fdo = io.s.f2;
  }
  return io;
}

static pmap_status forward16(const layer *l, replica *r, int i, const float *in, float *y,
                             int64_t bd) {
  const pmap_ops *ops = r->ops;
  attn_dims a = dims_of(l, bd);
  int blk = blocked(a.t, 1);
  attn_io16 io = io16_of(&a, r, i, bd, blk);
  int64_t e3 = 3 * a.e, part = a.rows * a.e;
  const float *bqkv = r->w + l->b_off, *bo = bqkv + e3;
  layer_mat wqkv = layer_weights(r, l->w_off), wo = layer_weights(r, l->w_off + (size_t)(a.d * e3));
  PMAP_TRY(
      layer_gemm(r, 0, 0, a.rows, e3, a.d, layer_input(r, i, in), a.d, wqkv, e3, 0.0f, io.f1, e3));
  for (int64_t j = 0; j < 3; j++) /* Q, K and V apart, each with its bias added as it is rounded */
    PMAP_TRY(ops->round_bf16_block(r->q, io.f1 + j * a.e, e3, bqkv + j * a.e, NULL,
                                   io.q16 + j * part, a.e, a.rows, a.e));
  PMAP_TRY(blk ? heads16_blocked(r, &a, &io.b, bd) : heads16_stored(r, &a, &io.s, bd));
  PMAP_TRY(ops->round_bf16(r->q, io.fo, io.o16, NULL, (size_t)part));
  PMAP_TRY(
      layer_gemm(r, 0, 0, a.rows, a.d, a.e, (layer_mat){NULL, io.o16}, a.e, wo, a.d, 0.0f, y, a.d));
  return ops->bias_forward(r->q, y, bo, a.rows, a.d, 1);
}

static pmap_status backward16(const layer *l, replica *r, int i, const float *dy, float *dx,
                              int64_t bd) {
  const pmap_ops *ops = r->ops;
  attn_dims a = dims_of(l, bd);
  int blk = blocked(a.t, 1);
  attn_io16 io = io16_of(&a, r, i, bd, blk);
  int64_t e3 = 3 * a.e, part = a.rows * a.e;
  layer_mat wqkv = layer_weights(r, l->w_off), wo = layer_weights(r, l->w_off + (size_t)(a.d * e3));
  float *gwqkv = layer_grad(r, l->w_off), *gwo = gwqkv + a.d * e3;
  float *gbqkv = layer_grad(r, l->b_off), *gbo = gbqkv + e3;
  layer_mat d16, o16 = {NULL, io.o16};
  /* the output projection: dWo += O^T dy, dbo += sum dy, dO = dy Wo^T (rounded into h4) */
  PMAP_TRY(layer_operand(r, dy, (size_t)(a.rows * a.d), io.h4, &d16));
  PMAP_TRY(layer_gemm(r, 1, 0, a.e, a.d, a.rows, o16, a.e, d16, a.d, 1.0f, gwo, a.d));
  PMAP_TRY(ops->bias_backward(r->q, dy, gbo, a.rows, a.d, 1));
  PMAP_TRY(layer_gemm(r, 0, 1, a.rows, a.e, a.d, d16, a.d, wo, a.d, 0.0f, io.fdo, a.e));
  PMAP_TRY(ops->round_bf16(r->q, io.fdo, io.h4, NULL, (size_t)part));
  PMAP_TRY(blk ? heads16_blocked_back(r, &a, &io.b, bd) : heads16_stored_back(r, &a, &io.s, bd));
  /* the input projection: dWqkv += x^T dqkv, dbqkv += sum dqkv, dx = dqkv Wqkv^T, with dqkv
   * (rows, 3E) put together from dQ, dK and dV as it is rounded */
  for (int64_t j = 0; j < 3; j++) /* with dbqkv += their sums, in the same pass */
    PMAP_TRY(ops->round_bf16_block(r->q, io.f1 + j * part, a.e, NULL, gbqkv + j * a.e,
                                   io.h4 + j * a.e, e3, a.rows, a.e));
  layer_mat dq16 = {NULL, io.h4};
  PMAP_TRY(layer_gemm(r, 1, 0, a.d, e3, a.rows, layer_input(r, i, r->in[i]), a.d, dq16, e3, 1.0f,
                      gwqkv, e3));
  if (!dx) return PMAP_SUCCESS;
  return layer_gemm(r, 0, 1, a.rows, a.d, e3, dq16, e3, wqkv, e3, 0.0f, dx, a.d);
}

/* ---- the layer: the projections around the per-head products ---- */

static pmap_status forward(pmap_device *dev, const layer *l, replica *r, int i, const float *in,
                           float *y, const float **out, int64_t bd) {
  (void)dev, (void)out;
  if (r->w16) return forward16(l, r, i, in, y, bd);
  const pmap_ops *ops = r->ops;
  attn_dims a = dims_of(l, bd);
  int blk = blocked(a.t, 0);
  attn_buf b = blk ? blocked_bufs(&a, r->aux[i], bd) : bufs_of(&a, r->aux[i], bd);
  int64_t e3 = 3 * a.e;
  const float *wqkv = r->w + l->w_off, *wo = wqkv + a.d * e3;
  const float *bqkv = r->w + l->b_off, *bo = bqkv + e3;
  PMAP_TRY(ops->gemm(r->q, 0, 0, a.rows, e3, a.d, 1.0f, in, a.d, wqkv, e3, 0.0f, b.qkv, e3));
  PMAP_TRY(ops->bias_forward(r->q, b.qkv, bqkv, a.rows, e3, 1));
  PMAP_TRY(blk ? heads_blocked(r, &a, &b, bd) : heads_stored(r, &a, &b, bd));
  PMAP_TRY(ops->gemm(r->q, 0, 0, a.rows, a.d, a.e, 1.0f, b.o, a.e, wo, a.d, 0.0f, y, a.d));
  return ops->bias_forward(r->q, y, bo, a.rows, a.d, 1);
}

static pmap_status backward(pmap_device *dev, const layer *l, replica *r, int i, const float *dy,
                            float *dx, const float **dx_out, int64_t bd) {
  (void)dev, (void)dx_out;
  if (r->w16) return backward16(l, r, i, dy, dx, bd);
  const pmap_ops *ops = r->ops;
  attn_dims a = dims_of(l, bd);
  int blk = blocked(a.t, 0);
  attn_buf b = blk ? blocked_bufs(&a, r->aux[i], bd) : bufs_of(&a, r->aux[i], bd);
  int64_t e3 = 3 * a.e;
  const float *wqkv = r->w + l->w_off, *wo = wqkv + a.d * e3;
  float *gwqkv = layer_grad(r, l->w_off), *gwo = gwqkv + a.d * e3;
  float *gbqkv = layer_grad(r, l->b_off), *gbo = gbqkv + e3;
  /* the output projection: dWo += O^T dy, dbo += sum dy, dO = dy Wo^T */
  PMAP_TRY(ops->gemm(r->q, 1, 0, a.e, a.d, a.rows, 1.0f, b.o, a.e, dy, a.d, 1.0f, gwo, a.d));
  PMAP_TRY(ops->bias_backward(r->q, dy, gbo, a.rows, a.d, 1));
  PMAP_TRY(ops->gemm(r->q, 0, 1, a.rows, a.e, a.d, 1.0f, dy, a.d, wo, a.d, 0.0f, b.d_o, a.e));
  PMAP_TRY(blk ? heads_blocked_back(r, &a, &b, bd) : heads_stored_back(r, &a, &b, bd));
  /* the input projection: dWqkv += x^T dqkv, dbqkv += sum dqkv, dx = dqkv Wqkv^T */
  PMAP_TRY(
      ops->gemm(r->q, 1, 0, a.d, e3, a.rows, 1.0f, r->in[i], a.d, b.dqkv, e3, 1.0f, gwqkv, e3));
  PMAP_TRY(ops->bias_backward(r->q, b.dqkv, gbqkv, a.rows, e3, 1));
  if (!dx) return PMAP_SUCCESS;
  return ops->gemm(r->q, 0, 1, a.rows, a.d, e3, 1.0f, b.dqkv, e3, wqkv, e3, 0.0f, dx, a.d);
}

/* heads16_blocked's and heads16_blocked_back's per-head GEMMs into g, block by block: S (and
 * dP), O (and dQ), dV (and dK); their count. */
static int blocked_gemms16(const attn_dims *a, int64_t bd, ops_gemm16 *g) {
  int64_t go = a->t * a->e, mb, kend, count = 1, n = 0;
  for (int64_t j = 0; j < count; j++) {
    int64_t i0 = block_at(a->t, j, &mb, &kend, &count), gs = a->h * mb * kend;
    (void)i0;
    g[n++] = layer_gemm16_strided(0, 1, mb, kend, a->hs, a->e, a->hs, a->e, a->hs, 0.0f, kend,
                                  mb * kend, a->h, bd, go, go, gs);
    g[n++] = layer_gemm16_strided(0, 0, mb, a->hs, kend, kend, mb * kend, a->e, a->hs, 0.0f, a->e,
                                  a->hs, a->h, bd, gs, go, go);
    g[n++] = layer_gemm16_strided(1, 0, kend, a->hs, mb, kend, mb * kend, a->e, a->hs,
                                  j == count - 1 ? 0.0f : 1.0f, a->e, a->hs, a->h, bd, gs, go, go);
  }
  return (int)n;
}

/* forward16's and backward16's GEMMs (room for 6 + 3 ATTN_MAX_BLOCKS; the per-head products
 * of backward16 have the shapes of forward16's: dP as S, dQ as O, dK as dV). */
static int gemms16(const layer *l, int64_t bd, ops_gemm16 *g) {
  attn_dims a = dims_of(l, bd);
  int64_t e3 = 3 * a.e, tt = a.t * a.t, gp = a.h * tt, go = a.t * a.e;
  /* forward: qkv = x Wqkv; S = Q K^T (and dP = dO V^T); O = P V (and dQ = dS K); y = O Wo */
  g[0] = layer_gemm16(0, 0, a.rows, e3, a.d, a.d, e3, 0.0f, e3);
  g[1] = layer_gemm16_strided(0, 1, a.t, a.t, a.hs, a.e, a.hs, a.e, a.hs, 0.0f, a.t, tt, a.h, bd,
                              go, go, gp);
  g[2] = layer_gemm16_strided(0, 0, a.t, a.hs, a.t, a.t, tt, a.e, a.hs, 0.0f, a.e, a.hs, a.h, bd,
                              gp, go, go);
  g[3] = layer_gemm16(0, 0, a.rows, a.d, a.e, a.e, a.d, 0.0f, a.d);
  /* backward: dWo += O^T dy; dO = dy Wo^T; dV = P^T dO (and dK = dS^T Q); dWqkv += x^T dqkv;
   * dx = dqkv Wqkv^T */
  g[4] = layer_gemm16(1, 0, a.e, a.d, a.rows, a.e, a.d, 1.0f, a.d);
  g[5] = layer_gemm16(0, 1, a.rows, a.e, a.d, a.d, a.d, 0.0f, a.e);
  g[6] = layer_gemm16_strided(1, 0, a.t, a.hs, a.t, a.t, tt, a.e, a.hs, 0.0f, a.e, a.hs, a.h, bd,
                              gp, go, go);
  g[7] = layer_gemm16(1, 0, a.d, e3, a.rows, a.d, e3, 1.0f, e3);
  g[8] = layer_gemm16(0, 1, a.rows, a.d, e3, e3, e3, 0.0f, a.d);
  if (!blocked(a.t, 1)) return 9;
  /* blocked: the projections, then the blocks' per-head products in place of g[1], g[2], g[6] */
  g[1] = g[3], g[2] = g[4], g[3] = g[5], g[4] = g[7], g[5] = g[8];
  return 6 + blocked_gemms16(&a, bd, g + 6);
}

/* Both projections ~ N(0, gain / D) and N(0, 1 / E) by their fan-in, biases 0. */
static void init(const layer *l, double gain, struct pmap_rng *rng, float *w) {
  attn_dims a = dims_of(l, 1);
  layer qkv = *l, o = *l;
  qkv.w_size = (size_t)(a.d * 3 * a.e);
  qkv.b_size = l->b_size;
  o.w_off = l->w_off + qkv.w_size;
  o.w_size = (size_t)(a.e * a.d);
  o.b_size = 0;
  layer_init_fan_in(&qkv, a.d, 1.0, rng, w);
  layer_init_fan_in(&o, a.e, gain, rng, w);
}

static void geometry(const layer *l, uint32_t g[4]) {
  const attn_settings *s = LAYER_SETTINGS_CONST(attn_settings, l);
  g[0] = (uint32_t)s->heads;
  g[1] = (uint32_t)s->hs;
}

/* The projections and both per-head products over the full T x T, as a dense attention
 * computes them (the model's count: the blocked path skips most of the masked half). */
static double macs(const layer *l) {
  attn_dims a = dims_of(l, 1);
  return (double)a.t * (double)a.d * 4.0 * (double)a.e + 2.0 * (double)a.t * (double)a.t * a.e;
}

static void describe(const layer *l, FILE *f) {
  const attn_settings *s = LAYER_SETTINGS_CONST(attn_settings, l);
  fprintf(f, ", \"context\": %lld, \"dim\": %lld, \"heads\": %lld, \"head_size\": %lld",
          (long long)l->in_shape[0], (long long)l->in_shape[1], (long long)s->heads,
          (long long)s->hs);
}

/* The weights of both projections, then their biases (the order forward reads them in). */
static int blocks(const layer *l, layer_block *b) {
  attn_dims a = dims_of(l, 1);
  b[0] = LAYER_BLOCK("wqkv", LAYER_WEIGHTS, a.d, 3 * a.e);
  b[1] = LAYER_BLOCK("wo", LAYER_WEIGHTS, a.e, a.d);
  b[2] = LAYER_BLOCK("bqkv", LAYER_BIAS, 3 * a.e);
  b[3] = LAYER_BLOCK("bo", LAYER_BIAS, a.d);
  return 4;
}

static const layer_class attention_class = {
    .name = "causal_attention",
    .code = 17,
    .gemm_in = 1,
    .bf16_rows = rows16,
    .gemms16 = gemms16,
    .forward = forward,
    .backward = backward,
    .init = init,
    .geometry = geometry,
    .macs = macs,
    .describe = describe,
    .blocks = blocks,
};

pmap_status pmap_model_add_causal_attention(pmap_model *m, int heads, int head_size) {
  const char *call = "pmap_model_add_causal_attention";
  layer l;
  PMAP_TRY(layer_start(m, &attention_class, call, &l));
  if (l.in_rank != 2)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: input of rank %d; it takes (T, D) token vectors", call, l.in_rank);
  if (heads < 1 || heads > 1024 || head_size < 1 || head_size > 4096)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: heads %d must be in 1..1024 and head_size %d in 1..4096", call, heads,
                    head_size);
  int64_t t = l.in_shape[0], d = l.in_shape[1], e = (int64_t)heads * head_size;
  if (t > 4096 || e * d > (1 << 26))
    return PMAP_ERR(
        PMAP_ERR_INVALID_ARGUMENT,
        "%s: context %lld (at most 4096) or width %lld x heads %d x head_size %d is too "
        "large",
        call, (long long)t, (long long)d, heads, head_size);
  attn_settings *s = LAYER_SETTINGS(attn_settings, &l);
  s->heads = heads;
  s->hs = head_size;
  l.w_size = (size_t)(d * 3 * e + e * d);
  l.b_size = (size_t)(3 * e + d);
  if (blocked(t, 0)) { /* blocked_bufs */
    l.aux_rows = (size_t)(2 * t * 3 * e + 2 * t * e + 2 * heads * t);
    l.aux_fixed = (size_t)(2 * heads * attn_block_rows(t) * t);
  } else {
    l.aux_rows = (size_t)(2 * t * 3 * e + 2 * heads * t * t + 2 * t * e);
  }
  return model_push(m, l, call);
}

LAYER_FILE_CLASSES(attention, &attention_class);
