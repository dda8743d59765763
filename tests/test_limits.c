/* test_limits.c: every limit the model builder and the calls document (include/pmap.h), tried
 * at the limit (accepted) and one past it (refused, the message naming the call and the
 * limit, the model unchanged); sizes whose products wrap 64 bits refused, never taken as the
 * wrapped value (an input of (2^24, 2^24, 2^24) is not a model of 0 features); pmap_predict's
 * out shape checked axis by axis; micro-batch pieces of huge row counts; pmap_array_numel's
 * overflow. Models are built, not trained: nothing here allocates a large buffer. */
#include "models/batch.h"
#include "testutil.h"

/* A fresh model of input `shape` (rank 1 or 3); NULL after a failed check. */
static pmap_model *model_of(int rank, int64_t a, int64_t b, int64_t c) {
  int64_t s[3] = {a, b, c};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(rank, s, &m));
  return m;
}

static void input_limits(void) {
  pmap_model *m = NULL;
  int64_t s[3];
  s[0] = PMAP_MAX_EXTENT;
  CHECK_OK(pmap_model_create(1, s, &m));
  pmap_model_destroy(m), m = NULL;
  s[0] = (int64_t)PMAP_MAX_EXTENT + 1;
  CHECK_FAILS(pmap_model_create(1, s, &m), PMAP_ERR_INVALID_ARGUMENT, "outside 1..16777216");
  CHECK(m == NULL, "a refused model was made");
  /* The product: at the limit, one past, and extents whose product wraps 2^64. */
  s[0] = 1 << 4, s[1] = 1 << 12, s[2] = 1 << 12;
  CHECK_OK(pmap_model_create(3, s, &m));
  CHECK(m && pmap_model_num_params(m) == 0, "an empty model has parameters");
  pmap_model_destroy(m), m = NULL;
  s[2] = (1 << 12) + 1;
  CHECK_FAILS(pmap_model_create(3, s, &m), PMAP_ERR_INVALID_ARGUMENT, "268435456");
  static const int64_t wraps[][3] = {
      {1 << 24, 1 << 24, 1 << 24}, {10584714, 460321, 3785993}, {1 << 24, 1 << 24, 1}};
  for (int i = 0; i < 3; i++) {
    CHECK_FAILS(pmap_model_create(3, wraps[i], &m), PMAP_ERR_INVALID_ARGUMENT,
                "values per example");
    CHECK(m == NULL, "input (%lld, %lld, %lld) made a model", (long long)wraps[i][0],
          (long long)wraps[i][1], (long long)wraps[i][2]);
  }
}

static void dense_limits(void) {
  pmap_model *m = model_of(1, 1, 0, 0);
  if (!m) return;
  CHECK_OK(pmap_model_add_dense(m, PMAP_MAX_EXTENT));
  size_t n = pmap_model_num_params(m);
  CHECK_FAILS(pmap_model_add_dense(m, (int64_t)PMAP_MAX_EXTENT + 1), PMAP_ERR_INVALID_ARGUMENT,
              "outside 1..16777216");
  /* 2^24 inputs x 2^24 units: 2^48 weights, past the parameter limit (not wrapped). */
  CHECK_FAILS(pmap_model_add_dense(m, PMAP_MAX_EXTENT), PMAP_ERR_INVALID_ARGUMENT,
              "2147483648 parameters");
  CHECK(pmap_model_num_params(m) == n, "a refused layer changed the model");
  pmap_model_destroy(m);
  /* The parameter limit exactly. */
  m = model_of(1, (1 << 15) - 1, 0, 0);
  if (!m) return;
  /* (2^15 - 1) x 2^16 weights + 2^16 biases = 2^31 exactly. */
  CHECK_OK(pmap_model_add_dense(m, 1 << 16));
  CHECK(pmap_model_num_params(m) == PMAP_MAX_PARAMS, "%zu parameters, want 2^31",
        pmap_model_num_params(m));
  CHECK_FAILS(pmap_model_add_dense(m, 1), PMAP_ERR_INVALID_ARGUMENT, "2147483648 parameters");
  pmap_model_destroy(m);
}

