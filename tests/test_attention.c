/* test_attention.c: causal attention against a float64 reference, at contexts of the stored
 * path (T <= 64; under bf16 T <= 256) and of the blocked one (two, three and five blocks of 64
 * queries, the last one short, and past 512 tokens blocks of T / 8), in fp32 and bf16, on 1 and
 * 2 devices: the
 * logits of pmap_predict, and the gradient of one SGD step of lr 1 against central differences
 * of the float64 loss; the causal mask across blocks (a later token changes no earlier logit,
 * to the bit); the activations of the memory plan grow linearly in T past the stored path. */
#include <math.h>

#include "testutil.h"

#define V 13
#define D 16
#define H 2
#define HS 8
#define E (H * HS)
#define B 4

/* embedding (V, D) -> causal attention (H heads of HS) -> untied lm_head (D -> V) */
static pmap_model *build(int64_t t) {
  pmap_model *m = NULL;
  int64_t in[1] = {t};
  pmap_status st = pmap_model_create(1, in, &m);
  if (!st) st = pmap_model_add_embedding(m, V, D);
  if (!st) st = pmap_model_add_causal_attention(m, H, HS);
  if (!st) st = pmap_model_add_lm_head(m, 0);
  if (st) {
    fprintf(stderr, "FAIL building the model of context %lld: %s\n", (long long)t,
            pmap_last_error());
    test_failures++;
    pmap_model_destroy(m);
    return NULL;
  }
  return m;
}

/* Where each block of the flat vector starts. */
typedef struct layout {
  size_t table, wqkv, wo, bqkv, bo, hw, hb, count;
} layout;

static size_t offset_of(const pmap_model *m, const char *name) {
  pmap_param_block b;
  if (pmap_model_find_param_block(m, name, &b)) {
    fprintf(stderr, "FAIL: no block %s: %s\n", name, pmap_last_error());
    test_failures++;
    return 0;
  }
  return b.offset;
}

static layout layout_of(const pmap_model *m, size_t count) {
  layout l = {offset_of(m, "0.embedding.table"),     offset_of(m, "1.causal_attention.wqkv"),
              offset_of(m, "1.causal_attention.wo"), offset_of(m, "1.causal_attention.bqkv"),
              offset_of(m, "1.causal_attention.bo"), offset_of(m, "2.lm_head.w"),
              offset_of(m, "2.lm_head.b"),           count};
  return l;
}

/* The float64 model: logits (rows, t, V) of ids (rows, t) under parameters w, and the mean
 * per-token cross-entropy against ys. */
static double reference(const layout *l, const double *w, const int32_t *ids, const int32_t *ys,
                        int64_t rows, int64_t t, double *logits) {
  double *qkv = malloc((size_t)(t * 3 * E) * sizeof *qkv), *o = malloc((size_t)(t * E) * sizeof *o);
  double *p = malloc((size_t)t * sizeof *p), loss = 0.0, scale = 1.0 / sqrt((double)HS);
  for (int64_t n = 0; n < rows; n++) {
    const int32_t *id = ids + n * t;
    for (int64_t i = 0; i < t; i++)
      for (int c = 0; c < 3 * E; c++) {
        double s = w[l->bqkv + (size_t)c];
        for (int d = 0; d < D; d++)
          s += w[l->table + (size_t)(id[i] * D + d)] * w[l->wqkv + (size_t)(d * 3 * E + c)];
        qkv[i * 3 * E + c] = s;
      }
    for (int h = 0; h < H; h++)
      for (int64_t i = 0; i < t; i++) {
        const double *q = qkv + i * 3 * E + h * HS;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t j = 0; j <= i; j++) {
          const double *k = qkv + j * 3 * E + E + h * HS;
          double s = 0.0;
          for (int c = 0; c < HS; c++) s += q[c] * k[c];
          p[j] = s * scale;
          mx = fmax(mx, p[j]);
        }
        for (int64_t j = 0; j <= i; j++) sum += p[j] = exp(p[j] - mx);
        for (int c = 0; c < HS; c++) {
          double s = 0.0;
          for (int64_t j = 0; j <= i; j++) s += p[j] / sum * qkv[j * 3 * E + 2 * E + h * HS + c];
          o[i * E + h * HS + c] = s;
        }
      }
    for (int64_t i = 0; i < t; i++) {
      double y[D], *z = logits + (n * t + i) * V, mx = -INFINITY, se = 0.0;
      for (int d = 0; d < D; d++) {
        y[d] = w[l->bo + (size_t)d];
        for (int e = 0; e < E; e++) y[d] += o[i * E + e] * w[l->wo + (size_t)(e * D + d)];
      }
      for (int v = 0; v < V; v++) {
        z[v] = w[l->hb + (size_t)v];
        for (int d = 0; d < D; d++) z[v] += y[d] * w[l->hw + (size_t)(d * V + v)];
        mx = fmax(mx, z[v]);
      }
      for (int v = 0; v < V; v++) se += exp(z[v] - mx);
      loss += log(se) + mx - z[ys[n * t + i]];
    }
  }
  free(qkv), free(o), free(p);
  return loss / (double)(rows * t);
}

