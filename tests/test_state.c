/* test_state.c: state that is not trained (batch norm's running mean and variance). A step that
 * fails or is skipped in any way (non-finite targets, the fault hooks nan, collective, stall,
 * alloc, with micro-batches and with a sharded optimizer, on batch norm across replicas or per
 * device, over features or channels) changes no replica at all, and retrying it gives bitwise
 * the run that never saw the bad batch; weight decay (SGD's L2, AdamW's decoupled) and clipping
 * leave the state alone; a step that is taken moves it once; a batch whose moments overflow float
 * gets the verdict of 1 device on every device count. CPU backend. */
#include "bounds.h"
#include "testutil.h"

enum { ROWS = 12 }; /* rows of a step's global batch */

typedef enum net { NET_DENSE, NET_DENSE_LOCAL, NET_TWO_NORMS, NET_CONV } net;
static const char *const net_name[] = {"dense+bn", "dense+bn per device", "two norms", "conv+bn"};

/* (4) -> dense 8 -> batch norm -> relu -> dense 1, MSE; or its variants. */
static pmap_model *build(net k) {
  pmap_model *m = NULL;
  int64_t in1[1] = {4}, in3[3] = {2, 5, 5};
  if (k == NET_CONV) {
    CHECK_OK(pmap_model_create(3, in3, &m));
    CHECK_OK(pmap_model_add_conv2d(m, 3, 3, 3, 1, 1));
    CHECK_OK(pmap_model_add_batchnorm(m, 1));
    CHECK_OK(pmap_model_add_relu(m));
    CHECK_OK(pmap_model_add_flatten(m));
    CHECK_OK(pmap_model_add_dense(m, 3));
    CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT));
    return m;
  }
  CHECK_OK(pmap_model_create(1, in1, &m));
  CHECK_OK(pmap_model_add_dense(m, 8));
  CHECK_OK(pmap_model_add_batchnorm(m, k != NET_DENSE_LOCAL));
  CHECK_OK(pmap_model_add_relu(m));
  if (k == NET_TWO_NORMS) {
    CHECK_OK(pmap_model_add_dense(m, 6));
    CHECK_OK(pmap_model_add_batchnorm(m, 1));
  }
  CHECK_OK(pmap_model_add_dense(m, 1));
  return m;
}

/* Batch b of every step: inputs and targets (or labels) from the seed b. bad: a NaN in the
 * targets of the last row (device N-1's), or in its inputs for the classifier. */
typedef struct batch {
  float x[ROWS * 50];
  float y[ROWS];
  int32_t label[ROWS];
  pmap_array xs, ys;
} batch;

static void make_batch(batch *b, net k, uint64_t seed, int bad) {
  uint64_t s = seed * 7919 + 11;
  int conv = k == NET_CONV;
  int64_t xshape[4] = {ROWS, conv ? 2 : 4, 5, 5}, yshape[2] = {ROWS, 1};
  size_t per = conv ? 50 : 4;
  test_fill(b->x, ROWS * per, &s, -1.5f, 2.5f);
  test_fill(b->y, ROWS, &s, -1.0f, 1.0f);
  for (int i = 0; i < ROWS; i++) b->label[i] = (int32_t)(test_rand_u64(&s) % 3);
  b->xs = pmap_array_f32(b->x, conv ? 4 : 2, xshape);
  if (conv) {
    b->ys = pmap_array_i32(b->label, 1, yshape);
    if (bad) b->x[(ROWS - 1) * per + 3] = NAN;
  } else {
    b->ys = pmap_array_f32(b->y, 2, yshape);
    if (bad) b->y[ROWS - 1] = NAN;
  }
}

typedef struct run {
  pmap_ctx *ctx;
  pmap_model *m;
  pmap_params *p;
  size_t P;
  int n;
} run;

