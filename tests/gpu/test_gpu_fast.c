/* test_gpu_fast.c: the CUDA fast steps against the plain step, on fresh random data:
 * - graphs: the captured and replayed step gives the plain step's losses and parameters
 *   (bitwise expected but where clipping acts on several devices, whose norm is summed another
 *   way) over steps with a learning-rate schedule, dropout, clipping, a numeric-guard skip, and
 *   batch-size changes (re-capture), and the graphs were really used;
 * - overlap: gradients all-reduced in several buckets agree with the plain step, with graphs and
 *   without;
 * - fallback: a capture forced to fail (PMAP_CUDA_GRAPH_FAIL) leaves every step working, with the
 *   plain step's results.
 * Every variant differs from the plain step at most in the order of float sums (a norm, an
 * all-reduce): bound_order32 of its model over the steps (tests/bounds.h; the counts below).
 * N: PMAP_GPU_TEST_DEVICES, else every GPU (2 on one GPU where NCCL allows it);
 * PMAP_GPU_TEST_QUICK=1 leaves out the fallback. Without a GPU it checks only that the GPU
 * check's bucket size splits mlp-1024 into 4 buckets, then skips (77). */
#include "gpu_util.h"
#include "models/params.h"
#include "models/step_fast.h"
#include "pmap_examples.h"
#include "runtime/cuda/cuda_backend.h"

#define STEPS 16
#define IN 48
#define CLASSES 10

typedef struct run {
  float loss[STEPS];
  pmap_status st[STEPS];
  float *w; /* (P) after the last step */
  size_t P;
  int live; /* graphs were in use at the end */
} run;

/* The step's global batch: per device 8 rows, then 4 (a new size: capture again), then 8 again
 * (captured anew after its warm-up); one step of NaN inputs the guard must skip. */
static int64_t batch_of(int s, int n) { return (s >= 7 && s < 12 ? 4 : 8) * (int64_t)n; }
static int nan_step(int s) { return s == 5; }

static pmap_model *small_model(void) {
  int64_t shape[1] = {IN};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, shape, &m));
  CHECK_OK(pmap_model_add_dense(m, 64));
  CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_dropout(m, 0.2f));
  CHECK_OK(pmap_model_add_dense(m, 32));
  CHECK_OK(pmap_model_add_gelu(m));
  CHECK_OK(pmap_model_add_dense(m, CLASSES));
  CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT));
  return m;
}

/* Several buckets of 1 MiB: about 0.7, 2 and 0.5 MiB of gradients in three dense layers. */
static pmap_model *wide_model(void) {
  int64_t shape[1] = {IN};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, shape, &m));
  CHECK_OK(pmap_model_add_dense(m, 1024));
  CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_dense(m, 512));
  CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_dense(m, 256));
  CHECK_OK(pmap_model_add_tanh(m));
  CHECK_OK(pmap_model_add_dense(m, CLASSES));
  CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT));
  return m;
}

/* The models' paths for bound_order32 (as tests/bounds.h counts its examples): each dense layer
 * of a inputs and b outputs adds a + b to k_path and 1 to k_batch; softmax cross-entropy's
 * condition 4. Clipping scales every gradient by one factor, from a norm summed in double: it
 * adds a rounding or two of each step, which the margin covers. */
static const bound_model small_bound = {
    "small", (IN + 64) + (64 + 32) + (32 + CLASSES), 3, 0, 0, 0, 4, 1};
static const bound_model wide_bound = {
    "wide", (IN + 1024) + (1024 + 512) + (512 + 256) + (256 + CLASSES), 4, 0, 0, 0, 4, 1};

/* Adam with warm-up and cosine decay (the learning rate changes every step) and clipping that
 * bites on some steps. */
static pmap_optimizer schedule_opt(void) {
  pmap_optimizer o = pmap_adam(3e-3f);
  o.schedule = PMAP_SCHEDULE_WARMUP_COSINE;
  o.warmup_steps = 3;
  o.decay_steps = 10;
  o.final_lr = 1e-4f;
  o.clip_norm = 0.5f;
  return o;
}

static pmap_status fast_ctx(int n, int gpus, int graphs, int overlap, pmap_ctx **out) {
  int ids[PMAP_MAX_DEVICES];
  for (int i = 0; i < n; i++) ids[i] = i % gpus;
  pmap_config cfg = {.backend = PMAP_BACKEND_CUDA,
                     .num_devices = n,
                     .device_ids = ids,
                     .cuda_graphs = graphs ? 1 : -1,
                     .cuda_overlap = overlap ? 1 : -1,
                     .cuda_bucket_mb = 1};
  pmap_status st = pmap_ctx_create(&cfg, out);
  CHECK(st == PMAP_SUCCESS, "CUDA context of %d devices (graphs %d, overlap %d): %s: %s", n, graphs,
        overlap, pmap_status_string(st), pmap_last_error());
  return st;
}