static double max_abs(const double *x, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
  return m;
}

/* One context, precision and device count: logits, a step's gradient at `samples` parameters
 * (the first of each block among them), the causal mask. */
static void check(int64_t t, int bf16, int devices, int samples) {
  char what[128];
  snprintf(what, sizeof what, "T %lld %s on %d device%s", (long long)t, bf16 ? "bf16" : "fp32",
           devices, devices > 1 ? "s" : "");
  pmap_model *m = build(t);
  if (!m) return;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = devices};
  pmap_optimizer opt = pmap_sgd(1.0f, 0.0f);
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  if (pmap_ctx_create(&cfg, &ctx) || pmap_params_create(ctx, m, &opt, 3, &params) ||
      pmap_params_set_precision(params, bf16 ? PMAP_PRECISION_BF16 : PMAP_PRECISION_FP32)) {
    fprintf(stderr, "FAIL %s: setting up: %s\n", what, pmap_last_error());
    test_failures++;
    pmap_ctx_destroy(ctx);
    pmap_model_destroy(m);
    return;
  }
  size_t count = pmap_params_count(params), nl = (size_t)(B * t * V);
  layout l = layout_of(m, count);
  /* Parameters of order 1 (not the initial 0.02 of the table), so that the scores spread over a
   * few units and the softmax is far from uniform. */
  uint64_t seed = 0x5eed0000u + (uint64_t)t;
  float *w0 = malloc(count * sizeof *w0), *w1 = malloc(count * sizeof *w1);
  double *wd = malloc(count * sizeof *wd), *want = malloc(nl * sizeof *want);
  float *got = malloc(nl * sizeof *got), *again = malloc(nl * sizeof *again);
  test_fill(w0, count, &seed, -0.5f, 0.5f);
  for (size_t i = l.table; i < l.table + (size_t)(V * D); i++) w0[i] *= 2.0f;
  for (size_t i = 0; i < count; i++) wd[i] = w0[i];
  int32_t *ids = malloc((size_t)(B * t) * sizeof *ids), *ys = malloc((size_t)(B * t) * sizeof *ys);
  for (int64_t i = 0; i < B * t; i++) {
    ids[i] = (int32_t)(test_rand_u64(&seed) % V);
    ys[i] = (int32_t)(test_rand_u64(&seed) % V);
  }
  pmap_array xs = {ids, PMAP_I32, 2, {B, t, 0, 0}}, ya = {ys, PMAP_I32, 2, {B, t, 0, 0}};
  pmap_array out = {got, PMAP_F32, 3, {B, t, V, 0}}, out2 = {again, PMAP_F32, 3, {B, t, V, 0}};
  CHECK_OK(pmap_params_write(params, w0, count));
  CHECK_OK(pmap_predict(params, &xs, &out));
  double loss = reference(&l, wd, ids, ys, B, t, want), scale = max_abs(want, nl) + 1.0;
  /* fp32: every float sum of n terms is within n 2^-24 of the sum of their magnitudes; a logit
   * goes through four (D, t keys, E, D terms), and its terms are of the order of the largest
   * logit: 8 times that. bf16: each GEMM operand rounded (2^-9 each, 2^-8 a product) about ten
   * times along the way (the embedding, Wqkv, Q, K, P, V, O, Wo, y, W of the head): 10 2^-8 of
   * the terms' magnitude, twice that for their spread. */
  double tol = bf16 ? 20.0 / 256.0 : 8.0 * (double)(3 * D + E + t) / 16777216.0;
  size_t worst = 0, off = 0;
  for (size_t i = 0; i < nl; i++) {
    double d = fabs((double)got[i] - want[i]);
    off += !(d <= tol * scale);
    if (d > fabs((double)got[worst] - want[worst])) worst = i;
  }
  CHECK(off == 0, "%s: %zu logits off the float64 model's by more than %.3g (worst %.9g, %.9g)",
        what, off, tol * scale, (double)got[worst], want[worst]);

  /* The mask: the last token, then the first of the second block, changed; the logits before
   * it stay to the bit. */
  int64_t rows = t > 512 ? ((t + 7) / 8 + 15) / 16 * 16 : 64; /* a block's queries */
  int64_t at[2] = {t - 1, t > 64 ? rows : t / 2};
  for (int k = 0; k < 2; k++) {
    int32_t keep = ids[at[k]];
    ids[at[k]] = (ids[at[k]] + 1) % V;
    CHECK_OK(pmap_predict(params, &xs, &out2));
    ids[at[k]] = keep;
    size_t before = (size_t)(at[k] * V), changed = 0;
    for (size_t i = 0; i < before; i++) changed += got[i] != again[i];
    CHECK(changed == 0, "%s: token %lld changed %zu logits before it", what, (long long)at[k],
          changed);
    for (size_t i = before; i < (size_t)(t * V); i++) changed += got[i] != again[i];
    CHECK(changed > 0, "%s: token %lld changed no logit", what, (long long)at[k]);
  }

  /* A step of SGD with lr 1 moves every parameter by minus the gradient. */
  float step_loss = 0.0f;
  CHECK_OK(pmap_update(params, &xs, &ya, &step_loss));
  CHECK_OK(pmap_params_read(params, 0, w1, count));
  CHECK(fabs(step_loss - loss) <= tol * fmax(1.0, fabs(loss)) * 4.0,
        "%s: the step's loss %.9g, the float64 model's %.9g", what, (double)step_loss, loss);
  size_t starts[7] = {l.table, l.wqkv, l.wo, l.bqkv, l.bo, l.hw, l.hb};
  double *gw = malloc((size_t)samples * sizeof *gw), *gg = malloc((size_t)samples * sizeof *gg);
  double *lp = malloc(nl * sizeof *lp), gmax = 0.0;
  size_t *idx = malloc((size_t)samples * sizeof *idx);
  for (int j = 0; j < samples; j++) {
    size_t i = j < 7 ? starts[j] + (size_t)j % 3 : (size_t)(test_rand_u64(&seed) % count);
    /* Central differences of the float64 loss: h 1e-5 leaves h^2 f''' / 6 and 2^-52 L / h, both
     * under 1e-9, far below the tolerances. */
    double h = 1e-5, keep = wd[i];
    wd[i] = keep + h;
    double up = reference(&l, wd, ids, ys, B, t, lp);
    wd[i] = keep - h;
    double down = reference(&l, wd, ids, ys, B, t, lp);
    wd[i] = keep;
    idx[j] = i;
    gw[j] = (up - down) / (2.0 * h);
    /* w1 = w0 - g rounded once: the difference carries half an ulp of w1 */
    gg[j] = (double)w0[i] - (double)w1[i];
    gmax = fmax(gmax, fabs(gw[j]));
  }
  /* fp32: a weight's gradient sums over the B t tokens of every device on top of the forward's
   * chains and their transposes (t keys, D, E): 8 (B t + 2 t + 3 D + E) 2^-24 of the largest
   * gradient, as for the logits; bf16: the rounded operands of the backward's GEMMs (dy, dO, dP,
   * dS, dqkv) on top of the forward's: 30 2^-8. */
  double gtol = bf16 ? 30.0 / 256.0 : 8.0 * (double)(B * t + 2 * t + 3 * D + E) / 16777216.0;
  size_t bad = 0;
  for (int j = 0; j < samples; j++) {
    double lim = gtol * gmax + fabs((double)w1[idx[j]]) / 16777216.0;
    if (fabs(gg[j] - gw[j]) > lim && bad++ < 5)
      fprintf(stderr, "  %s: parameter %zu: step moved it by %.9g, the gradient is %.9g (%.3g)\n",
              what, idx[j], gg[j], gw[j], lim);
  }
  CHECK(bad == 0, "%s: %zu of %d sampled gradients off the float64 model's (largest %.3g)", what,
        bad, samples, gmax);
  free(gw), free(gg), free(lp), free(idx);
  free(w0), free(w1), free(wd), free(want), free(got), free(again), free(ids), free(ys);
  pmap_params_destroy(params);
  pmap_ctx_destroy(ctx);
  pmap_model_destroy(m);
}

