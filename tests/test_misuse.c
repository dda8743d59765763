/* test_misuse.c: the runtime under misuse, each case a regression of a crash or a corruption:
 * freeing buffers right after a timed-out collective, two host threads on one context,
 * mismatched collectives, a device leaving early, stale messages, lifetime errors, extreme
 * timeouts, the one-verdict rule of a barrier at its deadline, collective counts whose bytes
 * overflow, and a forked child using its parent's context. CPU backend. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static pmap_ctx *make_ctx(int n, double timeout_s) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n, .timeout_s = timeout_s};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  return ctx;
}

static void sleep_ns(long ns) {
  struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------------------------------------ */
/* 1. A collective that fails leaves no device using another's buffers                         */

typedef struct big_job {
  size_t count;
  pmap_status st[PMAP_MAX_DEVICES];
} big_job;

/* psum of a large array with a tiny timeout; every device frees its buffers at once after the
 * call returns, whatever it returned (ASan reports any use after that). */
static pmap_status big_psum_fn(pmap_device *dev, void *arg) {
  big_job *j = arg;
  int d = pmap_axis_index(dev);
  float *send = malloc(j->count * sizeof *send), *recv = malloc(j->count * sizeof *recv);
  if (!send || !recv) {
    free(send);
    free(recv);
    return PMAP_ERR_OUT_OF_MEMORY;
  }
  for (size_t i = 0; i < j->count; i++) send[i] = (float)(i % 7);
  j->st[d] = pmap_psum(dev, send, recv, j->count);
  memset(send, 0xff, j->count * sizeof *send); /* as a reuse would */
  free(send);
  free(recv);
  return j->st[d];
}

