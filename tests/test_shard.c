/* test_shard.c: the sharded optimizer (pmap_config.shard_optimizer) against the replicated one.
 * On CPU both must give bitwise the same losses, parameters and optimizer state (compared as
 * checkpoint files, which hold the whole state): every example model, SGD, SGD with momentum and
 * Adam, N = 1, 2, 3, 4, 8 (parameter counts that N does not divide among them); then clipping,
 * the numeric guard's skipped step, micro-batches, uneven batches, AdamW with a schedule,
 * Nesterov and a user's gradient function; checkpoints across the two layouts; the state bytes
 * per device; and the setting's validation. */
#include <unistd.h>

#include "shard_util.h"

static char dir[64];
static int guard_mode = PMAP_GUARD_ON; /* the numeric guard of the contexts open_run makes */

static int open_run(run *r, const char *name, const pmap_optimizer *opt, int n, int shard,
                    int uneven) {
  memset(r, 0, sizeof *r);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = n,
                     .uneven_batches = uneven,
                     .numeric_guard = guard_mode,
                     .shard_optimizer = shard ? PMAP_SHARD_ON : PMAP_SHARD_OFF};
  CHECK_OK(pmap_ctx_create(&cfg, &r->ctx));
  CHECK_OK(pmap_example_model(name, &r->model));
  if (!r->ctx || !r->model) return -1;
  CHECK_OK(pmap_params_create(r->ctx, r->model, opt, 7, &r->params));
  return r->params ? 0 : -1;
}

/* `steps` steps of batch b on both runs from the same data; every loss and status the same. */
static void step_both(const char *what, run *a, run *b, const pmap_array *xs, const pmap_array *ys,
                      int64_t b_rows, int steps) {
  for (int t = 0; t < steps; t++) {
    pmap_array x, y;
    rows_of(xs, ys, (int64_t)t * b_rows % (xs->shape[0] - b_rows + 1), b_rows, &x, &y);
    float la = -1.0f, lb = -2.0f;
    pmap_status sa = pmap_update(a->params, &x, &y, &la);
    pmap_status sb = pmap_update(b->params, &x, &y, &lb);
    CHECK(sa == sb, "%s step %d: status %s (replicated) vs %s (sharded): %s", what, t,
          pmap_status_string(sa), pmap_status_string(sb), pmap_last_error());
    if (sa == PMAP_SUCCESS)
      CHECK(memcmp(&la, &lb, sizeof la) == 0,
            "%s step %d: loss %.9g (replicated) vs %.9g (sharded)", what, t, (double)la,
            (double)lb);
  }
}

static void grid(void) {
  const char *models[] = {"linear", "mlp", "convnet", "res-mlp", "cifar-cnn", "cifar-bn"};
  pmap_optimizer opts[] = {pmap_sgd(0.01f, 0.0f), pmap_sgd(0.01f, 0.9f), pmap_adam(0.001f)};
  const char *opt_names[] = {"sgd", "momentum", "adam"};
  int ns[] = {1, 2, 3, 4, 8};
  for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
    pmap_array xs, ys;
    CHECK_OK(pmap_example_data(models[m], 3, 48, &xs, &ys));
    if (!xs.data) continue;
    for (size_t o = 0; o < 3; o++)
      for (size_t k = 0; k < sizeof ns / sizeof *ns; k++) {
        /* Under TSan: every device count on mlp, every model on 3 devices (testutil.h). */
        if (TEST_UNDER_TSAN && strcmp(models[m], "mlp") != 0 && ns[k] != 3) continue;
        run a, b;
        char what[96];
        snprintf(what, sizeof what, "%s %s N=%d", models[m], opt_names[o], ns[k]);
        if (!open_run(&a, models[m], &opts[o], ns[k], 0, 0) &&
            !open_run(&b, models[m], &opts[o], ns[k], 1, 0)) {
          size_t P = pmap_params_count(a.params);
          if (o == 2 && ns[k] > 1) { /* Adam: two slots, each a part padded to 16 floats */
            size_t sb = pmap_params_optimizer_bytes(b.params),
                   ra = pmap_params_optimizer_bytes(a.params);
            CHECK(ra == 8 * P && sb <= 8 * (P / (size_t)ns[k] + 32) && (P < 1024 || sb < ra),
                  "%s: sharded state %zu bytes, replicated %zu, for %zu parameters", what, sb, ra,
                  P);
          }
          step_both(what, &a, &b, &xs, &ys, 24, 3);
          same_state(dir, what, &a, &b);
        }
        close_run(&a);
        close_run(&b);
      }
    pmap_example_data_free(&xs, &ys);
  }
}

