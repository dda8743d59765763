/* test_mpi.c: pmap across processes, run by test_mpi.sh under mpirun with P processes of D
 * devices each. Modes:
 *   coll D     every collective across processes with exactly summable values, in and out of
 *              place, sizes 0..50001; global and local indices; a mismatch across processes
 *   train D    five example models, 20 steps: P*D global devices equal one process with P*D
 *              devices and equal 1 device to the order of their float sums (parameters and each
 *              step's loss within the model's bound_order32, tests/bounds.h); replicas bitwise
 *              identical in every process
 *   layout D   process 1 asks for D + 1 devices: every process fails naming the counts; then
 *              process 1 passes more rows than the others: every process refuses the step;
 *              NaN gradients on one device of process 1: every process skips the step, naming
 *              that device by its global index, process and host
 *   stall D    process 1 stalls before step 3: process 0 gets PMAP_ERR_TIMEOUT naming process
 *              1, its host and the collective's number within the timeout, and later calls fail
 *              at once
 *   die D      process 1 exits before step 3: the job ends, not hangs (mpirun ends it), or,
 *              where mpirun lets the others run on, process 0 reports process 1 as for stall
 * Exits 77 when pmap was built without MPI. */
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

/* ------------------------------------------------------------------------------------------ */
/* Collectives                                                                                */

typedef struct coll_job {
  long wrong[PMAP_MAX_DEVICES]; /* wrong elements seen by each local device */
  int bad_index[PMAP_MAX_DEVICES];
} coll_job;

static const size_t counts[] = {0, 1, 7, 1000, 1025, 50001};
#define NCOUNTS (sizeof counts / sizeof counts[0])

static long count_wrong(const float *got, const double *want, size_t n, const char *what, int g) {
  long wrong = 0;
  for (size_t i = 0; i < n; i++)
    if ((double)got[i] != want[i]) {
      if (!wrong)
        fprintf(stderr, "FAIL process %d device %d: %s: element %zu is %.9g, want %.9g\n", RANK, g,
                what, i, (double)got[i], want[i]);
      wrong++;
    }
  return wrong;
}

static float pmax_value(int g, size_t i, int G) {
  return (float)(((size_t)g * 7 + i) % (size_t)G * 3 + i % 5);
}

