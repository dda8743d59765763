/* test_observe.c: what a user sees of a run through the API: the memory plan
 * (pmap_params_memory) equals, to the byte, what the CPU backend allocated for the params once a
 * step at that batch ran (replicated and sharded, micro-batches, batch norm's state, uneven
 * batches, custom params; under bf16 with the GEMMs' workspace, on either provider); the trace
 * calls refuse misuse and leave nothing on, and a step past
 * the span limit keeps its own spans; the waits count every device's collectives. Reaches inside for the CPU backend's count of live bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops/cpu/bf16.h"
#include "runtime/runtime.h"
#include "testutil.h"

static size_t in_use(pmap_ctx *ctx, int d) {
  size_t used = 0, free_bytes = 0;
  runtime_device_memory(runtime_device(ctx, d), &used, &free_bytes);
  return used;
}

static pmap_model *small_model(int batchnorm) {
  int64_t in[1] = {12};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_dense(m, 32));
  if (batchnorm) CHECK_OK(pmap_model_add_batchnorm(m, 0));
  CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_dense(m, 5));
  CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT));
  return m;
}

/* One step of `batch` rows on a context of 4 devices; the plan against each device's bytes. */
/* A prediction of 5 times the step's rows after the step allocates nothing beyond the plan:
 * each device runs them in pieces of the rows its arena holds. With one micro-batch and an even
 * split, device d's rows are its share of xs five times over, so each piece is that share and
 * runs the same kernels on the same rows as pmap_predict on xs: the outputs are the same bits. */
static void predict_within_plan(const char *what, pmap_ctx *ctx, pmap_params *p,
                                const pmap_array *xs, int same_pieces, const size_t *base,
                                size_t total) {
  int64_t batch = xs->shape[0], f = xs->shape[1], share = batch / 4, big = 5 * batch;
  float *x = malloc(sizeof *x * (size_t)(big * f)), *out = malloc(sizeof *out * (size_t)big * 5);
  float *small = malloc(sizeof *small * (size_t)batch * 5);
  for (int64_t r = 0; r < big; r++) { /* device d's rows: its share of xs, 5 times */
    int64_t d = r / (5 * share), k = r % share;
    int64_t src = same_pieces ? d * share + k : r % batch;
    memcpy(x + r * f, (const float *)xs->data + src * f, sizeof *x * (size_t)f);
  }
  int64_t xshape[2] = {big, f}, oshape[2] = {big, 5}, sshape[2] = {batch, 5};
  pmap_array bx = pmap_array_f32(x, 2, xshape), bo = pmap_array_f32(out, 2, oshape);
  pmap_array so = pmap_array_f32(small, 2, sshape);
  CHECK_OK(pmap_predict(p, &bx, &bo));
  for (int d = 0; d < 4; d++) {
    size_t used = in_use(ctx, d) - base[d];
    CHECK(used <= total, "%s: device %d holds %zu bytes after predicting %lld rows, the plan %zu",
          what, d, used, (long long)big, total);
  }
  if (same_pieces) {
    CHECK_OK(pmap_predict(p, xs, &so));
    long bad = 0;
    for (int64_t r = 0; r < big; r++) {
      int64_t d = r / (5 * share), k = r % share;
      bad += memcmp(out + r * 5, small + (d * share + k) * 5, 5 * sizeof *out) != 0;
    }
    CHECK(bad == 0, "%s: %ld of %lld rows predicted in pieces differ from the step-sized call",
          what, bad, (long long)big);
  }
  /* A change of precision and a shrink release the activations: the pieces stay those of the
   * step, within the plan at the new precision. */
  int64_t batch_rows = xs->shape[0];
  for (int k = 0; k < 3; k++) {
    if (k < 2)
      CHECK_OK(pmap_params_set_precision(p, k == 0 ? PMAP_PRECISION_BF16 : PMAP_PRECISION_FP32));
    else
      CHECK_OK(pmap_params_shrink(p));
    pmap_memory_plan plan;
    CHECK_OK(pmap_params_memory(p, batch_rows, &plan));
    CHECK_OK(pmap_predict(p, &bx, &bo));
    for (int d = 0; d < 4; d++) {
      size_t used = in_use(ctx, d) - base[d];
      CHECK(used <= plan.total, "%s: after %s, device %d holds %zu bytes, the plan %zu", what,
            k == 0   ? "bf16"
            : k == 1 ? "fp32 again"
                     : "a shrink",
            d, used, plan.total);
    }
  }
  free(x), free(out), free(small);
}