/* STEPS steps of m from seed 3 on fresh data of seed 100 + s at step s; the loss is asked for on
 * two steps of three. Every replica must hold the same bits at the end. */
static void train(pmap_ctx *ctx, const pmap_model *m, run *out) {
  pmap_optimizer opt = schedule_opt();
  pmap_params *p = NULL;
  int n = pmap_ctx_num_devices(ctx);
  CHECK_OK(pmap_params_create(ctx, m, &opt, 3, &p));
  if (!p) return;
  out->P = pmap_params_count(p);
  float *x = malloc((size_t)(8 * n) * IN * sizeof *x);
  int32_t *y = malloc((size_t)(8 * n) * sizeof *y);
  for (int s = 0; s < STEPS && x && y; s++) {
    int64_t b = batch_of(s, n), xs_shape[2] = {b, IN};
    uint64_t seed = 100 + (uint64_t)s;
    test_fill(x, (size_t)b * IN, &seed, -2.0f, 2.0f);
    for (int64_t i = 0; i < b; i++) y[i] = (int32_t)(test_rand_u64(&seed) % CLASSES);
    if (nan_step(s)) x[IN + 3] = NAN;
    pmap_array xs = pmap_array_f32(x, 2, xs_shape);
    pmap_array ys = {.data = y, .dtype = PMAP_I32, .rank = 1, .shape = {b}};
    out->loss[s] = NAN;
    out->st[s] = pmap_update(p, &xs, &ys, s % 3 == 2 ? NULL : &out->loss[s]);
    if (s % 3 == 2) out->loss[s] = 0.0f;
  }
  out->w = calloc(out->P, sizeof *out->w);
  float *other = calloc(out->P, sizeof *other);
  if (out->w) CHECK_OK(pmap_params_read(p, 0, out->w, out->P));
  for (int d = 1; d < n && other; d++) {
    CHECK_OK(pmap_params_read(p, d, other, out->P));
    test_same_bits("replica d vs 0", other, out->w, out->P);
  }
  CHECK(pmap_params_step(p) == STEPS - 1, "%lld steps taken, want %d (one skipped)",
        (long long)pmap_params_step(p), STEPS - 1);
  out->live = step_fast_graphs_live(p);
  free(other);
  free(x);
  free(y);
  pmap_params_destroy(p);
}

/* The variant against the plain run: the same statuses, losses and parameters within
 * bound_order32 of model m over the steps, on the largest batch (8 rows a device). */
static void compare(const char *what, const run *v, const run *plain, const bound_model *m, int n) {
  double tol = bound_order32(m, 8.0 * n, STEPS);
  char name[160];
  for (int s = 0; s < STEPS; s++) {
    pmap_status want = nan_step(s) ? PMAP_ERR_NUMERIC : PMAP_SUCCESS;
    CHECK(v->st[s] == want && plain->st[s] == want, "%s: step %d returned %s (plain %s), want %s",
          what, s, pmap_status_string(v->st[s]), pmap_status_string(plain->st[s]),
          pmap_status_string(want));
  }
  float lv[STEPS], lp[STEPS];
  int k = 0;
  for (int s = 0; s < STEPS; s++)
    if (s % 3 != 2 && !nan_step(s)) {
      lv[k] = v->loss[s];
      lp[k++] = plain->loss[s];
    }
  snprintf(name, sizeof name, "%s: losses", what);
  gpu_within(name, lv, lp, (size_t)k, tol);
  if (!v->w || !plain->w || v->P != plain->P) {
    CHECK(0, "%s: no parameters to compare", what);
    return;
  }
  snprintf(name, sizeof name, "%s: parameters after %d steps", what, STEPS);
  gpu_within(name, v->w, plain->w, v->P, tol);
  double worst = 0.0;
  for (size_t i = 0; i < v->P; i++) {
    double d = fabs((double)v->w[i] - (double)plain->w[i]);
    if (d > worst) worst = d;
  }
  printf("%s: max |w - w_plain| %.3g%s\n", what, worst, worst == 0.0 ? " (bitwise equal)" : "");
}

static void run_free(run *r) { free(r->w); }