static pmap_status coll_fn(pmap_device *dev, void *arg) {
  coll_job *job = arg;
  int g = pmap_axis_index(dev), G = pmap_axis_size(dev), l = pmap_local_index(dev);
  long wrong = 0;
  if (pmap_process_index(dev) != RANK || g != RANK * (G / P) + l) {
    fprintf(stderr, "FAIL: device %d of process %d: global index %d, local %d, process %d\n", l,
            RANK, g, l, pmap_process_index(dev));
    wrong++;
  }
  size_t maxc = counts[NCOUNTS - 1];
  float *send = NULL, *recv = NULL;
  double *want = malloc((size_t)G * maxc * sizeof *want);
  pmap_status st = pmap_device_alloc(dev, maxc, &send);
  if (!st) st = pmap_device_alloc(dev, (size_t)G * maxc, &recv);
  if (st || !want) goto out;
  for (size_t c = 0; c < NCOUNTS && !st; c++) {
    size_t n = counts[c];
    for (int in_place = 0; in_place < 2 && !st; in_place++) {
      /* psum and pmean of (g + 1) * k: sums and means are exact. */
      for (size_t i = 0; i < n; i++) {
        send[i] = (float)((g + 1) * (int)(i % 97 + 1));
        want[i] = (double)(i % 97 + 1) * G * (G + 1) / 2;
      }
      float *out = in_place ? send : recv;
      if ((st = pmap_psum(dev, send, out, n))) break;
      wrong += count_wrong(out, want, n, in_place ? "psum in place" : "psum", g);
      for (size_t i = 0; i < n; i++) {
        send[i] = (float)((g + 1) * (int)(i % 97 + 1));
        want[i] = (double)(i % 97 + 1) * (G + 1) / 2.0;
      }
      if ((st = pmap_pmean(dev, send, out, n))) break;
      wrong += count_wrong(out, want, n, "pmean", g);
      for (size_t i = 0; i < n; i++) {
        send[i] = pmax_value(g, i, G);
        double m = 0;
        for (int k = 0; k < G; k++) m = k == 0 || pmax_value(k, i, G) > m ? pmax_value(k, i, G) : m;
        want[i] = m;
      }
      if ((st = pmap_pmax(dev, send, out, n))) break;
      wrong += count_wrong(out, want, n, "pmax", g);
      /* all_gather: in place is send == recv + g * n. */
      float *src = in_place ? recv + (size_t)g * n : send;
      for (size_t i = 0; i < n; i++) src[i] = (float)(g * 4096 + (int)(i % 4096));
      for (int k = 0; k < G; k++)
        for (size_t i = 0; i < n; i++) want[(size_t)k * n + i] = k * 4096 + (double)(i % 4096);
      if ((st = pmap_all_gather(dev, src, recv, n))) break;
      wrong += count_wrong(recv, want, (size_t)G * n, "all_gather", g);
    }
    for (int root = 0; root < G && !st; root++) {
      for (size_t i = 0; i < n; i++) {
        send[i] = g == root ? (float)(root * 10000 + (int)(i % 1000)) : -1.0f;
        want[i] = root * 10000 + (double)(i % 1000);
      }
      if ((st = pmap_broadcast(dev, send, recv, n, root))) break;
      wrong += count_wrong(recv, want, n, "broadcast", g);
    }
    if (!st) st = pmap_barrier(dev);
  }
out:
  job->wrong[l] = wrong;
  pmap_device_free(dev, send);
  pmap_device_free(dev, recv);
  free(want);
  if (!st && !want) st = PMAP_ERR_OUT_OF_MEMORY;
  return st;
}

/* Process 0 calls psum of 4 floats, the others of 5: every process must refuse. */
static pmap_status mismatch_fn(pmap_device *dev, void *arg) {
  (void)arg;
  float buf[5] = {1, 2, 3, 4, 5};
  return pmap_psum(dev, buf, buf, pmap_process_index(dev) == 0 ? 4 : 5);
}