static void plan_case(const char *what, int shard, int uneven, int micro, int batchnorm,
                      int64_t batch) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = 4,
                     .shard_optimizer = shard,
                     .uneven_batches = uneven};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  if (!ctx) return;
  size_t base[4];
  for (int d = 0; d < 4; d++) base[d] = in_use(ctx, d);
  pmap_model *m = small_model(batchnorm);
  pmap_optimizer opt = pmap_adam(0.01f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, &opt, 7, &p));
  CHECK_OK(pmap_params_set_micro_batches(p, micro));
  pmap_memory_plan plan;
  CHECK_OK(pmap_params_memory(p, batch, &plan));
  CHECK(plan.total == plan.params + plan.grads + plan.optimizer + plan.state + plan.activations +
                          plan.staging,
        "%s: the total %zu is not the sum of its parts", what, plan.total);
  CHECK(plan.staging == 0 && plan.device_free == SIZE_MAX, "%s: CPU staging %zu, free %zu", what,
        plan.staging, plan.device_free);
  CHECK(plan.optimizer_sharded == pmap_params_sharded(p), "%s: sharded %d, params say %d", what,
        plan.optimizer_sharded, pmap_params_sharded(p));
  CHECK(plan.optimizer == pmap_params_optimizer_bytes(p), "%s: optimizer %zu, params say %zu", what,
        plan.optimizer, pmap_params_optimizer_bytes(p));
  CHECK((plan.state > 0) == (batchnorm != 0), "%s: state %zu", what, plan.state);
  CHECK(plan.grads_sharded == (shard == PMAP_SHARD_GRADS), "%s: gradients sharded %d", what,
        plan.grads_sharded);
  float *x = calloc((size_t)batch * 12, sizeof *x);
  int32_t *y = calloc((size_t)batch, sizeof *y);
  for (int64_t i = 0; i < batch * 12; i++) x[i] = (float)((i * 37) % 11) / 11.0f;
  for (int64_t i = 0; i < batch; i++) y[i] = (int32_t)(i % 5);
  int64_t xs_shape[2] = {batch, 12}, ys_shape[1] = {batch};
  pmap_array xs = pmap_array_f32(x, 2, xs_shape), ys = pmap_array_i32(y, 1, ys_shape);
  float loss = 0;
  CHECK_OK(pmap_update(p, &xs, &ys, &loss));
  for (int d = 0; d < 4; d++) {
    size_t used = in_use(ctx, d) - base[d];
    /* Device 0 takes the most rows (uneven batches give the first devices one more). */
    if (d == 0 || batch % 4 == 0)
      CHECK(used == plan.total, "%s: device %d holds %zu bytes, the plan says %zu", what, d, used,
            plan.total);
    else
      CHECK(used <= plan.total, "%s: device %d holds %zu bytes, over the plan's %zu", what, d, used,
            plan.total);
  }
  predict_within_plan(what, ctx, p, &xs, micro == 1 && batch % 4 == 0, base, plan.total);
  CHECK_FAILS(pmap_params_memory(p, 3, &plan), PMAP_ERR_INVALID_ARGUMENT, "batch 3");
  /* A batch pmap_update would refuse is not planned either. */
  if (!uneven)
    CHECK_FAILS(pmap_params_memory(p, batch + 1, &plan), PMAP_ERR_INVALID_ARGUMENT,
                "not a multiple");
  else
    CHECK_OK(pmap_params_memory(p, batch + 1, &plan));
  CHECK_FAILS(pmap_params_memory(p, batch, NULL), PMAP_ERR_INVALID_ARGUMENT, "out is NULL");
  CHECK_FAILS(pmap_params_memory(NULL, batch, &plan), PMAP_ERR_INVALID_ARGUMENT, "params");
  pmap_params_destroy(p);
  for (int d = 0; d < 4; d++)
    CHECK(in_use(ctx, d) == base[d], "%s: device %d holds %zu bytes after destroy, %zu before",
          what, d, in_use(ctx, d), base[d]);
  pmap_model_destroy(m);
  free(x);
  free(y);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* One step of small_model at `batch` on a 2-device context of the given max_memory: the
 * status, the parameters after it (n floats), what device 0 holds, and the plan. */