static void conv_limits(void) {
  pmap_model *m = model_of(3, 1, 8, 8);
  if (!m) return;
  CHECK_FAILS(pmap_model_add_conv2d(m, 65537, 3, 3, 1, 1), PMAP_ERR_INVALID_ARGUMENT,
              "out_channels 1..65536");
  CHECK_FAILS(pmap_model_add_conv2d(m, 1, 65, 3, 1, 64), PMAP_ERR_INVALID_ARGUMENT, "kernel 1..64");
  CHECK_FAILS(pmap_model_add_conv2d(m, 1, 3, 3, 1, 65), PMAP_ERR_INVALID_ARGUMENT, "pad 0..64");
  CHECK_FAILS(pmap_model_add_conv2d(m, 1, 3, 3, 0, 1), PMAP_ERR_INVALID_ARGUMENT, "stride >= 1");
  CHECK_OK(pmap_model_add_conv2d(m, 65536, 3, 3, 1, 1));
  pmap_model_destroy(m);
  m = model_of(3, 1, 8, 8);
  if (m) CHECK_OK(pmap_model_add_conv2d(m, 1, 64, 64, 1, 64));
  pmap_model_destroy(m);
  /* An output of 2^16 channels over 2^28 pixels (2^44 values) is past the features limit: it
   * is refused, where a dense layer after it once wrapped its weight count to 0. */
  m = model_of(3, 1, 1 << 14, 1 << 14);
  if (!m) return;
  CHECK_FAILS(pmap_model_add_conv2d(m, 1 << 16, 1, 1, 1, 0), PMAP_ERR_INVALID_ARGUMENT,
              "values per example");
  /* At the limit: one channel of 2^28 pixels. */
  CHECK_OK(pmap_model_add_conv2d(m, 1, 1, 1, 1, 0));
  CHECK_FAILS(pmap_model_add_conv2d(m, 2, 1, 1, 1, 0), PMAP_ERR_INVALID_ARGUMENT, "268435456");
  pmap_model_destroy(m);
}

static void pool_and_token_limits(void) {
  pmap_model *m = model_of(3, 1, 64, 64);
  if (!m) return;
  CHECK_OK(pmap_model_add_maxpool2d(m, 64, 64, 64));
  pmap_model_destroy(m);
  m = model_of(3, 1, 65, 65);
  if (!m) return;
  CHECK_FAILS(pmap_model_add_maxpool2d(m, 65, 1, 1), PMAP_ERR_INVALID_ARGUMENT, "window 1..64");
  CHECK_FAILS(pmap_model_add_avgpool2d(m, 1, 1, 65), PMAP_ERR_INVALID_ARGUMENT, "stride 1..64");
  pmap_model_destroy(m);
  m = model_of(3, 1, 1, 65536);
  if (m) CHECK_OK(pmap_model_add_global_avgpool(m));
  pmap_model_destroy(m);
  m = model_of(3, 1, 1, 65537);
  if (m) CHECK_FAILS(pmap_model_add_global_avgpool(m), PMAP_ERR_INVALID_ARGUMENT, "too large");
  pmap_model_destroy(m);
  /* Embedding: vocab 2^24 and dim 2^16 each accepted alone, one past refused, T x dim bounded
   * by the features limit. */
  m = model_of(1, 4, 0, 0);
  if (!m) return;
  CHECK_FAILS(pmap_model_add_embedding(m, (1 << 24) + 1, 8), PMAP_ERR_INVALID_ARGUMENT,
              "vocab 16777217");
  CHECK_FAILS(pmap_model_add_embedding(m, 8, 65537), PMAP_ERR_INVALID_ARGUMENT, "dim 65537");
  CHECK_OK(pmap_model_add_embedding(m, 8, 65536));
  pmap_model_destroy(m);
  m = model_of(1, 4, 0, 0);
  if (!m) return;
  CHECK_OK(pmap_model_add_embedding(m, 16, 8));
  CHECK_OK(pmap_model_add_token_dense(m, 1 << 20));
  CHECK_FAILS(pmap_model_add_token_dense(m, (1 << 20) + 1), PMAP_ERR_INVALID_ARGUMENT,
              "outside 1..1048576");
  pmap_model_destroy(m);
  m = model_of(1, 4, 0, 0);
  if (!m) return;
  CHECK_OK(pmap_model_add_embedding(m, 16, 8));
  CHECK_FAILS(pmap_model_add_causal_attention(m, 1025, 1), PMAP_ERR_INVALID_ARGUMENT, "1..1024");
  CHECK_FAILS(pmap_model_add_causal_attention(m, 1, 4097), PMAP_ERR_INVALID_ARGUMENT, "1..4096");
  CHECK_OK(pmap_model_add_causal_attention(m, 2, 4));
  pmap_model_destroy(m);
}

