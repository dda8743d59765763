/* test_mpi_fault.c: what must hold across processes when they disagree, fail or are late; run by
 * test_mpi.sh under mpirun (P processes of D devices each). Modes:
 *   mismatch D  collectives that differ across processes (psum against pmean, broadcast roots
 *               that are two devices of one process, pmax against psum, two devices of one
 *               process that differ): every process refuses at once with the same list, and
 *               the context stays usable; a process (or one device) that returns without the
 *               psum the others wait in, and an invalid call every process makes alike (a root
 *               out of range, a count whose bytes overflow): every process's pmap_run fails
 *               with the same message and the next runs pair with each other; process 0's
 *               pmap_update against the others' pmap_run: both fail, and they are in step
 *               after; process 1 with another numeric_guard or uneven_batches: every
 *               pmap_ctx_create refuses naming the setting
 *   row0 D      a gradient function's row0 is the global index of its first row (micro-batches
 *               too), and a loss weighted by it trains as on one device
 *   verify D    a replica perturbed on process 1 is found by pmap_params_verify on every process
 *               by its global index and process; another learning rate on process 1 is refused
 *               at the first step on every process, nothing changed
 *   leave D, leaveopen D  process 1 fails alone at step 3 and returns from main, having
 *               destroyed its context (leave) or not (leaveopen): process 0 hears at once,
 *               naming process 1 (test_mpi_fault.sh checks that the job ends within seconds)
 *   failjob D   a mapped function fails on process 1 alone (a collective called with NULL)
 *               while process 0 waits in that collective: process 0 fails at once with process
 *               1's message, and the context stays usable
 *   startinit   process 1 is 4 s late to start: process 0's pmap_ctx_create (timeout 1.5 s)
 *               returns PMAP_ERR_TIMEOUT from the wait for MPI_Init within 3 s
 *   startctx    process 1 creates its second context 4 s late: process 0's returns
 *               PMAP_ERR_TIMEOUT naming process 1 within 3 s
 *   stop, die   3 processes of 1 device: process 2 is 1 s late at step 3 and process 1 stops
 *               (SIGSTOP) or dies while it waits for it, its part of the exchange sent: processes
 *               0 and 2 name process 1, not each other
 *   closestop   2 processes train 3 steps (timeout 2 s); process 1 then stops before it destroys
 *               its context: process 0's pmap_ctx_destroy returns PMAP_ERR_TIMEOUT naming it
 *               within 5 s, the context destroyed all the same
 *   endstop     the same, but process 1 stops once its context is destroyed, before its exit:
 *               process 0's exit names it (test_mpi_fault.sh checks that the job ends)
 *   finstop     every process ends as usual; test_mpi_fault.sh preloads finalize_stop, which
 *               stops process 1 inside MPI_Finalize, and checks that process 0 says so and the
 *               job ends
 * Exits 77 when pmap was built without MPI. */
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "bounds.h"
#include "pmap_examples.h"
#include "testutil.h"

static int P = 1, RANK = 0;