static pmap_status limited_step(size_t limit, int64_t batch, float *w, size_t n, size_t *held,
                                pmap_memory_plan *plan, char *msg, size_t msg_size) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .max_memory = limit};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  pmap_model *m = small_model(0);
  pmap_optimizer opt = pmap_adam(0.01f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, &opt, 7, &p));
  CHECK_OK(pmap_params_memory(p, batch, plan));
  float *x = calloc((size_t)batch * 12, sizeof *x), before[1024];
  int32_t *y = calloc((size_t)batch, sizeof *y);
  for (int64_t i = 0; i < batch * 12; i++) x[i] = (float)((i * 37) % 11) / 11.0f;
  for (int64_t i = 0; i < batch; i++) y[i] = (int32_t)(i % 5);
  int64_t xs_shape[2] = {batch, 12}, ys_shape[1] = {batch};
  pmap_array xs = pmap_array_f32(x, 2, xs_shape), ys = pmap_array_i32(y, 1, ys_shape);
  CHECK(n == pmap_params_count(p) && n <= 1024, "params count %zu", pmap_params_count(p));
  CHECK_OK(pmap_params_read(p, 0, before, n));
  float loss = 0;
  pmap_status st = pmap_update(p, &xs, &ys, &loss);
  snprintf(msg, msg_size, "%s", st ? pmap_last_error() : "");
  CHECK_OK(pmap_params_read(p, 0, w, n));
  if (st) /* a step refused for memory changes nothing */
    CHECK(memcmp(before, w, n * sizeof *w) == 0, "limit %zu: the failed step changed the params",
          limit);
  *held = in_use(ctx, 0);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  free(x);
  free(y);
  CHECK_OK(pmap_ctx_destroy(ctx));
  return st;
}

/* pmap_config.max_memory: a limit of exactly the plan trains as without one, to the bit; one
 * byte less is refused at the step's first allocation past it, naming the limit, with the
 * parameters unchanged. */
static void memory_limit(void) {
  enum { N = 12 * 32 + 32 + 32 * 5 + 5 };
  float free_w[N], at_w[N], under_w[N];
  size_t held = 0;
  pmap_memory_plan plan;
  char msg[1024];
  CHECK_OK(limited_step(0, 64, free_w, N, &held, &plan, msg, sizeof msg));
  CHECK(held == plan.total, "no limit: device 0 holds %zu, the plan %zu", held, plan.total);
  CHECK_OK(limited_step(plan.total, 64, at_w, N, &held, &plan, msg, sizeof msg));
  CHECK(memcmp(free_w, at_w, sizeof at_w) == 0, "a limit at the plan changed the step's result");
  pmap_status st = limited_step(plan.total - 1, 64, under_w, N, &held, &plan, msg, sizeof msg);
  CHECK(st == PMAP_ERR_OUT_OF_MEMORY, "a limit 1 byte under the plan: %s (%s)",
        pmap_status_string(st), msg);
  CHECK(strncmp(msg, "pmap_update: ", 13) == 0 && strstr(msg, "pmap_config.max_memory"),
        "the refusal says \"%s\"", msg);
  CHECK(held < plan.total, "under the limit device 0 holds %zu of the plan's %zu", held,
        plan.total);
  /* A context whose limit is below the parameters refuses the params, naming it. */
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .max_memory = 100};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  pmap_model *m = small_model(0);
  pmap_optimizer opt = pmap_adam(0.01f);
  pmap_params *p = NULL;
  CHECK_FAILS(pmap_params_create(ctx, m, &opt, 7, &p), PMAP_ERR_OUT_OF_MEMORY,
              "pmap_config.max_memory");
  CHECK(p == NULL && in_use(ctx, 0) == 0 && in_use(ctx, 1) == 0,
        "a refused params left %zu and %zu bytes", in_use(ctx, 0), in_use(ctx, 1));
  pmap_model_destroy(m);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* Under bf16 the plan holds the GEMMs' workspace too (oneDNN's scratchpads, or the portable
 * path's widened operands): a few steps of a small transformer (token dense layers, attention's
 * per-head products, the head tied or not) and of an MLP on 2 devices, on the provider in use
 * and on each one forced, allocate exactly the plan, and none of their GEMMs takes scratch
 * outside it. */