static int open_run(run *r, net k, int n, const pmap_optimizer *opt, const char *fault, int shard,
                    int micro) {
  memset(r, 0, sizeof *r);
  if (fault) setenv("PMAP_FAULT", fault, 1);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = n,
                     .timeout_s = 0.5,
                     .shard_optimizer = shard ? PMAP_SHARD_ON : PMAP_SHARD_OFF};
  pmap_status st = pmap_ctx_create(&cfg, &r->ctx);
  unsetenv("PMAP_FAULT");
  CHECK(st == PMAP_SUCCESS, "ctx: %s", pmap_last_error());
  if (st) return -1;
  r->m = build(k);
  r->n = n;
  CHECK_OK(pmap_params_create(r->ctx, r->m, opt, 5, &r->p));
  if (!r->p) return -1;
  CHECK(pmap_params_sharded(r->p) == (shard && n > 1), "sharded %d", pmap_params_sharded(r->p));
  CHECK_OK(pmap_params_set_micro_batches(r->p, micro));
  r->P = pmap_params_count(r->p);
  return 0;
}

static void close_run(run *r) {
  pmap_params_destroy(r->p);
  pmap_model_destroy(r->m);
  CHECK_OK(pmap_ctx_destroy(r->ctx));
}

/* Every replica's parameters, state included: (n, P). */
static float *snapshot(run *r) {
  float *w = malloc((size_t)r->n * r->P * sizeof *w);
  for (int d = 0; w && d < r->n; d++)
    CHECK_OK(pmap_params_read(r->p, d, w + (size_t)d * r->P, r->P));
  return w;
}

static pmap_status step(run *r, net k, uint64_t seed, int bad) {
  batch b;
  make_batch(&b, k, seed, bad);
  float loss = 0.0f;
  return pmap_update(r->p, &b.xs, &b.ys, &loss);
}

/* The predictions (running statistics) on a fixed batch. */
static void predict(run *r, net k, float *out) {
  batch b;
  make_batch(&b, k, 99, 0);
  int64_t shape[2] = {ROWS, k == NET_CONV ? 3 : 1};
  pmap_array o = pmap_array_f32(out, 2, shape);
  CHECK_OK(pmap_predict(r->p, &b.xs, &o));
}

typedef enum failure {
  FAIL_NAN_DATA,   /* a NaN in device N-1's rows: the guard skips the step */
  FAIL_NAN_FAULT,  /* PMAP_FAULT=nan: poisoned local gradients */
  FAIL_COLLECTIVE, /* PMAP_FAULT=collective: the gradient all-reduce fails */
  FAIL_STALL,      /* PMAP_FAULT=stall: a device stalls past the timeout */
  FAIL_ALLOC       /* PMAP_FAULT=alloc: the activations of a larger batch cannot be allocated */
} failure;
static const char *const failure_name[] = {"NaN data", "nan fault", "collective fault",
                                           "stall fault", "alloc fault"};

/* Two clean steps, a step that fails, the same step again with clean data, one more: every
 * replica after the failure equals every replica before it (state included, and so do the
 * predictions), and the end equals a run that never saw the failure, bitwise. */