/* pmap_predict's out must have the model's output shape exactly: a language model's (B, T, V)
 * logits are refused into an out of the same count in another shape. */
static void predict_shape(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  pmap_model *m = model_of(1, 2, 0, 0); /* T = 2 tokens */
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  if (m) CHECK_OK(pmap_model_add_embedding(m, 3, 4)); /* vocab V = 3 */
  if (m) CHECK_OK(pmap_model_add_lm_head(m, 1));      /* (T, V) = (2, 3) */
  CHECK_OK(pmap_params_create(ctx, m, &opt, 1, &p));
  if (!p) goto done;
  int32_t x[4] = {0, 1, 2, 1};
  float y[12];
  int64_t xs_shape[2] = {2, 2}, good[3] = {2, 2, 3}, bad[3] = {2, 3, 2};
  pmap_array xs = pmap_array_i32(x, 2, xs_shape), out = pmap_array_f32(y, 3, good);
  CHECK_OK(pmap_predict(p, &xs, &out));
  out = pmap_array_f32(y, 3, bad);
  CHECK_FAILS(pmap_predict(p, &xs, &out), PMAP_ERR_INVALID_ARGUMENT, "(2, 2, 3)");
done:
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

static void numel(void) {
  int64_t s[4] = {1, 10584714, 460321, 3785993};
  pmap_array a = pmap_array_f32(NULL, 4, s);
  CHECK(pmap_array_numel(&a) == -1, "a wrapping product: %lld", (long long)pmap_array_numel(&a));
  int64_t t[2] = {3, -1};
  a = pmap_array_f32(NULL, 2, t);
  CHECK(pmap_array_numel(&a) == -1, "a negative extent: %lld", (long long)pmap_array_numel(&a));
  int64_t u[2] = {1 << 30, 1 << 30};
  a = pmap_array_f32(NULL, 2, u);
  CHECK(pmap_array_numel(&a) == (int64_t)1 << 60, "2^60: %lld", (long long)pmap_array_numel(&a));
  CHECK(pmap_array_numel(NULL) == 0, "NULL");
  /* A zero extent anywhere makes 0, which fits, whatever the others multiply to. */
  int64_t z[3][3] = {{0, INT64_C(1) << 62, INT64_C(1) << 62},
                     {INT64_C(1) << 62, INT64_C(1) << 62, 0},
                     {INT64_C(1) << 62, 0, INT64_C(1) << 62}};
  for (int i = 0; i < 3; i++) {
    a = pmap_array_f32(NULL, 3, z[i]);
    CHECK(pmap_array_numel(&a) == 0, "a zero extent at %d: %lld", i,
          (long long)pmap_array_numel(&a));
  }
  int64_t zn[2] = {0, -1};
  a = pmap_array_f32(NULL, 2, zn);
  CHECK(pmap_array_numel(&a) == -1, "a zero and a negative extent: %lld",
        (long long)pmap_array_numel(&a));
}

/* An xs whose element count wraps, for a model whose input has the same trailing extents is
 * impossible now (the model refuses them); for a custom model the shape is refused by name. */
static pmap_status zero_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  *a->loss = 0.0f;
  return PMAP_SUCCESS;
}

static void custom_wrap(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  float init[2] = {0, 0}, x[4] = {0}, loss = 0;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_params_create_custom(ctx, 2, init, zero_grad, NULL, &opt, &p));
  if (!p) goto done;
  int64_t s[4] = {1, 10584714, 460321, 3785993};
  pmap_array xs = pmap_array_f32(x, 4, s), ys = pmap_array_f32(x, 4, s);
  CHECK_FAILS(pmap_update(p, &xs, &ys, &loss), PMAP_ERR_INVALID_ARGUMENT, "fits in 64 bits");
done:
  pmap_params_destroy(p);
  pmap_ctx_destroy(ctx);
}

/* The micro-batch split of huge row counts: every piece within the rows, in order, none empty
 * where rows >= k, their lengths summing to the rows (rows (i + 1) / k wrapped past 2^63). */