static pmap_status dist_ctx(int devices, double timeout_s, pmap_ctx **out) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = devices,
                     .timeout_s = timeout_s,
                     .dist = PMAP_DIST_MPI};
  return pmap_ctx_create(&cfg, out);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int env_int(const char *a, const char *b) {
  const char *s = getenv(a);
  if (!s) s = getenv(b);
  return s ? atoi(s) : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* Collectives that differ                                                                    */

enum { MM_MEAN, MM_ROOT, MM_MAX, MM_LOCAL, MM_SUM, MM_SKIP, MM_SKIP_ONE, MM_BAD_ROOT, MM_HUGE };

static int mm_round; /* bumped by every MM_SUM run: a psum paired with another run's is wrong */

static pmap_status mm_fn(pmap_device *dev, void *arg) {
  int kind = *(const int *)arg, p = pmap_process_index(dev), g = pmap_axis_index(dev);
  int G = pmap_axis_size(dev);
  float buf[8] = {(float)(g + 1), 1, 1, 1, 0, 0, 0, 0};
  switch (kind) {
  case MM_MEAN: return p == 0 ? pmap_psum(dev, buf, buf, 4) : pmap_pmean(dev, buf, buf, 4);
  case MM_ROOT: return pmap_broadcast(dev, buf, buf + 4, 4, p == 0 ? 0 : 1);
  case MM_MAX: return p == 0 ? pmap_pmax(dev, buf, buf, 4) : pmap_psum(dev, buf, buf, 4);
  case MM_LOCAL: return g == G - 1 ? pmap_pmean(dev, buf, buf, 4) : pmap_psum(dev, buf, buf, 4);
  /* The last process's devices return without the psum the others wait in (or only its last
   * device does): every process fails, none pairs this psum with a later run's. */
  case MM_SKIP: return p == P - 1 ? PMAP_SUCCESS : pmap_psum(dev, buf, buf, 4);
  case MM_SKIP_ONE: return g == G - 1 ? PMAP_SUCCESS : pmap_psum(dev, buf, buf, 4);
  /* The same invalid call on every device of every process. */
  case MM_BAD_ROOT: return pmap_broadcast(dev, buf, buf + 4, 4, G);
  case MM_HUGE: return pmap_psum(dev, buf, buf + 4, (size_t)1 << 62);
  }
  buf[0] = (float)(mm_round * 1000 + g + 1);
  pmap_status st = pmap_psum(dev, buf, buf, 1);
  if (!st && buf[0] != (float)(mm_round * 1000 * G + G * (G + 1) / 2)) return PMAP_ERR_INTERNAL;
  return st;
}

typedef struct hash_job {
  float mine[4];
  float all[PMAP_MAX_DEVICES][4 * 64];
} hash_job;

static pmap_status hash_fn(pmap_device *dev, void *arg) {
  hash_job *j = arg;
  return pmap_all_gather(dev, j->mine, j->all[pmap_local_index(dev)], 4);
}

/* Every process got the same text after `from`: its hash, gathered. */
static void same_everywhere(pmap_ctx *ctx, const char *msg, const char *from, int d) {
  static hash_job job;
  const char *at = strstr(msg, from);
  uint64_t h = 1469598103934665603ull;
  for (const char *c = at ? at : msg; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  for (int k = 0; k < 4; k++) job.mine[k] = (float)((h >> (16 * k)) & 0xffff);
  CHECK_OK(pmap_run(ctx, hash_fn, &job));
  for (int k = 0; k < P * d; k++)
    CHECK(!memcmp(job.all[0] + 4 * k, job.mine, sizeof job.mine),
          "process %d: global device %d got another message than this process's: %s", RANK, k, msg);
}

static void mode_mismatch(int d) {
  pmap_ctx *ctx = NULL;
  CHECK_OK(dist_ctx(d, 20.0, &ctx));
  if (!ctx) return;
  static const struct {
    int kind;
    const char *a, *b;
  } cases[] = {{MM_MEAN, "pmap_psum(count 4)", "pmap_pmean(count 4)"},
               {MM_ROOT, "root 0", "root 1"},
               {MM_MAX, "pmap_pmax(count 4)", "pmap_psum(count 4)"},
               {MM_LOCAL, "pmap_psum(count 4)", "pmap_pmean(count 4)"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int kind = cases[i].kind, usable = MM_SUM;
    double t0 = now_s();
    pmap_status st = pmap_run(ctx, mm_fn, &kind);
    double took = now_s() - t0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pmap_last_error());
    CHECK(st == PMAP_ERR_INVALID_ARGUMENT, "case %d: %s: %s", kind, pmap_status_string(st), msg);
    CHECK(strstr(msg, "called different collectives") && strstr(msg, cases[i].a) &&
              strstr(msg, cases[i].b) && strstr(msg, "process 0 (host"),
          "case %d: message lacks the list: %s", kind, msg);
    if (kind == MM_LOCAL && d > 1)
      CHECK(strstr(msg, "its own devices called different collectives") != NULL,
            "case %d: message lacks the local difference: %s", kind, msg);
    CHECK(took < 5.0, "case %d: refused after %.1f s (timeout 20 s)", kind, took);
    if (RANK == 0) printf("process 0: refused in %.2f s: %s\n", took, msg);
    /* Still in step: a mismatch is refused before any data moves. */
    mm_round++;
    CHECK_OK(pmap_run(ctx, mm_fn, &usable));
    same_everywhere(ctx, msg, "called different collectives", d);
  }
  /* A process (or one device) that returns without the collective the others wait in, and a
   * call that every process gets wrong alike: every process fails its pmap_run with the same
   * message, and the next runs pair with each other, not with a collective of another run. */
  static const struct {
    int kind;
    const char *a;
  } shared[] = {{MM_SKIP, "returned from its mapped function without calling it"},
                {MM_SKIP_ONE, "mapped function without calling it"},
                {MM_BAD_ROOT, "is outside [0, "},
                {MM_HUGE, "count 4611686018427387904 on device"}};
  for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++) {
    int kind = shared[i].kind, usable = MM_SUM;
    double t0 = now_s();
    pmap_status st = pmap_run(ctx, mm_fn, &kind);
    double took = now_s() - t0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pmap_last_error());
    CHECK(st == PMAP_ERR_INVALID_ARGUMENT && strstr(msg, shared[i].a) &&
              !strncmp(msg, "pmap_run: device", 16),
          "case %d: %s: %s", kind, pmap_status_string(st), msg);
    CHECK(took < 5.0, "case %d: failed after %.1f s (timeout 20 s)", kind, took);
    if (RANK == 0) printf("process 0: failed in %.2f s: %s\n", took, msg);
    for (int k = 0; k < 2; k++) {
      mm_round++;
      CHECK_OK(pmap_run(ctx, mm_fn, &usable));
    }
    same_everywhere(ctx, msg, "pmap_run", d);
  }
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* A gradient function of one parameter: loss w * mean(x). */
static pmap_status one_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  *a->loss = a->params[0];
  a->grads[0] += a->scale;
  return PMAP_SUCCESS;
}