static void check_failed_step(net k, failure f, int n, const pmap_optimizer *opt, int shard,
                              int micro) {
  char what[256];
  snprintf(what, sizeof what, "%s, %s, %d devices, %s%s, %d micro-batches", net_name[k],
           failure_name[f], n, opt->kind == PMAP_OPT_SGD ? "SGD" : "AdamW", shard ? " sharded" : "",
           micro);
  /* Step 3, the one after the two clean steps. */
  static const char *const faults[] = {NULL, "nan:device=1:step=3", "collective:device=1:step=3",
                                       "stall:device=1:step=3", NULL};
  char alloc_fault[64];
  const char *fault = faults[f];
  if (f == FAIL_ALLOC) {
    /* Device 1's allocations: replica buffers (w, g, opt, pending), then the arena of the first
     * step; the next allocation is the larger arena of the step with the bigger batch. */
    int allocs = 2 + (opt->kind != PMAP_OPT_SGD || opt->momentum != 0.0f) + 1 + 1;
    snprintf(alloc_fault, sizeof alloc_fault, "alloc:device=1:after=%d", allocs);
    fault = alloc_fault;
  }
  run a, b;
  if (open_run(&a, k, n, opt, fault, shard, micro) || open_run(&b, k, n, opt, NULL, shard, micro))
    return;
  for (int s = 0; s < 2; s++) {
    CHECK_OK(step(&a, k, (uint64_t)s, 0));
    CHECK_OK(step(&b, k, (uint64_t)s, 0));
  }
  float *before = snapshot(&a), *after = NULL, *ref = NULL, *fin = NULL;
  float pred_before[ROWS * 3], pred_after[ROWS * 3];
  predict(&a, k, pred_before);
  pmap_status st;
  if (f == FAIL_ALLOC) {
    /* A batch of twice the rows needs a larger arena, whose allocation fails. */
    batch b1, b2;
    make_batch(&b1, k, 2, 0);
    make_batch(&b2, k, 3, 0);
    float x[2 * ROWS * 50], y[2 * ROWS];
    int32_t lab[2 * ROWS];
    size_t per = k == NET_CONV ? 50 : 4;
    memcpy(x, b1.x, sizeof(float) * ROWS * per);
    memcpy(x + ROWS * per, b2.x, sizeof(float) * ROWS * per);
    memcpy(y, b1.y, sizeof b1.y);
    memcpy(y + ROWS, b2.y, sizeof b2.y);
    memcpy(lab, b1.label, sizeof b1.label);
    memcpy(lab + ROWS, b2.label, sizeof b2.label);
    pmap_array xs = b1.xs, ys = b1.ys;
    xs.data = x;
    xs.shape[0] = ys.shape[0] = 2 * ROWS;
    ys.data = k == NET_CONV ? (void *)lab : (void *)y;
    float loss = 0.0f;
    st = pmap_update(a.p, &xs, &ys, &loss);
  } else {
    st = step(&a, k, 2, f == FAIL_NAN_DATA);
  }
  static const pmap_status want[] = {PMAP_ERR_NUMERIC, PMAP_ERR_NUMERIC, PMAP_ERR_DEVICE,
                                     PMAP_ERR_TIMEOUT, PMAP_ERR_OUT_OF_MEMORY};
  CHECK(st == want[f], "%s: status %s, want %s (%s)", what, pmap_status_string(st),
        pmap_status_string(want[f]), pmap_last_error());
  CHECK(pmap_params_step(a.p) == 2, "%s: step %lld after the failure", what,
        (long long)pmap_params_step(a.p));
  after = snapshot(&a);
  if (before && after) {
    char w2[300];
    snprintf(w2, sizeof w2, "%s: every replica after the failed step", what);
    test_same_bits(w2, after, before, (size_t)n * a.P);
  }
  predict(&a, k, pred_after);
  test_same_bits(what, pred_after, pred_before, ROWS * (k == NET_CONV ? 3 : 1));
  for (int s = 2; s < 4; s++) {
    CHECK_OK(step(&a, k, (uint64_t)s, 0));
    CHECK_OK(step(&b, k, (uint64_t)s, 0));
  }
  fin = snapshot(&a);
  ref = snapshot(&b);
  if (fin && ref) {
    char w2[300];
    snprintf(w2, sizeof w2, "%s: retried run against one that never failed", what);
    test_same_bits(w2, fin, ref, (size_t)n * a.P);
  }
  CHECK_OK(pmap_params_verify(a.p));
  free(before);
  free(after);
  free(fin);
  free(ref);
  close_run(&a);
  close_run(&b);
}

/* in (1) -> batch norm -> dense (1): parameters gamma 0, beta 1, running mean 2, running var 3,
 * W 4, b 5. x = {1, 3} (mean 2, biased variance 1), one step: running mean 0.1 * 2, running var
 * 0.9 + 0.1 * 1, whatever the optimizer's weight decay or clipping. */