static void test_timeout_then_free(void) {
  pmap_ctx *ctx = make_ctx(4, 0.002);
  if (!ctx) return;
  int failed_runs = 0;
  for (int rep = 0; rep < 6; rep++) {
    big_job j = {.count = 8000000};
    pmap_status st = pmap_run(ctx, big_psum_fn, &j);
    if (st != PMAP_SUCCESS) failed_runs++;
    CHECK(st == PMAP_SUCCESS || st == PMAP_ERR_TIMEOUT, "run %d -> %s: %s", rep,
          pmap_status_string(st), pmap_last_error());
  }
  /* The context survives: a small job succeeds (the 2 ms timeout still applies, so a loaded
   * machine may need a few tries). */
  int small_ok = 0;
  for (int rep = 0; rep < 50 && !small_ok; rep++) {
    big_job j = {.count = 100};
    small_ok = pmap_run(ctx, big_psum_fn, &j) == PMAP_SUCCESS;
  }
  CHECK(small_ok, "no small psum succeeded after the timeouts: %s", pmap_last_error());
  printf("timeout then free: %d of 6 runs timed out, no buffer used after its return\n",
         failed_runs);
  pmap_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* 2. Two host threads, one context                                                           */

typedef struct trainer {
  pmap_params *params;
  int64_t batch;
  int steps;
  int failures;
  float *x, *y;
} trainer;

static void *train_thread(void *arg) {
  trainer *t = arg;
  int64_t shape[2] = {t->batch, 1};
  pmap_array xs = pmap_array_f32(t->x, 2, shape), ys = pmap_array_f32(t->y, 2, shape);
  for (int s = 0; s < t->steps; s++) {
    float loss = NAN;
    if (pmap_update(t->params, &xs, &ys, &loss) != PMAP_SUCCESS || !isfinite(loss)) t->failures++;
  }
  return NULL;
}

typedef struct reader {
  pmap_params *params;
  int device, reads, failures;
} reader;

static void *read_thread(void *arg) {
  reader *r = arg;
  float w[2];
  for (int i = 0; i < r->reads; i++) {
    w[0] = w[1] = NAN;
    if (pmap_params_read(r->params, r->device, w, 2) || !isfinite(w[0]) || !isfinite(w[1]))
      r->failures++;
  }
  return NULL;
}

/* Saves to its own path, or (path NULL) verifies, `times` times. */
typedef struct keeper {
  pmap_params *params;
  const char *path;
  int times, failures;
  char msg[256];
} keeper;

static void *keep_thread(void *arg) {
  keeper *k = arg;
  for (int i = 0; i < k->times; i++) {
    pmap_status st = k->path ? pmap_params_save(k->params, k->path) : pmap_params_verify(k->params);
    if (st != PMAP_SUCCESS && !k->failures++)
      snprintf(k->msg, sizeof k->msg, "%s", pmap_last_error());
  }
  return NULL;
}

static void test_two_threads(void) {
  pmap_ctx *ctx = make_ctx(4, 0.0);
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  int64_t in[1] = {1};
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_dense(m, 1));
  CHECK_OK(pmap_params_create(ctx, m, &sgd, 3, &p));
  if (!p) return;
  enum { BIG = 4096 };
  static float xb[BIG], yb[BIG];
  uint64_t seed = 5;
  test_fill(xb, BIG, &seed, -1.0f, 1.0f);
  for (int i = 0; i < BIG; i++) yb[i] = 2.0f * xb[i] - 1.0f;
  trainer a = {p, 8, 300, 0, xb, yb}, b = {p, BIG, 60, 0, xb, yb};
  reader r1 = {p, 1, 200, 0}, r2 = {p, 3, 200, 0};
  /* Checkpoints and replica checks from two more threads: each call waits its turn. */
  char dir[] = "/tmp/pmap-misuse-XXXXXX", pa[64], pb[64];
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  snprintf(pa, sizeof pa, "%s/a.ckpt", dir);
  snprintf(pb, sizeof pb, "%s/b.ckpt", dir);
  keeper ka = {.params = p, .path = pa, .times = 40}, kb = {.params = p, .path = pb, .times = 40};
  keeper kv = {.params = p, .times = 40};
  pthread_t ta, tb, t1, t2, k1, k2, k3;
  pthread_create(&ta, NULL, train_thread, &a);
  pthread_create(&tb, NULL, train_thread, &b);
  pthread_create(&t1, NULL, read_thread, &r1);
  pthread_create(&t2, NULL, read_thread, &r2);
  pthread_create(&k1, NULL, keep_thread, &ka);
  pthread_create(&k2, NULL, keep_thread, &kb);
  pthread_create(&k3, NULL, keep_thread, &kv);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  pthread_join(k1, NULL);
  pthread_join(k2, NULL);
  pthread_join(k3, NULL);
  CHECK(a.failures == 0 && b.failures == 0, "concurrent updates failed %d + %d times", a.failures,
        b.failures);
  CHECK(r1.failures == 0 && r2.failures == 0, "concurrent reads failed %d + %d times", r1.failures,
        r2.failures);
  CHECK(ka.failures == 0 && kb.failures == 0 && kv.failures == 0,
        "concurrent saves and verifies failed %d + %d + %d times: %s%s%s", ka.failures, kb.failures,
        kv.failures, ka.msg, kb.msg, kv.msg);
  unlink(pa);
  unlink(pb);
  rmdir(dir);
  CHECK(pmap_params_step(p) == 360, "step count %lld after 300 + 60 updates",
        (long long)pmap_params_step(p));
  float w0[2], wd[2];
  CHECK_OK(pmap_params_read(p, 0, w0, 2));
  for (int d = 1; d < 4; d++) {
    CHECK_OK(pmap_params_read(p, d, wd, 2));
    test_same_bits("replicas after concurrent updates", wd, w0, 2);
  }
  CHECK(fabsf(w0[0] - 2.0f) < 0.05f && fabsf(w0[1] + 1.0f) < 0.05f,
        "w %g b %g after concurrent training", (double)w0[0], (double)w0[1]);
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* 4. Mismatched collectives and a device that leaves early                                   */

typedef struct mismatch_job {
  int mode;
  pmap_status st[PMAP_MAX_DEVICES];
  char msg[PMAP_MAX_DEVICES][1024];
} mismatch_job;

static pmap_status mismatch_fn(pmap_device *dev, void *arg) {
  mismatch_job *j = arg;
  int d = pmap_axis_index(dev);
  float buf[4] = {1, 2, 3, 4}, out[4];
  pmap_status st = PMAP_SUCCESS;
  switch (j->mode) {
  case 0: st = d == 0 ? pmap_psum(dev, buf, out, 4) : pmap_barrier(dev); break;
  case 1: st = pmap_psum(dev, buf, out, d == 1 ? 2 : 4); break;
  case 2: st = pmap_broadcast(dev, buf, out, 4, d == 2 ? 1 : 0); break;
  case 3: /* device 0 returns at once; the others wait for it in a psum */
    if (d == 0) return PMAP_SUCCESS;
    st = pmap_psum(dev, buf, out, 4);
    break;
  case 4: st = pmap_psum(dev, buf, out, d == 0 ? 0 : 4); break;
  }
  j->st[d] = st;
  snprintf(j->msg[d], sizeof j->msg[d], "%s", pmap_last_error());
  return st;
}

static void test_mismatch(void) {
  const char *needle[] = {"pmap_psum(count 4)", "count 2", "root 1", "returned from the mapped",
                          "count 0"};
  for (int n = 2; n <= 4; n++) {
    pmap_ctx *ctx = make_ctx(n, 30.0); /* a hang would take 30 s: the test bounds it */
    if (!ctx) return;
    for (int mode = 0; mode < 5; mode++) {
      if (mode == 2 && n < 3) continue;
      mismatch_job j;
      memset(&j, 0, sizeof j);
      j.mode = mode;
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      pmap_status st = pmap_run(ctx, mismatch_fn, &j);
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
      CHECK(st == PMAP_ERR_INVALID_ARGUMENT, "N %d mode %d -> %s: %s", n, mode,
            pmap_status_string(st), pmap_last_error());
      CHECK(strstr(pmap_last_error(), needle[mode]) != NULL, "N %d mode %d: \"%s\" lacks \"%s\"", n,
            mode, pmap_last_error(), needle[mode]);
      CHECK(secs < 10.0, "N %d mode %d took %.1f s: waited for the timeout", n, mode, secs);
      for (int d = mode == 3 ? 1 : 0; d < n; d++)
        CHECK(j.st[d] != PMAP_SUCCESS, "N %d mode %d: device %d's collective succeeded", n, mode,
              d);
    }
    /* The context is still usable. */
    mismatch_job ok = {.mode = 1};
    CHECK(pmap_run(ctx, mismatch_fn, &ok) == PMAP_ERR_INVALID_ARGUMENT, "again");
    pmap_ctx_destroy(ctx);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* 5. Stale messages; 6. lifetime                                                              */

static pmap_status fail_on_2(pmap_device *dev, void *arg) {
  (void)arg;
  if (pmap_axis_index(dev) != 2) return pmap_barrier(dev);
  return PMAP_ERR_DEVICE; /* no message */
}

static pmap_status aborting_fn(pmap_device *dev, void *arg) {
  (void)arg;
  if (pmap_axis_index(dev) == 0) return PMAP_ERR_INTERNAL; /* no message either */
  float x = 1.0f;
  return pmap_psum(dev, &x, &x, 1);
}

static void test_stale_message(void) {
  pmap_ctx *ctx = make_ctx(4, 0.0);
  if (!ctx) return;
  CHECK(pmap_run(ctx, aborting_fn, NULL) == PMAP_ERR_INTERNAL, "%s", pmap_last_error());
  CHECK_FAILS(pmap_run(ctx, fail_on_2, NULL), PMAP_ERR_DEVICE, "without a message");
  CHECK(strstr(pmap_last_error(), "abandoned") == NULL, "stale text: %s", pmap_last_error());
  CHECK(strstr(pmap_last_error(), "device 2") != NULL, "%s", pmap_last_error());
  pmap_ctx_destroy(ctx);
}

typedef struct destroy_job {
  pmap_ctx *ctx;
  pmap_params *params;
  pmap_status st[PMAP_MAX_DEVICES];
} destroy_job;

static pmap_status destroy_inside_fn(pmap_device *dev, void *arg) {
  destroy_job *j = arg;
  int d = pmap_axis_index(dev);
  j->st[d] = d == 0 ? pmap_ctx_destroy(j->ctx) : PMAP_SUCCESS;
  if (d == 1) {
    float w[2];
    pmap_status st = pmap_params_read(j->params, 0, w, 2);
    j->st[d] = st;
  }
  return PMAP_SUCCESS;
}

static void test_lifetime(void) {
  pmap_ctx *ctx = make_ctx(3, 5.0);
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  int64_t in[1] = {1};
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_dense(m, 1));
  CHECK_OK(pmap_params_create(ctx, m, &sgd, 1, &p));
  CHECK_FAILS(pmap_ctx_destroy(ctx), PMAP_ERR_INVALID_ARGUMENT, "1 pmap_params still use");
  float w[2];
  CHECK_OK(pmap_params_read(p, 2, w, 2)); /* still usable */
  destroy_job j = {ctx, p, {0}};
  CHECK_OK(pmap_run(ctx, destroy_inside_fn, &j));
  CHECK(j.st[0] == PMAP_ERR_INVALID_ARGUMENT, "destroy inside a mapped function -> %s",
        pmap_status_string(j.st[0]));
  CHECK(j.st[1] == PMAP_ERR_INVALID_ARGUMENT, "params_read inside a mapped function -> %s",
        pmap_status_string(j.st[1]));
  pmap_params_destroy(p);
  CHECK_OK(pmap_ctx_destroy(ctx));
  CHECK_OK(pmap_ctx_destroy(NULL));
  pmap_model_destroy(m);
}

/* ------------------------------------------------------------------------------------------ */
/* 8. Extreme timeouts; 9. one verdict at the deadline                                         */

static void test_timeouts(void) {
  const double values[] = {INFINITY, 1e300, 1e10, 1e9, -INFINITY, -1.0, 1e-300};
  for (size_t i = 0; i < sizeof values / sizeof *values; i++) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .timeout_s = values[i]};
    pmap_ctx *ctx = NULL;
    CHECK(pmap_ctx_create(&cfg, &ctx) == PMAP_SUCCESS, "timeout %g: %s", values[i],
          pmap_last_error());
    pmap_ctx_destroy(ctx);
  }
  pmap_config bad = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .numeric_guard = 7};
  pmap_ctx *ctx = NULL;
  CHECK_FAILS(pmap_ctx_create(&bad, &ctx), PMAP_ERR_INVALID_ARGUMENT, "numeric_guard 7");
}