static pmap_status noop_fn(pmap_device *dev, void *arg) {
  (void)dev, (void)arg;
  return PMAP_SUCCESS;
}

/* Process 0 calls pmap_update while the others run a mapped function without collectives:
 * both calls fail on their processes, nothing is stepped, and the processes are in step for
 * the calls that follow. */
static void mode_skew(int d) {
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  CHECK_OK(dist_ctx(d, 20.0, &ctx));
  float w0 = 1.0f, x[16] = {0}, y[16] = {0};
  pmap_optimizer sgd = pmap_sgd(0.5f, 0.0f);
  if (ctx) CHECK_OK(pmap_params_create_custom(ctx, 1, &w0, one_grad, NULL, &sgd, &p));
  if (!p) return;
  int64_t shape[2] = {d, 1};
  pmap_array xs = pmap_array_f32(x, 2, shape), ys = pmap_array_f32(y, 2, shape);
  pmap_status st = RANK == 0 ? pmap_update(p, &xs, &ys, NULL) : pmap_run(ctx, noop_fn, NULL);
  CHECK(st == PMAP_ERR_INVALID_ARGUMENT && strstr(pmap_last_error(), "mapped function without"),
        "%s: %s: %s", RANK == 0 ? "pmap_update" : "pmap_run", pmap_status_string(st),
        pmap_last_error());
  CHECK(pmap_params_step(p) == 0, "a refused step counted");
  if (RANK == 0) printf("process 0: %s\n", pmap_last_error());
  int usable = MM_SUM;
  mm_round++;
  CHECK_OK(pmap_run(ctx, mm_fn, &usable));
  CHECK_OK(pmap_update(p, &xs, &ys, NULL));
  float w = 0.0f;
  CHECK_OK(pmap_params_read(p, RANK * d, &w, 1));
  CHECK(w == 0.5f && pmap_params_step(p) == 1, "after one step: w %g, step %lld", (double)w,
        (long long)pmap_params_step(p));
  pmap_params_destroy(p);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* Process 1 creates its context with another setting that changes what a step exchanges: every
 * process's pmap_ctx_create refuses, naming the setting and the processes. */
static void mode_settings(int d) {
  for (int which = 0; which < 2; which++) {
    pmap_config cfg = {
        .backend = PMAP_BACKEND_CPU, .num_devices = d, .timeout_s = 20.0, .dist = PMAP_DIST_MPI};
    if (RANK == 1 && which == 0) cfg.numeric_guard = PMAP_GUARD_OFF;
    if (RANK == 1 && which == 1) cfg.uneven_batches = 1;
    pmap_ctx *ctx = NULL;
    const char *name = which ? "uneven_batches" : "numeric_guard";
    CHECK_FAILS(pmap_ctx_create(&cfg, &ctx), PMAP_ERR_INVALID_ARGUMENT, name);
    CHECK(strstr(pmap_last_error(), "process 1 (host") != NULL, "message: %s", pmap_last_error());
    CHECK(ctx == NULL, "a refused context was returned");
    if (RANK == 0) printf("process 0: %s\n", pmap_last_error());
  }
}

/* ------------------------------------------------------------------------------------------ */
/* row0                                                                                       */

/* Loss of a row: w * (row % 5 + 1), so the gradient is the mean of (row % 5 + 1). xs holds each
 * row's global index, which row0 must match. */
static pmap_status r0_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  const float *x = a->xs.data;
  double c = 0;
  for (int64_t i = 0; i < a->xs.shape[0]; i++) {
    if ((int64_t)x[i] != a->row0 + i) {
      fprintf(stderr, "FAIL process %d device %d: row0 %lld, but its row %lld is global row %g\n",
              RANK, pmap_axis_index(a->dev), (long long)a->row0, (long long)i, (double)x[i]);
      return PMAP_ERR_INVALID_ARGUMENT;
    }
    c += (double)((a->row0 + i) % 5 + 1);
  }
  c /= (double)a->xs.shape[0];
  a->grads[0] += a->scale * (float)c;
  *a->loss = a->params[0] * (float)c;
  return PMAP_SUCCESS;
}

