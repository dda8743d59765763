/* test_errors.c: bad input at the API boundary gets a specific status and a message naming the
 * values, and changes nothing: parameters (compared bitwise) and the step counter stay as they
 * were, and a good step afterwards still works. */
#include <unistd.h>

#include "pmap_examples.h"
#include "testutil.h"

static pmap_ctx *ctx;
static pmap_params *lin, *conv;
static float *before_lin, *before_conv;

static void snapshot(pmap_params *p, float *dst) {
  CHECK_OK(pmap_params_read(p, pmap_ctx_num_devices(ctx) - 1, dst, pmap_params_count(p)));
}

/* Nothing changed since the last snapshot, on every device. */
static void unchanged(const char *what) {
  pmap_params *ps[2] = {lin, conv};
  float *before[2] = {before_lin, before_conv};
  for (int k = 0; k < 2; k++) {
    size_t n = pmap_params_count(ps[k]);
    float *now = malloc(n * sizeof *now);
    for (int d = 0; d < pmap_ctx_num_devices(ctx); d++) {
      CHECK_OK(pmap_params_read(ps[k], d, now, n));
      test_same_bits(what, now, before[k], n);
    }
    free(now);
  }
  CHECK(pmap_params_step(lin) == 0 && pmap_params_step(conv) == 0, "%s: a step was counted", what);
}