static pmap_model *small_gpt(int tied) {
  int64_t in[1] = {16};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_embedding(m, 40, 32));
  CHECK_OK(pmap_model_add_pos_embedding(m));
  CHECK_OK(pmap_model_begin_residual(m));
  CHECK_OK(pmap_model_add_token_layernorm(m));
  CHECK_OK(pmap_model_add_causal_attention(m, 2, 16));
  CHECK_OK(pmap_model_end_residual(m));
  CHECK_OK(pmap_model_add_token_dense(m, 64));
  CHECK_OK(pmap_model_add_gelu(m));
  CHECK_OK(pmap_model_add_token_dense(m, 32));
  CHECK_OK(pmap_model_add_lm_head(m, tied));
  return m;
}

static void plan16_case(const char *provider, int gpt, int tied, int micro, int64_t batch) {
  char what[96];
  snprintf(what, sizeof what, "bf16 on %s, %s%s, %d micro-batches, batch %lld", provider,
           gpt ? "transformer" : "mlp", gpt ? (tied ? " tied" : " untied") : "", micro,
           (long long)batch);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  if (!ctx) return;
  size_t base[2];
  for (int d = 0; d < 2; d++) base[d] = in_use(ctx, d);
  pmap_model *m = gpt ? small_gpt(tied) : small_model(0);
  pmap_optimizer opt = pmap_adam(0.01f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, &opt, 7, &p));
  CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16));
  CHECK_OK(pmap_params_set_micro_batches(p, micro));
  pmap_memory_plan plan, plan32;
  CHECK_OK(pmap_params_memory(p, batch, &plan));
  int64_t width = gpt ? 16 : 12;
  size_t n = (size_t)(batch * width);
  float *x = calloc(n, sizeof *x);
  int32_t *ids = calloc(n, sizeof *ids), *y = calloc(n, sizeof *y);
  for (size_t i = 0; i < n; i++) {
    x[i] = (float)((i * 37) % 11) / 11.0f;
    ids[i] = (int32_t)((i * 7 + 3) % 40);
    y[i] = (int32_t)((i * 11 + 1) % (gpt ? 40 : 5));
  }
  int64_t xs_shape[2] = {batch, width}, ys_shape[2] = {batch, 16};
  pmap_array xs = gpt ? pmap_array_i32(ids, 2, xs_shape) : pmap_array_f32(x, 2, xs_shape);
  pmap_array ys = pmap_array_i32(y, gpt ? 2 : 1, ys_shape);
  uint64_t before = cpu_bf16_unplanned();
  float loss = 0;
  for (int s = 0; s < 2; s++) CHECK_OK(pmap_update(p, &xs, &ys, &loss));
  CHECK(cpu_bf16_unplanned() == before, "%s: %llu GEMMs took scratch outside the plan", what,
        (unsigned long long)(cpu_bf16_unplanned() - before));
  for (int d = 0; d < 2; d++)
    CHECK(in_use(ctx, d) - base[d] == plan.total,
          "%s: device %d holds %zu bytes, the plan says %zu", what, d, in_use(ctx, d) - base[d],
          plan.total);
  /* The workspace is in the plan: more than the same params' plan under fp32 by at least the
   * bfloat16 copies' bytes alone would explain (which are 2 per parameter and activation kept). */
  CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_FP32));
  CHECK_OK(pmap_params_memory(p, batch, &plan32));
  CHECK(plan.params == plan32.params + pmap_params_count(p) * 2,
        "%s: params %zu against fp32's %zu", what, plan.params, plan32.params);
  pmap_params_destroy(p);
  for (int d = 0; d < 2; d++)
    CHECK(in_use(ctx, d) == base[d], "%s: device %d holds %zu bytes after destroy, %zu before",
          what, d, in_use(ctx, d), base[d]);
  pmap_model_destroy(m);
  free(x), free(ids), free(y);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* pmap_config.max_memory and a switch of precision after a step: the switch fits under a limit
 * that a step at either precision fits in (the activations go before the bfloat16 copy comes),
 * on a transformer, whose bf16 activations are the smaller. */