/* One model, N devices, a variant of the settings: replicated against sharded. */
static void variant(const char *what, const char *model, pmap_optimizer opt, int n, int micro,
                    int uneven, int64_t batch, int steps) {
  pmap_array xs, ys;
  CHECK_OK(pmap_example_data(model, 5, 64, &xs, &ys));
  run a, b;
  if (xs.data && !open_run(&a, model, &opt, n, 0, uneven) &&
      !open_run(&b, model, &opt, n, 1, uneven)) {
    CHECK_OK(pmap_params_set_micro_batches(a.params, micro));
    CHECK_OK(pmap_params_set_micro_batches(b.params, micro));
    step_both(what, &a, &b, &xs, &ys, batch, steps);
    same_state(dir, what, &a, &b);
  }
  close_run(&a);
  close_run(&b);
  pmap_example_data_free(&xs, &ys);
}

static void variants(void) {
  pmap_optimizer clip = pmap_adam(0.01f);
  clip.clip_norm = 0.05f; /* below the norms of these gradients: every step clips */
  variant("clip 3", "mlp", clip, 3, 1, 0, 24, 4);
  variant("clip 8", "res-mlp", clip, 8, 1, 0, 32, 3);
  pmap_optimizer w = pmap_adamw(0.01f, 0.1f);
  w.schedule = PMAP_SCHEDULE_WARMUP_COSINE;
  w.warmup_steps = 2;
  w.decay_steps = 5;
  w.final_lr = 0.001f;
  variant("adamw cosine", "mlp", w, 4, 1, 0, 32, 5);
  pmap_optimizer nest = pmap_sgd(0.02f, 0.9f);
  nest.nesterov = 1;
  nest.weight_decay = 0.01f;
  variant("nesterov", "convnet", nest, 3, 1, 0, 24, 3);
  variant("micro-batches", "mlp", pmap_adam(0.01f), 4, 3, 0, 48, 3);
  variant("uneven", "mlp", pmap_adam(0.01f), 4, 1, 1, 27, 3);
  variant("uneven micro", "cifar-bn", pmap_sgd(0.02f, 0.9f), 3, 2, 1, 29, 2);
  /* The guard off: only [gradients | part | loss] is reduced, the flag slots lie in padding. */
  guard_mode = PMAP_GUARD_OFF;
  variant("guard off", "mlp", pmap_adam(0.01f), 3, 1, 0, 24, 3);
  variant("guard off, clip", "res-mlp", clip, 8, 1, 0, 32, 3);
  guard_mode = PMAP_GUARD_ON;
}

/* The numeric guard: device 1's gradients turn NaN at step 2 (PMAP_FAULT): both layouts skip
 * that step alike, change nothing, and go on alike. */
static void guard(void) {
  setenv("PMAP_FAULT", "nan:device=1:step=2", 1);
  variant("guard", "mlp", pmap_adam(0.01f), 4, 1, 0, 32, 4);
  unsetenv("PMAP_FAULT");
}

/* Five parameters over 17 devices: the loss and the 17 guard flags spread over several devices'
 * parts; device 8's gradients turn NaN at step 2. Both layouts skip that step alike (the same
 * message) and go on alike. */