static void pieces(void) {
  static const int64_t rows[] = {10, 65536, (int64_t)1 << 50, INT64_MAX / 3, INT64_MAX};
  static const int64_t ks[] = {1, 3, 7, 65536};
  for (size_t a = 0; a < sizeof rows / sizeof rows[0]; a++)
    for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
      int64_t k = ks[b], next = 0, lo = 0, len = 0, bad = -1;
      for (int64_t i = 0; i < k && bad < 0; i++) {
        batch_piece_rows(rows[a], k, i, &lo, &len);
        if (lo != next || len < (rows[a] >= k) || len - 1 > rows[a] / k) bad = i;
        /* Where rows i / k does not wrap, the same split as it. */
        if (rows[a] < ((int64_t)1 << 40) && lo != rows[a] * i / k) bad = i;
        next = lo + len;
      }
      CHECK(bad < 0 && next == rows[a], "%lld rows in %lld pieces: piece %lld at %lld of %lld",
            (long long)rows[a], (long long)k, (long long)bad, (long long)lo, (long long)len);
    }
}

/* Under the sanitizers an allocation too large for them returns NULL, as it does from the C
 * library, instead of ending the process (their options from the environment still apply). */
#if defined(__SANITIZE_ADDRESS__)
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }
#endif
#if defined(__SANITIZE_THREAD__)
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "allocator_may_return_null=1"; }
#endif

/* An allocation the device cannot make, inside a mapped function: refused by the call that was
 * made, named first, *out NULL. */
static pmap_status huge_alloc(pmap_device *dev, void *arg) {
  int *ok = arg;
  float *p = (float *)1;
  pmap_status st = pmap_device_alloc(dev, (size_t)1 << 58, &p);
  ok[pmap_local_index(dev)] = st == PMAP_ERR_OUT_OF_MEMORY && p == NULL &&
                              strncmp(pmap_last_error(), "pmap_device_alloc: ", 19) == 0;
  if (!ok[pmap_local_index(dev)]) fprintf(stderr, "pmap_device_alloc: %s\n", pmap_last_error());
  return PMAP_SUCCESS;
}

static void device_alloc(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  int ok[2] = {0, 0};
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  if (ctx) CHECK_OK(pmap_run(ctx, huge_alloc, ok));
  CHECK(ok[0] && ok[1], "an allocation of 2^60 bytes: devices %d %d", ok[0], ok[1]);
  pmap_ctx_destroy(ctx);
}

/* A plan past the address space is refused as such, not returned: at every batch up to the
 * largest it takes (2^40) and 1 or 7 micro-batches, either a total that fits a pointer
 * difference or PMAP_ERR_INVALID_ARGUMENT naming the address space. */
static void plan_limits(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  int64_t in[1] = {1}; /* 2^20 outputs: 8 MiB of activations a row */
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, in, &m));
  if (m) CHECK_OK(pmap_model_add_dense(m, 1 << 20));
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  pmap_params *p = NULL;
  if (ctx && m) CHECK_OK(pmap_params_create(ctx, m, &opt, 1, &p));
  int refused = 0;
  for (int micro = 1; p && micro <= 7; micro += 6) {
    CHECK_OK(pmap_params_set_micro_batches(p, micro));
    for (int e = 20; e <= 40; e += 4) {
      pmap_memory_plan plan;
      pmap_status st = pmap_params_memory(p, (int64_t)1 << e, &plan);
      if (st == PMAP_SUCCESS) {
        CHECK(plan.total <= (size_t)PTRDIFF_MAX,
              "batch 2^%d, %d micro-batches: a plan of %zu bytes", e, micro, plan.total);
      } else {
        refused++;
        CHECK(st == PMAP_ERR_INVALID_ARGUMENT && strstr(pmap_last_error(), "address space"),
              "batch 2^%d, %d micro-batches: status %d, %s", e, micro, st, pmap_last_error());
      }
    }
  }
  CHECK(refused > 0, "no batch up to 2^40 of 2^20 outputs was refused");
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

int main(void) {
  plan_limits();
  device_alloc();
  pieces();
  input_limits();
  dense_limits();
  conv_limits();
  pool_and_token_limits();
  predict_shape();
  numel();
  custom_wrap();
  return test_exit("limits");
}