static void precision_switch_limit(void) {
  size_t plan32 = 0, plan16 = 0;
  for (int pass = 0; pass < 2; pass++) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                       .num_devices = 2,
                       .max_memory = pass ? (plan32 > plan16 ? plan32 : plan16) : 0};
    pmap_ctx *ctx = NULL;
    CHECK_OK(pmap_ctx_create(&cfg, &ctx));
    pmap_model *m = small_gpt(1);
    pmap_optimizer opt = pmap_adam(0.01f);
    pmap_params *p = NULL;
    CHECK_OK(pmap_params_create(ctx, m, &opt, 7, &p));
    int32_t ids[16 * 16], y[16 * 16];
    for (int i = 0; i < 16 * 16; i++) ids[i] = (i * 7 + 3) % 40, y[i] = (i * 11 + 1) % 40;
    int64_t shape[2] = {16, 16}; /* 16 rows: bf16's activations are below fp32's */
    pmap_array xs = pmap_array_i32(ids, 2, shape), ys = pmap_array_i32(y, 2, shape);
    pmap_memory_plan plan;
    CHECK_OK(pmap_params_memory(p, 16, &plan));
    plan32 = plan.total;
    CHECK_OK(pmap_update(p, &xs, &ys, NULL));
    CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_BF16));
    CHECK_OK(pmap_params_memory(p, 16, &plan));
    plan16 = plan.total;
    CHECK_OK(pmap_update(p, &xs, &ys, NULL));
    CHECK_OK(pmap_params_set_precision(p, PMAP_PRECISION_FP32));
    CHECK_OK(pmap_update(p, &xs, &ys, NULL));
    pmap_params_destroy(p);
    pmap_model_destroy(m);
    CHECK_OK(pmap_ctx_destroy(ctx));
  }
}

static void plan16(void) {
  const char *in_use_now = pmap_bf16_provider();
  const char *providers[] = {in_use_now, "portable", "onednn"};
  for (int i = 0; i < 3; i++) {
    if (i > 0 && cpu_bf16_force(providers[i]) != PMAP_SUCCESS) continue; /* not built */
    plan16_case(providers[i], 1, 1, 1, 8);
    plan16_case(providers[i], 1, 0, 2, 12);
    plan16_case(providers[i], 0, 0, 1, 64);
  }
  CHECK_OK(cpu_bf16_force(in_use_now));
}