static void mode_row0(int d) {
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  CHECK_OK(dist_ctx(d, 20.0, &ctx));
  float w0 = 1.0f;
  pmap_optimizer opt = pmap_sgd(0.125f, 0.0f);
  if (ctx) CHECK_OK(pmap_params_create_custom(ctx, 1, &w0, r0_grad, NULL, &opt, &params));
  if (!params) return;
  int64_t mine = 4 * d, global = mine * P; /* rows of this process, of the global batch */
  float x[64], y[64] = {0};
  /* Every gradient is exact in float: a device's mean over its 4 or 2 rows of integers up to
   * 5 is a multiple of 1/4, and so is a micro-batch's half of it; the all-reduce sums a few such
   * values exactly. Two roundings remain per step, and each is exact where its exact result is a
   * float: the mean's division by the P * D devices, |d g| <= u |g|, and the update w - lr g
   * (lr = 2^-3, its product exact), at most u of its result. want is the exact run (in double,
   * whose own error is 2^-29 of float's) and tol the sum of those roundings' worst cases: 0 on
   * the layouts test_mpi_fault.sh runs (2 x 2, 3 x 1), where w must come out bitwise. */
  double want = 1.0, c = 0, tol = 0;
  /* This process's rows are rows [RANK * mine, (RANK + 1) * mine) of the global batch. */
  for (int64_t i = 0; i < mine; i++) x[i] = (float)(RANK * mine + i);
  for (int64_t i = 0; i < global; i++) c += (double)(i % 5 + 1);
  int64_t shape[2] = {mine, 1};
  pmap_array xs = pmap_array_f32(x, 2, shape), ys = pmap_array_f32(y, 2, shape);
  for (int step = 0; step < 4; step++) {
    CHECK_OK(pmap_params_set_micro_batches(params, step % 2 + 1));
    CHECK_OK(pmap_update(params, &xs, &ys, NULL));
    double g = c / (double)global, dg = (double)(float)g == g ? 0 : 0.125 * BOUND_U32 * fabs(g);
    want -= 0.125 * g;
    int exact = tol + dg == 0 && (double)(float)want == want;
    tol += dg + (exact ? 0 : BOUND_U32 * (fabs(want) + tol + dg));
  }
  float got = 0;
  CHECK_OK(pmap_params_read(params, RANK * d, &got, 1));
  CHECK(fabs((double)got - want) <= tol, "process %d: w %.9g, want %.9g (off by %.3g > %.3g)", RANK,
        (double)got, want, fabs((double)got - want), tol);
  if (RANK == 0)
    printf("process 0: row0 global on %d x %d devices, w %.9g, off by %.2e (bound %.2e)\n", P, d,
           (double)got, fabs((double)got - want), tol);
  pmap_params_destroy(params);
  pmap_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* Replica checks and the step check                                                          */

static pmap_status mlp_params(pmap_ctx *ctx, float lr, pmap_params **out, pmap_model **m) {
  pmap_example_info info;
  pmap_status st = pmap_example_info_get("mlp", &info);
  if (!st) st = pmap_example_model("mlp", m);
  info.opt.lr = lr;
  return st ? st : pmap_params_create(ctx, *m, &info.opt, 1, out);
}

static void mode_verify(int d) {
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  pmap_model *m = NULL;
  pmap_array xs = {0}, ys = {0};
  char fault[64]; /* process 1's device 0, by its global index */
  snprintf(fault, sizeof fault, "drift:device=%d:step=2", d); /* after the second update */
  if (RANK == 1) setenv("PMAP_FAULT", fault, 1);
  CHECK_OK(dist_ctx(d, 20.0, &ctx));
  unsetenv("PMAP_FAULT");
  if (ctx) CHECK_OK(mlp_params(ctx, 0.001f, &params, &m));
  CHECK_OK(pmap_example_data("mlp", 2, 4 * d, &xs, &ys));
  if (params) {
    for (int s = 0; s < 3; s++) CHECK_OK(pmap_update(params, &xs, &ys, NULL));
    char want[64];
    snprintf(want, sizeof want, "device %d (process 1, host", d); /* process 1's device 0 */
    CHECK_FAILS(pmap_params_verify(params), PMAP_ERR_DEVICE, want);
    CHECK(strstr(pmap_last_error(), "1 of ") != NULL, "one replica differs: %s", pmap_last_error());
    if (RANK == 0) printf("process 0: %s\n", pmap_last_error());
  }
  pmap_params_destroy(params);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  params = NULL;
  m = NULL;
  /* Process 1 trains with twice the learning rate: refused before anything moves. */
  CHECK_OK(dist_ctx(d, 20.0, &ctx));
  if (ctx) CHECK_OK(mlp_params(ctx, RANK == 1 ? 0.002f : 0.001f, &params, &m));
  if (params) {
    CHECK_FAILS(pmap_update(params, &xs, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT,
                "different optimizer settings");
    CHECK(strstr(pmap_last_error(), "lr 0.002") != NULL, "message lacks the rates: %s",
          pmap_last_error());
    CHECK(pmap_params_step(params) == 0, "a refused step counted");
    if (RANK == 0) printf("process 0: %s\n", pmap_last_error());
  }
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(params);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* Processes that leave, start late, stop or die                                              */

/* Process 1 fails alone before step 3 and ends; process 0 must hear within seconds. */
static int mode_leave(int d, int destroy) {
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  pmap_model *m = NULL;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(dist_ctx(d, 30.0, &ctx));
  if (ctx) CHECK_OK(mlp_params(ctx, 0.001f, &params, &m));
  CHECK_OK(pmap_example_data("mlp", 2, 4 * d, &xs, &ys));
  if (!params) return test_exit("test_mpi_fault leave setup");
  for (int s = 0; s < 6; s++) {
    if (RANK == 1 && s == 3) {
      printf("process 1: fails alone and ends (%s)\n", destroy ? "context destroyed" : "open");
      fflush(stdout);
      if (destroy) {
        pmap_params_destroy(params);
        pmap_ctx_destroy(ctx);
      }
      return 1;
    }
    double t0 = now_s();
    pmap_status st = pmap_update(params, &xs, &ys, NULL);
    if (s < 3) {
      CHECK_OK(st);
      continue;
    }
    if (RANK != 0) break;
    CHECK(st == PMAP_ERR_ABORTED, "step %d: %s: %s", s, pmap_status_string(st), pmap_last_error());
    CHECK(strstr(pmap_last_error(), "process 1 (host") != NULL, "message lacks process 1: %s",
          pmap_last_error());
    CHECK(strstr(pmap_last_error(), destroy ? "destroyed its context" : "ended") != NULL,
          "message lacks why: %s", pmap_last_error());
    CHECK(now_s() - t0 < 5.0, "heard after %.1f s (timeout 30 s)", now_s() - t0);
    printf("process 0: step %d failed after %.2f s: %s\n", s, now_s() - t0, pmap_last_error());
    if (!test_failures) printf("OK leave\n");
    break;
  }
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(params);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return test_exit("test_mpi_fault leave");
}

static pmap_status null_psum(pmap_device *dev, void *arg) {
  (void)arg;
  float buf[4] = {1, 2, 3, 4};
  int bad = pmap_process_index(dev) == 1 && pmap_local_index(dev) == 0;
  return pmap_psum(dev, bad ? NULL : buf, bad ? NULL : buf, 4);
}

static int mode_failjob(int d) {
  pmap_ctx *ctx = NULL;
  CHECK_OK(dist_ctx(d, 30.0, &ctx));
  if (!ctx) return test_exit("test_mpi_fault failjob setup");
  for (int rep = 0; rep < 2; rep++) {
    double t0 = now_s();
    pmap_status st = pmap_run(ctx, null_psum, NULL);
    double took = now_s() - t0;
    const char *msg = pmap_last_error();
    char who[64];
    snprintf(who, sizeof who, "pmap_run: device %d (process 1 of", d); /* process 1's device 0 */
    CHECK(st == PMAP_ERR_INVALID_ARGUMENT, "%s: %s", pmap_status_string(st), msg);
    CHECK(strstr(msg, "send is NULL") && !strncmp(msg, who, strlen(who)),
          "message is not process 1's: %s", msg);
    CHECK(took < 5.0, "heard after %.1f s (timeout 30 s)", took);
    if (RANK == 0) printf("process 0: failed after %.2f s: %s\n", took, msg);
  }
  /* Every process failed the same run alike: the context is in step and usable. */
  int usable = MM_SUM;
  mm_round++;
  CHECK_OK(pmap_run(ctx, mm_fn, &usable));
  if (RANK == 0 && !test_failures) printf("OK failjob\n");
  pmap_ctx_destroy(ctx);
  return test_exit("test_mpi_fault failjob");
}

static int mode_start(int late_init) {
  pmap_ctx *ctx = NULL;
  if (!late_init) {
    CHECK_OK(dist_ctx(1, 30.0, &ctx)); /* MPI started, every process met once */
    CHECK_OK(pmap_ctx_destroy(ctx));
    ctx = NULL;
  }
  if (RANK == 1) {
    sleep(4);
    pmap_status st = dist_ctx(1, 30.0, &ctx);
    pmap_ctx_destroy(ctx);
    return st ? 1 : 0;
  }
  double t0 = now_s();
  pmap_status st = dist_ctx(1, 1.5, &ctx);
  double took = now_s() - t0;
  CHECK(st == PMAP_ERR_TIMEOUT, "late process: %s: %s", pmap_status_string(st), pmap_last_error());
  CHECK(took < 3.0, "gave up after %.1f s (timeout 1.5 s)", took);
  CHECK(strstr(pmap_last_error(), late_init ? "MPI_Init_thread did not return" : "process 1 did") !=
            NULL,
        "message: %s", pmap_last_error());
  printf("process 0: pmap_ctx_create failed after %.2f s: %s\n", took, pmap_last_error());
  if (!test_failures) printf("OK start\n");
  pmap_ctx_destroy(ctx);
  return test_exit("test_mpi_fault start");
}

static void stop_or_die(int die) {
  struct timespec ts = {0, 300000000};
  nanosleep(&ts, NULL);
  if (die) _exit(5);
  kill(getpid(), SIGSTOP);
}
static void *stopper(void *arg) {
  stop_or_die(arg != NULL);
  return NULL;
}

static int mode_after_send(int die) {
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  pmap_model *m = NULL;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(dist_ctx(1, 2.0, &ctx));
  if (ctx) CHECK_OK(mlp_params(ctx, 0.001f, &params, &m));
  CHECK_OK(pmap_example_data("mlp", 2, 4, &xs, &ys));
  if (!params || P != 3) return test_exit("test_mpi_fault after-send setup (3 processes)");
  for (int s = 0; s < 3; s++) CHECK_OK(pmap_update(params, &xs, &ys, NULL));
  pthread_t th;
  if (RANK == 2) sleep(1);
  if (RANK == 1) pthread_create(&th, NULL, stopper, die ? &th : NULL);
  double t0 = now_s();
  pmap_status st = pmap_update(params, &xs, &ys, NULL);
  double took = now_s() - t0;
  if (RANK != 1) {
    const char *msg = pmap_last_error(), *other = RANK == 0 ? "process 2 (host" : "process 0 (host";
    CHECK(st == PMAP_ERR_TIMEOUT, "%s: %s", pmap_status_string(st), msg);
    CHECK(strstr(msg, "process 1 (host") && strstr(msg, "during the transfer"),
          "message does not name process 1: %s", msg);
    /* Process 2 is named only as the process of the device that reports. */
    const char *named = strstr(msg, other);
    CHECK(!named || strstr(msg, "collective #") < named, "names another process: %s", msg);
    CHECK(took < 6.0, "gave up after %.1f s (timeout 2 s, 1 s late)", took);
    printf("process %d: %.2f s: %s\n", RANK, took, msg);
    if (!test_failures) printf("OK after-send %d\n", RANK);
  }
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(params);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
  return test_exit("test_mpi_fault after-send");
}

/* The end of a job whose process 1 stops (SIGSTOP): before destroying its context (closestop),
 * after it (endstop), or inside MPI_Finalize (finstop, by the preloaded finalize_stop). */
static int mode_end(const char *mode) {
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  pmap_model *m = NULL;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(dist_ctx(1, 2.0, &ctx));
  if (ctx) CHECK_OK(mlp_params(ctx, 0.001f, &params, &m));
  CHECK_OK(pmap_example_data("mlp", 2, 4, &xs, &ys));
  if (!params) return test_exit("test_mpi_fault end setup");
  for (int s = 0; s < 3; s++) CHECK_OK(pmap_update(params, &xs, &ys, NULL));
  pmap_example_data_free(&xs, &ys);
  pmap_params_destroy(params);
  pmap_model_destroy(m);
  int closestop = !strcmp(mode, "closestop");
  if (RANK == 1 && closestop) kill(getpid(), SIGSTOP);
  double t0 = now_s();
  pmap_status st = pmap_ctx_destroy(ctx);
  double took = now_s() - t0;
  if (closestop && RANK == 0) {
    const char *msg = pmap_last_error();
    CHECK(st == PMAP_ERR_TIMEOUT, "pmap_ctx_destroy: %s: %s", pmap_status_string(st), msg);
    CHECK(!strncmp(msg, "pmap_ctx_destroy: process 0 of 2 (host ", 39) &&
              strstr(msg, "process 1 (host ") && strstr(msg, "did not destroy its context"),
          "message does not name process 1: %s", msg);
    CHECK(took < 5.0, "gave up after %.1f s (timeout 2 s)", took);
    printf("process 0: pmap_ctx_destroy after %.2f s: %s\n", took, msg);
  } else if (!closestop) {
    CHECK(st == PMAP_SUCCESS, "pmap_ctx_destroy: %s: %s", pmap_status_string(st),
          pmap_last_error());
  }
  if (RANK == 1 && !strcmp(mode, "endstop")) kill(getpid(), SIGSTOP);
  if (RANK == 0 && !test_failures) printf("OK end %s\n", mode);
  fflush(stdout);
  return test_exit("test_mpi_fault end");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s MODE [DEVICES] (under mpirun; see the top of the file)\n", argv[0]);
    return 2;
  }
  if (!pmap_backend_built(PMAP_BACKEND_CPU)) return 77;
  RANK = env_int("OMPI_COMM_WORLD_RANK", "PMI_RANK");
  P = env_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE");
  if (RANK < 0 || P < 2) {
    printf("SKIP: not started by mpirun with 2 or more processes\n");
    return 77;
  }
  const char *mode = argv[1];
  int d = argc > 2 ? atoi(argv[2]) : 1;
  if (!strcmp(mode, "startinit")) return mode_start(1);
  if (!strcmp(mode, "startctx")) return mode_start(0);
  /* Learn whether this build spans processes from a one-device context. */
  pmap_ctx *probe = NULL;
  pmap_status st = dist_ctx(1, 30.0, &probe);
  if (st == PMAP_ERR_UNAVAILABLE) {
    printf("SKIP: %s\n", pmap_last_error());
    return 77;
  }
  pmap_ctx_destroy(probe);
  if (!strcmp(mode, "mismatch")) {
    mode_mismatch(d);
    mode_skew(d);
    mode_settings(d);
  } else if (!strcmp(mode, "row0")) {
    mode_row0(d);
  } else if (!strcmp(mode, "verify")) {
    mode_verify(d);
  } else if (!strcmp(mode, "failjob")) {
    return mode_failjob(d);
  } else if (!strcmp(mode, "leave") || !strcmp(mode, "leaveopen")) {
    return mode_leave(d, !strcmp(mode, "leave"));
  } else if (!strcmp(mode, "stop") || !strcmp(mode, "die")) {
    return mode_after_send(!strcmp(mode, "die"));
  } else if (!strcmp(mode, "closestop") || !strcmp(mode, "endstop") || !strcmp(mode, "finstop")) {
    return mode_end(mode);
  } else {
    fprintf(stderr, "unknown mode %s\n", mode);
    return 2;
  }
  char name[64];
  snprintf(name, sizeof name, "test_mpi_fault %s, process %d of %d", mode, RANK, P);
  return test_exit(name);
}
