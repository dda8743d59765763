/* test_resume.c: training resumed from a checkpoint continues exactly: 40 steps equal 20 steps,
 * a save, a load into a fresh training state and 20 more, bitwise on the same device count and,
 * on another, within the bound of 20 steps summed in another order (tests/bounds.h), for SGD
 * with momentum and Adam; and a save killed at any moment leaves a file that loads and holds one
 * of the saved states. */
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "bounds.h"
#include "ckpt_util.h"

static char dir[256], path[300];

/* bound_output_size (tests/bounds.h, bound_loss_scale) of the outputs from pmap_predict at
 * the parameters s holds, on batch `b` of its data. */
static double output_size(state *s, int64_t b) {
  int rank;
  int64_t shape[PMAP_MAX_RANK], osh[PMAP_MAX_RANK] = {s->batch};
  pmap_model_output_shape(s->model, &rank, shape);
  size_t n = (size_t)s->batch, row = (size_t)(pmap_array_numel(&s->xs) / s->rows);
  for (int i = 0; i < rank; i++) n *= (size_t)(osh[i + 1] = shape[i]);
  pmap_array x = s->xs;
  x.data = (char *)s->xs.data + (size_t)(b * s->batch) * row * 4;
  x.shape[0] = s->batch;
  float *out = malloc(n * sizeof *out);
  pmap_array o = pmap_array_f32(out, rank + 1, osh);
  double size = INFINITY;
  if (out && pmap_predict(s->params, &x, &o) == PMAP_SUCCESS)
    size = bound_output_size(out, n, s->ys.dtype != PMAP_F32);
  CHECK(isfinite(size), "the outputs' size: %s", pmap_last_error());
  free(out);
  return size;
}

/* 40 straight steps on n1 devices against 20 on n1, save, load on n2 (fresh state of another
 * seed), 20 more. On another device count the last 20 steps sum in another order: the
 * parameters and the last loss (relative to max(L, S / kappa)) within
 * bound_order32(model, batch, 20) of the straight run's. */
static void resume(const char *name, const pmap_optimizer *opt, int n1, int n2, int64_t batch,
                   int64_t rows) {
  char what[128];
  snprintf(what, sizeof what, "%s %s%s, %d then %d devices", name,
           opt ? (opt->kind == PMAP_OPT_ADAM ? "Adam" : "SGD") : "default optimizer",
           opt && opt->kind == PMAP_OPT_SGD && opt->momentum != 0.0f ? " with momentum" : "", n1,
           n2);
  const bound_model *bm = bound_model_of(name);
  CHECK(bm != NULL, "%s: no bound", name);
  state full, first, second;
  if (!bm || state_open(&full, name, n1, opt, 11, batch, rows) ||
      state_open(&first, name, n1, opt, 11, batch, rows) ||
      state_open(&second, name, n2, opt, 99, batch, rows))
    return;
  float l_full = NAN, l_res = NAN;
  state_train(&full, 0, 39, NULL);
  double size = output_size(&full, 39 % (rows / batch)); /* at the last loss's parameters */
  state_train(&full, 39, 40, &l_full);
  state_train(&first, 0, 20, NULL);
  CHECK_OK(pmap_params_save(first.params, path));
  CHECK_OK(pmap_params_load(second.params, path));
  CHECK(pmap_params_step(second.params) == 20, "%s: step %lld after load", what,
        (long long)pmap_params_step(second.params));
  state_train(&second, 20, 40, &l_res);
  CHECK(pmap_params_step(second.params) == 40, "%s: step %lld", what,
        (long long)pmap_params_step(second.params));
  size_t P = pmap_params_count(full.params);
  float *a = malloc(P * sizeof *a), *b = malloc(P * sizeof *b);
  double bound = bound_order32(bm, (double)batch, 20), worst = 0.0;
  CHECK_OK(pmap_params_read(full.params, 0, a, P));
  for (int d = 0; d < n2; d++) {
    CHECK_OK(pmap_params_read(second.params, d, b, P));
    if (n1 == n2) {
      test_same_bits(what, b, a, P);
    } else {
      test_close_f(what, b, a, P, bound);
      worst = fmax(worst, test_rel_err(b, a, P));
    }
  }
  if (n1 == n2) {
    CHECK(!memcmp(&l_full, &l_res, sizeof l_full), "%s: loss %.9g vs %.9g", what, (double)l_res,
          (double)l_full);
  } else {
    double el = fabs((double)l_full - (double)l_res) /
                bound_loss_scale(l_full, size, full.ys.dtype != PMAP_F32, bm->kappa);
    printf("%-42s parameters %.2e, loss %.2e (bound %.2e)\n", what, worst, el, bound);
    CHECK(el <= bound, "%s: loss %.9g vs %.9g: %.3g > %.3g", what, (double)l_res, (double)l_full,
          el, bound);
  }
  free(a);
  free(b);
  state_close(&full);
  state_close(&first);
  state_close(&second);
}

/* ------------------------------------------------------------------------------------------ */
/* A kill during a save                                                                        */

#define KILL_UNITS 384 /* a 384 -> 384 -> 384 dense model: ~300k parameters, Adam: ~3.5 MB */

static int kill_model(pmap_model **m) {
  int64_t in[1] = {KILL_UNITS};
  if (pmap_model_create(1, in, m)) return -1;
  if (pmap_model_add_dense(*m, KILL_UNITS) || pmap_model_add_dense(*m, KILL_UNITS)) return -1;
  return 0;
}