static void spread_flags(void) {
  enum { P = 5, N = 17, B = 34 };
  float init[P] = {0.1f, -0.2f, 0.3f, 0.05f, -0.1f}, x[B * P], y[B];
  for (int i = 0; i < B * P; i++) x[i] = (float)((i * 29 + 3) % 13) / 13.0f - 0.5f;
  for (int i = 0; i < B; i++) y[i] = (float)(i % 3) * 0.5f;
  pmap_array xs = {.dtype = PMAP_F32, .rank = 2, .shape = {B, P}, .data = x};
  pmap_array ys = {.dtype = PMAP_F32, .rank = 1, .shape = {B}, .data = y};
  pmap_optimizer opt = pmap_adam(0.05f);
  pmap_ctx *ctx[2] = {NULL, NULL};
  pmap_params *p[2] = {NULL, NULL};
  setenv("PMAP_FAULT", "nan:device=8:step=2", 1);
  for (int s = 0; s < 2; s++) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                       .num_devices = N,
                       .shard_optimizer = s ? PMAP_SHARD_ON : PMAP_SHARD_OFF};
    CHECK_OK(pmap_ctx_create(&cfg, &ctx[s]));
    if (ctx[s]) CHECK_OK(pmap_params_create_custom(ctx[s], P, init, lsq, NULL, &opt, &p[s]));
  }
  unsetenv("PMAP_FAULT");
  CHECK(pmap_params_sharded(p[1]) && !pmap_params_sharded(p[0]), "one of each layout");
  for (int t = 0; p[0] && p[1] && t < 4; t++) {
    float l[2] = {0.0f, 0.0f};
    char msg[2][1024];
    pmap_status st[2];
    for (int s = 0; s < 2; s++) {
      st[s] = pmap_update(p[s], &xs, &ys, &l[s]);
      snprintf(msg[s], sizeof msg[s], "%s", pmap_last_error());
    }
    CHECK(st[0] == st[1] && (t == 1) == (st[0] == PMAP_ERR_NUMERIC), "step %d: %s vs %s", t,
          pmap_status_string(st[0]), pmap_status_string(st[1]));
    if (t == 1)
      CHECK(!strcmp(msg[0], msg[1]) &&
                strstr(msg[1], "step 2: the local loss or gradients of device 8 were non-finite"),
            "the same message naming device 8: \"%s\" vs \"%s\"", msg[0], msg[1]);
    else
      CHECK(memcmp(&l[0], &l[1], sizeof l[0]) == 0, "step %d: loss %.9g vs %.9g", t, (double)l[0],
            (double)l[1]);
  }
  float w[2][P];
  for (int s = 0; s < 2 && p[0] && p[1]; s++) CHECK_OK(pmap_params_read(p[s], 16, w[s], P));
  CHECK(p[0] && p[1] && memcmp(w[0], w[1], sizeof w[0]) == 0, "the parameters after the run");
  CHECK(pmap_params_step(p[1]) == 3, "three steps taken, one skipped: %lld",
        (long long)pmap_params_step(p[1]));
  for (int s = 0; s < 2; s++) {
    pmap_params_destroy(p[s]);
    CHECK_OK(pmap_ctx_destroy(ctx[s]));
  }
}

static void custom(void) {
  enum { P = 37, B = 24 }; /* 37 parameters: no N of these divides them */
  float init[P], x[B * P], y[B];
  for (int i = 0; i < P; i++) init[i] = 0.01f * (float)(i % 7) - 0.03f;
  for (int i = 0; i < B * P; i++) x[i] = (float)((i * 37 + 11) % 17) / 17.0f - 0.5f;
  for (int i = 0; i < B; i++) y[i] = (float)(i % 5) * 0.25f;
  pmap_array xs = {.dtype = PMAP_F32, .rank = 2, .shape = {B, P}, .data = x};
  pmap_array ys = {.dtype = PMAP_F32, .rank = 1, .shape = {B}, .data = y};
  pmap_optimizer opt = pmap_adam(0.05f);
  for (int n = 2; n <= 8; n *= 2) {
    run a = {0}, b = {0};
    pmap_config ca = {
        .backend = PMAP_BACKEND_CPU, .num_devices = n, .shard_optimizer = PMAP_SHARD_OFF};
    pmap_config cb = ca;
    cb.shard_optimizer = PMAP_SHARD_ON;
    CHECK_OK(pmap_ctx_create(&ca, &a.ctx));
    CHECK_OK(pmap_ctx_create(&cb, &b.ctx));
    if (a.ctx && b.ctx) {
      CHECK_OK(pmap_params_create_custom(a.ctx, P, init, lsq, NULL, &opt, &a.params));
      CHECK_OK(pmap_params_create_custom(b.ctx, P, init, lsq, NULL, &opt, &b.params));
    }
    if (a.params && b.params) {
      char what[32];
      snprintf(what, sizeof what, "custom N=%d", n);
      step_both(what, &a, &b, &xs, &ys, B, 5);
      float wa[P], wb[P];
      CHECK_OK(pmap_params_read(a.params, n - 1, wa, P));
      CHECK_OK(pmap_params_read(b.params, n - 1, wb, P));
      CHECK(memcmp(wa, wb, sizeof wa) == 0, "%s: parameters differ", what);
      CHECK(memcmp(wa, init, sizeof wa) != 0, "%s: the parameters moved", what);
      same_state(dir, what, &a, &b);
    }
    pmap_params_destroy(a.params);
    pmap_params_destroy(b.params);
    CHECK_OK(pmap_ctx_destroy(a.ctx));
    CHECK_OK(pmap_ctx_destroy(b.ctx));
  }
}