typedef struct verdict_job {
  long delay_ns[PMAP_MAX_DEVICES];
  pmap_status st[PMAP_MAX_DEVICES];
} verdict_job;

static pmap_status verdict_fn(pmap_device *dev, void *arg) {
  verdict_job *j = arg;
  int d = pmap_axis_index(dev);
  if (j->delay_ns[d]) sleep_ns(j->delay_ns[d]);
  j->st[d] = pmap_barrier(dev);
  return PMAP_SUCCESS;
}

/* One device arrives close to the others' deadline: over many tries, every device of each
 * barrier must agree on success or failure. */
static void test_one_verdict(void) {
  const int n = 3;
  const double timeout = 0.002;
  pmap_ctx *ctx = make_ctx(n, timeout);
  if (!ctx) return;
  uint64_t seed = 11;
  int split = 0, ok = 0, failed = 0;
  for (int rep = 0; rep < 300; rep++) {
    verdict_job j;
    memset(&j, 0, sizeof j);
    int late = (int)(test_rand_u64(&seed) % (uint64_t)n);
    j.delay_ns[late] = (long)(test_rand_uniform(&seed, 0.6f, 1.4f) * timeout * 1e9);
    pmap_run(ctx, verdict_fn, &j);
    int good = 0;
    for (int d = 0; d < n; d++) good += j.st[d] == PMAP_SUCCESS;
    if (good != 0 && good != n) split++;
    if (good == n) ok++;
    if (good == 0) failed++;
  }
  CHECK(split == 0, "%d of 300 barriers split their verdict", split);
  printf("one verdict: %d barriers released, %d failed everywhere, %d split\n", ok, failed, split);
  pmap_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* 3. Sizes from user input that overflow                                                     */

static void test_overflow(void) {
  pmap_ctx *ctx = make_ctx(4, 0.0);
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  int64_t in[1] = {1};
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_model_create(1, in, &m));
  /* 255 layers of 2^20 activations per example, 2^33 examples per device: 2^62 floats. */
  CHECK_OK(pmap_model_add_dense(m, (int64_t)1 << 20));
  for (int i = 0; i < 255; i++) CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_dense(m, 1));
  CHECK_OK(pmap_params_create(ctx, m, &sgd, 1, &p));
  float tiny[64] = {0};
  int32_t labels[64] = {0};
  int64_t big[2] = {(int64_t)1 << 35, 1}, yshape[2] = {(int64_t)1 << 35, 1};
  pmap_array xs = pmap_array_f32(tiny, 2, big), ys = pmap_array_f32(tiny, 2, yshape);
  CHECK_FAILS(pmap_update(p, &xs, &ys, NULL), PMAP_ERR_OUT_OF_MEMORY, "address space");
  int64_t huge[2] = {INT64_C(1) << 62, 1};
  xs = pmap_array_f32(tiny, 2, huge);
  CHECK_FAILS(pmap_update(p, &xs, &ys, NULL), PMAP_ERR_INVALID_ARGUMENT, "address space");
  CHECK(pmap_params_step(p) == 0, "a rejected step counted");
  pmap_params_destroy(p);
  pmap_model_destroy(m);

  /* Labels whose shape overflows or is negative. */
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_dense(m, 3));
  CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT));
  CHECK_OK(pmap_params_create(ctx, m, &sgd, 1, &p));
  int64_t xshape[2] = {4, 1}, l4[4] = {4, INT64_C(1) << 32, INT64_C(1) << 32, 1},
          lneg[3] = {4, -1, -1}, lzero[2] = {4, 0};
  xs = pmap_array_f32(tiny, 2, xshape);
  pmap_array bad = pmap_array_i32(labels, 4, l4);
  CHECK_FAILS(pmap_update(p, &xs, &bad, NULL), PMAP_ERR_INVALID_ARGUMENT, "fit in 64 bits");
  bad = pmap_array_i32(labels, 3, lneg);
  CHECK_FAILS(pmap_update(p, &xs, &bad, NULL), PMAP_ERR_INVALID_ARGUMENT, "(4, -1, -1)");
  bad = pmap_array_i32(labels, 2, lzero);
  CHECK_FAILS(pmap_update(p, &xs, &bad, NULL), PMAP_ERR_INVALID_ARGUMENT, "(4, 0)");
  bad = pmap_array_f32(tiny, 2, xshape);
  CHECK_FAILS(pmap_update(p, &xs, &bad, NULL), PMAP_ERR_INVALID_ARGUMENT, "got f32");
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  pmap_ctx_destroy(ctx);
}

