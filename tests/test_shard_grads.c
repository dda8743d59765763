/* test_shard_grads.c: sharded gradients (PMAP_SHARD_GRADS, ZeRO stage 2) against the sharded
 * optimizer alone (PMAP_SHARD_ON) and the replicated step. On CPU all three must give bitwise
 * the same losses, parameters and optimizer state (compared as checkpoint files): every example
 * model (the transformer's tied table is reduced after the embedding, its other layers one by
 * one), SGD, momentum and Adam, N = 2, 3, 4, 8; then clipping, uneven batches, the guard off,
 * bf16, recomputation, the numeric guard's skipped step (the same message, naming the device,
 * for an injected fault and for non-finite inputs); a failed step (nothing changed); the plan's bytes (a part, not the whole
 * gradient); and what is refused: micro-batches, and a setting out of range. */
#include <math.h>
#include <unistd.h>

#include "shard_util.h"

static char dir[64];

typedef struct setup {
  int n, uneven, guard, recompute;
  pmap_precision precision;
  int sharded; /* 1: the gradients must be sharded (the model's layers are small enough) */
} setup;

static int open_run(run *r, const char *name, const pmap_optimizer *opt, const setup *s,
                    int shard) {
  memset(r, 0, sizeof *r);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = s->n,
                     .uneven_batches = s->uneven,
                     .numeric_guard = s->guard ? s->guard : PMAP_GUARD_ON,
                     .recompute = s->recompute,
                     .shard_optimizer = shard};
  CHECK_OK(pmap_ctx_create(&cfg, &r->ctx));
  CHECK_OK(pmap_example_model(name, &r->model));
  if (!r->ctx || !r->model) return -1;
  CHECK_OK(pmap_params_create(r->ctx, r->model, opt, 7, &r->params));
  if (r->params && s->precision == PMAP_PRECISION_BF16)
    CHECK_OK(pmap_params_set_precision(r->params, PMAP_PRECISION_BF16));
  return r->params ? 0 : -1;
}

/* `steps` steps of batch b on the runs from the same data: every status, message and loss the
 * same; bad_step (>= 0): the step whose inputs of row bad_row are made NaN. */
static void step_all(const char *what, run *r, int count, pmap_array *xs, const pmap_array *ys,
                     int64_t b_rows, int steps, int bad_step, int64_t bad_row) {
  size_t row = (size_t)(pmap_array_numel(xs) / xs->shape[0]);
  for (int t = 0; t < steps; t++) {
    pmap_array x, y;
    int64_t at = (int64_t)t * b_rows % (xs->shape[0] - b_rows + 1);
    rows_of(xs, ys, at, b_rows, &x, &y);
    float *bad = (float *)xs->data + (size_t)(at + bad_row) * row, keep = 0.0f;
    if (t == bad_step) keep = bad[0], bad[0] = NAN;
    float loss[3] = {-1.0f, -2.0f, -3.0f};
    pmap_status st[3];
    char msg[3][1024];
    for (int k = 0; k < count; k++) {
      st[k] = pmap_update(r[k].params, &x, &y, &loss[k]);
      snprintf(msg[k], sizeof msg[k], "%s", st[k] ? pmap_last_error() : "");
    }
    if (t == bad_step) bad[0] = keep;
    for (int k = 1; k < count; k++) {
      CHECK(st[k] == st[0], "%s step %d: status %s (run 0) vs %s (run %d): %s", what, t,
            pmap_status_string(st[0]), pmap_status_string(st[k]), k, msg[k]);
      if (st[0] == PMAP_SUCCESS)
        CHECK(memcmp(&loss[0], &loss[k], sizeof loss[0]) == 0,
              "%s step %d: loss %.9g (run 0) vs %.9g (run %d)", what, t, (double)loss[0],
              (double)loss[k], k);
      else
        CHECK(!strcmp(msg[0], msg[k]), "%s step %d: messages differ:\n  %s\n  %s", what, t, msg[0],
              msg[k]);
    }
  }
}

/* One model and setup: replicated, the optimizer sharded and the gradients sharded, stepped
 * alike, then compared; the gradient run's plan holds a part of the gradients. */
