/* test_gpu_coll.c: the NCCL collectives on every GPU and on PMAP_GPU_TEST_DEVICES (default 4)
 * logical devices (exact sums; sizes 0, 1, odd, large; in place and not; wrong elements
 * counted); then failures. Before the rendezvous (a device failing or late) the others stop
 * there, before NCCL, and the context recovers, as tests/test_coll.c expects on the CPU; after
 * it (a device stalling or failing instead of issuing its part) the communicators are aborted:
 * an error everywhere, no hang, a clean destroy. PMAP_GPU_TEST_QUICK=1 leaves out the failures
 * before the rendezvous. Skips (77) without GPU. */
#include <time.h>

#include "gpu_util.h"
#include "runtime/backend.h"
#include "base/error.h"

static const size_t sizes[] = {0, 1, 17, 1000, 4097, (1u << 20) + 3};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

typedef struct coll_arg {
  long wrong[PMAP_MAX_DEVICES];      /* wrong elements seen by each device */
  pmap_status got[PMAP_MAX_DEVICES]; /* failure tests: what each device returned */
  int fail_device;                   /* failure tests: the device that fails or comes late */
  int after;                         /* collectives it completes first */
  double late_s;                     /* 0: it fails; else how long it stalls */
} coll_arg;

/* Small integers: every sum over up to 64 devices is exact in float. */
static float value(int d, size_t i) { return (float)((d + 1) * (int)(i % 251 + 1)); }

/* Elements of got (n) further than tol * |want| from want (n); prints the first of them. */
static long count_wrong(const char *what, int d, size_t count, const float *got, const float *want,
                        size_t n, double tol) {
  long wrong = 0;
  for (size_t i = 0; i < n; i++) {
    double diff = fabs((double)got[i] - (double)want[i]);
    if (!(diff <= tol * fabs((double)want[i]))) {
      if (!wrong)
        fprintf(stderr, "FAIL %s count %zu device %d: first wrong at %zu: got %.9g want %.9g\n",
                what, count, d, i, (double)got[i], (double)want[i]);
      wrong++;
    }
  }
  return wrong;
}

/* One size on one device: every collective, in place and out of place; wrong elements are added
 * to *wrong. h (2 count) and want (2 N count) are host scratch. */
static pmap_status check_size(pmap_device *dev, size_t count, float *h, float *want, long *wrong) {
  int n = pmap_axis_size(dev), d = pmap_axis_index(dev);
  size_t big = count * (size_t)n;
  float *send = NULL, *recv = NULL;
  pmap_status st = pmap_device_alloc(dev, count ? count : 1, &send);
  if (!st) st = pmap_device_alloc(dev, big ? big : 1, &recv);
  for (size_t i = 0; i < count; i++) h[i] = value(d, i);
  if (st) goto out;

  double tri = (double)n * (n + 1) / 2.0;
  /* psum, pmean, pmax, out of place then in place. NCCL's average may scale before summing:
   * exact for a power-of-two device count, within rounding otherwise. */
  for (int op = 0; op < 3 && !st; op++)
    for (int in_place = 0; in_place < 2 && !st; in_place++) {
      float *dst = in_place ? send : recv;
      st = pmap_device_upload(dev, send, h, count); /* the previous in-place call overwrote it */
      if (st) break;
      st = op == 0   ? pmap_psum(dev, send, dst, count)
           : op == 1 ? pmap_pmean(dev, send, dst, count)
                     : pmap_pmax(dev, send, dst, count);
      if (!st) st = pmap_device_download(dev, h + count, dst, count);
      if (st) break;
      for (size_t i = 0; i < count; i++) {
        double base = (double)(i % 251 + 1);
        want[i] = (float)(op == 0 ? tri * base : op == 1 ? tri * base / n : n * base);
      }
      static const char *names[] = {"psum", "pmean", "pmax"};
      int pow2 = (n & (n - 1)) == 0;
      *wrong +=
          count_wrong(names[op], d, count, h + count, want, count, op == 1 && !pow2 ? 1e-6 : 0.0);
    }
  if (st) goto out;

  /* all_gather out of place, then in place (own part at row d of recv, as in NCCL). */
  for (int in_place = 0; in_place < 2 && !st; in_place++) {
    float *src = in_place ? recv + (size_t)d * count : send;
    st = pmap_device_upload(dev, src, h, count);
    if (!st) st = pmap_all_gather(dev, src, recv, count);
    if (!st) st = pmap_device_download(dev, want + big, recv, big);
    if (st) break;
    for (int k = 0; k < n; k++)
      for (size_t i = 0; i < count; i++) want[(size_t)k * count + i] = value(k, i);
    *wrong += count_wrong(in_place ? "all_gather in place" : "all_gather", d, count, want + big,
                          want, big, 0.0);
  }
  /* broadcast from every root, in place on even roots. */
  for (int root = 0; root < n && !st; root++) {
    int in_place = root % 2 == 0;
    st = pmap_device_upload(dev, send, h, count);
    if (!st) st = pmap_broadcast(dev, send, in_place ? send : recv, count, root);
    if (!st) st = pmap_device_download(dev, want + big, in_place ? send : recv, count);
    if (st) break;
    for (size_t i = 0; i < count; i++) want[i] = value(root, i);
    *wrong += count_wrong("broadcast", d, count, want + big, want, count, 0.0);
  }
  if (!st) st = pmap_barrier(dev);
out:
  pmap_device_free(dev, send);
  pmap_device_free(dev, recv);
  return st;
}