static void trace_misuse(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  if (!ctx) return;
  char path[] = "/tmp/pmap-observe-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  close(fd);
  CHECK_FAILS(pmap_trace_start(NULL, path, NULL), PMAP_ERR_INVALID_ARGUMENT, "ctx is NULL");
  CHECK_FAILS(pmap_trace_start(ctx, NULL, NULL), PMAP_ERR_INVALID_ARGUMENT, "path");
  CHECK_FAILS(pmap_trace_start(ctx, "", NULL), PMAP_ERR_INVALID_ARGUMENT, "path");
  CHECK_FAILS(pmap_trace_start(ctx, path, "abc"), PMAP_ERR_INVALID_ARGUMENT, "\"abc\"");
  CHECK_FAILS(pmap_trace_start(ctx, path, "5..2"), PMAP_ERR_INVALID_ARGUMENT, "\"5..2\"");
  CHECK_FAILS(pmap_trace_start(ctx, path, "0"), PMAP_ERR_INVALID_ARGUMENT, "\"0\"");
  CHECK_FAILS(pmap_trace_start(ctx, path, "1..20000"), PMAP_ERR_INVALID_ARGUMENT, "1..20000");
  CHECK_FAILS(pmap_trace_start(ctx, "/nonexistent-dir/t.json", NULL), PMAP_ERR_UNAVAILABLE,
              "/nonexistent-dir/t.json");
  { /* the writer's reason once, whole, after the call's name */
    const char *e = pmap_last_error(), *again = strstr(e, "cannot write the trace");
    CHECK(!strncmp(e, "pmap_trace_start: cannot write the trace: ", 42) && again &&
              !strstr(again + 1, "cannot write the trace") && strstr(e, "No such file"),
          "unwritable trace: \"%s\"", e);
  }
  CHECK_FAILS(pmap_trace_stop(ctx), PMAP_ERR_INVALID_ARGUMENT, "no trace");
  CHECK_OK(pmap_trace_start(ctx, path, "4"));
  CHECK_FAILS(pmap_trace_start(ctx, path, NULL), PMAP_ERR_INVALID_ARGUMENT, "already");
  CHECK_OK(pmap_trace_stop(ctx));
  CHECK_FAILS(pmap_trace_stop(ctx), PMAP_ERR_INVALID_ARGUMENT, "no trace");
  CHECK_FAILS(pmap_trace_stop(NULL), PMAP_ERR_INVALID_ARGUMENT, "ctx is NULL");
  FILE *f = fopen(path, "r");
  char head[32] = "";
  CHECK(f && fgets(head, sizeof head, f) && !strncmp(head, "{\"traceEvents\"", 14),
        "the file of an empty recording starts \"%s\"", head);
  if (f) fclose(f);
  remove(path);

  /* A recording whose folder is gone by pmap_ctx_destroy: destroy succeeds and the thread's last
   * error stays the one of the last failed call. */
  {
    pmap_ctx *c2 = NULL;
    CHECK_OK(pmap_ctx_create(&cfg, &c2));
    char dir[] = "/tmp/pmap-observe-XXXXXX", file[64];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(file, sizeof file, "%s/t.json", dir);
    CHECK_OK(pmap_trace_start(c2, file, NULL));
    remove(file);
    rmdir(dir);
    CHECK_FAILS(pmap_trace_stop(NULL), PMAP_ERR_INVALID_ARGUMENT, "ctx is NULL");
    char before_msg[256];
    snprintf(before_msg, sizeof before_msg, "%s", pmap_last_error());
    CHECK_OK(pmap_ctx_destroy(c2));
    CHECK(!strcmp(pmap_last_error(), before_msg), "destroy changed the last error to \"%s\"",
          pmap_last_error());
  }

  /* The waits: every device met every collective of the steps. */
  pmap_device_waits w[2];
  CHECK_FAILS(pmap_ctx_waits(ctx, w, 3), PMAP_ERR_INVALID_ARGUMENT, "count 3");
  CHECK_FAILS(pmap_ctx_waits(ctx, NULL, 2), PMAP_ERR_INVALID_ARGUMENT, "out is NULL");
  CHECK_OK(pmap_ctx_waits(ctx, w, 2));
  int64_t before = w[0].collectives;
  pmap_model *m = small_model(0);
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, &opt, 1, &p));
  float x[8 * 12] = {0};
  int32_t y[8] = {0};
  int64_t xs_shape[2] = {8, 12}, ys_shape[1] = {8};
  pmap_array xs = pmap_array_f32(x, 2, xs_shape), ys = pmap_array_i32(y, 1, ys_shape);
  for (int i = 0; i < 3; i++) CHECK_OK(pmap_update(p, &xs, &ys, NULL));
  CHECK_OK(pmap_ctx_waits(ctx, w, 2));
  for (int d = 0; d < 2; d++) {
    /* The params' broadcast and one all-reduce per step. */
    CHECK(w[d].device == d && w[d].collectives - before == 4,
          "device %d: %lld collectives, want %lld", d, (long long)w[d].collectives,
          (long long)before + 4);
    CHECK(w[d].busy_s > 0 && w[d].wait_s >= 0 && w[d].held_s >= 0, "device %d: %g %g %g", d,
          w[d].busy_s, w[d].wait_s, w[d].held_s);
  }
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* How many spans of track `tid` in the trace file at path are named `name` (a name ending in a
 * space: whose name starts so); *dropped: the file's dropped_spans. */
static int spans_named(const char *path, int tid, const char *name, long long *dropped) {
  FILE *f = fopen(path, "r");
  char line[1024], want[256];
  int n = 0, t = -1;
  size_t len = strlen(name);
  snprintf(want, sizeof want, "\"name\": \"%s%s", name, len && name[len - 1] == ' ' ? "" : "\", ");
  while (f && fgets(line, sizeof line, f)) {
    const char *d = strstr(line, "\"dropped_spans\": ");
    if (d) *dropped = atoll(d + 17);
    if (strncmp(line, "{\"ph\": \"X\"", 10) || !strstr(line, want)) continue;
    const char *at = strstr(line, "\"tid\": ");
    if (at && sscanf(at, "\"tid\": %d", &t) == 1 && t == tid) n++;
  }
  if (f) fclose(f);
  return n;
}