static void compare(const char *what, const char *model, pmap_optimizer opt, setup s, int64_t batch,
                    int steps, int bad_step, int64_t bad_row) {
  pmap_array xs, ys;
  CHECK_OK(pmap_example_data(model, 5, 64, &xs, &ys));
  run r[3];
  memset(r, 0, sizeof r);
  int modes[3] = {PMAP_SHARD_OFF, PMAP_SHARD_ON, PMAP_SHARD_GRADS};
  int ok = xs.data != NULL;
  for (int k = 0; k < 3 && ok; k++) ok = !open_run(&r[k], model, &opt, &s, modes[k]);
  if (ok) {
    pmap_memory_plan on, gr;
    CHECK_OK(pmap_params_memory(r[1].params, batch, &on));
    CHECK_OK(pmap_params_memory(r[2].params, batch, &gr));
    CHECK(on.grads_sharded == 0 && (s.n > 1 || !gr.grads_sharded) &&
              gr.optimizer_sharded == (s.n > 1) && gr.optimizer == on.optimizer &&
              gr.params == on.params && gr.activations == on.activations,
          "%s: the plans: grads sharded %d and %d, optimizer sharded %d, optimizer %zu and %zu",
          what, on.grads_sharded, gr.grads_sharded, gr.optimizer_sharded, on.optimizer,
          gr.optimizer);
    /* The part (P / N), the window (the largest layer) and a tied table against the whole:
     * where that is not less (a model of mostly one layer) the gradients stay whole. The
     * transformer's layers are many and small. */
    CHECK(gr.grads_sharded >= s.sharded, "%s: the gradients are not sharded", what);
    CHECK(gr.grads_sharded ? gr.grads < on.grads : gr.grads == on.grads,
          "%s: gradients sharded %d in %zu bytes, whole %zu", what, gr.grads_sharded, gr.grads,
          on.grads);
    if (!strcmp(model, "gpt-mini"))
      CHECK(gr.grads_sharded && gr.grads * (size_t)s.n < 2 * on.grads,
            "%s: gradients sharded %d in %zu bytes on %d devices, whole %zu", what,
            gr.grads_sharded, gr.grads, s.n, on.grads);
    step_all(what, r, 3, &xs, &ys, batch, steps, bad_step, bad_row);
    same_state(dir, what, &r[1], &r[2]);
    same_state(dir, what, &r[0], &r[2]);
  }
  for (int k = 0; k < 3; k++) close_run(&r[k]);
  pmap_example_data_free(&xs, &ys);
}

static void grid(void) {
  const char *models[] = {"linear",    "mlp",      "convnet", "res-mlp",
                          "cifar-cnn", "cifar-bn", "gpt-mini"};
  pmap_optimizer opts[] = {pmap_sgd(0.01f, 0.0f), pmap_sgd(0.01f, 0.9f), pmap_adam(0.001f)};
  const char *opt_names[] = {"sgd", "momentum", "adam"};
  int ns[] = {2, 3, 4, 8};
  for (size_t m = 0; m < sizeof models / sizeof *models; m++)
    for (size_t o = 0; o < 3; o++)
      for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
        int gpt = !strcmp(models[m], "gpt-mini");
        /* Under TSan: every device count on mlp, every model on 3 devices (testutil.h); the
         * transformer with one optimizer. */
        if (TEST_UNDER_TSAN && strcmp(models[m], "mlp") != 0 && ns[k] != 3) continue;
        if (gpt && (o != 2 || ns[k] == 8)) continue;
        char what[96];
        snprintf(what, sizeof what, "%s %s N=%d", models[m], opt_names[o], ns[k]);
        compare(what, models[m], opts[o], (setup){.n = ns[k], .sharded = gpt}, gpt ? 2 * ns[k] : 24,
                gpt ? 2 : 3, -1, 0);
      }
}