static pmap_status coll_job(pmap_device *dev, void *p) {
  coll_arg *a = p;
  int n = pmap_axis_size(dev), d = pmap_axis_index(dev);
  size_t most = sizes[N_SIZES - 1];
  float *h = malloc(2 * most * sizeof *h), *want = malloc(2 * most * (size_t)n * sizeof *want);
  if (!h || !want) {
    free(h);
    free(want);
    return pmap_error_set(PMAP_ERR_OUT_OF_MEMORY, "test: out of host memory");
  }
  a->wrong[d] = 0;
  pmap_status st = PMAP_SUCCESS;
  for (size_t s = 0; s < N_SIZES && !st; s++) st = check_size(dev, sizes[s], h, want, &a->wrong[d]);
  free(h);
  free(want);
  return st;
}

static void run_collectives(pmap_ctx *ctx, const char *label) {
  coll_arg a = {{0}, {0}, -1, 0, 0.0};
  int n = pmap_ctx_num_devices(ctx);
  CHECK_OK(pmap_run(ctx, coll_job, &a));
  long wrong = 0;
  for (int d = 0; d < n; d++) wrong += a.wrong[d];
  CHECK(wrong == 0, "%s: %ld wrong elements over %d devices", label, wrong, n);
  printf("collectives on %s: %d devices, %ld wrong elements\n", label, n, wrong);
}

/* ---- failures before the rendezvous: as tests/test_coll.c expects on the CPU ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* Collectives of both sizes in turn (the second takes NCCL's larger protocol); device
 * fail_device, after `after` of them, fails (late_s 0) or sleeps late_s first. */
static pmap_status sequence_job(pmap_device *dev, void *p) {
  coll_arg *a = p;
  int d = pmap_axis_index(dev);
  size_t count = (size_t)1 << 20;
  float *buf = NULL;
  PMAP_TRY(pmap_device_alloc(dev, count, &buf));
  pmap_status st = PMAP_SUCCESS;
  for (int k = 0; k < 6 && !st; k++) {
    if (d == a->fail_device && k == a->after) {
      if (a->late_s <= 0.0) {
        st = pmap_error_set(PMAP_ERR_INVALID_ARGUMENT, "device %d fails on purpose", d);
        break;
      }
      sleep_s(a->late_s);
    }
    st = pmap_psum(dev, buf, buf, k % 2 ? count : 17);
  }
  pmap_device_free(dev, buf);
  a->got[d] = st;
  return st;
}

/* A job of collectives works (after a failure the rendezvous stopped before NCCL, so the next
 * job's collectives work). */
static void check_works(pmap_ctx *ctx, const char *when) {
  int before = test_failures;
  coll_arg a = {{0}, {0}, -1, 0, 0.0};
  CHECK_OK(pmap_run(ctx, sequence_job, &a));
  CHECK(test_failures == before, "the context's collectives failed %s", when);
}

/* The contexts of the failure tests time out after this long: long enough for a first
 * collective's connections to be set up, short enough to keep the test quick. */
#define FAIL_TIMEOUT_S 2.0