/* A step past the span limit of a track (base/trace.h): 1100 micro-batches through 32 layers
 * record over 71 000 spans on each device; layers' spans past the limit are dropped, while the
 * step's own span, its reduction with the waits in it and the optimizer are kept. */
static void trace_cap(int shard) {
  enum { N = 2, K = 1100, L = 32, F = 4 };
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = N,
                     .shard_optimizer = shard ? PMAP_SHARD_ON : PMAP_SHARD_OFF};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  int64_t in[1] = {F}, shape[2] = {N * K, F};
  static float x[N * K * F], y[N * K * F];
  for (int i = 0; i < N * K * F; i++) x[i] = (float)(i % 7) / 7.0f, y[i] = (float)(i % 3);
  pmap_array xs = pmap_array_f32(x, 2, shape), ys = pmap_array_f32(y, 2, shape);
  char path[] = "/tmp/pmap-observe-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  close(fd);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_model_create(1, in, &m));
  for (int i = 0; m && i < L; i++) CHECK_OK(pmap_model_add_dense(m, F));
  pmap_optimizer opt = pmap_adam(1e-3f);
  if (ctx && m) CHECK_OK(pmap_params_create(ctx, m, &opt, 1, &p));
  if (p) {
    CHECK_OK(pmap_params_set_micro_batches(p, K));
    CHECK_OK(pmap_trace_start(ctx, path, "1"));
    for (int s = 0; s < 2; s++) CHECK_OK(pmap_update(p, &xs, &ys, NULL));
    CHECK_OK(pmap_trace_stop(ctx));
    const char *reduce[] = {"pmap_update's all-reduce", "pmap_update's reduce-scatter",
                            "pmap_update's exchange of norms", "pmap_update's all-gather"};
    long long dropped = -1;
    for (int d = 0; d < N; d++) {
      int layers = spans_named(path, d, "forward dense ", &dropped);
      CHECK(layers > 0 && layers < K * L,
            "%s device %d: %d of %d forward spans kept: the limit was not reached",
            shard ? "sharded" : "replicated", d, layers, K * L);
      CHECK(spans_named(path, d, "step", &dropped) == 1, "device %d: the step's span is lost", d);
      CHECK(spans_named(path, d, "optimizer", &dropped) == 1, "device %d: the optimizer is lost",
            d);
      for (int c = shard ? 1 : 0; c < (shard ? 4 : 1); c++) {
        char wait[64];
        snprintf(wait, sizeof wait, "wait %s", reduce[c]);
        CHECK(spans_named(path, d, reduce[c], &dropped) == 1 &&
                  spans_named(path, d, wait, &dropped) == 1,
              "device %d: %s or its wait is lost", d, reduce[c]);
      }
    }
    CHECK(spans_named(path, N, "pmap_update", &dropped) == 1, "the caller's pmap_update is lost");
    CHECK(dropped > 0, "no span was dropped (%lld)", dropped);
  }
  remove(path);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

int main(void) {
  plan_case("replicated", PMAP_SHARD_OFF, 0, 1, 0, 64);
  plan_case("sharded", PMAP_SHARD_ON, 0, 1, 0, 64);
  plan_case("micro-batches", PMAP_SHARD_OFF, 0, 3, 0, 64);
  plan_case("batch norm", PMAP_SHARD_OFF, 0, 1, 1, 32);
  plan_case("uneven", PMAP_SHARD_OFF, 1, 2, 0, 67);
  plan_case("sharded gradients", PMAP_SHARD_GRADS, 0, 1, 0, 64);
  plan_case("sharded gradients, batch norm, uneven", PMAP_SHARD_GRADS, 1, 1, 1, 67);
  plan16();
  memory_limit();
  precision_switch_limit();
  trace_misuse();
  trace_cap(0);
  trace_cap(1);
  return test_exit("test_observe");
}
