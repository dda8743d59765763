/* test_coll.c: the CPU backend's collectives through pmap_run: exact results on every device for
 * every op, size, device count and buffer layout, barrier reuse over long sequences, and how a
 * failing, slow or misused device ends a job without leaving the others waiting. */
#include <stdatomic.h>
#include <time.h>

#include "testutil.h"

enum { OP_SUM, OP_MEAN, OP_MAX, OP_GATHER, OP_BCAST, OP_COUNT };
static const char *const op_names[OP_COUNT] = {"psum", "pmean", "pmax", "all_gather", "broadcast"};

/* Small integers, so any summation order is exact and the expected value is known exactly. Not
 * linear in d, so that counting one device twice and another not at all cannot add up right. */
static float val_sum(int d, size_t i, int salt) {
  return (float)(((d * 5 + 3) % 11 + 1) * (int)((i + (size_t)salt + 2 * (size_t)d) % 7 + 1));
}

/* Varies which device holds the maximum from element to element, and includes negatives. */
static float val_max(int d, size_t i, int salt) {
  return (float)((int)(((i + (size_t)salt) % 13) * (size_t)(d + 3) + (size_t)d * 7) % 17 - 8);
}

/* Distinct per device and per element, so a row from the wrong device is always noticed. */
static float val_id(int d, size_t i, int salt) {
  return (float)(d * 1000 + (int)((i + (size_t)salt) % 997));
}

static float send_value(int op, int d, size_t i, int salt) {
  if (op == OP_MAX) return val_max(d, i, salt);
  if (op == OP_SUM || op == OP_MEAN) return val_sum(d, i, salt);
  return val_id(d, i, salt);
}

/* Element i of the result of `op` over n devices (for all_gather, i indexes the (n, count) rows). */
static float expected_value(int op, int n, int root, size_t count, size_t i, int salt) {
  switch (op) {
  case OP_SUM:
  case OP_MEAN: {
    float s = 0.0f;
    for (int d = 0; d < n; d++) s += val_sum(d, i, salt);
    return op == OP_MEAN ? s / (float)n : s;
  }
  case OP_MAX: {
    float m = val_max(0, i, salt);
    for (int d = 1; d < n; d++) m = val_max(d, i, salt) > m ? val_max(d, i, salt) : m;
    return m;
  }
  case OP_GATHER: return val_id((int)(i / count), i % count, salt);
  default: return val_id(root, i, salt);
  }
}

static size_t result_len(int op, int n, size_t count) {
  return op == OP_GATHER ? (size_t)n * count : count;
}