static void mode_coll(int d) {
  pmap_ctx *ctx = NULL;
  CHECK_OK(dist_ctx(d, 60.0, &ctx));
  if (!ctx) return;
  CHECK(pmap_ctx_num_processes(ctx) == P && pmap_ctx_process_index(ctx) == RANK,
        "context: %d processes, index %d; want %d, %d", pmap_ctx_num_processes(ctx),
        pmap_ctx_process_index(ctx), P, RANK);
  coll_job job;
  memset(&job, 0, sizeof job);
  double t0 = now_s();
  CHECK_OK(pmap_run(ctx, coll_fn, &job));
  long wrong = 0;
  for (int i = 0; i < d; i++) wrong += job.wrong[i];
  CHECK(wrong == 0, "process %d: %ld wrong elements", RANK, wrong);
  printf("process %d: collectives over %d x %d devices: %ld wrong (%.2f s)\n", RANK, P, d, wrong,
         now_s() - t0);
  CHECK_FAILS(pmap_run(ctx, mismatch_fn, NULL), PMAP_ERR_INVALID_ARGUMENT,
              "called different collectives");
  /* Still in step: a mismatch is refused before any data moves. */
  memset(&job, 0, sizeof job);
  CHECK_OK(pmap_run(ctx, coll_fn, &job));
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* ------------------------------------------------------------------------------------------ */
/* Training                                                                                   */

/* Rows [first, first + n) of a, as a view. */
static pmap_array rows_of(const pmap_array *a, int64_t first, int64_t n) {
  pmap_array v = *a;
  int64_t row = pmap_array_numel(a) / a->shape[0];
  v.data = (char *)a->data + (size_t)(first * row) * 4;
  v.shape[0] = n;
  return v;
}

#define STEPS 20
#define WINDOWS 4 /* the data holds WINDOWS batches; step s trains on batch s % WINDOWS */

/* The largest and the root mean square of the outputs of `params` on the rows x. */
static pmap_status outputs_size(pmap_params *params, const pmap_array *x, int64_t outputs,
                                double *most, double *rms) {
  int64_t shape[2] = {x->shape[0], outputs};
  size_t n = (size_t)(shape[0] * outputs);
  float *z = malloc(n * sizeof *z);
  pmap_array out = pmap_array_f32(z, 2, shape);
  pmap_status st = z ? pmap_predict(params, x, &out) : PMAP_ERR_OUT_OF_MEMORY;
  double sq = 0;
  *most = 0;
  for (size_t i = 0; !st && i < n; i++) *most = fmax(*most, fabs((double)z[i])), sq += z[i] * z[i];
  *rms = sqrt(sq / (double)n);
  free(z);
  return st;
}

/* The loss's condition (docs/tolerances.md, item 4): how many times a relative change d of the
 * model's outputs z moves the loss L, relatively, from the outputs themselves. Cross-entropy: a
 * row's loss moves by sum_j (p_j - y_j) dz_j, at most 2 (1 - p_label) max |dz|, and
 * 1 - p_label <= min(1, its loss): kappa = 2 max |z| min(1, 1 / L). MSE: |dL| <= 2 sqrt(L)
 * rms(dz): kappa = 2 rms(z) / sqrt(L). These short runs on 4 batches of 12 rows drive
 * cifar-cnn's and mlp-1024's losses below 1e-2 with logits of 9 and 14, kappa 19 and 28
 * (tests/bounds.h's 4 holds while the logits stay below twice the loss): each step's bound takes
 * the larger. */
static double condition(const pmap_array *y, double most, double rms, float loss) {
  if (y->dtype == PMAP_F32) return 2.0 * rms / sqrt((double)loss);
  return 2.0 * most * fmin(1.0, 1.0 / (double)loss);
}

/* Trains `model` for STEPS steps on a context of `devices` local devices (distributed when
 * dist) and returns the parameters of this process's first device and the losses; with kappa,
 * the loss's condition at every step (computed before its update, at the parameters its loss is
 * of). */
static float *train(const char *model, int64_t batch, int devices, int dist, float *losses,
                    double *kappa) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = devices,
                     .timeout_s = 60.0,
                     .dist = dist ? PMAP_DIST_MPI : PMAP_DIST_NONE};
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  pmap_model *m = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  float *w = NULL;
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  if (!st) st = pmap_example_info_get(model, &info);
  if (!st) st = pmap_example_model(model, &m);
  if (!st) st = pmap_params_create(ctx, m, &info.opt, 42, &params);
  if (!st) st = pmap_example_data(model, 7, batch * WINDOWS, &xs, &ys);
  int procs = dist ? P : 1, me = dist ? RANK : 0;
  int64_t mine = batch / procs; /* this process's rows of each global batch */
  int out_rank = 0;
  int64_t out_shape[PMAP_MAX_RANK] = {1};
  if (!st) pmap_model_output_shape(m, &out_rank, out_shape);
  for (int s = 0; s < STEPS && !st; s++) {
    int64_t first = (int64_t)(s % WINDOWS) * batch + me * mine;
    pmap_array x = rows_of(&xs, first, mine), y = rows_of(&ys, first, mine);
    double most = 0, rms = 0;
    if (kappa) st = outputs_size(params, &x, out_shape[0], &most, &rms);
    if (!st) st = pmap_update(params, &x, &y, &losses[s]);
    if (kappa && !st) kappa[s] = condition(&y, most, rms, losses[s]);
  }
  size_t n = st ? 0 : pmap_params_count(params);
  if (!st && !(w = malloc(n * sizeof *w))) st = PMAP_ERR_OUT_OF_MEMORY;
  if (!st) st = pmap_params_read(params, me * devices, w, n);
  /* Every local replica equals the first, bitwise. */
  float *o = st ? NULL : malloc(n * sizeof *o);
  for (int k = 1; o && k < devices && !st; k++) {
    st = pmap_params_read(params, me * devices + k, o, n);
    CHECK(st || !memcmp(o, w, n * sizeof *o), "%s: process %d device %d differs from its first",
          model, me, k);
  }
  free(o);
  if (st) {
    fprintf(stderr, "FAIL %s on %d x %d devices: %s: %s\n", model, procs, devices,
            pmap_status_string(st), pmap_last_error());
    test_failures++;
    free(w);
    w = NULL;
  }
  if (dist && params && !st) {
    /* A device of another process is not readable here. */
    float one;
    int other = ((RANK + 1) % P) * devices;
    CHECK_FAILS(pmap_params_read(params, other, &one, pmap_params_count(params)),
                PMAP_ERR_INVALID_ARGUMENT, "lives in process");
  }
  pmap_example_data_free(&xs, &ys);
  pmap_model_destroy(m);
  pmap_params_destroy(params);
  pmap_ctx_destroy(ctx);
  return w;
}