static void variants(void) {
  pmap_optimizer clip = pmap_adam(0.01f);
  clip.clip_norm = 0.05f; /* below the norms of these gradients: every step clips */
  compare("clip", "res-mlp", clip, (setup){.n = 3, .sharded = 1}, 24, 3, -1, 0);
  compare("uneven", "mlp", pmap_adam(0.01f), (setup){.n = 4, .uneven = 1, .sharded = 1}, 27, 3, -1,
          0);
  compare("uneven batch norm", "cifar-bn", pmap_sgd(0.02f, 0.9f),
          (setup){.n = 8, .uneven = 1, .sharded = 1}, 29, 2, -1, 0);
  compare("guard off", "res-mlp", pmap_adam(0.01f),
          (setup){.n = 3, .guard = PMAP_GUARD_OFF, .sharded = 1}, 24, 3, -1, 0);
  if (TEST_UNDER_TSAN) { /* the transformer once (its layers' hooks, the tied table) */
    compare("gpt full recomputation", "gpt-mini", pmap_adam(0.001f),
            (setup){.n = 3, .recompute = PMAP_RECOMPUTE_FULL, .sharded = 1}, 6, 1, -1, 0);
    return;
  }
  compare("bf16", "mlp", pmap_adam(0.01f),
          (setup){.n = 4, .precision = PMAP_PRECISION_BF16, .sharded = 1}, 32, 3, -1, 0);
  compare("gpt bf16", "gpt-mini", pmap_adam(0.001f),
          (setup){.n = 2, .precision = PMAP_PRECISION_BF16, .sharded = 1}, 8, 2, -1, 0);
  compare("gpt full recomputation", "gpt-mini", pmap_adam(0.001f),
          (setup){.n = 3, .recompute = PMAP_RECOMPUTE_FULL, .sharded = 1}, 6, 2, -1, 0);
  compare("gpt selective recomputation", "gpt-mini", pmap_adam(0.001f),
          (setup){.n = 2, .recompute = PMAP_RECOMPUTE_SELECTIVE, .sharded = 1}, 8, 2, -1, 0);
}

/* The numeric guard: a step with a non-finite value on one device is skipped alike, with the
 * same message naming that device, on all three layouts, and they go on alike. */
static void guard(void) {
  /* Row 13 of 32 on 4 devices: device 1's. */
  compare("non-finite input", "mlp", pmap_adam(0.01f), (setup){.n = 4, .sharded = 1}, 32, 4, 1, 13);
  if (!TEST_UNDER_TSAN)
    compare("non-finite input, gpt", "gpt-mini", pmap_adam(0.001f), (setup){.n = 2, .sharded = 1},
            8, 3, 1, 5);
  /* Batch norm across the devices: the search for the sources watches its exchanges (its
   * gradients are sharded from 8 devices on). Row 9 of 32: device 2's. */
  compare("non-finite input, batch norm", "cifar-bn", pmap_adam(0.01f),
          (setup){.n = 8, .sharded = 1}, 32, 3, 1, 9);
  setenv("PMAP_FAULT", "nan:device=2:step=2", 1);
  compare("injected NaN", "res-mlp", pmap_adam(0.01f), (setup){.n = 3, .sharded = 1}, 24, 4, -1, 0);
  unsetenv("PMAP_FAULT");
}

/* A device's collective fails (PMAP_FAULT collective, after its backward pass and its
 * per-layer reductions): the step fails on every device with PMAP_ERR_DEVICE and changes
 * nothing, as under the sharded optimizer alone (the same message), and both go on alike. */