static pmap_status call_op(pmap_device *dev, int op, const float *send, float *recv, size_t count,
                           int root) {
  switch (op) {
  case OP_SUM: return pmap_psum(dev, send, recv, count);
  case OP_MEAN: return pmap_pmean(dev, send, recv, count);
  case OP_MAX: return pmap_pmax(dev, send, recv, count);
  case OP_GATHER: return pmap_all_gather(dev, send, recv, count);
  default: return pmap_broadcast(dev, send, recv, count, root);
  }
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

#define RUN_TRY(call)                                  \
  do {                                                 \
    pmap_status run_try_s_ = (call);                   \
    if (run_try_s_ != PMAP_SUCCESS) return run_try_s_; \
  } while (0)

/* ------------------------------------------------------------------------------------------ */
/* One collective per job                                                                     */

typedef struct one_case {
  int op, root, in_place;
  size_t count;
  float *out[PMAP_MAX_DEVICES];        /* each device's result, host memory owned by the test */
  size_t send_wrong[PMAP_MAX_DEVICES]; /* out of place: elements of send that changed */
} one_case;

#define SENTINEL -12345.0f

static pmap_status one_fn(pmap_device *dev, void *arg) {
  one_case *c = arg;
  int d = pmap_axis_index(dev), n = pmap_axis_size(dev);
  size_t count = c->count, len = result_len(c->op, n, count);
  float *host = malloc((len ? len : 1) * sizeof *host);
  float *send = NULL, *recv = NULL, *own = NULL;
  pmap_status st = PMAP_ERR_OUT_OF_MEMORY;
  if (!host) return st;
  if ((st = pmap_device_alloc(dev, len, &recv)) != PMAP_SUCCESS) goto done;
  /* Every element of recv that the collective must write starts as a sentinel. */
  for (size_t i = 0; i < len; i++) host[i] = SENTINEL;
  own = recv;
  if (c->in_place) {
    if (c->op == OP_GATHER) own = recv + (size_t)d * count;
    send = own;
  } else {
    if ((st = pmap_device_alloc(dev, count, &send)) != PMAP_SUCCESS) goto done;
  }
  if ((st = pmap_device_upload(dev, recv, host, len)) != PMAP_SUCCESS) goto done;
  for (size_t i = 0; i < count; i++) host[i] = send_value(c->op, d, i, 0);
  if ((st = pmap_device_upload(dev, send, host, count)) != PMAP_SUCCESS) goto done;

  if ((st = call_op(dev, c->op, send, recv, count, c->root)) != PMAP_SUCCESS) goto done;

  if ((st = pmap_device_download(dev, c->out[d], recv, len)) != PMAP_SUCCESS) goto done;
  if (!c->in_place) {
    if ((st = pmap_device_download(dev, host, send, count)) != PMAP_SUCCESS) goto done;
    for (size_t i = 0; i < count; i++)
      if (!same_bits(host[i], send_value(c->op, d, i, 0))) c->send_wrong[d]++;
  }
done:
  if (!c->in_place) pmap_device_free(dev, send);
  pmap_device_free(dev, recv);
  free(host);
  return st;
}

static void run_one(pmap_ctx *ctx, int op, size_t count, int in_place, int root) {
  int n = pmap_ctx_num_devices(ctx);
  size_t len = result_len(op, n, count);
  one_case c;
  memset(&c, 0, sizeof c);
  c.op = op;
  c.count = count;
  c.in_place = in_place;
  c.root = root;
  float *want = malloc((len ? len : 1) * sizeof *want);
  int alloc_ok = want != NULL;
  for (int d = 0; d < n; d++) {
    c.out[d] = malloc((len ? len : 1) * sizeof(float));
    alloc_ok = alloc_ok && c.out[d];
  }
  CHECK(alloc_ok, "out of host memory for count %zu", count);
  if (alloc_ok) {
    for (size_t i = 0; i < len; i++) want[i] = expected_value(op, n, root, count, i, 0);
    char what[160];
    snprintf(what, sizeof what, "%s count %zu N %d %s root %d", op_names[op], count, n,
             in_place ? "in place" : "out of place", root);
    pmap_status st = pmap_run(ctx, one_fn, &c);
    CHECK(st == PMAP_SUCCESS, "%s: pmap_run -> %s: %s", what, pmap_status_string(st),
          pmap_last_error());
    if (st == PMAP_SUCCESS) {
      for (int d = 0; d < n; d++) {
        size_t wrong = 0, first = 0;
        for (size_t i = 0; i < len; i++)
          if (!same_bits(c.out[d][i], want[i]) && wrong++ == 0) first = i;
        CHECK(wrong == 0, "%s: device %d: %zu of %zu elements wrong, first at %zu: %.9g want %.9g",
              what, d, wrong, len, first, (double)c.out[d][first], (double)want[first]);
        CHECK(c.send_wrong[d] == 0, "%s: device %d: %zu elements of send changed", what, d,
              c.send_wrong[d]);
        if (d > 0) {
          char same[200];
          snprintf(same, sizeof same, "%s: device %d vs device 0", what, d);
          test_same_bits(same, c.out[d], c.out[0], len);
        }
      }
    }
  }
  for (int d = 0; d < n; d++) free(c.out[d]);
  free(want);
}

static void run_all_ops(pmap_ctx *ctx, size_t count, int gather) {
  int n = pmap_ctx_num_devices(ctx);
  for (int in_place = 0; in_place < 2; in_place++) {
    for (int op = OP_SUM; op <= OP_MAX; op++) run_one(ctx, op, count, in_place, 0);
    if (gather) run_one(ctx, OP_GATHER, count, in_place, 0);
    for (int root = 0; root < n; root++) run_one(ctx, OP_BCAST, count, in_place, root);
  }
}

/* Zero-length collectives accept NULL buffers and still complete on every device. */
static pmap_status empty_fn(pmap_device *dev, void *arg) {
  (void)arg;
  RUN_TRY(pmap_psum(dev, NULL, NULL, 0));
  RUN_TRY(pmap_pmean(dev, NULL, NULL, 0));
  RUN_TRY(pmap_pmax(dev, NULL, NULL, 0));
  RUN_TRY(pmap_all_gather(dev, NULL, NULL, 0));
  RUN_TRY(pmap_broadcast(dev, NULL, NULL, 0, pmap_axis_size(dev) - 1));
  return pmap_barrier(dev);
}

/* ------------------------------------------------------------------------------------------ */
/* Many collectives in one job: the barrier is reused hundreds of times                       */

#define MIX_CALLS 200
#define MIX_MAX_COUNT 3000

typedef struct mix_case {
  size_t wrong[PMAP_MAX_DEVICES];
  int first_bad_call[PMAP_MAX_DEVICES];
  _Atomic int arrived;
  int barrier_bad[PMAP_MAX_DEVICES];
} mix_case;

static const size_t mix_counts[] = {1, 5, 16, 1023, 1024, 1025, 2999, 0, 17};

static pmap_status mix_fn(pmap_device *dev, void *arg) {
  mix_case *c = arg;
  int d = pmap_axis_index(dev), n = pmap_axis_size(dev);
  float *send = NULL, *recv = NULL;
  pmap_status st;
  c->first_bad_call[d] = -1;
  if ((st = pmap_device_alloc(dev, MIX_MAX_COUNT, &send)) != PMAP_SUCCESS) return st;
  if ((st = pmap_device_alloc(dev, (size_t)n * MIX_MAX_COUNT, &recv)) != PMAP_SUCCESS) goto done;
  int rounds = 0;
  for (int k = 0; k < MIX_CALLS; k++) {
    int op = k % (OP_COUNT + 1);
    if (op == OP_COUNT) {
      /* Between two barriers every device has counted itself, and nobody counts again. */
      atomic_fetch_add(&c->arrived, 1);
      if ((st = pmap_barrier(dev)) != PMAP_SUCCESS) goto done;
      rounds++;
      if (atomic_load(&c->arrived) != rounds * n) c->barrier_bad[d]++;
      if ((st = pmap_barrier(dev)) != PMAP_SUCCESS) goto done;
      continue;
    }
    size_t count = mix_counts[(size_t)k % (sizeof mix_counts / sizeof mix_counts[0])];
    int root = (k / 3) % n, in_place = (k / 2) % 2;
    size_t len = result_len(op, n, count);
    float *own = in_place && op == OP_GATHER ? recv + (size_t)d * count : in_place ? recv : send;
    for (size_t i = 0; i < count; i++) own[i] = send_value(op, d, i, k);
    if ((st = call_op(dev, op, own, recv, count, root)) != PMAP_SUCCESS) goto done;
    size_t bad = 0;
    for (size_t i = 0; i < len; i++)
      if (!same_bits(recv[i], expected_value(op, n, root, count, i, k))) bad++;
    if (bad && c->first_bad_call[d] < 0) c->first_bad_call[d] = k;
    c->wrong[d] += bad;
  }
done:
  pmap_device_free(dev, recv);
  pmap_device_free(dev, send);
  return st;
}

static void run_mix(pmap_ctx *ctx) {
  int n = pmap_ctx_num_devices(ctx);
  mix_case c;
  memset(&c, 0, sizeof c);
  atomic_init(&c.arrived, 0);
  CHECK_OK(pmap_run(ctx, mix_fn, &c));
  for (int d = 0; d < n; d++) {
    int k = c.first_bad_call[d];
    CHECK(c.wrong[d] == 0, "mixed calls N %d device %d: %zu wrong elements, first in call %d (%s)",
          n, d, c.wrong[d], k, k >= 0 ? op_names[k % (OP_COUNT + 1)] : "-");
    CHECK(c.barrier_bad[d] == 0,
          "mixed calls N %d device %d: %d barriers let a device through early", n, d,
          c.barrier_bad[d]);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Failures                                                                                   */

typedef struct fail_case {
  int bad_device;  /* the device that fails or sleeps */
  int after_calls; /* collectives it completes first */
  int kind;        /* FAIL_RETURN, FAIL_API, FAIL_SLEEP */
  pmap_status got[PMAP_MAX_DEVICES];
} fail_case;

enum { FAIL_RETURN, FAIL_API, FAIL_SLEEP };

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Heap buffers, so that a device still reading another's buffer after that device has left the
 * job reads freed memory, which the sanitizers report. One size takes the small all-reduce path,
 * the other the chunked one. */
#define FAIL_SMALL 64
#define FAIL_LARGE 1500

static pmap_status fail_fn(pmap_device *dev, void *arg) {
  fail_case *c = arg;
  int d = pmap_axis_index(dev);
  float *buf = NULL;
  pmap_status st = pmap_device_alloc(dev, FAIL_LARGE, &buf);
  if (st != PMAP_SUCCESS) return c->got[d] = st;
  for (int k = 0; k < 50; k++) {
    if (d == c->bad_device && k == c->after_calls) {
      if (c->kind == FAIL_RETURN) {
        st = PMAP_ERR_DEVICE;
        break;
      }
      /* A real failing call, so the message is this device's own. */
      if (c->kind == FAIL_API) {
        st = pmap_device_upload(dev, NULL, buf, FAIL_SMALL);
        break;
      }
      sleep_s(1.0);
    }
    for (int i = 0; i < FAIL_LARGE; i++) buf[i] = (float)(d + i % 3);
    st = pmap_psum(dev, buf, buf, (k % 2) ? FAIL_LARGE : FAIL_SMALL);
    if (st == PMAP_SUCCESS) st = pmap_barrier(dev);
    if (st != PMAP_SUCCESS) break;
  }
  pmap_device_free(dev, buf);
  c->got[d] = st;
  return st;
}

static void check_recovers(pmap_ctx *ctx, const char *after) {
  int before = test_failures;
  run_one(ctx, OP_SUM, 1025, 1, 0);
  run_one(ctx, OP_GATHER, 7, 0, 0);
  run_one(ctx, OP_BCAST, 100, 0, pmap_ctx_num_devices(ctx) - 1);
  CHECK(test_failures == before, "the context did not recover after %s", after);
}

static void run_failure(pmap_ctx *ctx, int bad_device, int after_calls, int kind) {
  int n = pmap_ctx_num_devices(ctx);
  fail_case c;
  memset(&c, 0, sizeof c);
  c.bad_device = bad_device;
  c.after_calls = after_calls;
  c.kind = kind;
  double t0 = now_s();
  pmap_status st = pmap_run(ctx, fail_fn, &c);
  double took = now_s() - t0;
  char name[32];
  snprintf(name, sizeof name, "device %d:", bad_device);
  const char *msg = pmap_last_error();
  if (kind == FAIL_SLEEP) {
    /* The message names the sleeping device, whichever waiting device gave up first, and
     * no waiting device. */
    CHECK(st == PMAP_ERR_TIMEOUT, "N %d, device %d sleeps after %d calls: pmap_run -> %s (%s)", n,
          bad_device, after_calls, pmap_status_string(st), msg);
    char late[80];
    snprintf(late, sizeof late, ": device %d did not arrive within", bad_device);
    CHECK(strncmp(msg, "pmap_run: pmap_", 15) == 0 && strstr(msg, late) != NULL,
          "timeout message \"%s\" does not name device %d alone", msg, bad_device);
    for (int d = 0; d < n; d++) {
      snprintf(name, sizeof name, "device %d", d);
      CHECK(d == bad_device || !strstr(msg, name), "timeout message \"%s\" names waiting %s", msg,
            name);
    }
    CHECK(took < 10.0, "a timed-out job took %.2f s", took);
    CHECK(c.got[bad_device] == PMAP_ERR_ABORTED || c.got[bad_device] == PMAP_ERR_TIMEOUT,
          "the sleeping device got %s", pmap_status_string(c.got[bad_device]));
    check_recovers(ctx, "a timeout");
    return;
  }
  pmap_status want = kind == FAIL_RETURN ? PMAP_ERR_DEVICE : PMAP_ERR_INVALID_ARGUMENT;
  CHECK(st == want, "N %d, device %d fails after %d calls: pmap_run -> %s, want %s (%s)", n,
        bad_device, after_calls, pmap_status_string(st), pmap_status_string(want), msg);
  CHECK(strstr(msg, name) != NULL, "message \"%s\" does not name \"%s\"", msg, name);
  if (kind == FAIL_API)
    CHECK(strstr(msg, "pmap_device_upload: dst is NULL") != NULL,
          "message \"%s\" lost the failing call's own message", msg);
  for (int d = 0; d < n; d++)
    if (d != bad_device)
      CHECK(c.got[d] == PMAP_ERR_ABORTED, "N %d: device %d got %s while device %d failed", n, d,
            pmap_status_string(c.got[d]), bad_device);
  check_recovers(ctx, "a failed device");
}

/* Every device misuses a collective the same way, so every device fails at once. */
typedef struct misuse_case {
  int which; /* 0 NULL send, 1 NULL recv, 2 root n, 3 root -1, 4 NULL send on one device only,
                5 psum with recv one element past send, 6 all_gather with send == recv */
} misuse_case;

static pmap_status misuse_fn(pmap_device *dev, void *arg) {
  const misuse_case *c = arg;
  int n = pmap_axis_size(dev), d = pmap_axis_index(dev);
  float buf[8] = {0}, wide[8 * 64] = {0};
  switch (c->which) {
  case 5: return pmap_psum(dev, buf, buf + 1, 7);
  case 6: return pmap_all_gather(dev, wide, wide, 8); /* in place only for device 0 */
  case 0: return pmap_psum(dev, NULL, buf, 8);
  case 1: return pmap_all_gather(dev, buf, NULL, 1);
  case 2: return pmap_broadcast(dev, buf, buf, 8, n);
  case 3: return pmap_broadcast(dev, buf, buf, 8, -1);
  default: return pmap_pmax(dev, d == n - 1 ? NULL : buf, buf, 8);
  }
}

static void run_misuse(pmap_ctx *ctx) {
  int n = pmap_ctx_num_devices(ctx);
  misuse_case c;
  char needle[64];
  c.which = 0;
  CHECK_FAILS(pmap_run(ctx, misuse_fn, &c), PMAP_ERR_INVALID_ARGUMENT, "pmap_psum: send is NULL");
  c.which = 1;
  CHECK_FAILS(pmap_run(ctx, misuse_fn, &c), PMAP_ERR_INVALID_ARGUMENT,
              "pmap_all_gather: recv is NULL");
  c.which = 2;
  snprintf(needle, sizeof needle, "root %d is outside [0, %d)", n, n);
  CHECK_FAILS(pmap_run(ctx, misuse_fn, &c), PMAP_ERR_INVALID_ARGUMENT, needle);
  c.which = 3;
  CHECK_FAILS(pmap_run(ctx, misuse_fn, &c), PMAP_ERR_INVALID_ARGUMENT, "root -1");
  c.which = 4;
  snprintf(needle, sizeof needle, "device %d", n - 1);
  CHECK_FAILS(pmap_run(ctx, misuse_fn, &c), PMAP_ERR_INVALID_ARGUMENT, needle);
  CHECK(strstr(pmap_last_error(), "pmap_pmax: send is NULL") != NULL, "message \"%s\"",
        pmap_last_error());
  c.which = 5;
  CHECK_FAILS(pmap_run(ctx, misuse_fn, &c), PMAP_ERR_INVALID_ARGUMENT,
              "pmap_psum: send and recv overlap on device 0 without being in place");
  if (n > 1) {
    c.which = 6;
    CHECK_FAILS(pmap_run(ctx, misuse_fn, &c), PMAP_ERR_INVALID_ARGUMENT,
                "pmap_all_gather: send and recv overlap on device 1 without being in place "
                "(in place means send == recv + axis_index * count)");
  }
  check_recovers(ctx, "invalid arguments");
}

/* ------------------------------------------------------------------------------------------ */

static pmap_ctx *make_ctx(int n, double timeout_s) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n, .timeout_s = timeout_s};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  if (ctx)
    CHECK(pmap_ctx_num_devices(ctx) == n, "context has %d devices, want %d",
          pmap_ctx_num_devices(ctx), n);
  return ctx;
}

int main(void) {
  static const size_t sizes[] = {0,    1,    2,    7,    15,   16,   17,   31,
                                 1000, 1023, 1024, 1025, 1026, 1040, 4097, 65537};
  double t0 = now_s();
  for (int n = 1; n <= 8; n++) {
    pmap_ctx *ctx = make_ctx(n, 0.0);
    if (!ctx) continue;
    int before = test_failures;
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) run_all_ops(ctx, sizes[s], 1);
    CHECK_OK(pmap_run(ctx, empty_fn, NULL));
    run_mix(ctx);
    run_misuse(ctx);
    /* Fails before its first collective, and in the middle of a sequence of them. */
    run_failure(ctx, n - 1, 0, FAIL_RETURN);
    run_failure(ctx, 0, 0, FAIL_API);
    if (n > 1) run_failure(ctx, n / 2, 17, FAIL_RETURN);
    printf("N %d: %s (%.1f s)\n", n, test_failures == before ? "ok" : "FAILED", now_s() - t0);
    fflush(stdout);
    pmap_ctx_destroy(ctx);
  }

  /* Over a million elements, where every device reduces a chunk of its own. */
  static const int big_n[] = {1, 3, 8};
  for (size_t k = 0; k < sizeof big_n / sizeof big_n[0]; k++) {
    pmap_ctx *ctx = make_ctx(big_n[k], 0.0);
    if (!ctx) continue;
    size_t count = ((size_t)1 << 20) + 3;
    /* One layout per op keeps the sanitizer builds quick; the small sizes cover both. */
    run_one(ctx, OP_SUM, count, 1, 0);
    run_one(ctx, OP_MEAN, count, 0, 0);
    run_one(ctx, OP_MAX, count, 1, 0);
    run_one(ctx, OP_BCAST, count, 0, big_n[k] - 1);
    if (big_n[k] <= 3) run_one(ctx, OP_GATHER, count, 1, 0);
    pmap_ctx_destroy(ctx);
  }
  printf("large counts done (%.1f s)\n", now_s() - t0);

  /* A device that arrives long after the timeout: the others give up, nobody hangs. */
  static const int slow_n[] = {2, 3, 5};
  for (size_t k = 0; k < sizeof slow_n / sizeof slow_n[0]; k++) {
    pmap_ctx *ctx = make_ctx(slow_n[k], 0.2);
    if (!ctx) continue;
    /* The caller's own thread (device 0) sleeps once, a worker the other times. */
    run_failure(ctx, k == 0 ? 0 : slow_n[k] - 1, (int)k * 3, FAIL_SLEEP);
    run_mix(ctx);
    pmap_ctx_destroy(ctx);
  }
  printf("timeouts done (%.1f s)\n", now_s() - t0);
  return test_exit("coll");
}
