/* test_backward_hook.c: the generic pieces under the CUDA fast steps, on the CPU: the backward
 * hook of a replica is called once per layer, in reverse order, right after that layer's
 * parameter gradients are complete (they already equal the final gradients at that point); the
 * bucket starts derived from it; and the dropout key's salt, which a captured step turns back
 * into each step's key. Also the names batch norm's collectives go by in mismatch messages. */
#include "models/model.h"
#include "models/step_fast.h"
#include "ops/op_math.h"
#include "runtime/backend.h"
#include "testutil.h"

#define ROWS 6

typedef struct hook_log {
  const pmap_model *m;
  const replica *r;
  int calls, order[32];
  float *seen; /* (P) gradients copied at each layer's hook, for that layer's parameters */
} hook_log;

static pmap_status record(pmap_device *dev, replica *r, int i, void *user) {
  (void)dev;
  hook_log *h = user;
  if (h->calls < 32) h->order[h->calls] = i;
  h->calls++;
  const layer *l = &h->m->layers[i];
  size_t n = l->w_size + l->b_size + l->s_size;
  memcpy(h->seen + l->w_off, r->g + l->w_off, n * sizeof(float));
  return PMAP_SUCCESS;
}

typedef struct job {
  pmap_model *m;
  hook_log log;
  float *g_final;
} job;

/* Forward, loss and backward of one replica on device 0, with the hook. */
static pmap_status backward_job(pmap_device *dev, void *arg) {
  job *j = arg;
  if (dev->index != 0) return PMAP_SUCCESS;
  const pmap_model *m = j->m;
  size_t P = m->n_params, in = (size_t)m->in_size * ROWS;
  size_t k = (size_t)m->layers[m->n_layers - 1].out_size;
  float *w = calloc(P, sizeof *w), *g = calloc(P + 8, sizeof *g), *x = malloc(in * sizeof *x);
  int32_t y[ROWS];
  replica r = {.ops = &pmap_cpu_ops, .q = NULL, .w = w, .g = g}; /* CPU kernels need no queue */
  pmap_status st = PMAP_ERR_OUT_OF_MEMORY;
  if (!w || !g || !x) goto out;
  model_init_params(m, 7, w);
  uint64_t seed = 11;
  test_fill(x, in, &seed, -1.0f, 1.0f);
  for (int i = 0; i < ROWS; i++) y[i] = (int32_t)((size_t)i % k);
  j->log.m = m;
  j->log.r = &r;
  r.layer_grads_done = record;
  r.layer_grads_user = &j->log;
  float loss = 0.0f;
  st = replica_reserve(dev, m, &r, ROWS);
  if (!st) st = model_forward(dev, m, &r, x, ROWS);
  if (!st) st = model_loss(m, &r, y, ROWS, &loss);
  if (!st) st = model_backward(dev, m, &r, ROWS);
  if (!st) memcpy(j->g_final, g, P * sizeof *g);
  replica_release(dev, &r);
out:
  free(w);
  free(g);
  free(x);
  return st;
}

static void test_hook(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  int64_t shape[3] = {1, 6, 6};
  job j = {0};
  CHECK_OK(pmap_model_create(3, shape, &j.m));
  CHECK_OK(pmap_model_add_conv2d(j.m, 2, 3, 3, 1, 1));
  CHECK_OK(pmap_model_add_relu(j.m));
  CHECK_OK(pmap_model_add_flatten(j.m));
  CHECK_OK(pmap_model_add_dense(j.m, 8));
  CHECK_OK(pmap_model_add_layernorm(j.m));
  CHECK_OK(pmap_model_add_dense(j.m, 4));
  CHECK_OK(pmap_model_set_loss(j.m, PMAP_LOSS_SOFTMAX_XENT));
  if (test_failures) goto out;
  size_t P = j.m->n_params;
  int L = j.m->n_layers;
  j.log.seen = calloc(P, sizeof(float));
  j.g_final = calloc(P, sizeof(float));
  CHECK_OK(pmap_run(ctx, backward_job, &j));
  CHECK(j.log.calls == L, "the hook ran %d times for %d layers", j.log.calls, L);
  for (int c = 0; c < j.log.calls && c < L; c++)
    CHECK(j.log.order[c] == L - 1 - c, "call %d was for layer %d, want %d", c, j.log.order[c],
          L - 1 - c);
  /* What a layer's hook saw of its own gradients is what they ended as. */
  size_t bad = 0;
  for (size_t i = 0; i < P; i++) bad += j.log.seen[i] != j.g_final[i];
  CHECK(bad == 0, "%zu gradients changed after their layer's hook", bad);
  double norm = 0.0;
  for (size_t i = 0; i < P; i++) norm += (double)j.g_final[i] * j.g_final[i];
  CHECK(norm > 0.0, "the gradients are all zero: the check above proves nothing");
  /* Bucket starts: non-increasing, 0 at layer 0, each layer's own parameters included. */
  size_t lo[16];
  step_fast_bucket_starts(j.m, lo);
  CHECK(lo[0] == 0, "layer 0's bucket start %zu, want 0", lo[0]);
  for (int i = 0; i < L; i++) {
    const layer *l = &j.m->layers[i];
    if (i + 1 < L) CHECK(lo[i] <= lo[i + 1], "bucket starts grow from layer %d to %d", i, i + 1);
    if (l->w_size + l->b_size)
      CHECK(lo[i] == l->w_off, "layer %d starts at %zu, want %zu", i, lo[i], l->w_off);
  }
  CHECK(lo[L - 1] == j.m->layers[L - 1].w_off, "the last layer's start");
out:
  free(j.log.seen);
  free(j.g_final);
  pmap_model_destroy(j.m);
  pmap_ctx_destroy(ctx);
}