static void failed_step(void) {
  pmap_array xs, ys;
  CHECK_OK(pmap_example_data("gpt-mini", 5, 64, &xs, &ys));
  pmap_optimizer opt = pmap_adam(0.001f);
  setup s = {.n = 3, .sharded = 1};
  run r[2];
  memset(r, 0, sizeof r);
  setenv("PMAP_FAULT", "collective:device=2:step=2", 1);
  int ok = xs.data && !open_run(&r[0], "gpt-mini", &opt, &s, PMAP_SHARD_ON) &&
           !open_run(&r[1], "gpt-mini", &opt, &s, PMAP_SHARD_GRADS);
  unsetenv("PMAP_FAULT");
  if (ok) {
    pmap_array x, y;
    rows_of(&xs, &ys, 0, 6, &x, &y);
    CHECK_OK(pmap_update(r[1].params, &x, &y, NULL));
    CHECK_OK(pmap_update(r[0].params, &x, &y, NULL));
    char before[128], after[128];
    snprintf(before, sizeof before, "%s/before.ckpt", dir);
    snprintf(after, sizeof after, "%s/after.ckpt", dir);
    CHECK_OK(pmap_params_save(r[1].params, before));
    rows_of(&xs, &ys, 6, 6, &x, &y);
    CHECK_FAILS(pmap_update(r[1].params, &x, &y, NULL), PMAP_ERR_DEVICE,
                "device 2: the gradient reduce-scatter of step 2 failed");
    CHECK_OK(pmap_params_save(r[1].params, after));
    size_t la = 0, lb = 0;
    unsigned char *a = slurp(before, &la), *b = slurp(after, &lb);
    CHECK(a && b && la == lb && !memcmp(a, b, la), "the failed step changed the state");
    free(a);
    free(b);
    unlink(before);
    unlink(after);
    CHECK_FAILS(pmap_update(r[0].params, &x, &y, NULL), PMAP_ERR_DEVICE,
                "device 2: the gradient reduce-scatter of step 2 failed");
    step_all("after a failed step", r, 2, &xs, &ys, 6, 2, -1, 0);
    same_state(dir, "after a failed step", &r[0], &r[1]);
  }
  for (int k = 0; k < 2; k++) close_run(&r[k]);
  pmap_example_data_free(&xs, &ys);
}

/* A model of a few dozen parameters on 8 devices: the parts of devices 2 to 7 hold none (their
 * parts are of the loss, the flags and padding). PMAP_FAULT's nan on device 5 must still skip
 * the step, naming it, as on the other layouts; then they go on alike. */
static void empty_parts(void) {
  enum { N = 8, B = 32, IN = 3 };
  float x[B * IN];
  int32_t y[B];
  for (int i = 0; i < B * IN; i++) x[i] = (float)((i * 7 + 2) % 11) / 11.0f - 0.5f;
  for (int i = 0; i < B; i++) y[i] = i % 2;
  int64_t xs_shape[2] = {B, IN}, ys_shape[1] = {B};
  pmap_array xs = pmap_array_f32(x, 2, xs_shape), ys = pmap_array_i32(y, 1, ys_shape);
  pmap_optimizer opt = pmap_adam(0.05f);
  int modes[3] = {PMAP_SHARD_OFF, PMAP_SHARD_ON, PMAP_SHARD_GRADS};
  run r[3];
  memset(r, 0, sizeof r);
  setenv("PMAP_FAULT", "nan:device=5:step=2", 1);
  int ok = 1;
  for (int k = 0; k < 3 && ok; k++) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = N, .shard_optimizer = modes[k]};
    int64_t in[1] = {IN};
    CHECK_OK(pmap_ctx_create(&cfg, &r[k].ctx));
    CHECK_OK(pmap_model_create(1, in, &r[k].model));
    ok = r[k].ctx && r[k].model;
    if (ok) {
      CHECK_OK(pmap_model_add_dense(r[k].model, 3));
      CHECK_OK(pmap_model_add_tanh(r[k].model));
      CHECK_OK(pmap_model_add_dense(r[k].model, 3));
      CHECK_OK(pmap_model_add_tanh(r[k].model));
      CHECK_OK(pmap_model_add_dense(r[k].model, 2));
      CHECK_OK(pmap_model_set_loss(r[k].model, PMAP_LOSS_SOFTMAX_XENT));
      CHECK_OK(pmap_params_create(r[k].ctx, r[k].model, &opt, 3, &r[k].params));
      ok = r[k].params != NULL;
    }
  }
  unsetenv("PMAP_FAULT");
  if (ok) {
    pmap_memory_plan m;
    CHECK_OK(pmap_params_memory(r[2].params, B, &m));
    CHECK(m.grads_sharded, "a few dozen parameters on 8 devices: gradients sharded");
    /* A refused step comes again with the same batch: step_all's batches are the same. */
    step_all("empty parts", r, 3, &xs, &ys, B, 4, -1, 0);
    CHECK(pmap_params_step(r[2].params) == 3, "three steps taken, one skipped: %lld",
          (long long)pmap_params_step(r[2].params));
    same_state(dir, "empty parts", &r[1], &r[2]);
    same_state(dir, "empty parts", &r[0], &r[2]);
  }
  for (int k = 0; k < 3; k++) close_run(&r[k]);
}