typedef struct alloc_job {
  pmap_status st[PMAP_MAX_DEVICES];
} alloc_job;

static pmap_status huge_alloc_fn(pmap_device *dev, void *arg) {
  alloc_job *j = arg;
  float *p = (float *)&j; /* must be set to NULL on failure */
  j->st[pmap_axis_index(dev)] = pmap_device_alloc(dev, (size_t)1 << 62, &p);
  if (p) return PMAP_ERR_INTERNAL;
  pmap_status st2 = pmap_device_alloc(dev, SIZE_MAX, &p);
  if (st2 == PMAP_SUCCESS || p) return PMAP_ERR_INTERNAL;
  return PMAP_SUCCESS;
}

static void test_device_alloc_overflow(void) {
  pmap_ctx *ctx = make_ctx(2, 0.0);
  alloc_job j;
  memset(&j, 0, sizeof j);
  CHECK_OK(pmap_run(ctx, huge_alloc_fn, &j));
  for (int d = 0; d < 2; d++)
    CHECK(j.st[d] == PMAP_ERR_OUT_OF_MEMORY, "device %d: alloc of 2^62 floats -> %s", d,
          pmap_status_string(j.st[d]));
  pmap_ctx_destroy(ctx);
}

/* Collective counts whose bytes do not fit an object (count x 4, and N x count x 4 for
 * all_gather's recv): refused on every device before any rendezvous, naming the count, on 1
 * device as on several; the buffers are tiny, so a count that got through would crash. */