static void test_dropout_salt(void) {
  uint64_t z = 0x0123456789abcdefull;
  size_t bad = 0;
  for (int i = 0; i < 1000; i++) {
    z = pmap_mix64(z);
    bad += pmap_unmix64(pmap_mix64(z)) != z;
    uint64_t salt = z * 3u, step = (uint64_t)i * 7u;
    bad += pmap_dropout_salt(pmap_dropout_key(step, salt), step) != salt;
  }
  CHECK(bad == 0, "%zu keys did not come back from their salt", bad);
}

/* Device 0 runs a batch norm model's forward pass (and backward when j->backward), device 1 the
 * same up to the layer's collective under test, then a pmap_psum there instead. */
typedef struct bn_job {
  pmap_model *m;
  int backward;
} bn_job;

static pmap_status bn_label_job(pmap_device *dev, void *arg) {
  bn_job *j = arg;
  const pmap_model *m = j->m;
  size_t P = m->n_params;
  float w[64] = {0}, g[64] = {0}, x[3 * ROWS], one = 1.0f, loss = 0.0f;
  int32_t y[ROWS] = {0};
  uint64_t seed = 5;
  test_fill(x, 3 * ROWS, &seed, -1.0f, 1.0f);
  model_init_params(m, 3, w);
  replica r = {.ops = &pmap_cpu_ops, .q = NULL, .w = w, .g = g}; /* CPU kernels need no queue */
  if (P > 64) return PMAP_ERR_INTERNAL;
  pmap_status st = replica_reserve(dev, m, &r, ROWS);
  if (!st && (dev->index == 0 || j->backward)) st = model_forward(dev, m, &r, x, ROWS);
  if (!st && j->backward) st = model_loss(m, &r, y, ROWS, &loss);
  if (!st && dev->index == 0 && j->backward) st = model_backward(dev, m, &r, ROWS);
  if (!st && dev->index == 1) st = pmap_psum(dev, &one, &one, 1);
  replica_release(dev, &r);
  return st;
}

static void test_bn_labels(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  int64_t shape[1] = {3};
  bn_job j = {0};
  CHECK_OK(pmap_model_create(1, shape, &j.m));
  CHECK_OK(pmap_model_add_dense(j.m, 3)); /* so that batch norm's backward needs dx */
  CHECK_OK(pmap_model_add_batchnorm(j.m, 1));
  CHECK_OK(pmap_model_add_dense(j.m, 2));
  CHECK_OK(pmap_model_set_loss(j.m, PMAP_LOSS_SOFTMAX_XENT));
  if (!test_failures) {
    CHECK_FAILS(pmap_run(ctx, bn_label_job, &j), PMAP_ERR_INVALID_ARGUMENT,
                "batch norm's statistics");
    CHECK(strstr(pmap_last_error(), "backward") == NULL, "forward named backward: %s",
          pmap_last_error());
    j.backward = 1;
    CHECK_FAILS(pmap_run(ctx, bn_label_job, &j), PMAP_ERR_INVALID_ARGUMENT,
                "batch norm's backward");
    CHECK(strstr(pmap_last_error(), "pmap_psum") != NULL, "the other side: %s", pmap_last_error());
  }
  pmap_model_destroy(j.m);
  pmap_ctx_destroy(ctx);
}

int main(void) {
  test_hook();
  test_bn_labels();
  test_dropout_salt();
  return test_exit("backward-hook");
}