/* A checkpoint of either layout loads into the other and the runs go on bitwise alike. */
static void checkpoints(void) {
  pmap_array xs, ys;
  CHECK_OK(pmap_example_data("mlp", 9, 64, &xs, &ys));
  pmap_optimizer opt = pmap_adam(0.01f);
  run a, b, c;
  char path[128];
  snprintf(path, sizeof path, "%s/cross.ckpt", dir);
  if (xs.data && !open_run(&a, "mlp", &opt, 3, 1, 0) && !open_run(&b, "mlp", &opt, 3, 0, 0) &&
      !open_run(&c, "mlp", &opt, 3, 1, 0)) {
    step_both("before the save", &a, &b, &xs, &ys, 24, 2);
    CHECK_OK(pmap_params_save(a.params, path)); /* sharded */
    CHECK_OK(pmap_params_load(c.params, path)); /* into sharded */
    step_both("sharded from sharded", &a, &c, &xs, &ys, 24, 2);
    CHECK_OK(pmap_params_save(c.params, path));
    CHECK_OK(pmap_params_load(b.params, path)); /* into replicated */
    step_both("replicated from sharded", &b, &c, &xs, &ys, 24, 2);
    same_state(dir, "replicated from sharded", &b, &c);
    CHECK_OK(pmap_params_save(b.params, path));
    CHECK_OK(pmap_params_load(a.params, path)); /* replicated into sharded */
    same_state(dir, "sharded from replicated", &a, &b);
    step_both("sharded from replicated", &b, &a, &xs, &ys, 24, 2);
    same_state(dir, "after", &a, &b);
    CHECK_OK(pmap_params_verify(a.params));
  }
  close_run(&a);
  close_run(&b);
  close_run(&c);
  pmap_example_data_free(&xs, &ys);
}

/* The all-gather of the parameters, the one collective after the optimizer, fails on device 2 at
 * step 2 (PMAP_FAULT=gather), 1 + `again` times. Once: pmap_update runs it again at once and
 * succeeds. Twice: the update fails saying the step was taken, and the next call completes
 * it. Three times: that call fails too (the params stay torn) and the one after completes it.
 * Every way the run ends bitwise as a replicated run of as many steps. */
static void gather_fault(int again) {
  char spec[64], what[64];
  snprintf(spec, sizeof spec, "gather:device=2:step=2:after=%d", again);
  snprintf(what, sizeof what, "gather fault, %d more", again);
  pmap_array xs, ys;
  CHECK_OK(pmap_example_data("mlp", 4, 64, &xs, &ys));
  pmap_optimizer opt = pmap_adam(0.01f);
  run a, b;
  int bad = open_run(&a, "mlp", &opt, 4, 0, 0);
  setenv("PMAP_FAULT", spec, 1);
  bad |= open_run(&b, "mlp", &opt, 4, 1, 0);
  unsetenv("PMAP_FAULT");
  pmap_array x, y;
  rows_of(&xs, &ys, 0, 32, &x, &y);
  float la = 0.0f, lb = 0.0f;
  for (int t = 0; !bad && t < 3; t++) {
    CHECK_OK(pmap_update(a.params, &x, &y, &la));
    pmap_status st = pmap_update(b.params, &x, &y, &lb);
    if (t == 1 && again >= 1) {
      CHECK(st == PMAP_ERR_DEVICE && strstr(pmap_last_error(), "step 2 was taken") &&
                strstr(pmap_last_error(), "injected"),
            "%s: step 1: %s: %s", what, pmap_status_string(st), pmap_last_error());
      CHECK(pmap_params_step(b.params) == 2, "%s: the step counts", what);
      float w[1441];
      size_t P = pmap_params_count(b.params);
      if (again >= 2 && P <= 1441) {
        CHECK_FAILS(pmap_params_verify(b.params), PMAP_ERR_DEVICE, "completing them failed again");
        CHECK_OK(pmap_params_read(b.params, 3, w, P));
      }
      CHECK_OK(pmap_params_verify(b.params));
    } else {
      CHECK(st == PMAP_SUCCESS, "%s: step %d: %s", what, t, pmap_last_error());
      CHECK(memcmp(&la, &lb, sizeof la) == 0, "%s: step %d: loss %.9g vs %.9g", what, t, (double)la,
            (double)lb);
    }
  }
  if (!bad) same_state(dir, what, &a, &b);
  close_run(&a);
  close_run(&b);
  pmap_example_data_free(&xs, &ys);
}