static double rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
    double e = (double)a[i] - (double)b[i];
    num += e * e;
    den += (double)b[i] * b[i];
  }
  return sqrt(num / (den > 1e-30 ? den : 1e-30));
}

/* FNV-1a of the parameters' bits, as four 16-bit pieces: floats that sum and compare exactly. */
static void hash_pieces(const float *w, size_t n, float out[4]) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char *b = (const unsigned char *)w;
  for (size_t i = 0; i < n * sizeof *w; i++) h = (h ^ b[i]) * 1099511628211ull;
  for (int k = 0; k < 4; k++) out[k] = (float)((h >> (16 * k)) & 0xffff);
}

typedef struct hash_job {
  float mine[4];
  float all[PMAP_MAX_DEVICES][4 * 4096]; /* per local device: (G, 4) */
} hash_job;

static pmap_status hash_fn(pmap_device *dev, void *arg) {
  hash_job *j = arg;
  return pmap_all_gather(dev, j->mine, j->all[pmap_local_index(dev)], 4);
}

/* Every process's replica hashes the same: gathered over the distributed context. */
static void check_same_everywhere(const char *model, const float *w, size_t n, int d) {
  static hash_job job;
  pmap_ctx *ctx = NULL;
  CHECK_OK(dist_ctx(d, 60.0, &ctx));
  if (!ctx) return;
  hash_pieces(w, n, job.mine);
  CHECK_OK(pmap_run(ctx, hash_fn, &job));
  for (int k = 0; k < P * d; k++)
    CHECK(!memcmp(job.all[0] + 4 * k, job.mine, sizeof job.mine),
          "%s: the replica of global device %d differs from process %d's", model, k, RANK);
  pmap_ctx_destroy(ctx);
}

/* P x D devices against one process of P*D devices and against 1 device, on the same global
 * batches: every device computes the same rows' sums in either layout, and the layouts differ in
 * the order of the sums over the batch (the all-reduce over processes, then devices, against one
 * process's devices in order, against one device's whole batch). That is a change of summation
 * order only: the parameters and the losses stay within bound_order32 of the model on its global
 * batch (tests/bounds.h, docs/tolerances.md), its condition the run's where that is larger
 * (condition()), after STEPS steps for the parameters and, for step s's loss (computed before
 * its update), after s + 1 passes. The same bound serves both references: it counts every sum
 * on a row's path and over the batch, of which the all-reduce's order is a part. */