static void test_rendezvous_failures(int n, int gpus) {
  pmap_ctx *ctx = NULL;
  if (gpu_ctx(n, gpus, FAIL_TIMEOUT_S, &ctx) != PMAP_SUCCESS) return;
  check_works(ctx, "on a new context"); /* every size's connections set up first */
  /* A device failing before its first collective, and in the middle of a sequence. */
  for (int after = 0; after <= 3; after += 3) {
    coll_arg a = {{0}, {0}, n - 1, after, 0.0};
    double t0 = now_s();
    CHECK_FAILS(pmap_run(ctx, sequence_job, &a), PMAP_ERR_INVALID_ARGUMENT, "fails on purpose");
    CHECK(now_s() - t0 < 10.0, "a failed job took %.1f s", now_s() - t0);
    for (int d = 0; d < n - 1; d++)
      CHECK(a.got[d] == PMAP_ERR_ABORTED, "device %d got %s while device %d failed", d,
            pmap_status_string(a.got[d]), n - 1);
    check_works(ctx, "after a failed device");
  }
  /* A device arriving after the timeout: the others give up at the rendezvous, before NCCL,
   * and nobody hangs. */
  coll_arg late = {{0}, {0}, n - 1, 1, 2.5 * FAIL_TIMEOUT_S};
  double t0 = now_s();
  char late_msg[48]; /* the late device is named, not a device that waited */
  snprintf(late_msg, sizeof late_msg, "device %d did not arrive within", n - 1);
  CHECK_FAILS(pmap_run(ctx, sequence_job, &late), PMAP_ERR_TIMEOUT, late_msg);
  CHECK(now_s() - t0 < 10.0, "a timed-out job took %.1f s", now_s() - t0);
  CHECK(late.got[n - 1] == PMAP_ERR_ABORTED || late.got[n - 1] == PMAP_ERR_TIMEOUT,
        "the late device got %s", pmap_status_string(late.got[n - 1]));
  check_works(ctx, "after a timeout");
  pmap_ctx_destroy(ctx);
  printf("failures before the rendezvous on %d devices: reported, recovered\n", n);
}

/* ---- failures after the rendezvous: the NCCL communicators are aborted ---- */

/* Every device meets the others (the rendezvous every collective starts with), then all but
 * fail_device issue an all-reduce on the backend and wait for it, while fail_device stalls
 * until the context gives up on it (late_s > 0) or fails (late_s 0) instead of issuing its
 * part: the others' collective kernels wait on the GPU for a peer that never comes. */
static pmap_status stalled_job(pmap_device *dev, void *p) {
  coll_arg *a = p;
  int d = pmap_axis_index(dev);
  size_t count = (size_t)1 << 20;
  float *buf = NULL;
  PMAP_TRY(pmap_device_alloc(dev, count, &buf));
  pmap_status st = backend_meet(dev, "test: the rendezvous before a stall");
  if (!st && d == a->fail_device) {
    if (a->late_s <= 0.0) {
      st = pmap_error_set(PMAP_ERR_INVALID_ARGUMENT, "device %d fails after the rendezvous", d);
    } else {
      double t0 = now_s();
      while (!atomic_load(&dev->ctx->abort) && now_s() - t0 < a->late_s) sleep_s(0.001);
    }
  }
  if (!st) st = dev->ctx->be->coll->all_reduce(dev, buf, buf, count, PMAP_RED_SUM);
  if (!st) st = backend_sync(dev);
  pmap_device_free(dev, buf);
  a->got[d] = st;
  return st;
}

static pmap_status psum_job(pmap_device *dev, void *p) {
  (void)p;
  float *buf = NULL;
  PMAP_TRY(pmap_device_alloc(dev, 1000, &buf));
  pmap_status st = pmap_psum(dev, buf, buf, 1000);
  pmap_device_free(dev, buf);
  return st;
}