typedef struct count_job {
  int which;
  size_t count;
} count_job;

static pmap_status huge_count_fn(pmap_device *dev, void *arg) {
  const count_job *j = arg;
  float s[16] = {0}, r[64] = {0};
  switch (j->which) {
  case 0: return pmap_psum(dev, s, r, j->count);
  case 1: return pmap_pmean(dev, s, s, j->count);
  case 2: return pmap_pmax(dev, s, r, j->count);
  case 3: return pmap_all_gather(dev, s, r, j->count);
  default: return pmap_broadcast(dev, s, r, j->count, 0);
  }
}

static void test_collective_overflow(void) {
  for (int n = 1; n <= 2; n++) {
    pmap_ctx *ctx = make_ctx(n, 5.0);
    if (!ctx) return;
    const size_t gather2 = (size_t)PTRDIFF_MAX / 4 / 2 + 1; /* fits once, not twice */
    const count_job jobs[] = {{0, (size_t)1 << 62},  {0, SIZE_MAX},        {1, (size_t)1 << 62},
                              {2, SIZE_MAX / 4 + 1}, {3, (size_t)1 << 62}, {4, (size_t)1 << 62},
                              {3, gather2}};
    for (size_t k = 0; k < sizeof jobs / sizeof *jobs; k++) {
      if (jobs[k].count == gather2 && n == 1) continue; /* fits on one device: a real size */
      char want[64];
      snprintf(want, sizeof want, "count %zu on device 0", jobs[k].count);
      CHECK_FAILS(pmap_run(ctx, huge_count_fn, (void *)&jobs[k]), PMAP_ERR_INVALID_ARGUMENT, want);
    }
    count_job ok = {0, 4};
    CHECK_OK(pmap_run(ctx, huge_count_fn, &ok));
    pmap_ctx_destroy(ctx);
  }
}