static void check_decay(const pmap_optimizer *opt, int n, int shard, const char *what) {
  pmap_ctx *ctx = NULL;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = n,
                     .shard_optimizer = shard ? PMAP_SHARD_ON : PMAP_SHARD_OFF};
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  pmap_model *m = NULL;
  int64_t in[1] = {1};
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_batchnorm(m, 1));
  CHECK_OK(pmap_model_add_dense(m, 1));
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, opt, 1, &p));
  if (!p) return;
  float x[2] = {1.0f, 3.0f}, y[2] = {0.5f, -0.5f}, w[6], loss = 0.0f;
  int64_t shape[2] = {2, 1};
  pmap_array xs = pmap_array_f32(x, 2, shape), ys = pmap_array_f32(y, 2, shape);
  CHECK_OK(pmap_update(p, &xs, &ys, &loss));
  for (int d = 0; d < n; d++) {
    CHECK_OK(pmap_params_read(p, d, w, 6));
    /* The step takes 1 - 0.9f = 0.1f + 2.2e-8 and rounds twice; the statistics' sums of 2 exact
     * values are exact: within 1e-7 of these. */
    float mean = 0.9f * 0.0f + 0.1f * 2.0f, var = 0.9f * 1.0f + 0.1f * 1.0f;
    CHECK(fabsf(w[2] - mean) <= 1e-7f && fabsf(w[3] - var) <= 1e-7f,
          "%s, device %d: running mean %.9g, var %.9g; want %.9g, %.9g", what, d, (double)w[2],
          (double)w[3], (double)mean, (double)var);
    /* gamma and beta are trained: weight decay reaches them (gamma starts at 1). */
    if (opt->weight_decay > 0.0f)
      CHECK(w[0] != 1.0f, "%s: gamma %.9g not decayed", what, (double)w[0]);
  }
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* A batch whose moments overflow float: one value of 1e30 (OVER_ONE), or per-device shards
 * that each fit while the global batch does not (OVER_GLOBAL: +2e19 on rows 0..3, -2e19 on rows
 * 4..7, so 2 or 4 devices each see a variance of 0 and the global one is 4e38); OVER_NONE: a
 * large value whose moments still fit (1e19). In (2) -> batch norm -> dense (1): gamma 0..1, beta
 * 2..3, running mean 4..5, running var 6..7; feature 1 carries the large values. */
typedef enum overflow { OVER_ONE, OVER_GLOBAL, OVER_NONE } overflow;
static const char *const overflow_name[] = {"one value 1e30", "shards fit, the batch does not",
                                            "1e19, fits"};

/* One step on n devices; *loss, the status and the parameters after it (w, 11 floats); the
 * largest |x| of each feature into most (2). */
static pmap_status overflow_step(overflow o, int cross, int n, int guard, float *loss, float *w0,
                                 float *w, double *most) {
  enum { B = 8 };
  float x[B * 2], y[B];
  for (int i = 0; i < B; i++) {
    x[2 * i] = 0.1f * (float)i, x[2 * i + 1] = 0.2f * (float)i - 0.5f, y[i] = 0.05f * (float)i;
    if (o == OVER_GLOBAL) x[2 * i + 1] = i < B / 2 ? 2e19f : -2e19f;
  }
  if (o != OVER_GLOBAL) x[2 * (B - 1) + 1] = o == OVER_ONE ? 1e30f : 1e19f;
  most[0] = most[1] = 0.0;
  for (int i = 0; i < 2 * B; i++) most[i % 2] = fmax(most[i % 2], fabs((double)x[i]));
  int64_t in[1] = {2}, xs_[2] = {B, 2}, ys_[2] = {B, 1};
  pmap_array xs = pmap_array_f32(x, 2, xs_), ys = pmap_array_f32(y, 2, ys_);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU,
                     .num_devices = n,
                     .numeric_guard = guard ? PMAP_GUARD_ON : PMAP_GUARD_OFF};
  pmap_ctx *ctx = NULL;
  pmap_model *m = NULL;
  pmap_params *p = NULL;
  pmap_optimizer sgd = pmap_sgd(0.01f, 0.0f);
  pmap_status st = PMAP_ERR_INTERNAL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_batchnorm(m, cross));
  CHECK_OK(pmap_model_add_dense(m, 1));
  if (ctx && m) CHECK_OK(pmap_params_create(ctx, m, &sgd, 0, &p));
  if (p && pmap_params_count(p) == 11) {
    CHECK_OK(pmap_params_read(p, 0, w0, 11));
    st = pmap_update(p, &xs, &ys, loss);
    CHECK_OK(pmap_params_read(p, n - 1, w, 11));
  }
  pmap_params_destroy(p);
  pmap_model_destroy(m);
  CHECK_OK(pmap_ctx_destroy(ctx));
  return st;
}

