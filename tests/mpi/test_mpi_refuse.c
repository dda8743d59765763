/* test_mpi_refuse.c: a call that one process refuses by its own checks, across processes; run by
 * test_mpi_fault.sh under mpirun (P processes of D devices each). Modes:
 *   update D  every kind of local refusal of pmap_update on process 0, then on the last process
 *             (a label or token id out of range, the wrong dtype, rank or extent, no rows, NULL
 *             xs, xs->data and ys, another ys extent, pmap_update_refuse, another micro-batch
 *             count with batch norm across replicas), and NaN rows on one process (the numeric
 *             guard: no refusal, the control): every process fails the call (the refusing one
 *             with its own message, the others naming it, its host and why), the training
 *             state is bitwise unchanged on every process, the next step is taken together,
 *             and it ends bitwise where a run without the bad call ends (CASE: only that
 *             kind, by its number in the list below)
 *   calls D   the other collective calls refused on one process: pmap_params_create (a bad
 *             optimizer, another parameter count), pmap_ctx_waits (another count), pmap_run
 *             (fn NULL): every process fails, and the next calls pair with each other;
 *             pmap_predict refused on one process is that process's alone (it exchanges
 *             nothing) and the next step is taken together (CASE 0: only the creates, 1: the
 *             rest)
 * Exits 77 when pmap was built without MPI. */
#include <unistd.h>

#include "ckpt_util.h"

static int P = 1, RANK = 0;

static pmap_status dist_ctx(int devices, pmap_ctx **out) {
  /* A process left behind is named within 10 s rather than hanging the test. */
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = devices,
                     .timeout_s = 10.0,
                     .dist = PMAP_DIST_MPI};
  return pmap_ctx_create(&cfg, out);
}

static int env_int(const char *a, const char *b) {
  const char *s = getenv(a);
  if (!s) s = getenv(b);
  return s ? atoi(s) : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* The models and their rows                                                                  */

enum { M_MLP, M_TOKENS, M_BN }; /* f32 (5) -> 3 classes; i32 (4) ids of 7; batch norm across */
enum { FEATURES = 5, TOKENS = 4, VOCAB = 7, CLASSES = 3 };

static pmap_model *build(int kind) {
  pmap_model *m = NULL;
  int64_t f = FEATURES, t = TOKENS;
  pmap_status st = pmap_model_create(1, kind == M_TOKENS ? &t : &f, &m);
  if (!st && kind == M_TOKENS) st = pmap_model_add_embedding(m, VOCAB, 3);
  if (!st && kind == M_TOKENS) st = pmap_model_add_flatten(m);
  if (!st) st = pmap_model_add_dense(m, 6);
  if (!st && kind == M_BN) st = pmap_model_add_batchnorm(m, 1);
  if (!st) st = pmap_model_add_relu(m);
  if (!st) st = pmap_model_add_dense(m, CLASSES);
  if (!st) st = pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT);
  CHECK(st == PMAP_SUCCESS, "model %d: %s", kind, pmap_last_error());
  return m;
}

/* This process's rows of step `step`: 4 per local device, every value exact and its own. */
typedef struct batch {
  float x[16 * FEATURES];
  int32_t ids[16 * TOKENS], y[16];
  pmap_array xs, ys;
} batch;

static void rows_of(batch *b, int kind, int d, int step) {
  int64_t rows = 4 * d, xshape[2] = {rows, kind == M_TOKENS ? TOKENS : FEATURES};
  for (int64_t i = 0; i < rows; i++) {
    b->y[i] = (int32_t)((i + RANK + step) % CLASSES);
    for (int j = 0; j < FEATURES; j++)
      b->x[i * FEATURES + j] = (float)((i * 7 + j * 3 + RANK * 5 + step) % 11) / 8.0f - 0.6f;
    for (int j = 0; j < TOKENS; j++) b->ids[i * TOKENS + j] = (int32_t)((i + j + RANK) % VOCAB);
  }
  b->xs = kind == M_TOKENS ? pmap_array_i32(b->ids, 2, xshape) : pmap_array_f32(b->x, 2, xshape);
  b->ys = pmap_array_i32(b->y, 1, &rows);
}

