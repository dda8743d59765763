/* test_run.c: user mapped functions through pmap_run on the CPU backend: sharding by axis index,
 * collectives on shard results, device memory, argument checks, context creation from config and
 * environment, and many contexts and jobs back to back. */
#include <time.h>

#include "testutil.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static pmap_ctx *make_ctx(int n) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  return ctx;
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* ------------------------------------------------------------------------------------------ */
/* A data-parallel job: shard, reduce, average                                                */

#define VEC_LEN 1500 /* over the small all-reduce path's limit */
#define ROUND_TRIP 777

typedef struct shard_job {
  const float *global; /* (total) */
  size_t total;
  int index[PMAP_MAX_DEVICES], size[PMAP_MAX_DEVICES];
  float sum[PMAP_MAX_DEVICES]; /* psum of the shard sums */
  float mean_index[PMAP_MAX_DEVICES];
  float *mean_vec[PMAP_MAX_DEVICES]; /* (VEC_LEN) each, owned by the test */
  size_t round_trip_wrong[PMAP_MAX_DEVICES];
  pmap_status bad_upload[PMAP_MAX_DEVICES];
  int bad_upload_named[PMAP_MAX_DEVICES];
} shard_job;

static float vec_value(int d, size_t i) { return (float)((d % 3 + 1) * (int)(i % 5 + 1) + d); }

static pmap_status shard_fn(pmap_device *dev, void *arg) {
  shard_job *j = arg;
  int d = pmap_axis_index(dev), n = pmap_axis_size(dev);
  j->index[d] = d;
  j->size[d] = n;

  /* Uneven shards: the global length need not divide by n. */
  size_t lo = j->total * (size_t)d / (size_t)n, hi = j->total * (size_t)(d + 1) / (size_t)n;
  float partial = 0.0f;
  for (size_t i = lo; i < hi; i++) partial += j->global[i];
  pmap_status st = pmap_psum(dev, &partial, &j->sum[d], 1);
  if (st) return st;

  float idx = (float)d;
  if ((st = pmap_pmean(dev, &idx, &j->mean_index[d], 1))) return st;

  float *v = malloc(VEC_LEN * sizeof *v);
  if (!v) return PMAP_ERR_OUT_OF_MEMORY;
  for (size_t i = 0; i < VEC_LEN; i++) v[i] = vec_value(d, i);
  st = pmap_pmean(dev, v, j->mean_vec[d], VEC_LEN);
  free(v);
  if (st) return st;

  /* Device memory round trip, and its argument checks. */
  float host[ROUND_TRIP], back[ROUND_TRIP];
  for (int i = 0; i < ROUND_TRIP; i++) host[i] = (float)(d * ROUND_TRIP + i) * 0.25f;
  float *buf = NULL, *empty = NULL;
  if ((st = pmap_device_alloc(dev, ROUND_TRIP, &buf))) return st;
  if ((st = pmap_device_alloc(dev, 0, &empty))) goto done;
  if ((st = pmap_device_upload(dev, buf, host, ROUND_TRIP))) goto done;
  memset(back, 0, sizeof back);
  if ((st = pmap_device_download(dev, back, buf, ROUND_TRIP))) goto done;
  for (int i = 0; i < ROUND_TRIP; i++)
    if (!same_bits(back[i], host[i])) j->round_trip_wrong[d]++;
  /* Zero elements need no pointers. */
  if ((st = pmap_device_upload(dev, NULL, NULL, 0))) goto done;
  if ((st = pmap_device_download(dev, NULL, NULL, 0))) goto done;
  j->bad_upload[d] = pmap_device_upload(dev, NULL, host, 5);
  char name[32];
  snprintf(name, sizeof name, "on device %d", d);
  j->bad_upload_named[d] = strstr(pmap_last_error(), name) != NULL;
done:
  pmap_device_free(dev, empty);
  pmap_device_free(dev, buf);
  pmap_device_free(dev, NULL);
  return st;
}