/* N devices reach the verdict of 1 device. With the guard: a batch whose moments overflow is
 * skipped (PMAP_ERR_NUMERIC, nothing changed) on 1, 2 and 4 devices alike; without it the step
 * is taken with a loss that is not finite and the overflowing feature's running statistics
 * stay as they were, while the other feature's move alike on every device count. A batch
 * whose moments fit is taken everywhere. */
/* How far the running statistics of 1 and n devices can part: each run sums x - shift (every term
 * below 2 M, M the feature's largest |x|) in double per device, rounds each device's sums to
 * float and adds them (2 n roundings of values below the sum of the terms' sizes), rounds the
 * mean's quotient and shift (and the terms x - shift): the mean errs by at most (4 n + 5) u M.
 * The variance's sums of squares (terms below 4 M^2, all positive) err by 2 n u of their sum,
 * its quotient and subtraction by u each, the mean's square by 2 |m| (4 n + 5) u M with
 * |m| <= 2 M: (24 n + 32) u M^2. The running statistic takes a tenth of the difference of the
 * two runs, plus its own roundings (momentum times the old value, the sum: 2 u of it in each
 * run). */
static double running_bound(int n, int is_var, double most, float w1) {
  double m = (4.0 * n + 5.0) + (4.0 * 1 + 5.0), v = (24.0 * n + 32.0) + (24.0 * 1 + 32.0);
  double sum = is_var ? v * most * most : m * most;
  return 0.1 * BOUND_U32 * sum * (1.0 + BOUND_U32) + 4.0 * BOUND_U32 * fabsf(w1);
}

static double running_worst[2] = {0, 1}; /* the statistic nearest its bound, and that bound */

static void check_overflow(overflow o, int cross, int guard) {
  float loss1 = 0.0f, w1[11] = {0};
  double most[2];
  for (int n = 1; n <= 4; n *= 2) {
    char what[200];
    snprintf(what, sizeof what, "batch norm%s, %s, %d devices, guard %s",
             cross ? " across devices" : " per device", overflow_name[o], n, guard ? "on" : "off");
    float loss = 1234.0f, w0[11] = {0}, w[11] = {0};
    pmap_status st = overflow_step(o, cross, n, guard, &loss, w0, w, most);
    if (o == OVER_NONE) {
      CHECK(st == PMAP_SUCCESS && isfinite(loss), "%s: status %s, loss %g (%s)", what,
            pmap_status_string(st), (double)loss, pmap_last_error());
      CHECK(w[5] != w0[5] && isfinite(w[7]), "%s: running mean %g var %g", what, (double)w[5],
            (double)w[7]);
    } else if (guard) {
      CHECK(st == PMAP_ERR_NUMERIC, "%s: status %s, loss %g; want the step skipped", what,
            pmap_status_string(st), (double)loss);
      test_same_bits(what, w, w0, 11);
    } else {
      CHECK(st == PMAP_SUCCESS && !isfinite(loss),
            "%s: status %s, loss %g; want a non-finite "
            "loss",
            what, pmap_status_string(st), (double)loss);
      CHECK(w[5] == w0[5] && w[7] == w0[7], "%s: running mean %g, var %g moved from %g, %g", what,
            (double)w[5], (double)w[7], (double)w0[5], (double)w0[7]);
      CHECK(w[4] != w0[4] && w[6] != w0[6], "%s: feature 0's running statistics did not move",
            what);
    }
    if (n == 1) {
      loss1 = loss;
      memcpy(w1, w, sizeof w);
      continue;
    }
    /* The other device counts: the same running statistics as 1 device, up to the order of the
     * statistics' sums (running_bound); the ones that stayed, bitwise. */
    for (int j = 4; j < 8; j++) {
      double bound = running_bound(n, j >= 6, most[(j - 4) % 2], w1[j]);
      double e = w[j] == w1[j] ? 0.0 : fabs((double)w[j] - w1[j]);
      CHECK(e <= bound, "%s: running statistic %d is %.9g, on 1 device %.9g (bound %.3g)", what,
            j - 4, (double)w[j], (double)w1[j], bound);
      if (e / bound > running_worst[0] / running_worst[1])
        running_worst[0] = e, running_worst[1] = bound;
    }
    CHECK(isfinite(loss) == isfinite(loss1), "%s: loss %g, on 1 device %g", what, (double)loss,
          (double)loss1);
  }
}