/* ------------------------------------------------------------------------------------------ */
/* State                                                                                      */

static char scratch[256];

/* The training state as this process sees it: its first replica's parameters, the step, and
 * the bytes of a save (the optimizer state). */
static void take(pmap_params *p, int d, snapshot *s) {
  memset(s, 0, sizeof *s);
  s->n = 1;
  s->count = pmap_params_count(p);
  s->w = malloc(s->count * sizeof *s->w);
  if (s->w) CHECK_OK(pmap_params_read(p, RANK * d, s->w, s->count));
  s->step = pmap_params_step(p);
  CHECK_OK(pmap_params_save(p, scratch));
  s->file = file_read(scratch, &s->bytes);
  unlink(scratch);
  CHECK(s->w && s->file, "snapshot: out of memory or %s unreadable", scratch);
}

/* ------------------------------------------------------------------------------------------ */
/* pmap_update refused on one process                                                         */

enum {
  K_LABEL,
  K_TOKEN,
  K_DTYPE,
  K_RANK,
  K_EXTENT,
  K_NO_ROWS,
  K_XS_NULL,
  K_XDATA_NULL,
  K_YS_NULL,
  K_YS_EXTENT,
  K_REFUSE,
  K_MICRO,
  K_NAN,
  K_COUNT
};

static const struct {
  int model;
  const char *why; /* in the refusing process's message and the others' */
} kinds[K_COUNT] = {
    [K_LABEL] = {M_MLP, "label 7 at row 1 is outside [0, 3)"},
    [K_TOKEN] = {M_TOKENS, "token id 9 at example 1 position 2 is outside [0, 7)"},
    [K_DTYPE] = {M_MLP, "xs must be f32, got i32"},
    [K_RANK] = {M_MLP, "xs has rank 3; the model takes rank 2"},
    [K_EXTENT] = {M_MLP, "xs axis 1 has extent 4; the model's input needs 5"},
    [K_NO_ROWS] = {M_MLP, "global batch 0 is not divisible"},
    [K_XS_NULL] = {M_MLP, "xs is NULL"},
    [K_XDATA_NULL] = {M_MLP, "xs->data is NULL"},
    [K_YS_NULL] = {M_MLP, "ys is NULL"},
    [K_YS_EXTENT] = {M_MLP, "ys has leading extent 3"},
    [K_REFUSE] = {M_MLP, "my loader found a torn record"},
    [K_MICRO] = {M_BN, "different numbers of micro-batches"},
    [K_NAN] = {M_MLP, "were non-finite"},
};

/* The call of process `bad` in case k (the others make the valid call). */
static pmap_status bad_update(pmap_params *p, int k, batch *b) {
  pmap_array xs = b->xs, ys = b->ys;
  int64_t three[3] = {b->xs.shape[0], FEATURES, 1};
  switch (k) {
  case K_LABEL: b->y[1] = 7; break;
  case K_TOKEN: b->ids[1 * TOKENS + 2] = 9; break;
  case K_DTYPE: xs.dtype = PMAP_I32; break;
  case K_RANK: xs = pmap_array_f32(b->x, 3, three); break;
  case K_EXTENT: xs.shape[1] = FEATURES - 1; break;
  case K_NO_ROWS: xs.shape[0] = ys.shape[0] = 0; break;
  case K_XS_NULL: return pmap_update(p, NULL, &ys, NULL);
  case K_XDATA_NULL: xs.data = NULL; break;
  case K_YS_NULL: return pmap_update(p, &xs, NULL, NULL);
  case K_YS_EXTENT: ys.shape[0] = 3; break;
  case K_REFUSE: return pmap_update_refuse(p, PMAP_ERR_INVALID_ARGUMENT, kinds[k].why);
  case K_MICRO: CHECK_OK(pmap_params_set_micro_batches(p, 2)); break;
  case K_NAN: b->x[3] = NAN; break;
  }
  pmap_status st = pmap_update(p, &xs, &ys, NULL);
  if (k == K_MICRO) CHECK_OK(pmap_params_set_micro_batches(p, 1));
  return st;
}