static void test_shard(int n) {
  pmap_ctx *ctx = make_ctx(n);
  if (!ctx) return;
  CHECK(pmap_ctx_num_devices(ctx) == n, "pmap_ctx_num_devices %d, want %d",
        pmap_ctx_num_devices(ctx), n);
  CHECK(pmap_ctx_backend(ctx) == PMAP_BACKEND_CPU, "backend %d", (int)pmap_ctx_backend(ctx));
  shard_job j;
  memset(&j, 0, sizeof j);
  j.total = (size_t)1000 * (size_t)n + 7;
  float *global = malloc(j.total * sizeof *global);
  int alloc_ok = global != NULL;
  for (int d = 0; d < n; d++) {
    j.mean_vec[d] = calloc(VEC_LEN, sizeof(float));
    alloc_ok = alloc_ok && j.mean_vec[d];
  }
  CHECK(alloc_ok, "out of host memory");
  if (alloc_ok) {
    float want_sum = 0.0f;
    for (size_t i = 0; i < j.total; i++) {
      global[i] = (float)(i % 10);
      want_sum += global[i];
    }
    j.global = global;
    CHECK_OK(pmap_run(ctx, shard_fn, &j));
    float want_index = (float)(n - 1) / 2.0f;
    for (int d = 0; d < n; d++) {
      CHECK(j.index[d] == d && j.size[d] == n, "N %d: device %d saw axis index %d, size %d", n, d,
            j.index[d], j.size[d]);
      CHECK(same_bits(j.sum[d], want_sum), "N %d device %d: global sum %.9g, want %.9g", n, d,
            (double)j.sum[d], (double)want_sum);
      CHECK(same_bits(j.mean_index[d], want_index),
            "N %d device %d: pmean of axis_index %.9g, "
            "want %.9g",
            n, d, (double)j.mean_index[d], (double)want_index);
      size_t wrong = 0, first = 0;
      float want = 0.0f;
      for (size_t i = 0; i < VEC_LEN; i++) {
        float s = 0.0f;
        for (int k = 0; k < n; k++) s += vec_value(k, i);
        s /= (float)n;
        if (!same_bits(j.mean_vec[d][i], s) && wrong++ == 0) first = i, want = s;
      }
      CHECK(wrong == 0,
            "N %d device %d: pmean vector: %zu of %d wrong, first at %zu: %.9g want "
            "%.9g",
            n, d, wrong, VEC_LEN, first, (double)j.mean_vec[d][first], (double)want);
      CHECK(j.round_trip_wrong[d] == 0,
            "N %d device %d: %zu elements changed in an upload and "
            "download",
            n, d, j.round_trip_wrong[d]);
      CHECK(j.bad_upload[d] == PMAP_ERR_INVALID_ARGUMENT && j.bad_upload_named[d],
            "N %d device %d: upload to NULL -> %s (message names the device: %d)", n, d,
            pmap_status_string(j.bad_upload[d]), j.bad_upload_named[d]);
    }
  }
  for (int d = 0; d < n; d++) free(j.mean_vec[d]);
  free(global);
  pmap_ctx_destroy(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* pmap_run arguments and re-entry                                                            */

static pmap_status noop_fn(pmap_device *dev, void *arg) {
  (void)dev;
  (void)arg;
  return PMAP_SUCCESS;
}

typedef struct reenter_job {
  pmap_ctx *ctx;
  pmap_status inner[PMAP_MAX_DEVICES];
  int named[PMAP_MAX_DEVICES];
} reenter_job;

static pmap_status reenter_fn(pmap_device *dev, void *arg) {
  reenter_job *j = arg;
  int d = pmap_axis_index(dev);
  j->inner[d] = pmap_run(j->ctx, noop_fn, NULL);
  j->named[d] = strstr(pmap_last_error(), "re-entrant") != NULL;
  /* The job itself must still be able to synchronise afterwards. */
  return pmap_barrier(dev);
}

static void test_run_args(void) {
  int x = 0;
  CHECK_FAILS(pmap_run(NULL, noop_fn, &x), PMAP_ERR_INVALID_ARGUMENT, "ctx is NULL");
  static const int ns[] = {1, 3};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
    int n = ns[k];
    pmap_ctx *ctx = make_ctx(n);
    if (!ctx) continue;
    CHECK_FAILS(pmap_run(ctx, NULL, &x), PMAP_ERR_INVALID_ARGUMENT, "fn is NULL");
    reenter_job j;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    double t0 = now_s();
    CHECK_OK(pmap_run(ctx, reenter_fn, &j));
    CHECK(now_s() - t0 < 10.0, "a re-entrant pmap_run took %.1f s", now_s() - t0);
    for (int d = 0; d < n; d++)
      CHECK(j.inner[d] == PMAP_ERR_INVALID_ARGUMENT && j.named[d],
            "N %d device %d: pmap_run inside fn -> %s (message says re-entrant: %d)", n, d,
            pmap_status_string(j.inner[d]), j.named[d]);
    /* The refused call left the context usable. */
    CHECK_OK(pmap_run(ctx, noop_fn, NULL));
    pmap_ctx_destroy(ctx);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Context creation                                                                           */

static void check_create_fails(pmap_backend backend, int n, pmap_status want, const char *needle) {
  pmap_config cfg = {.backend = backend, .num_devices = n};
  pmap_ctx *ctx = NULL;
  CHECK_FAILS(pmap_ctx_create(&cfg, &ctx), want, needle);
  CHECK(ctx == NULL, "a failed pmap_ctx_create returned a context");
  pmap_ctx_destroy(ctx);
}

static void check_default_count(const char *env, int want) {
  if (env)
    setenv("PMAP_CPU_DEVICES", env, 1);
  else
    unsetenv("PMAP_CPU_DEVICES");
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = PMAP_DEVICES_DEFAULT};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK(pmap_ctx_num_devices(ctx) == want, "PMAP_CPU_DEVICES=%s: %d devices, want %d",
        env ? env : "(unset)", pmap_ctx_num_devices(ctx), want);
  if (ctx) CHECK_OK(pmap_run(ctx, noop_fn, NULL));
  pmap_ctx_destroy(ctx);
}

static void test_create(void) {
  const char *saved = getenv("PMAP_CPU_DEVICES");
  char *saved_copy = saved ? strdup(saved) : NULL;

  check_default_count("3", 3);
  check_default_count(NULL, 4);
  if (!pmap_backend_built(PMAP_BACKEND_CUDA)) {
    /* All defaults: the CPU backend with PMAP_CPU_DEVICES devices. */
    setenv("PMAP_CPU_DEVICES", "2", 1);
    pmap_ctx *ctx = NULL;
    CHECK_OK(pmap_ctx_create(NULL, &ctx));
    CHECK(pmap_ctx_num_devices(ctx) == 2 && pmap_ctx_backend(ctx) == PMAP_BACKEND_CPU,
          "pmap_ctx_create(NULL): %d devices on %s", pmap_ctx_num_devices(ctx),
          pmap_backend_name(pmap_ctx_backend(ctx)));
    pmap_ctx_destroy(ctx);
  }
  static const char *const bad_env[] = {"abc", "0", "65", "3x", "-1", " 3", "3 ", "+3", "\t3"};
  for (size_t k = 0; k < sizeof bad_env / sizeof bad_env[0]; k++) {
    setenv("PMAP_CPU_DEVICES", bad_env[k], 1);
    check_create_fails(PMAP_BACKEND_CPU, PMAP_DEVICES_DEFAULT, PMAP_ERR_INVALID_ARGUMENT,
                       "pmap_ctx_create: environment variable PMAP_CPU_DEVICES");
  }
  /* An explicit count ignores the variable, even a malformed one. */
  pmap_ctx *ctx = make_ctx(2);
  CHECK(pmap_ctx_num_devices(ctx) == 2, "explicit count: %d devices", pmap_ctx_num_devices(ctx));
  pmap_ctx_destroy(ctx);

  if (saved_copy)
    setenv("PMAP_CPU_DEVICES", saved_copy, 1);
  else
    unsetenv("PMAP_CPU_DEVICES");
  free(saved_copy);

  static const int bad_n[] = {0, -2, PMAP_MAX_DEVICES + 1, -1000};
  for (size_t k = 0; k < sizeof bad_n / sizeof bad_n[0]; k++) {
    if (bad_n[k] == PMAP_DEVICES_DEFAULT) continue;
    char needle[48];
    snprintf(needle, sizeof needle, "device count %d", bad_n[k]);
    check_create_fails(PMAP_BACKEND_CPU, bad_n[k], PMAP_ERR_INVALID_ARGUMENT, needle);
  }
  check_create_fails((pmap_backend)7, 2, PMAP_ERR_INVALID_ARGUMENT, "unknown backend 7");
  if (!pmap_backend_built(PMAP_BACKEND_CUDA))
    check_create_fails(PMAP_BACKEND_CUDA, 2, PMAP_ERR_UNAVAILABLE, "cuda");
  else
    printf("CUDA backend built: skipping its unavailable check\n");
  {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .timeout_s = NAN};
    pmap_ctx *c = NULL;
    CHECK_FAILS(pmap_ctx_create(&cfg, &c), PMAP_ERR_INVALID_ARGUMENT, "timeout_s");
  }
  CHECK_FAILS(pmap_ctx_create(NULL, NULL), PMAP_ERR_INVALID_ARGUMENT, "out is NULL");
  pmap_ctx_destroy(NULL);
  CHECK(pmap_ctx_num_devices(NULL) == 0, "pmap_ctx_num_devices(NULL) %d",
        pmap_ctx_num_devices(NULL));

  /* Threads are started and joined every time; a leak or a missed stop shows here. */
  for (int k = 0; k < 50; k++) {
    pmap_ctx *c = make_ctx(4);
    if (!c) break;
    if (k % 2) CHECK_OK(pmap_run(c, noop_fn, NULL));
    pmap_ctx_destroy(c);
  }
  /* A context whose workers never ran a user job. */
  for (int k = 0; k < 10; k++) pmap_ctx_destroy(make_ctx(k % 8 + 1));
}

/* ------------------------------------------------------------------------------------------ */
/* Many short jobs: each one wakes every worker and waits for all of them                     */

typedef struct count_job {
  long runs[PMAP_MAX_DEVICES];
  long reduce_wrong[PMAP_MAX_DEVICES];
  long call;
} count_job;

static pmap_status count_fn(pmap_device *dev, void *arg) {
  count_job *j = arg;
  int d = pmap_axis_index(dev), n = pmap_axis_size(dev);
  j->runs[d]++;
  if (j->call % 64 == 0) {
    float one = 1.0f, got = 0.0f;
    pmap_status st = pmap_psum(dev, &one, &got, 1);
    if (st) return st;
    if (got != (float)n) j->reduce_wrong[d]++;
  }
  return PMAP_SUCCESS;
}

static void test_many_runs(int n, long runs) {
  pmap_ctx *ctx = make_ctx(n);
  if (!ctx) return;
  count_job j;
  memset(&j, 0, sizeof j);
  double t0 = now_s();
  long failed = 0, slow = 0;
  for (j.call = 0; j.call < runs; j.call++) {
    /* Now and then the workers are left idle long enough to go from spinning to sleeping. */
    if (j.call % 4 == 3) {
      struct timespec pause = {0, 300000};
      nanosleep(&pause, NULL);
    }
    double r0 = now_s();
    pmap_status st = pmap_run(ctx, count_fn, &j);
    if (st != PMAP_SUCCESS && failed++ == 0)
      CHECK(0, "N %d: run %ld -> %s: %s", n, j.call, pmap_status_string(st), pmap_last_error());
    /* A lost wake-up costs a whole 100 ms sleep slice rather than a hang. */
    if (now_s() - r0 > 0.09) slow++;
  }
  double took = now_s() - t0;
  CHECK(failed == 0, "N %d: %ld of %ld runs failed", n, failed, runs);
  CHECK(slow <= runs / 50, "N %d: %ld of %ld runs took over 90 ms: lost wake-ups?", n, slow, runs);
  for (int d = 0; d < n; d++) {
    CHECK(j.runs[d] == runs, "N %d: device %d ran %ld of %ld jobs", n, d, j.runs[d], runs);
    CHECK(j.reduce_wrong[d] == 0, "N %d: device %d: %ld wrong sums", n, d, j.reduce_wrong[d]);
  }
  printf("N %d: %ld runs in %.2f s (%.1f us each, %ld over 90 ms)\n", n, runs, took,
         took / (double)runs * 1e6, slow);
  pmap_ctx_destroy(ctx);
}

int main(void) {
  double t0 = now_s();
  static const int ns[] = {1, 2, 3, 4, 5, 7, 8};
  for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) test_shard(ns[k]);
  test_run_args();
  test_create();
  test_many_runs(2, 2000);
  test_many_runs(5, 2000);
  printf("total %.1f s\n", now_s() - t0);
  return test_exit("run");
}