/* Contexts nested across threads: A's device 1 (a worker thread) runs a job on B, whose device 0
 * calls pmap_run on A: refused, not a deadlock, on every device of B. */
static pmap_ctx *nest_a, *nest_b;
static _Atomic int nest_refused;

static pmap_status nest_inner(pmap_device *dev, void *arg) {
  (void)dev;
  (void)arg;
  return PMAP_SUCCESS;
}

static pmap_status nest_b_fn(pmap_device *dev, void *arg) {
  (void)dev;
  (void)arg;
  if (pmap_run(nest_a, nest_inner, NULL) == PMAP_ERR_INVALID_ARGUMENT &&
      strstr(pmap_last_error(), "re-entrant"))
    atomic_fetch_add(&nest_refused, 1);
  return PMAP_SUCCESS;
}

static pmap_status nest_a_fn(pmap_device *dev, void *arg) {
  (void)arg;
  return pmap_axis_index(dev) == 1 ? pmap_run(nest_b, nest_b_fn, NULL) : PMAP_SUCCESS;
}

static void test_nested_contexts(void) {
  nest_a = make_ctx(2, 20.0);
  nest_b = make_ctx(3, 20.0);
  if (!nest_a || !nest_b) return;
  atomic_store(&nest_refused, 0);
  CHECK_OK(pmap_run(nest_a, nest_a_fn, NULL));
  CHECK(atomic_load(&nest_refused) == 3, "%d of B's 3 devices were refused a call on A",
        atomic_load(&nest_refused));
  CHECK_OK(pmap_run(nest_b, nest_b_fn, NULL)); /* not nested: A is free, the calls succeed */
  CHECK(atomic_load(&nest_refused) == 3, "a call on A from an unnested job was refused");
  pmap_ctx_destroy(nest_b);
  pmap_ctx_destroy(nest_a);
}

/* ------------------------------------------------------------------------------------------ */
/* 10. A forked child and its parent's context                                                */

static _Atomic int slow_started;

static pmap_status slow_fn(pmap_device *dev, void *arg) {
  (void)arg;
  atomic_store(&slow_started, 1);
  if (pmap_axis_index(dev) == 0) sleep_ns(300000000L);
  return PMAP_SUCCESS;
}

static pmap_status slow_status;

static void *slow_thread(void *arg) {
  slow_status = pmap_run(arg, slow_fn, NULL); /* checked by the main thread after the join */
  return NULL;
}