/* Step 1 on params and on a reference, the bad call on params (process `bad` refuses), then
 * step 2 on both: the bad call failed everywhere and changed nothing, and the two end alike. */
static void update_case(pmap_ctx *ctx, int d, int k, int bad) {
  pmap_model *m = build(kinds[k].model);
  pmap_optimizer adam = pmap_adam(0.01f);
  pmap_params *p = NULL, *ref = NULL;
  if (m) CHECK_OK(pmap_params_create(ctx, m, &adam, 7, &p));
  if (m) CHECK_OK(pmap_params_create(ctx, m, &adam, 7, &ref));
  pmap_model_destroy(m);
  if (!p || !ref) goto done;
  static batch b;
  float loss = 0.0f, ref_loss = 0.0f;
  rows_of(&b, kinds[k].model, d, 1);
  CHECK_OK(pmap_update(p, &b.xs, &b.ys, &loss));
  CHECK_OK(pmap_update(ref, &b.xs, &b.ys, &ref_loss));
  snapshot before, after, end, ref_end;
  take(p, d, &before);
  /* The bad call. */
  rows_of(&b, kinds[k].model, d, 2);
  int shared = k == K_MICRO || k == K_NAN; /* a failure of every process, refusing none */
  pmap_status st = RANK == bad ? bad_update(p, k, &b) : pmap_update(p, &b.xs, &b.ys, NULL);
  char msg[1024], who[64];
  snprintf(msg, sizeof msg, "%s", pmap_last_error());
  snprintf(who, sizeof who, "refused on process %d (host", bad);
  pmap_status want = k == K_NAN ? PMAP_ERR_NUMERIC : PMAP_ERR_INVALID_ARGUMENT;
  CHECK(st == want, "case %d, process %d refusing: process %d got %s: %s", k, bad, RANK,
        pmap_status_string(st), msg);
  CHECK(strstr(msg, kinds[k].why) != NULL, "case %d: process %d's message lacks \"%s\": %s", k,
        RANK, kinds[k].why, msg);
  if (!shared && RANK != bad)
    CHECK(strstr(msg, who) && strstr(msg, "every process refuses"),
          "case %d: process %d's message does not name the refusing process %d: %s", k, RANK, bad,
          msg);
  if (RANK == 0 && (bad != 0 || shared))
    printf("process 0: case %d, process %d refusing: %s\n", k, bad, msg);
  take(p, d, &after);
  snapshot_same("the refused call", &before, &after);
  /* Taken together after it (on the batch the bad call spoiled, made again), and bitwise where
   * the run without it ends. */
  rows_of(&b, kinds[k].model, d, 2);
  CHECK_OK(pmap_update(p, &b.xs, &b.ys, &loss));
  CHECK_OK(pmap_update(ref, &b.xs, &b.ys, &ref_loss));
  CHECK(!memcmp(&loss, &ref_loss, sizeof loss), "case %d: loss %.9g, without the bad call %.9g", k,
        (double)loss, (double)ref_loss);
  CHECK_OK(pmap_params_verify(p));
  take(p, d, &end);
  take(ref, d, &ref_end);
  CHECK(end.step == 2, "case %d: step %lld after the next step", k, (long long)end.step);
  snapshot_same("the run with the refused call against the run without it", &end, &ref_end);
  snapshot_free(&before);
  snapshot_free(&after);
  snapshot_free(&end);
  snapshot_free(&ref_end);
done:
  pmap_params_destroy(p);
  pmap_params_destroy(ref);
}