static void bad_updates(void) {
  float x[64], y[64];
  int32_t labels[8] = {0, 1, 0, 1, 1, 0, 1, 0};
  float img[8 * 1024];
  for (int i = 0; i < 64; i++) x[i] = y[i] = (float)i * 0.1f;
  for (int i = 0; i < 8 * 1024; i++) img[i] = (float)(i % 13) * 0.05f;
  int64_t s30[2] = {30, 1}, s32[2] = {32, 1}, s16x2[2] = {16, 2}, s32r3[3] = {32, 1, 1};
  pmap_array xs30 = pmap_array_f32(x, 2, s30), ys30 = pmap_array_f32(y, 2, s30);
  pmap_array xs = pmap_array_f32(x, 2, s32), ys = pmap_array_f32(y, 2, s32);
  float loss = 123.0f;

  CHECK_FAILS(pmap_update(lin, &xs30, &ys30, &loss), PMAP_ERR_INVALID_ARGUMENT,
              "global batch 30 is not divisible by 4 devices");
  CHECK(loss == 123.0f, "loss written on failure: %g", (double)loss);
  pmap_array wide = pmap_array_f32(x, 2, s16x2), rank3 = pmap_array_f32(x, 3, s32r3);
  CHECK_FAILS(pmap_update(lin, &wide, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT,
              "xs axis 1 has extent 2; the model's input needs 1");
  CHECK_FAILS(pmap_update(lin, &rank3, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT, "xs has rank 3");
  int64_t s32x3[2] = {32, 3}, s16[2] = {16, 1};
  pmap_array ys_wide = pmap_array_f32(y, 2, s32x3), ys_short = pmap_array_f32(y, 2, s16);
  CHECK_FAILS(pmap_update(lin, &xs, &ys_wide, NULL), PMAP_ERR_INVALID_ARGUMENT, "(32, 1)");
  CHECK_FAILS(pmap_update(lin, &xs, &ys_short, NULL), PMAP_ERR_INVALID_ARGUMENT,
              "leading extent 16");
  pmap_array ys_i32 = xs;
  ys_i32.dtype = PMAP_I32;
  CHECK_FAILS(pmap_update(lin, &xs, &ys_i32, NULL), PMAP_ERR_INVALID_ARGUMENT, "MSE needs ys f32");
  CHECK_FAILS(pmap_update(NULL, &xs, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT, "params is NULL");
  CHECK_FAILS(pmap_update(lin, NULL, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT, "xs is NULL");
  CHECK_FAILS(pmap_update(lin, &xs, NULL, NULL), PMAP_ERR_INVALID_ARGUMENT, "ys is NULL");
  pmap_array nodata = xs;
  nodata.data = NULL;
  CHECK_FAILS(pmap_update(lin, &nodata, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT, "xs->data is NULL");
  CHECK_FAILS(pmap_update(lin, &xs, &nodata, NULL), PMAP_ERR_INVALID_ARGUMENT, "ys->data is NULL");
  int64_t s0[2] = {0, 1};
  pmap_array empty = pmap_array_f32(x, 2, s0);
  CHECK_FAILS(pmap_update(lin, &empty, &empty, NULL), PMAP_ERR_INVALID_ARGUMENT,
              "global batch 0 is not divisible");

  /* convnet: labels and image shapes. */
  int64_t si[4] = {8, 1, 32, 32}, sl[1] = {8}, sbad[4] = {8, 1, 32, 31};
  pmap_array imgs = pmap_array_f32(img, 4, si), lab = pmap_array_i32(labels, 1, sl);
  pmap_array badimg = pmap_array_f32(img, 4, sbad);
  CHECK_FAILS(pmap_update(conv, &badimg, &lab, NULL), PMAP_ERR_INVALID_ARGUMENT,
              "xs axis 3 has extent 31; the model's input needs 32");
  labels[5] = 2;
  CHECK_FAILS(pmap_update(conv, &imgs, &lab, NULL), PMAP_ERR_INVALID_ARGUMENT,
              "label 2 at row 5 is outside [0, 2)");
  labels[5] = -1;
  CHECK_FAILS(pmap_update(conv, &imgs, &lab, NULL), PMAP_ERR_INVALID_ARGUMENT, "label -1 at row 5");
  labels[5] = 0;
  pmap_array labf = pmap_array_f32(y, 1, sl);
  CHECK_FAILS(pmap_update(conv, &imgs, &labf, NULL), PMAP_ERR_INVALID_ARGUMENT, "i32 labels");

  /* predict: wrong output shape. */
  float out[32];
  int64_t so[2] = {16, 1};
  pmap_array o = pmap_array_f32(out, 2, so);
  CHECK_FAILS(pmap_predict(lin, &xs, &o), PMAP_ERR_INVALID_ARGUMENT, "out must be f32 (32, 1)");
  CHECK_FAILS(pmap_predict(lin, &xs30, &o), PMAP_ERR_INVALID_ARGUMENT, "global batch 30");

  /* reads and writes. */
  float w[2];
  CHECK_FAILS(pmap_params_read(lin, 4, w, 2), PMAP_ERR_INVALID_ARGUMENT,
              "device 4 is outside [0, 4)");
  CHECK_FAILS(pmap_params_read(lin, -1, w, 2), PMAP_ERR_INVALID_ARGUMENT, "device -1");
  CHECK_FAILS(pmap_params_read(lin, 0, w, 3), PMAP_ERR_INVALID_ARGUMENT,
              "count 3 is not the parameter count 2");
  CHECK_FAILS(pmap_params_read(lin, 0, NULL, 2), PMAP_ERR_INVALID_ARGUMENT, "dst is NULL");
  CHECK_FAILS(pmap_params_write(lin, w, 1), PMAP_ERR_INVALID_ARGUMENT, "count 1");
  /* A refused step (one process: at once) with its status and message; a status that is no
   * failure, or no pmap_status at all, is refused as an invalid argument. */
  pmap_status st = pmap_update_refuse(lin, PMAP_ERR_DEVICE, "the loader's disk");
  CHECK(st == PMAP_ERR_DEVICE && !strcmp(pmap_last_error(), "the loader's disk"),
        "pmap_update_refuse: status %d, message \"%s\"", (int)st, pmap_last_error());
  const pmap_status odd[3] = {PMAP_SUCCESS, (pmap_status)99, (pmap_status)-7};
  for (int k = 0; k < 3; k++) {
    st = pmap_update_refuse(lin, odd[k], "a bad row");
    CHECK(st == PMAP_ERR_INVALID_ARGUMENT && !strcmp(pmap_last_error(), "a bad row"),
          "pmap_update_refuse with status %d: status %d, message \"%s\"", (int)odd[k], (int)st,
          pmap_last_error());
  }
  CHECK_FAILS(pmap_update_refuse(NULL, PMAP_ERR_DEVICE, "x"), PMAP_ERR_INVALID_ARGUMENT,
              "params is NULL");
  unchanged("after rejected updates");

  /* A good step still works and changes the parameters. */
  CHECK_OK(pmap_update(lin, &xs, &ys, &loss));
  CHECK(pmap_params_step(lin) == 1, "step %lld after one good update",
        (long long)pmap_params_step(lin));
}

static void bad_setup(void) {
  pmap_ctx *c = (pmap_ctx *)0x1;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 0};
  CHECK_FAILS(pmap_ctx_create(&cfg, &c), PMAP_ERR_INVALID_ARGUMENT, "device count 0");
  CHECK(c == (pmap_ctx *)0x1, "a failed create changed *out");
  cfg.num_devices = PMAP_MAX_DEVICES + 1;
  CHECK_FAILS(pmap_ctx_create(&cfg, &c), PMAP_ERR_INVALID_ARGUMENT, "device count 65");
  cfg.num_devices = -7;
  CHECK_FAILS(pmap_ctx_create(&cfg, &c), PMAP_ERR_INVALID_ARGUMENT, "device count -7");
  cfg.num_devices = 2;
  cfg.backend = (pmap_backend)9;
  CHECK_FAILS(pmap_ctx_create(&cfg, &c), PMAP_ERR_INVALID_ARGUMENT, "unknown backend 9");
  CHECK_FAILS(pmap_ctx_create(NULL, NULL), PMAP_ERR_INVALID_ARGUMENT, "out is NULL");
  pmap_backend b;
  CHECK_FAILS(pmap_backend_parse("tpu", &b), PMAP_ERR_INVALID_ARGUMENT, "unknown backend \"tpu\"");

  pmap_model *m = NULL;
  CHECK_OK(pmap_example_model("linear", &m));
  pmap_params *p = (pmap_params *)0x1;
  pmap_optimizer bad[] = {pmap_sgd(0.0f, 0.0f), pmap_sgd(-0.1f, 0.0f), pmap_sgd(NAN, 0.0f),
                          pmap_adam(INFINITY)};
  const char *why[] = {"learning rate 0 must be > 0", "learning rate -0.1", "learning rate nan",
                       "learning rate inf"};
  for (int i = 0; i < 4; i++)
    CHECK_FAILS(pmap_params_create(ctx, m, &bad[i], 0, &p), PMAP_ERR_INVALID_ARGUMENT, why[i]);
  CHECK(p == (pmap_params *)0x1, "a failed create changed *out");
  pmap_optimizer mom = pmap_sgd(0.1f, 1.0f);
  CHECK_FAILS(pmap_params_create(ctx, m, &mom, 0, &p), PMAP_ERR_INVALID_ARGUMENT,
              "momentum 1 is outside [0, 1)");
  CHECK_FAILS(pmap_params_create(ctx, NULL, &mom, 0, &p), PMAP_ERR_INVALID_ARGUMENT,
              "model is NULL");
  pmap_model_destroy(m);

  /* Model builder. */
  int64_t img[3] = {1, 8, 8}, flat[1] = {4}, zero[1] = {0};
  m = (pmap_model *)0x1;
  CHECK_FAILS(pmap_model_create(2, flat, &m), PMAP_ERR_INVALID_ARGUMENT, "input rank 2");
  CHECK_FAILS(pmap_model_create(1, zero, &m), PMAP_ERR_INVALID_ARGUMENT, "input extent 0");
  CHECK(m == (pmap_model *)0x1, "a failed create changed *out");
  CHECK_OK(pmap_model_create(3, img, &m));
  CHECK_FAILS(pmap_model_add_dense(m, 4), PMAP_ERR_INVALID_ARGUMENT, "add a flatten layer first");
  CHECK_FAILS(pmap_model_add_dense(m, 4), PMAP_ERR_INVALID_ARGUMENT, "rank 3 (1 x 8 x 8)");
  {
    int64_t tokens[1] = {6}; /* (T, D) token vectors: only their own extents named */
    pmap_model *t = NULL;
    CHECK_OK(pmap_model_create(1, tokens, &t));
    CHECK_OK(pmap_model_add_embedding(t, 10, 4));
    CHECK_FAILS(pmap_model_add_dense(t, 3), PMAP_ERR_INVALID_ARGUMENT, "rank 2 (6 x 4);");
    pmap_model_destroy(t);
  }
  CHECK_FAILS(pmap_model_add_conv2d(m, 2, 9, 9, 1, 0), PMAP_ERR_INVALID_ARGUMENT,
              "kernel 9x9 does not fit input 8x8");
  CHECK_FAILS(pmap_model_add_conv2d(m, 2, 3, 3, 0, 1), PMAP_ERR_INVALID_ARGUMENT, "stride 0");
  CHECK(pmap_model_num_params(m) == 0, "failed layers added parameters");
  CHECK_FAILS(pmap_params_create(ctx, m, &mom, 0, &p), PMAP_ERR_INVALID_ARGUMENT, "0 layers");
  CHECK_OK(pmap_model_add_conv2d(m, 2, 3, 3, 1, 1));
  CHECK_FAILS(pmap_params_create(ctx, m, &mom, 0, &p), PMAP_ERR_INVALID_ARGUMENT, "rank 3");
  pmap_model_destroy(m);
  CHECK_OK(pmap_model_create(1, flat, &m));
  CHECK_FAILS(pmap_model_add_conv2d(m, 1, 3, 3, 1, 1), PMAP_ERR_INVALID_ARGUMENT,
              "input of rank 1");
  CHECK_FAILS(pmap_model_add_dense(m, 0), PMAP_ERR_INVALID_ARGUMENT, "units 0");
  CHECK_FAILS(pmap_model_set_loss(m, (pmap_loss)5), PMAP_ERR_INVALID_ARGUMENT, "unknown loss 5");
  pmap_model_destroy(m);
  CHECK_FAILS(pmap_example_model("resnet", &m), PMAP_ERR_INVALID_ARGUMENT,
              "unknown model \"resnet\"");
  pmap_model_destroy(NULL);
  pmap_params_destroy(NULL);
  pmap_ctx_destroy(NULL);
}

/* pmap_last_error() keeps a failure's message until the next failing call on the thread: none
 * of these successful calls (each a job on the devices, a host exchange or none) clears or
 * changes it. */
static pmap_status psum_fn(pmap_device *dev, void *arg) {
  (void)arg;
  float v = 1.0f;
  return pmap_psum(dev, &v, &v, 1);
}

static void last_error_kept(void) {
  char path[64], want[1024];
  snprintf(path, sizeof path, "/tmp/pmap_test_errors_%ld.ckpt", (long)getpid());
  float x[8] = {0}, y[8] = {0}, out[8], w[64], loss = 0.0f;
  int64_t s3[2] = {3, 1}, s8[2] = {8, 1};
  pmap_array bad = pmap_array_f32(x, 2, s3), xs = pmap_array_f32(x, 2, s8),
             ys = pmap_array_f32(y, 2, s8), o = pmap_array_f32(out, 2, s8);
  CHECK_FAILS(pmap_update(lin, &bad, &bad, NULL), PMAP_ERR_INVALID_ARGUMENT, "global batch 3");
  snprintf(want, sizeof want, "%s", pmap_last_error());
  size_t n = pmap_params_count(lin);
  char user[16] = "user", back[16];
  size_t got = 0;
  pmap_ctx *c = NULL;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  pmap_backend b;
  for (int round = 0; round < 3; round++) {
    const char *what[] = {"read",       "write",  "verify",    "update",    "predict", "run",
                          "save",       "load",   "save_user", "load_user", "shrink",  "micro",
                          "ctx_create", "params", "model",     "parse"};
    for (int k = 0; k < (int)(sizeof what / sizeof *what); k++) {
      switch (k) {
      case 0: CHECK_OK(pmap_params_read(lin, 3, w, n)); break;
      case 1: CHECK_OK(pmap_params_write(lin, w, n)); break;
      case 2: CHECK_OK(pmap_params_verify(lin)); break;
      case 3: CHECK_OK(pmap_update(lin, &xs, &ys, &loss)); break;
      case 4: CHECK_OK(pmap_predict(lin, &xs, &o)); break;
      case 5: CHECK_OK(pmap_run(ctx, psum_fn, NULL)); break;
      case 6: CHECK_OK(pmap_params_save(lin, path)); break;
      case 7: CHECK_OK(pmap_params_load(lin, path)); break;
      case 8: CHECK_OK(pmap_params_save_user(lin, path, user, sizeof user)); break;
      case 9: CHECK_OK(pmap_params_load_user(lin, path, back, sizeof back, &got)); break;
      case 10: CHECK_OK(pmap_params_shrink(lin)); break;
      case 11: CHECK_OK(pmap_params_set_micro_batches(lin, 1 + round % 2)); break;
      case 12:
        CHECK_OK(pmap_ctx_create(&cfg, &c));
        CHECK_OK(pmap_ctx_destroy(c));
        break;
      case 13:
        CHECK_OK(pmap_example_model("linear", &m));
        CHECK_OK(pmap_params_create(ctx, m, &sgd, 2, &p));
        pmap_params_destroy(p);
        pmap_model_destroy(m);
        break;
      case 14:
        CHECK_OK(pmap_model_create(1, s8 + 1, &m));
        CHECK_OK(pmap_model_add_dense(m, 2));
        pmap_model_destroy(m);
        break;
      case 15: CHECK_OK(pmap_backend_parse("cpu", &b)); break;
      }
      CHECK(!strcmp(pmap_last_error(), want),
            "round %d: a successful %s changed the last error from \"%s\" to \"%s\"", round,
            what[k], want, pmap_last_error());
    }
  }
  remove(path);
  /* The next failing call replaces it. */
  CHECK_FAILS(pmap_params_read(lin, 9, w, n), PMAP_ERR_INVALID_ARGUMENT, "device 9");
}

int main(void) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 4};
  pmap_model *m = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  pmap_optimizer sgd = pmap_sgd(0.01f, 0.0f), adam = pmap_adam(0.001f);
  CHECK_OK(pmap_example_model("linear", &m));
  CHECK_OK(pmap_params_create(ctx, m, &sgd, 1, &lin));
  pmap_model_destroy(m);
  CHECK_OK(pmap_example_model("convnet", &m));
  CHECK_OK(pmap_params_create(ctx, m, &adam, 1, &conv));
  pmap_model_destroy(m);
  if (test_failures) return test_exit("errors");
  before_lin = malloc(pmap_params_count(lin) * sizeof(float));
  before_conv = malloc(pmap_params_count(conv) * sizeof(float));
  snapshot(lin, before_lin);
  snapshot(conv, before_conv);
  bad_updates();
  bad_setup();
  last_error_kept();
  free(before_lin);
  free(before_conv);
  pmap_params_destroy(conv);
  pmap_params_destroy(lin);
  pmap_ctx_destroy(ctx);
  return test_exit("errors");
}
