/* test_gpu_coll.c: the NCCL collectives on every GPU and on PMAP_GPU_TEST_DEVICES (default 4)
 * logical devices (exact sums; sizes 0, 1, odd, large; in place and not; wrong elements
 * counted), then a device failing and a collective timing out: an error everywhere, no hang, a
 * clean destroy. Skips (77) without GPU. */
#include <time.h>

#include "gpu_util.h"
#include "runtime/error.h"

static const size_t sizes[] = {0, 1, 17, 1000, 4097, (1u << 20) + 3};
#define N_SIZES (sizeof sizes / sizeof sizes[0])

typedef struct coll_arg {
  long wrong[PMAP_MAX_DEVICES]; /* wrong elements seen by each device */
  int fail_device;              /* failure tests: the device that fails or comes late */
  double late_s;
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
  coll_arg a = {{0}, -1, 0.0};
  int n = pmap_ctx_num_devices(ctx);
  CHECK_OK(pmap_run(ctx, coll_job, &a));
  long wrong = 0;
  for (int d = 0; d < n; d++) wrong += a.wrong[d];
  CHECK(wrong == 0, "%s: %ld wrong elements over %d devices", label, wrong, n);
  printf("collectives on %s: %d devices, %ld wrong elements\n", label, n, wrong);
}

/* Device fail_device fails (or, with late_s, arrives late) while the others are in a psum. */
static pmap_status failing_job(pmap_device *dev, void *p) {
  coll_arg *a = p;
  size_t count = 1u << 20;
  float *buf = NULL;
  PMAP_TRY(pmap_device_alloc(dev, count, &buf));
  pmap_status st = PMAP_SUCCESS;
  if (pmap_axis_index(dev) == a->fail_device) {
    if (a->late_s <= 0.0) {
      pmap_device_free(dev, buf);
      return pmap_error_set(PMAP_ERR_INVALID_ARGUMENT, "device %d fails on purpose",
                            pmap_axis_index(dev));
    }
    struct timespec ts = {(time_t)a->late_s, (long)((a->late_s - (double)(time_t)a->late_s) * 1e9)};
    nanosleep(&ts, NULL);
  }
  st = pmap_psum(dev, buf, buf, count);
  pmap_device_free(dev, buf);
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

static void test_failure_paths(int n, int gpus) {
  pmap_ctx *ctx = NULL;
  /* A device failing before the collective: its error is reported, nobody hangs. */
  if (gpu_ctx(n, gpus, 60.0, &ctx) != PMAP_SUCCESS) return;
  coll_arg a = {{0}, n - 1, 0.0};
  struct timespec ts0, ts1;
  clock_gettime(CLOCK_MONOTONIC, &ts0);
  CHECK_FAILS(pmap_run(ctx, failing_job, &a), PMAP_ERR_INVALID_ARGUMENT, "fails on purpose");
  /* The communicators were aborted: later collectives fail at once, saying why. */
  CHECK_FAILS(pmap_run(ctx, psum_job, NULL), PMAP_ERR_DEVICE, "destroy the context");
  pmap_ctx_destroy(ctx);
  clock_gettime(CLOCK_MONOTONIC, &ts1);
  double s = (double)(ts1.tv_sec - ts0.tv_sec) + 1e-9 * (double)(ts1.tv_nsec - ts0.tv_nsec);
  CHECK(s < 30.0, "failure, abort and destroy took %.1f s", s);

  /* A device arriving after the timeout: the others time out, and it finds the communicators
   * aborted; the context is destroyed cleanly. The others time out either in the stream wait
   * ("did not complete within") or, where the collective still sets up connections with the
   * late peer, inside NCCL under the watchdog ("stuck in NCCL"); both messages say this. */
  if (gpu_ctx(n, gpus, 1.0, &ctx) != PMAP_SUCCESS) return;
  coll_arg late = {{0}, n - 1, 3.0};
  clock_gettime(CLOCK_MONOTONIC, &ts0);
  CHECK_FAILS(pmap_run(ctx, failing_job, &late), PMAP_ERR_TIMEOUT,
              "the NCCL communicators were aborted");
  pmap_ctx_destroy(ctx);
  clock_gettime(CLOCK_MONOTONIC, &ts1);
  s = (double)(ts1.tv_sec - ts0.tv_sec) + 1e-9 * (double)(ts1.tv_nsec - ts0.tv_nsec);
  CHECK(s < 30.0, "timeout, abort and destroy took %.1f s", s);
  printf("failure and timeout on %d devices: reported, aborted, destroyed\n", n);
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
  /* Logical devices sharing GPUs: PMAP_GPU_TEST_DEVICES, else 4. */
  int shared = gpu_test_devices(4);
  if (shared < 0) return 1;
  int many = gpus >= 2 ? gpus : 0; /* devices of the failure tests */
  if (gpu_ctx(shared, gpus, 0.0, &ctx) == PMAP_SUCCESS) {
    snprintf(label, sizeof label, "%d logical devices on %d GPU%s", shared, gpus,
             gpus == 1 ? "" : "s");
    run_collectives(ctx, label);
    pmap_ctx_destroy(ctx);
    if (shared >= 2 && (!many || getenv("PMAP_GPU_TEST_DEVICES"))) many = shared;
  }
  if (many)
    test_failure_paths(many, gpus);
  else
    printf("note: the failure tests need 2 devices\n");
  return test_exit("gpu_coll");
}