static void mode_update(int d, int only) {
  pmap_ctx *ctx = NULL;
  CHECK_OK(dist_ctx(d, &ctx));
  if (!ctx) return;
  for (int k = 0; k < K_COUNT; k++) {
    if (only >= 0 && k != only) continue;
    update_case(ctx, d, k, 0);
    update_case(ctx, d, k, P - 1);
  }
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* ------------------------------------------------------------------------------------------ */
/* The other collective calls, and pmap_predict                                               */

static int round_no; /* bumped by every sum_fn run: a psum paired with another run's is wrong */

static pmap_status sum_fn(pmap_device *dev, void *arg) {
  (void)arg;
  int g = pmap_axis_index(dev), G = pmap_axis_size(dev);
  float v = (float)(round_no * 1000 + g + 1);
  pmap_status st = pmap_psum(dev, &v, &v, 1);
  if (st) return st;
  return v == (float)(round_no * 1000 * G + G * (G + 1) / 2) ? PMAP_SUCCESS : PMAP_ERR_INTERNAL;
}

/* The next mapped function pairs with the other processes' (every process's sum is right). */
static void in_step(pmap_ctx *ctx, const char *after) {
  round_no++;
  pmap_status st = pmap_run(ctx, sum_fn, NULL);
  CHECK(st == PMAP_SUCCESS, "after %s, a psum: %s: %s", after, pmap_status_string(st),
        pmap_last_error());
}

static void calls_create(pmap_ctx *ctx, int bad) {
  pmap_model *m = build(M_MLP), *big = build(M_BN);
  pmap_optimizer adam = pmap_adam(0.01f), none = pmap_adam(-1.0f);
  pmap_params *p = NULL;
  char who[64];
  snprintf(who, sizeof who, "refused on process %d (host", bad);
  /* A bad optimizer on one process. */
  pmap_status st = pmap_params_create(ctx, m, RANK == bad ? &none : &adam, 7, &p);
  CHECK(st == PMAP_ERR_INVALID_ARGUMENT && !p, "create, process %d refusing: %s: %s", bad,
        pmap_status_string(st), pmap_last_error());
  CHECK(RANK == bad
            ? strstr(pmap_last_error(), "learning rate -1") != NULL
            : strstr(pmap_last_error(), who) && strstr(pmap_last_error(), "learning rate -1"),
        "create: process %d's message: %s", RANK, pmap_last_error());
  if (RANK == 0) printf("process 0: create, process %d refusing: %s\n", bad, pmap_last_error());
  pmap_params_destroy(p);
  p = NULL;
  in_step(ctx, "a refused pmap_params_create");
  /* Another model on one process: refused on every process, naming the counts. */
  st = pmap_params_create(ctx, RANK == bad ? big : m, &adam, 7, &p);
  CHECK(st == PMAP_ERR_INVALID_ARGUMENT && !p && strstr(pmap_last_error(), "different sizes"),
        "create of another size: %s: %s", pmap_status_string(st), pmap_last_error());
  pmap_params_destroy(p);
  p = NULL;
  in_step(ctx, "pmap_params_create of different sizes");
  CHECK_OK(pmap_params_create(ctx, m, &adam, 7, &p));
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_model_destroy(big);
}

static void calls_other(pmap_ctx *ctx, int d, int bad) {
  char who[64];
  snprintf(who, sizeof who, "refused on process %d (host", bad);
  /* pmap_ctx_waits with another count on one process. */
  pmap_device_waits w[16];
  pmap_status st = pmap_ctx_waits(ctx, w, RANK == bad ? P * d + 1 : P * d);
  CHECK(st == PMAP_ERR_INVALID_ARGUMENT && strstr(pmap_last_error(), "is not the context's") &&
            (RANK == bad || strstr(pmap_last_error(), who)),
        "waits, process %d refusing: %s: %s", bad, pmap_status_string(st), pmap_last_error());
  if (RANK == 0) printf("process 0: waits, process %d refusing: %s\n", bad, pmap_last_error());
  in_step(ctx, "a refused pmap_ctx_waits");
  CHECK_OK(pmap_ctx_waits(ctx, w, P * d));
  /* pmap_run without a function on one process: every process's run fails alike. */
  round_no++;
  st = pmap_run(ctx, RANK == bad ? NULL : sum_fn, NULL);
  char name[64];
  snprintf(name, sizeof name, "process %d of %d (host", bad, P);
  CHECK(st == PMAP_ERR_INVALID_ARGUMENT && strstr(pmap_last_error(), "fn is NULL") &&
            strstr(pmap_last_error(), name),
        "pmap_run, fn NULL on process %d: %s: %s", bad, pmap_status_string(st), pmap_last_error());
  if (RANK == 0) printf("process 0: pmap_run, fn NULL on process %d: %s\n", bad, pmap_last_error());
  in_step(ctx, "pmap_run with fn NULL on one process");
  /* pmap_predict refused on one process: its own, the others predict. */
  pmap_model *m = build(M_MLP);
  pmap_optimizer adam = pmap_adam(0.01f);
  pmap_params *p = NULL;
  if (m) CHECK_OK(pmap_params_create(ctx, m, &adam, 7, &p));
  pmap_model_destroy(m);
  if (!p) return;
  static batch b;
  rows_of(&b, M_MLP, d, 1);
  float out[16 * CLASSES];
  int64_t oshape[2] = {b.xs.shape[0], CLASSES};
  pmap_array o = pmap_array_f32(out, 2, oshape), xs = b.xs;
  if (RANK == bad) xs.shape[1] = FEATURES - 1;
  st = pmap_predict(p, &xs, &o);
  CHECK(RANK == bad ? st == PMAP_ERR_INVALID_ARGUMENT : st == PMAP_SUCCESS,
        "predict, process %d refusing: process %d: %s: %s", bad, RANK, pmap_status_string(st),
        pmap_last_error());
  CHECK_OK(pmap_update(p, &b.xs, &b.ys, NULL));
  CHECK_OK(pmap_params_verify(p));
  CHECK(pmap_params_step(p) == 1, "predict refused: step %lld", (long long)pmap_params_step(p));
  pmap_params_destroy(p);
}

static void mode_calls(int d, int only) {
  pmap_ctx *ctx = NULL;
  CHECK_OK(dist_ctx(d, &ctx));
  if (!ctx) return;
  for (int bad = 0; bad < P; bad += P - 1) {
    if (only < 0 || only == 0) calls_create(ctx, bad);
    if (only < 0 || only == 1) calls_other(ctx, d, bad);
  }
  CHECK_OK(pmap_ctx_destroy(ctx));
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s update|calls [DEVICES [CASE]] (under mpirun)\n", argv[0]);
    return 2;
  }
  if (!pmap_backend_built(PMAP_BACKEND_CPU)) return 77;
  RANK = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK");
  P = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE");
  if (RANK < 0 || P < 2) {
    printf("SKIP: not started by mpirun with 2 or more processes\n");
    return 77;
  }
  int d = argc > 2 ? atoi(argv[2]) : 1;
  if (d < 1 || d > 4) {
    fprintf(stderr, "devices %d: 1..4\n", d);
    return 2;
  }
  const char *dir = getenv("TMPDIR");
  snprintf(scratch, sizeof scratch, "%s/pmap_refuse_%ld_%d.ckpt", dir && *dir ? dir : "/tmp",
           (long)getppid(), RANK);
  pmap_ctx *probe = NULL;
  pmap_status st = dist_ctx(1, &probe);
  if (st == PMAP_ERR_UNAVAILABLE) {
    printf("SKIP: %s\n", pmap_last_error());
    return 77;
  }
  pmap_ctx_destroy(probe);
  int only = argc > 3 ? atoi(argv[3]) : -1;
  if (!strcmp(argv[1], "update")) {
    mode_update(d, only);
  } else if (!strcmp(argv[1], "calls")) {
    mode_calls(d, only);
  } else {
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  }
  char name[64];
  snprintf(name, sizeof name, "test_mpi_refuse %s (process %d)", argv[1], RANK);
  return test_exit(name);
}