static void test_nccl_aborts(int n, int gpus) {
  for (int stall = 1; stall >= 0; stall--) {
    pmap_ctx *ctx = NULL;
    if (gpu_ctx(n, gpus, FAIL_TIMEOUT_S, &ctx) != PMAP_SUCCESS) return;
    /* The connections of the stalled all-reduce's size set up first, so the others' kernels
     * are running, not setting up, when they are aborted. */
    check_works(ctx, "on a new context");
    coll_arg a = {{0}, {0}, n - 1, 0, stall ? 10.0 : 0.0};
    double t0 = now_s();
    pmap_status st = pmap_run(ctx, stalled_job, &a);
    double took = now_s() - t0;
    if (stall) {
      /* The others time out in their wait (or inside NCCL), the communicators are aborted, and
       * the stalled device finds them aborted when it finally calls NCCL. */
      CHECK(st == PMAP_ERR_TIMEOUT, "stall after the rendezvous: pmap_run -> %s (%s)",
            pmap_status_string(st), pmap_last_error());
      CHECK(strstr(pmap_last_error(), "the NCCL communicators were aborted") != NULL,
            "stall after the rendezvous: message \"%s\"", pmap_last_error());
      CHECK(a.got[n - 1] == PMAP_ERR_DEVICE || a.got[n - 1] == PMAP_ERR_ABORTED,
            "the stalled device got %s", pmap_status_string(a.got[n - 1]));
    } else {
      /* The others' waits cover a collective a failed device will never join: the watchdog
       * aborts the communicators under them. */
      CHECK(st == PMAP_ERR_INVALID_ARGUMENT && strstr(pmap_last_error(), "after the rendezvous"),
            "failure after the rendezvous: pmap_run -> %s (%s)", pmap_status_string(st),
            pmap_last_error());
      for (int d = 0; d < n - 1; d++)
        CHECK(a.got[d] == PMAP_ERR_ABORTED, "device %d got %s while device %d failed", d,
              pmap_status_string(a.got[d]), n - 1);
    }
    for (int d = 0; d < n - 1 && stall; d++)
      CHECK(a.got[d] == PMAP_ERR_TIMEOUT || a.got[d] == PMAP_ERR_ABORTED,
            "device %d got %s while device %d stalled", d, pmap_status_string(a.got[d]), n - 1);
    CHECK(took < 20.0, "%s after the rendezvous took %.1f s", stall ? "a stall" : "a failure",
          took);
    /* The communicators are gone: later collectives fail at once, saying why. */
    t0 = now_s();
    CHECK_FAILS(pmap_run(ctx, psum_job, NULL), PMAP_ERR_DEVICE, "destroy the context");
    CHECK(now_s() - t0 < 5.0, "a collective on aborted communicators took %.1f s", now_s() - t0);
    pmap_ctx_destroy(ctx);
    CHECK(now_s() - t0 < 30.0, "destroying the aborted context took %.1f s", now_s() - t0);
  }
  printf(
      "a stall and a failure after the rendezvous on %d devices: NCCL aborted, reported, "
      "destroyed\n",
      n);
}

int main(void) {
  int gpus = gpu_count();
  if (gpus == 0) return GPU_SKIP;
  if (gpus < 0) return 1;
  int bad_ids[2] = {0, gpus};
  pmap_config bad = {.backend = PMAP_BACKEND_CUDA, .num_devices = 2, .device_ids = bad_ids};
  pmap_ctx *ctx = NULL;
  CHECK_FAILS(pmap_ctx_create(&bad, &ctx), PMAP_ERR_INVALID_ARGUMENT, "outside");

  char label[64];
  snprintf(label, sizeof label, "%d GPU%s", gpus, gpus == 1 ? "" : "s");
  if (gpu_ctx(gpus, gpus, 0.0, &ctx) == PMAP_SUCCESS) {
    run_collectives(ctx, label);
    pmap_ctx_destroy(ctx);
  }
  /* Logical devices sharing GPUs: PMAP_GPU_TEST_DEVICES, else 2 on each GPU (the most NCCL 2.30
   * documents for several ranks on one GPU: docs/cuda.md). */
  int shared = gpu_test_devices(2 * gpus);
  if (shared < 0) return 1;
  int many = gpus >= 2 ? gpus : 0; /* devices of the failure tests */
  if (gpu_ctx(shared, gpus, 0.0, &ctx) == PMAP_SUCCESS) {
    snprintf(label, sizeof label, "%d logical devices on %d GPU%s", shared, gpus,
             gpus == 1 ? "" : "s");
    run_collectives(ctx, label);
    pmap_ctx_destroy(ctx);
    if (shared >= 2 && (!many || getenv("PMAP_GPU_TEST_DEVICES"))) many = shared;
  }
  /* Quick (PMAP_GPU_TEST_QUICK=1): the failures before the rendezvous are the host's logic,
   * the same on any device count; only the NCCL aborts run again. */
  if (many) {
    if (!gpu_test_quick()) test_rendezvous_failures(many, gpus);
    test_nccl_aborts(many, gpus);
  } else
    printf("note: the failure tests need 2 devices\n");
  return test_exit("gpu_coll");
}