/* What is refused, changing nothing; what falls back. */
static void refusals(void) {
  run r;
  pmap_optimizer opt = pmap_adam(0.01f);
  setup s = {.n = 2};
  if (!open_run(&r, "gpt-mini", &opt, &s, PMAP_SHARD_GRADS)) {
    pmap_memory_plan m;
    CHECK_OK(pmap_params_memory(r.params, 8, &m));
    CHECK(pmap_params_sharded(r.params) && m.grads_sharded, "the gradients and the optimizer");
    CHECK_FAILS(pmap_params_set_micro_batches(r.params, 2), PMAP_ERR_INVALID_ARGUMENT,
                "micro-batches with sharded gradients");
    CHECK(
        strstr(pmap_last_error(), "2 micro-batches") && strstr(pmap_last_error(), "PMAP_SHARD_ON"),
        "the message names the count and the way out: %s", pmap_last_error());
    CHECK_OK(pmap_params_set_micro_batches(r.params, 1));
  }
  close_run(&r);
  /* One device: nothing to shard. */
  s.n = 1;
  if (!open_run(&r, "mlp", &opt, &s, PMAP_SHARD_GRADS)) {
    pmap_memory_plan m;
    CHECK_OK(pmap_params_memory(r.params, 8, &m));
    CHECK(!m.grads_sharded && !m.optimizer_sharded, "one device shards nothing");
  }
  close_run(&r);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .shard_optimizer = 4};
  pmap_ctx *ctx = NULL;
  CHECK_FAILS(pmap_ctx_create(&cfg, &ctx), PMAP_ERR_INVALID_ARGUMENT, "shard_optimizer 4");
  CHECK(strstr(pmap_last_error(), "shard_optimizer 4") &&
            strstr(pmap_last_error(), "PMAP_SHARD_GRADS (3)"),
        "the message names the value and the choices: %s", pmap_last_error());
  /* A user's gradient function writes the whole gradient: its params shard the optimizer
   * alone, and step. */
  cfg.shard_optimizer = PMAP_SHARD_GRADS;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  float init[40] = {0}, x[4 * 40], y[4] = {1.0f, -1.0f, 0.5f, 2.0f};
  for (int i = 0; i < 4 * 40; i++) x[i] = (float)(i % 7) / 7.0f;
  pmap_array xs = {.dtype = PMAP_F32, .rank = 2, .shape = {4, 40}, .data = x};
  pmap_array ys = {.dtype = PMAP_F32, .rank = 1, .shape = {4}, .data = y};
  pmap_params *p = NULL;
  if (ctx) CHECK_OK(pmap_params_create_custom(ctx, 40, init, lsq, NULL, &opt, &p));
  if (p) {
    pmap_memory_plan m;
    CHECK_OK(pmap_params_memory(p, 4, &m));
    CHECK(m.optimizer_sharded && !m.grads_sharded, "custom: optimizer %d, gradients %d",
          m.optimizer_sharded, m.grads_sharded);
    float loss = 0.0f, w[40];
    CHECK_OK(pmap_update(p, &xs, &ys, &loss));
    CHECK_OK(pmap_params_read(p, 1, w, 40));
    CHECK(memcmp(w, init, sizeof w) != 0, "custom: the parameters moved");
    CHECK_OK(pmap_params_set_micro_batches(p, 2)); /* its gradients are whole */
  }
  pmap_params_destroy(p);
  if (ctx) CHECK_OK(pmap_ctx_destroy(ctx));
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/pmap-test-shard-grads-XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  refusals();
  empty_parts();
  failed_step();
  grid();
  variants();
  guard();
  char path[128];
  const char *files[] = {"a.ckpt", "b.ckpt"};
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  rmdir(dir);
  return test_exit("shard-grads");
}