static void mode_train(int d) {
  static const struct {
    const char *name;
    int64_t batch; /* global, divisible by P * D for P in {2, 3} and D in {1, 2} */
  } models[] = {{"linear", 24}, {"mlp", 24}, {"convnet", 24}, {"cifar-cnn", 12}, {"mlp-1024", 12}};
  for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
    const char *name = models[i].name;
    int64_t batch = models[i].batch;
    const bound_model *bm = bound_model_of(name);
    CHECK(bm != NULL, "%s: no bound model", name);
    if (!bm) continue;
    pmap_model *m = NULL;
    CHECK_OK(pmap_example_model(name, &m));
    size_t n = pmap_model_num_params(m);
    pmap_model_destroy(m);
    double t0 = now_s();
    float dl[STEPS], l1[STEPS], lg[STEPS];
    float *wd = train(name, batch, d, 1, dl, NULL);
    if (!wd) continue;
    check_same_everywhere(name, wd, n, d);
    if (RANK == 0) {
      /* The references: one process with P*D devices, and one device. */
      double kappa[STEPS];
      float *wg = train(name, batch, P * d, 0, lg, NULL);
      float *w1 = train(name, batch, 1, 0, l1, kappa);
      if (wg && w1) {
        /* The parameters carry every step's difference, the gradients' conditioned as the
         * loss is (p - y, y - t): the largest condition of the run. */
        bound_model at = *bm;
        for (int s = 0; s < STEPS; s++) at.kappa = fmax(at.kappa, kappa[s]);
        double bound = bound_order32(&at, (double)batch, STEPS);
        double eg = rel_err(wd, wg, n), e1 = rel_err(wd, w1, n);
        /* Each step's loss against its own step's bound; the worst ratio is reported. */
        double le = 0, lb = 0, worst = -1;
        for (int s = 0; s < STEPS; s++) {
          double e = fabs((double)dl[s] - l1[s]) / fmax(fabs((double)l1[s]), 1e-30);
          at.kappa = fmax(bm->kappa, kappa[s]);
          double b = bound_order32(&at, (double)batch, s + 1);
          CHECK(e <= b,
                "%s: %d x %d devices: step %d's loss differs from 1 device's by %.3g > %.3g", name,
                P, d, s, e, b);
          if (!(e / b <= worst)) worst = e / b, le = e, lb = b;
        }
        CHECK(eg <= bound, "%s: %d x %d devices vs one process of %d: relative error %.3g > %.3g",
              name, P, d, P * d, eg, bound);
        CHECK(e1 <= bound, "%s: %d x %d devices vs 1 device: relative error %.3g > %.3g", name, P,
              d, e1, bound);
        printf(
            "%-9s %d x %d devices: vs %d devices %.2e, vs 1 device %.2e (bound %.2e), "
            "losses %.2e (bound %.2e) (%.2f s)\n",
            name, P, d, P * d, eg, e1, bound, le, lb, now_s() - t0);
      }
      free(wg);
      free(w1);
    }
    free(wd);
  }
}

/* ------------------------------------------------------------------------------------------ */
/* Failures                                                                                   */

/* Batch norm across devices exchanges statistics between every device of every process: a NaN
 * in the rows of process 1's device 0 alone names that device as the source, and every other
 * device as having only received it; the step is skipped everywhere. */
static void layout_exchange_source(int d) {
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  pmap_model *m = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(dist_ctx(d, 30.0, &ctx));
  CHECK_OK(pmap_example_info_get("cifar-bn", &info));
  CHECK_OK(pmap_example_model("cifar-bn", &m));
  CHECK_OK(pmap_example_data("cifar-bn", 2, 2 * d, &xs, &ys));
  if (ctx && m) CHECK_OK(pmap_params_create(ctx, m, &info.opt, 1, &params));
  if (params && xs.data) {
    pmap_array x = xs, y = ys;
    x.shape[0] = y.shape[0] = 2 * d;
    CHECK_OK(pmap_update(params, &x, &y, NULL));
    float *first = xs.data, saved = first[5];
    if (RANK == 1) first[5] = NAN; /* the first row of this process's device 0 */
    CHECK_FAILS(pmap_update(params, &x, &y, NULL), PMAP_ERR_NUMERIC, "skipped on every replica");
    /* "gradients of device D (process 1, host h) were non-finite; device 0 (process 0, ...". */
    char who[64];
    snprintf(who, sizeof who, "gradients of device %d (process 1, host ", d);
    const char *e = pmap_last_error(), *src = strstr(e, who);
    const char *end = src ? strstr(src, ") were non-finite; device 0 (process 0, host ") : NULL;
    int sources = 0;
    for (const char *q = src; q && end && (q = strstr(q + 1, "device ")) && q < end;) sources++;
    CHECK(src && end && sources == 1 && strstr(end, "only received"),
          "the guard does not name process 1's device 0 alone: %s", e);
    if (RANK == 0) printf("process 0: %s\n", e);
    first[5] = saved;
    CHECK(pmap_params_step(params) == 1, "a skipped step counted");
    CHECK_OK(pmap_update(params, &x, &y, NULL));
  }
  pmap_params_destroy(params);
  pmap_ctx_destroy(ctx);
  pmap_example_data_free(&xs, &ys);
  pmap_model_destroy(m);
}