int main(void) {
  pmap_optimizer sgd = pmap_sgd(0.05f, 0.9f), adamw = pmap_adamw(0.01f, 0.1f);
  sgd.weight_decay = 0.01f;
  for (int k = NET_DENSE; k <= NET_CONV; k++)
    for (int f = FAIL_NAN_DATA; f <= FAIL_ALLOC; f++) check_failed_step(k, f, 2, &sgd, 0, 1);
  /* Across the other settings: 3 devices, AdamW, sharded, micro-batches. */
  check_failed_step(NET_DENSE, FAIL_NAN_DATA, 3, &adamw, 0, 1);
  check_failed_step(NET_TWO_NORMS, FAIL_NAN_DATA, 2, &adamw, 1, 1);
  check_failed_step(NET_TWO_NORMS, FAIL_COLLECTIVE, 3, &sgd, 1, 1);
  check_failed_step(NET_CONV, FAIL_STALL, 2, &adamw, 1, 1);
  check_failed_step(NET_DENSE, FAIL_NAN_DATA, 2, &sgd, 0, 3);
  check_failed_step(NET_DENSE_LOCAL, FAIL_COLLECTIVE, 2, &adamw, 0, 2);
  check_failed_step(NET_CONV, FAIL_NAN_FAULT, 2, &sgd, 1, 2);

  pmap_optimizer sgd_wd = pmap_sgd(0.1f, 0.0f), mom_wd = pmap_sgd(0.1f, 0.9f);
  sgd_wd.weight_decay = 0.5f;
  mom_wd.weight_decay = 0.5f;
  mom_wd.nesterov = 1;
  pmap_optimizer adamw_wd = pmap_adamw(0.1f, 0.5f), clipped = pmap_adamw(0.1f, 0.5f);
  clipped.clip_norm = 1e-3f;
  for (int n = 1; n <= 2; n++)
    for (int shard = 0; shard <= 1; shard++) {
      check_decay(&sgd_wd, n, shard, "SGD, weight decay 0.5");
      check_decay(&mom_wd, n, shard, "Nesterov, weight decay 0.5");
      check_decay(&adamw_wd, n, shard, "AdamW, weight decay 0.5");
      check_decay(&clipped, n, shard, "AdamW, weight decay, clipping");
    }
  for (int cross = 0; cross <= 1; cross++) {
    for (int guard = 0; guard <= 1; guard++) {
      check_overflow(OVER_ONE, cross, guard);
      check_overflow(OVER_GLOBAL, cross, guard);
    }
    check_overflow(OVER_NONE, cross, 1);
  }
  printf("batch norm's running statistics, 2 and 4 devices vs 1: %.2e (its bound %.2e)\n",
         running_worst[0], running_worst[1]);
  return test_exit("test_state");
}