/* The child: saves states whose every parameter is base + k, k = 0, 1, ..., until killed (or
 * `count` saves when count > 0), writing a byte to `ready` after the first save so that the
 * parent's kill lands in the loop of saves, not in the start-up. Exits 0, or 2 on a failure. */
static void saver(float base, int count, int ready) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_adam(0.001f);
  if (pmap_ctx_create(&cfg, &ctx) || kill_model(&m) || pmap_params_create(ctx, m, &opt, 1, &p))
    _exit(2);
  size_t P = pmap_params_count(p);
  float *w = malloc(P * sizeof *w);
  if (!w) _exit(2);
  for (int k = 0; count <= 0 || k < count; k++) {
    for (size_t i = 0; i < P; i++) w[i] = base + (float)k;
    if (pmap_params_write(p, w, P) || pmap_params_save(p, path)) _exit(2);
    if (k == 0 && ready >= 0 && write(ready, "r", 1) != 1) _exit(2);
  }
  _exit(0);
}

/* Starts a saver; with *ready non-NULL, *ready is the read end of its readiness pipe. */
static pid_t spawn(float base, int count, int *ready) {
  int fds[2] = {-1, -1};
  if (ready && pipe(fds) != 0) return -1;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    if (ready) close(fds[0]);
    saver(base, count, fds[1]);
  }
  if (ready) {
    close(fds[1]);
    *ready = fds[0];
  }
  return pid;
}

/* Kills savers at times spread over a few saves, keeps a copy of the file after each kill, then
 * loads every copy: each must load and hold a state some child saved. */
static void kill_during_save(void) {
  int status = 0;
  pid_t pid = spawn(0.0f, 1, NULL); /* a first good file */
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the first save failed (status %d)", status);
  enum { ROUNDS = 24 };
  for (int r = 1; r <= ROUNDS; r++) {
    int ready = -1;
    pid = spawn(1000.0f * (float)r, 0, &ready);
    CHECK(pid > 0, "fork failed");
    if (pid <= 0) return;
    char byte;
    CHECK(read(ready, &byte, 1) == 1, "round %d: the saver did not start", r);
    close(ready);
    /* 0..47 ms after the first save: a few saves of ~3.5 MB each, cut anywhere. */
    struct timespec t = {0, (long)(r * 7919 % 48) * 1000000L};
    nanosleep(&t, NULL);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status), "round %d: the saver ended before the kill (status %d)", r, status);
    char copy[400];
    snprintf(copy, sizeof copy, "%s.%d", path, r);
    size_t n = 0;
    unsigned char *f = file_read(path, &n);
    CHECK(f && file_write(copy, f, n) == 0, "round %d: cannot copy the checkpoint", r);
    free(f);
  }
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_optimizer opt = pmap_adam(0.001f);
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK(kill_model(&m) == 0, "model");
  CHECK_OK(pmap_params_create(ctx, m, &opt, 1, &p));
  size_t P = pmap_params_count(p);
  float *w = malloc(P * sizeof *w);
  for (int r = 1; p && w && r <= ROUNDS; r++) {
    char copy[400];
    snprintf(copy, sizeof copy, "%s.%d", path, r);
    pmap_status st = pmap_params_load(p, copy);
    CHECK(st == PMAP_SUCCESS, "round %d: the file after a kill does not load: %s", r,
          pmap_last_error());
    remove(copy);
    if (st) continue;
    CHECK_OK(pmap_params_read(p, 1, w, P));
    float v = w[0];
    int same = 1;
    for (size_t i = 0; i < P; i++) same &= w[i] == v;
    float base = 1000.0f * floorf(v / 1000.0f);
    CHECK(same && base <= 1000.0f * (float)r && v - base < 1000.0f && v == floorf(v),
          "round %d: the loaded state (first value %g) is none of the saved ones", r, (double)v);
  }
  /* A kill in the middle of a save leaves its temporary file: count them, to show the kills
   * did land inside saves. */
  int torn = 0;
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));) torn += strstr(e->d_name, ".tmp.") != NULL;
  if (d) closedir(d);
  printf("kill during save: %d rounds, %d killed while writing the file\n", ROUNDS, torn);
  free(w);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

int main(void) {
  const char *t = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/pmap-resume-XXXXXX", t && *t ? t : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof path, "%s/state.ckpt", dir);
  /* Forks first, while this process has no worker threads. */
  kill_during_save();
  pmap_optimizer sgdm = pmap_sgd(0.01f, 0.9f), adam = pmap_adam(0.001f);
  resume("mlp", &adam, 2, 2, 64, 256);
  resume("mlp", &sgdm, 2, 2, 64, 256);
  resume("mlp", &adam, 1, 1, 64, 256);
  resume("linear", NULL, 4, 4, 32, 128);
  resume("convnet", &adam, 2, 2, 8, 64);
  resume("convnet", &sgdm, 3, 3, 6, 36);
  resume("mlp", &adam, 2, 4, 64, 256);
  resume("mlp", &sgdm, 4, 1, 64, 256);
  resume("convnet", &adam, 1, 2, 8, 64);
  resume("linear", NULL, 2, 1, 32, 128);
  /* the transformer: tied weights (one block used twice), Adam, token ids as input. Its 160
   * steps take longer than the test's limit under the sanitizers, whose builds check its layers
   * and ops through test_transformer and the op harness instead. */
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  resume("gpt-mini", &adam, 2, 2, 8, 32);
  resume("gpt-mini", NULL, 1, 2, 8, 32);
#else
  printf("resume: gpt-mini runs in the builds without a sanitizer\n");
#endif
  /* Stray temporary files of killed saves are the only leftovers. */
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", dir);
  return test_exit("resume");
}