static void mode_layout(int d) {
  pmap_ctx *ctx = NULL;
  CHECK_FAILS(dist_ctx(RANK == 1 ? d + 1 : d, 30.0, &ctx), PMAP_ERR_INVALID_ARGUMENT,
              "same backend and device count");
  pmap_ctx_destroy(ctx);
  printf("process %d: layout mismatch refused: %s\n", RANK, pmap_last_error());
  /* Process 1 passes twice the rows of the others: refused everywhere, nothing changed. */
  pmap_params *params = NULL;
  pmap_model *m = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(dist_ctx(d, 30.0, &ctx));
  CHECK_OK(pmap_example_info_get("mlp", &info));
  CHECK_OK(pmap_example_model("mlp", &m));
  if (ctx) CHECK_OK(pmap_params_create(ctx, m, &info.opt, 1, &params));
  CHECK_OK(pmap_example_data("mlp", 2, 2 * d, &xs, &ys));
  if (params) {
    pmap_array x = xs, y = ys;
    x.shape[0] = y.shape[0] = RANK == 1 ? 2 * d : d;
    CHECK_FAILS(pmap_update(params, &x, &y, NULL), PMAP_ERR_INVALID_ARGUMENT,
                "different numbers of rows");
    CHECK(pmap_params_step(params) == 0, "a refused step counted");
    x.shape[0] = y.shape[0] = d;
    CHECK_OK(pmap_update(params, &x, &y, NULL));
    CHECK(pmap_params_step(params) == 1, "step %lld after one update",
          (long long)pmap_params_step(params));
  }
  pmap_params_destroy(params);
  pmap_ctx_destroy(ctx);
  params = NULL;
  ctx = NULL;

  /* The numeric guard: NaN gradients on one device of process 1 skip the step everywhere. */
  char fault[64]; /* process 1's device 0, by its global index */
  snprintf(fault, sizeof fault, "nan:device=%d:step=2", d); /* the second update */
  if (RANK == 1) setenv("PMAP_FAULT", fault, 1);
  CHECK_OK(dist_ctx(d, 30.0, &ctx));
  unsetenv("PMAP_FAULT");
  if (ctx) CHECK_OK(pmap_params_create(ctx, m, &info.opt, 1, &params));
  if (params) {
    pmap_array x = xs, y = ys;
    x.shape[0] = y.shape[0] = d;
    CHECK_OK(pmap_update(params, &x, &y, NULL));
    CHECK_FAILS(pmap_update(params, &x, &y, NULL), PMAP_ERR_NUMERIC, "skipped on every replica");
    /* The device is named by its global index, process and host (process 1's device 0). */
    char who[64];
    snprintf(who, sizeof who, "device %d (process 1, host", d);
    CHECK(strstr(pmap_last_error(), who) != NULL, "the guard's message lacks \"%s\": %s", who,
          pmap_last_error());
    CHECK(pmap_params_step(params) == 1, "a skipped step counted");
    CHECK_OK(pmap_update(params, &x, &y, NULL));
    size_t n = pmap_params_count(params);
    float *w = malloc(n * sizeof *w);
    if (w) CHECK_OK(pmap_params_read(params, RANK * d, w, n));
    pmap_params_destroy(params);
    pmap_ctx_destroy(ctx);
    if (w) check_same_everywhere("mlp after a skipped step", w, n, d);
    free(w);
  } else {
    pmap_ctx_destroy(ctx);
  }
  pmap_example_data_free(&xs, &ys);
  pmap_model_destroy(m);
  layout_exchange_source(d);
}