/* The child's calls, each of which must return at once; its exit status is its failure count. */
static void forked_child(pmap_ctx *ctx, pmap_params *p, pmap_model *m, long parent) {
  char pids[64];
  snprintf(pids, sizeof pids, "created by process %ld and this is process %ld", parent,
           (long)getpid());
  float x[4] = {1, 2, 3, 4}, y[4] = {0, 0, 0, 0}, w[2], loss = 0;
  pmap_array xs = pmap_array_f32(x, 2, (int64_t[]){4, 1});
  pmap_array ys = pmap_array_f32(y, 2, (int64_t[]){4, 1});
  CHECK_FAILS(pmap_update(p, &xs, &ys, &loss), PMAP_ERR_INVALID_ARGUMENT, pids);
  CHECK_FAILS(pmap_params_read(p, 0, w, 2), PMAP_ERR_INVALID_ARGUMENT, pids);
  CHECK_FAILS(pmap_run(ctx, nest_inner, NULL), PMAP_ERR_INVALID_ARGUMENT, pids);
  pmap_params *q = NULL;
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  CHECK_FAILS(pmap_params_create(ctx, m, &sgd, 1, &q), PMAP_ERR_INVALID_ARGUMENT, pids);
  CHECK(pmap_params_step(p) == 0, "pmap_params_step in the child: %lld",
        (long long)pmap_params_step(p));
  pmap_params_destroy(p); /* refused: changes nothing */
  CHECK_FAILS(pmap_ctx_destroy(ctx), PMAP_ERR_INVALID_ARGUMENT, "cannot be used here");
  fflush(stdout);
  _exit(test_failures > 255 ? 255 : test_failures);
}

/* The child is forked while another thread of the parent holds the context's lock inside a job:
 * in the child that lock is never released and no worker thread exists, so anything that waits
 * hangs. Every call must fail at once instead; the parent's context is unharmed. */
static void test_fork(void) {
  pmap_ctx *ctx = make_ctx(2, 120.0);
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  int64_t in[1] = {1};
  pmap_optimizer sgd = pmap_sgd(0.1f, 0.0f);
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_dense(m, 1));
  CHECK_OK(pmap_params_create(ctx, m, &sgd, 1, &p));
  if (!p) return;
  atomic_store(&slow_started, 0);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, slow_thread, ctx) == 0, "pthread_create");
  while (!atomic_load(&slow_started)) sleep_ns(1000000L);
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork failed");
  if (pid == 0) forked_child(ctx, p, m, (long)getppid());
  /* A child that waits for the lock or a worker would outlive this: 60 s, then it is a hang. */
  int status = 0, waited_ms = 0;
  pid_t r = 0;
  while (pid > 0 && (r = waitpid(pid, &status, WNOHANG)) == 0 && waited_ms < 60000) {
    sleep_ns(10000000L);
    waited_ms += 10;
  }
  if (pid > 0 && r == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  CHECK(r == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the forked child %s (status %d after %d ms)", r == 0 ? "hung" : "failed", status,
        waited_ms);
  pthread_join(t, NULL);
  CHECK(slow_status == PMAP_SUCCESS, "the parent's job during the fork -> %s",
        pmap_status_string(slow_status));
  float x[4] = {1, 2, 3, 4}, y[4] = {0, 0, 0, 0}, loss = 0;
  pmap_array xs = pmap_array_f32(x, 2, (int64_t[]){4, 1});
  pmap_array ys = pmap_array_f32(y, 2, (int64_t[]){4, 1});
  CHECK_OK(pmap_update(p, &xs, &ys, &loss)); /* the parent's context still works */
  CHECK(pmap_params_step(p) == 1, "step %lld after one update", (long long)pmap_params_step(p));
  pmap_params_destroy(p);
  CHECK_OK(pmap_ctx_destroy(ctx));
  pmap_model_destroy(m);
  printf("fork: the child's calls on its parent's context returned within %d ms\n", waited_ms);
}

int main(void) {
  test_fork();
  test_nested_contexts();
  test_timeout_then_free();
  test_two_threads();
  test_mismatch();
  test_stale_message();
  test_lifetime();
  test_timeouts();
  test_one_verdict();
  test_overflow();
  test_device_alloc_overflow();
  test_collective_overflow();
  return test_exit("misuse");
}