/* The plan's activations per token at contexts past the stored path (fp32: 128, 256 and 512;
 * bf16: 320 and 512): the same (the blocked path keeps no T x T matrix). */
static void plan_linear(void) {
  for (int bf16 = 0; bf16 < 2; bf16++) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
    pmap_ctx *ctx = NULL;
    CHECK_OK(pmap_ctx_create(&cfg, &ctx));
    double per[3];
    int64_t ts[3] = {128, 256, 512}, n = 3;
    if (bf16) ts[0] = 320, ts[1] = 512, n = 2;
    for (int k = 0; k < n; k++) {
      pmap_model *m = build(ts[k]);
      pmap_params *p = NULL;
      pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
      pmap_memory_plan plan = {0};
      per[k] = 0.0;
      if (m && !pmap_params_create(ctx, m, &opt, 1, &p) &&
          !pmap_params_set_precision(p, bf16 ? PMAP_PRECISION_BF16 : PMAP_PRECISION_FP32) &&
          !pmap_params_memory(p, 8, &plan))
        per[k] = (double)plan.activations / (double)ts[k];
      else
        CHECK(0, "plan at T %lld: %s", (long long)ts[k], pmap_last_error());
      pmap_params_destroy(p);
      pmap_model_destroy(m);
    }
    /* Linear: the same bytes a token (the plan's fixed parts, a few kB, are under 1 %). */
    for (int k = 1; k < n; k++)
      CHECK(per[k] <= per[0] * 1.01 && per[k] >= per[0] * 0.9,
            "%s: activations a token %.1f at T %lld, %.1f at T %lld: not linear in T",
            bf16 ? "bf16" : "fp32", per[k], (long long)ts[k], per[0], (long long)ts[0]);
    pmap_ctx_destroy(ctx);
  }
}

int main(void) {
  int64_t ts[5] = {40, 75, 150, 300, 600};
  for (int k = 0; k < 5; k++)
    for (int bf16 = 0; bf16 < 2; bf16++)
      for (int devices = 1; devices <= 2; devices++)
        check(ts[k], bf16, devices, ts[k] > 200 ? 12 : devices == 1 ? 60 : 20);
  plan_linear();
  return test_exit("attention");
}