/* Process 1 stalls (stall) or exits (die) before step 3; process 0 must get an error naming it
 * within the 3 s timeout. */
static void mode_fail(int d, int die) {
  pmap_ctx *ctx = NULL;
  pmap_params *params = NULL;
  pmap_model *m = NULL;
  pmap_example_info info;
  pmap_array xs = {0}, ys = {0};
  CHECK_OK(dist_ctx(d, 3.0, &ctx));
  CHECK_OK(pmap_example_info_get("mlp", &info));
  CHECK_OK(pmap_example_model("mlp", &m));
  if (ctx) CHECK_OK(pmap_params_create(ctx, m, &info.opt, 1, &params));
  CHECK_OK(pmap_example_data("mlp", 2, 8 * d, &xs, &ys));
  if (!params || test_failures) exit(test_exit("test_mpi fail setup"));
  for (int s = 0; s < 6; s++) {
    if (RANK == 1 && s == 3) {
      fflush(stdout);
      if (die) _exit(3);
      sleep(120);
    }
    double t0 = now_s();
    pmap_status st = pmap_update(params, &xs, &ys, NULL);
    if (s < 3) {
      CHECK_OK(st);
      continue;
    }
    double took = now_s() - t0;
    if (RANK != 0) break;
    CHECK(st == PMAP_ERR_TIMEOUT, "step %d: %s: %s", s, pmap_status_string(st), pmap_last_error());
    CHECK(strstr(pmap_last_error(), "process 1 (host") != NULL, "message lacks the process: %s",
          pmap_last_error());
    CHECK(strstr(pmap_last_error(), "collective #") != NULL && strstr(pmap_last_error(), "host"),
          "message lacks the collective's number or the host: %s", pmap_last_error());
    CHECK(took < 20.0, "the timeout took %.1f s", took);
    printf("process 0: step %d failed after %.2f s: %s\n", s, took, pmap_last_error());
    t0 = now_s();
    st = pmap_update(params, &xs, &ys, NULL);
    CHECK(st != PMAP_SUCCESS && now_s() - t0 < 1.0, "after the failure: %s in %.2f s",
          pmap_status_string(st), now_s() - t0);
    if (!test_failures) printf("OK %s: process 0 reported process 1\n", die ? "die" : "stall");
    break;
  }
  pmap_example_data_free(&xs, &ys);
  pmap_model_destroy(m);
  pmap_params_destroy(params);
  pmap_ctx_destroy(ctx);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s coll|train|layout|stall|die DEVICES (under mpirun)\n", argv[0]);
    return 2;
  }
  int d = atoi(argv[2]);
  /* Learn P and the rank from a one-device context. */
  pmap_ctx *probe = NULL;
  pmap_status st = dist_ctx(1, 60.0, &probe);
  if (st == PMAP_ERR_UNAVAILABLE) {
    printf("SKIP: %s\n", pmap_last_error());
    return 77;
  }
  if (st) {
    fprintf(stderr, "FAIL: distributed context: %s\n", pmap_last_error());
    return 1;
  }
  P = pmap_ctx_num_processes(probe);
  RANK = pmap_ctx_process_index(probe);
  pmap_ctx_destroy(probe);
  if (!strcmp(argv[1], "coll"))
    mode_coll(d);
  else if (!strcmp(argv[1], "train"))
    mode_train(d);
  else if (!strcmp(argv[1], "layout"))
    mode_layout(d);
  else if (!strcmp(argv[1], "stall"))
    mode_fail(d, 0);
  else if (!strcmp(argv[1], "die"))
    mode_fail(d, 1);
  else {
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  }
  char name[64];
  snprintf(name, sizeof name, "test_mpi %s, process %d of %d", argv[1], RANK, P);
  return test_exit(name);
}