static void settings(void) {
  pmap_ctx *ctx = NULL;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .shard_optimizer = 7};
  CHECK_FAILS(pmap_ctx_create(&cfg, &ctx), PMAP_ERR_INVALID_ARGUMENT, "shard_optimizer 7");
  cfg.shard_optimizer = -1;
  CHECK_FAILS(pmap_ctx_create(&cfg, &ctx), PMAP_ERR_INVALID_ARGUMENT, "shard_optimizer -1");
  cfg.shard_optimizer = PMAP_SHARD_AUTO;
  setenv("PMAP_SHARD_OPTIMIZER", "2", 1);
  CHECK_FAILS(pmap_ctx_create(&cfg, &ctx), PMAP_ERR_INVALID_ARGUMENT, "PMAP_SHARD_OPTIMIZER=\"2\"");
  CHECK(ctx == NULL, "no context on error");
  /* The variable decides AUTO, not an explicit setting. */
  pmap_model *m = NULL;
  CHECK_OK(pmap_example_model("mlp", &m));
  size_t bytes[2][2] = {{0, 0}, {0, 0}};
  for (int env = 0; env <= 1; env++)
    for (int mode = 0; mode <= 1; mode++) {
      setenv("PMAP_SHARD_OPTIMIZER", env ? "1" : "0", 1);
      cfg.shard_optimizer = mode ? PMAP_SHARD_AUTO : PMAP_SHARD_OFF;
      pmap_optimizer opt = pmap_adam(0.01f);
      pmap_params *p = NULL;
      CHECK_OK(pmap_ctx_create(&cfg, &ctx));
      if (ctx && m) CHECK_OK(pmap_params_create(ctx, m, &opt, 1, &p));
      bytes[env][mode] = pmap_params_optimizer_bytes(p);
      if (p && !mode)
        CHECK(bytes[env][mode] == 2 * 4 * pmap_params_count(p), "replicated Adam: %zu bytes",
              bytes[env][mode]);
      if (p && mode && env)
        CHECK(bytes[env][mode] <= 2 * 4 * (pmap_params_count(p) / 2 + 32) &&
                  bytes[env][mode] >= 2 * 4 * (pmap_params_count(p) / 2),
              "sharded over 2 devices: %zu bytes for %zu parameters", bytes[env][mode],
              pmap_params_count(p));
      pmap_params_destroy(p);
      CHECK_OK(pmap_ctx_destroy(ctx));
      ctx = NULL;
    }
  CHECK(bytes[0][1] == bytes[0][0] && bytes[1][1] < bytes[1][0] && bytes[1][0] == bytes[0][0],
        "PMAP_SHARD_OPTIMIZER decides AUTO only");
  unsetenv("PMAP_SHARD_OPTIMIZER");
  /* AUTO without the variable: small models replicated, large ones (>= 65536 parameters)
   * sharded; one device never. */
  /* ...and plain SGD (no state to shard) replicated whatever the size. Under a memory limit
   * (max_memory, 1 GB here) small models are sharded too, still not on one device nor without
   * state; PMAP_SHARD_OFF stays replicated under it. */
  const char *names[] = {"mlp", "cifar-cnn", "mlp-1024", "mlp-1024", "mlp-1024", "mlp-1024",
                         "mlp", "cifar-cnn", "mlp",      "mlp",      "mlp"};
  int devices[] = {2, 2, 2, 1, 2, 2, 2, 3, 1, 2, 2}, want[] = {0, 0, 1, 0, 0, 1, 1, 1, 0, 0, 0};
  size_t limit[] = {0, 0, 0, 0, 0, 0, 1u << 30, 1u << 30, 1u << 30, 1u << 30, 1u << 30};
  int setting[] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, PMAP_SHARD_OFF};
  pmap_optimizer opts[] = {pmap_adam(0.01f),      pmap_adam(0.01f),      pmap_adam(0.01f),
                           pmap_adam(0.01f),      pmap_sgd(0.01f, 0.0f), pmap_sgd(0.01f, 0.9f),
                           pmap_adam(0.01f),      pmap_sgd(0.01f, 0.9f), pmap_adam(0.01f),
                           pmap_sgd(0.01f, 0.0f), pmap_adam(0.01f)};
  for (int i = 0; i < 11; i++) {
    pmap_config auto_cfg = {.backend = PMAP_BACKEND_CPU,
                            .num_devices = devices[i],
                            .max_memory = limit[i],
                            .shard_optimizer = setting[i]};
    pmap_model *mm = NULL;
    pmap_params *p = NULL;
    pmap_optimizer opt = opts[i];
    CHECK_OK(pmap_ctx_create(&auto_cfg, &ctx));
    CHECK_OK(pmap_example_model(names[i], &mm));
    if (ctx && mm) CHECK_OK(pmap_params_create(ctx, mm, &opt, 1, &p));
    CHECK(pmap_params_sharded(p) == want[i],
          "shard %d, limit %zu: %s (%zu parameters) on %d devices: sharded %d", setting[i],
          limit[i], names[i], pmap_params_count(p), devices[i], pmap_params_sharded(p));
    pmap_params_destroy(p);
    pmap_model_destroy(mm);
    CHECK_OK(pmap_ctx_destroy(ctx));
    ctx = NULL;
  }
  pmap_model_destroy(m);
  /* Under a limit AUTO shards only where that holds less: 3 parameters padded to 4 equal parts
   * of 16 take more than Adam's replicated state saves, so they stay replicated (and ON's plan
   * is the larger). */
  int64_t in2[1] = {2};
  CHECK_OK(pmap_model_create(1, in2, &m));
  if (m) CHECK_OK(pmap_model_add_dense(m, 1));
  size_t fixed[2] = {0, 0};
  for (int on = 0; on <= 1 && m; on++) {
    pmap_config tiny = {.backend = PMAP_BACKEND_CPU,
                        .num_devices = 4,
                        .max_memory = 1u << 30,
                        .shard_optimizer = on ? PMAP_SHARD_ON : PMAP_SHARD_AUTO};
    pmap_optimizer opt = pmap_adam(0.01f);
    pmap_params *p = NULL;
    pmap_memory_plan plan;
    CHECK_OK(pmap_ctx_create(&tiny, &ctx));
    if (ctx) CHECK_OK(pmap_params_create(ctx, m, &opt, 1, &p));
    if (p) CHECK_OK(pmap_params_memory(p, 8, &plan));
    CHECK(pmap_params_sharded(p) == on, "3 parameters on 4 devices under a limit, %s: sharded %d",
          on ? "ON" : "AUTO", pmap_params_sharded(p));
    if (p) fixed[on] = plan.params + plan.grads + plan.optimizer;
    pmap_params_destroy(p);
    CHECK_OK(pmap_ctx_destroy(ctx));
    ctx = NULL;
  }
  CHECK(fixed[1] > fixed[0], "3 parameters: sharded %zu bytes, replicated %zu", fixed[1], fixed[0]);
  pmap_model_destroy(m);
  CHECK(pmap_params_optimizer_bytes(NULL) == 0, "NULL: 0 bytes");
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/pmap-test-shard-XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  settings();
  grid();
  variants();
  guard();
  custom();
  spread_flags();
  checkpoints();
  for (int again = 0; again <= 2; again++) gather_fault(again);
  char path[128];
  const char *files[] = {"a.ckpt", "b.ckpt", "cross.ckpt"};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    unlink(path);
  }
  rmdir(dir);
  return test_exit("shard");
}