static void test_variants(int n, int gpus) {
  pmap_model *small = small_model(), *wide = wide_model();
  if (test_failures) goto out;
  /* Graphs against plain on the small model with dropout. */
  run plain = {0}, graph = {0};
  pmap_ctx *ctx = NULL;
  if (fast_ctx(n, gpus, 0, 0, &ctx) == PMAP_SUCCESS) train(ctx, small, &plain);
  pmap_ctx_destroy(ctx);
  ctx = NULL;
  if (fast_ctx(n, gpus, 1, 0, &ctx) == PMAP_SUCCESS) train(ctx, small, &graph);
  pmap_ctx_destroy(ctx);
  ctx = NULL;
  compare("graphs vs plain", &graph, &plain, &small_bound, n);
  CHECK(graph.live, "graphs vs plain: the last steps did not replay a captured graph");
  CHECK(!plain.live, "the plain run replayed graphs");
  /* The fallback: device n-1's graph fails to instantiate; every step still runs, plainly.
   * Not in the quick form (PMAP_GPU_TEST_QUICK=1): it is the same logic on any device count. */
  run fallback = {0};
  if (!gpu_test_quick()) {
    setenv("PMAP_CUDA_GRAPH_FAIL", n > 1 ? "1" : "0", 1);
    if (fast_ctx(n, gpus, 1, 0, &ctx) == PMAP_SUCCESS) train(ctx, small, &fallback);
    pmap_ctx_destroy(ctx);
    ctx = NULL;
    unsetenv("PMAP_CUDA_GRAPH_FAIL");
    compare("failed capture vs plain", &fallback, &plain, &small_bound, n);
    CHECK(!fallback.live, "a failed capture left graphs in use");
  }
  run_free(&plain);
  run_free(&graph);
  run_free(&fallback);
  /* Buckets against plain on the wide model (several buckets of 1 MiB), with graphs and
   * without. */
  run wplain = {0}, overlap = {0}, both = {0};
  if (fast_ctx(n, gpus, 0, 0, &ctx) == PMAP_SUCCESS) train(ctx, wide, &wplain);
  pmap_ctx_destroy(ctx);
  ctx = NULL;
  if (fast_ctx(n, gpus, 0, 1, &ctx) == PMAP_SUCCESS) train(ctx, wide, &overlap);
  pmap_ctx_destroy(ctx);
  ctx = NULL;
  if (fast_ctx(n, gpus, 1, 1, &ctx) == PMAP_SUCCESS) train(ctx, wide, &both);
  pmap_ctx_destroy(ctx);
  compare("overlap vs plain", &overlap, &wplain, &wide_bound, n);
  compare("overlap and graphs vs plain", &both, &wplain, &wide_bound, n);
  CHECK(both.live, "overlap and graphs: the last steps did not replay a captured graph");
  run_free(&wplain);
  run_free(&overlap);
  run_free(&both);
out:
  pmap_model_destroy(small);
  pmap_model_destroy(wide);
}

/* The buckets of a step as the backward hook issues them (models/step_fast.c): after layer i,
 * the gradients from lo[i] up go out once they make bucket_bytes, and after layer 0 whatever
 * is left. */
static int bucket_count(const char *model, size_t bucket_bytes) {
  pmap_model *m = NULL;
  CHECK_OK(pmap_example_model(model, &m));
  if (!m) return -1;
  size_t *lo = calloc((size_t)m->n_layers, sizeof *lo), hi = m->n_params;
  int count = 0;
  step_fast_bucket_starts(m, lo);
  for (int i = m->n_layers - 1; i >= 0 && lo; i--) {
    if (lo[i] >= hi || (i > 0 && (hi - lo[i]) * sizeof(float) < bucket_bytes)) continue;
    count++;
    hi = lo[i];
  }
  free(lo);
  pmap_model_destroy(m);
  return count;
}

/* bench/gpu-check.sh overlaps mlp-1024's gradients in PMAP_CUDA_BUCKET_MB=0.03125: one bucket
 * per dense layer, four, where the default 25 MiB makes one. */
static void test_check_buckets(void) {
  size_t small = 0, dflt = 0;
  CHECK_OK(cuda_bucket_bytes_parse("0.03125", &small));
  CHECK_OK(cuda_bucket_bytes_parse(NULL, &dflt));
  int n_small = bucket_count("mlp-1024", small), n_dflt = bucket_count("mlp-1024", dflt);
  CHECK(n_small == 4, "mlp-1024 in buckets of %zu bytes: %d buckets, want 4", small, n_small);
  CHECK(n_dflt == 1, "mlp-1024 in buckets of %zu bytes: %d buckets, want 1", dflt, n_dflt);
}

int main(void) {
  test_check_buckets();
  int gpus = gpu_count();
  if (gpus == 0) return test_failures ? test_exit("gpu_fast") : GPU_SKIP;
  if (gpus < 0) return 1;
  int n = gpu_test_devices(gpus >= 2 ? gpus : 2);
  if (n < 0) return 1;
  pmap_ctx *probe = NULL;
  if (n > gpus && gpu_ctx(n, gpus, 0.0, &probe) != PMAP_SUCCESS) n = 1;
  pmap_ctx_destroy(probe);
  if (test_failures) return test_exit("gpu_fast");
  test_variants(n, gpus);
  return test_exit("gpu_fast");
}
