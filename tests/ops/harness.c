/* harness.c: the machinery of the op harness (harness.h): buffers on a backend's device, one run
 * of an op with the write contract, repeatability and the CPU oracle checked, and the run of
 * every case on one backend through the public device API (a context of 1 device, or of several
 * each running every case at once; pmap_run) and the op backend's queue; the comparisons are
 * check.c's. The table of cases is made from
 * ops/op_list.h, so an op without a case (opcase_<op>) does not link. */
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

#include "../gpu/gpu_util.h"
#include "harness.h"
#include "ops/op_math.h"

static const struct hx_case {
  const char *name;
  void (*run)(hx *h);
} cases[] = {
#define PMAP_OP(name, args) {#name, opcase_##name},
#include "ops/op_list.h"
#undef PMAP_OP
};
#define NCASES (sizeof cases / sizeof cases[0])

/* A failing case prints at most this many failures (all are counted). */
#define HX_PRINT_MAX 12
/* Floats of guard before and after every buffer on the device (256 bytes: the alignment of the
 * buffer itself stays that of the allocation); a write outside the buffer changes them. */
#define HX_GUARD 64

static void *xalloc(size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p) {
    fprintf(stderr, "test_ops: out of memory for %zu bytes\n", bytes);
    exit(2);
  }
  return p;
}

/* ---- messages and counts ---- */

/* Failures of the case running on this thread (each device runs its cases on its own), for
 * HX_PRINT_MAX. */
static _Thread_local int case_failures;

static void vfail(hx *h, const char *fmt, va_list ap) {
  h->failures++;
  if (++case_failures > HX_PRINT_MAX) return;
  fprintf(stderr, "FAIL [%s] %s%s%s%s: ", h->label, h->op, h->trial[0] ? " (" : "", h->trial,
          h->trial[0] ? ")" : "");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
}

static void fail(hx *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(hx *h, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vfail(h, fmt, ap);
  va_end(ap);
}

void hx_check(hx *h, int ok, const char *fmt, ...) {
  h->checks++;
  if (ok) return;
  va_list ap;
  va_start(ap, fmt);
  vfail(h, fmt, ap);
  va_end(ap);
}

void hx_trial(hx *h, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(h->trial, sizeof h->trial, fmt, ap);
  va_end(ap);
}

/* ---- random values ---- */

static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t hx_u64(hx *h) { return mix64(h->rng++ * 0x2545f4914f6cdd1dull); }

int64_t hx_int(hx *h, int64_t lo, int64_t hi) {
  return lo + (int64_t)(hx_u64(h) % (uint64_t)(hi - lo + 1));
}

float hx_uniform(hx *h, float lo, float hi) {
  return lo + (hi - lo) * (float)((double)(hx_u64(h) >> 40) / 16777216.0);
}

int hx_rounds(const hx *h, int full) { return h->quick ? (full + 2) / 3 : full; }

/* ---- tolerances ---- */

/* A float sum of k terms of random sign errs, in any order, by about u sqrt(k / 2) of its root
 * mean square (each addition errs by at most u of a partial sum, with a random sign: the errors
 * add as a random walk), and each product rounded apart (no fused multiply-add) by u of itself,
 * independently: u sqrt(k / 2 + 1) in all, at most u sqrt(k) from k = 2 on (one term: one
 * rounding, u). bound_sum(k) = lambda u sqrt(k) (tests/bounds.h). */
double hx_tol_sum(double k) { return bound_sum(k); }

/* TF32 keeps 10 bits of an fp32 operand's 23: each operand errs by up to 2^-10 of itself where
 * the conversion truncates (2^-11 where it rounds), two per product; the products' errors have
 * their random signs, so they add as a random walk to lambda sqrt(2) 2^-10 of the sum's root
 * mean square, whatever k. Then the fp32 sum's own bound_sum(k). */
double hx_tol_gemm(const hx *h, double k) {
  return bound_sum(k) + (h->tf32 ? BOUND_LAMBDA * sqrt(2.0) * 0x1p-10 : 0.0);
}

/* The products of bfloat16 values are exact in float (8 + 8 significant bits), so only the
 * float sum errs: bound_sum(k) for the CPU's (AVX512_BF16's and AMX's dot products round each
 * addition to nearest, as the portable path's float GEMM does), gpu_bound_sum16(k) for the
 * tensor cores', which truncate (tests/gpu/gpu_util.h says how much). */
double hx_tol_gemm16(const hx *h, double k) {
  return h->tensor16 ? gpu_bound_sum16(k) : bound_sum(k);
}

double hx_tol_vs_cpu(double tol, double k) { return tol + bound_sum(k); }

void hx_fill(hx *h, float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = hx_uniform(h, lo, hi);
}

void hx_fill_away(hx *h, float *x, size_t n, float lo, float hi) {
  for (size_t i = 0; i < n; i++) {
    float v = hx_uniform(h, lo, hi);
    x[i] = (hx_u64(h) & 1) ? v : -v;
  }
}

int hx_vec_trials(hx *h) { return 4 + (h->large ? 1 : 0) + hx_rounds(h, 3); }

size_t hx_vec_size(hx *h, int i) {
  static const size_t fixed[] = {0, 1, 7, 1000};
  if (i < 4) return fixed[i];
  if (i == 4 && h->large) return 100003;
  return (size_t)hx_int(h, 2, 300) | 1;
}

/* ---- buffers ---- */

typedef struct scratch {
  struct scratch *next;
  double data[]; /* aligned for doubles and floats */
} scratch;

static void *host_array(hx *h, size_t bytes) {
  scratch *s = xalloc(sizeof *s + bytes);
  s->next = h->scratch;
  h->scratch = s;
  return s->data;
}

double *hx_doubles(hx *h, size_t n) { return host_array(h, n * sizeof(double)); }
float *hx_floats(hx *h, size_t n) { return host_array(h, n * sizeof(float)); }

double *hx_to_double(hx *h, const float *x, size_t n) {
  double *d = hx_doubles(h, n);
  for (size_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

hx_buf *hx_new(hx *h, hx_role role, size_t n, const char *name) {
  hx_buf *b = xalloc(sizeof *b);
  b->name = name;
  b->role = role;
  b->n = n;
  /* Element-wise ops take op_math.h's formulas on every backend: a few roundings apart where a
   * compiler fuses a multiply-add (17 u). Ops with float sums set their own. */
  b->tol_cpu = 1e-6;
  b->init = xalloc(n * sizeof(float));
  b->got = xalloc(n * sizeof(float));
  b->again = xalloc(n * sizeof(float));
  b->cpu = xalloc(n * sizeof(float));
  /* A quiet NaN with a payload of the buffer's own: a NaN read from another buffer's guard
   * and written here still shows. */
  static _Thread_local uint32_t made;
  b->guard = 0x7fc00001u | ((++made * 2654435761u) & 0x3ffffeu);
  float guard[HX_GUARD];
  for (int i = 0; i < HX_GUARD; i++) memcpy(&guard[i], &b->guard, sizeof guard[i]);
  pmap_status st = pmap_device_alloc(h->dev, n + 2 * HX_GUARD, &b->base);
  if (st == PMAP_SUCCESS) st = pmap_device_upload(h->dev, b->base, guard, HX_GUARD);
  b->dev = b->base ? b->base + HX_GUARD : NULL;
  if (st == PMAP_SUCCESS) st = pmap_device_upload(h->dev, b->dev + n, guard, HX_GUARD);
  if (st != PMAP_SUCCESS) {
    fprintf(stderr, "test_ops: [%s] %zu floats of device memory: %s\n", h->label, n,
            pmap_last_error());
    exit(2);
  }
  b->next = h->bufs;
  h->bufs = b;
  return b;
}

hx_buf *hx_in(hx *h, size_t n, float lo, float hi, const char *name) {
  hx_buf *b = hx_new(h, HX_IN, n, name);
  hx_fill(h, b->init, n, lo, hi);
  return b;
}

hx_buf *hx_in_away(hx *h, size_t n, float lo, float hi, const char *name) {
  hx_buf *b = hx_new(h, HX_IN, n, name);
  hx_fill_away(h, b->init, n, lo, hi);
  return b;
}

hx_buf *hx_out(hx *h, size_t n, const char *name) { return hx_new(h, HX_OUT, n, name); }

hx_buf *hx_inout(hx *h, size_t n, float lo, float hi, const char *name) {
  hx_buf *b = hx_new(h, HX_INOUT, n, name);
  hx_fill(h, b->init, n, lo, hi);
  return b;
}

hx_buf *hx_scratch(hx *h, size_t n, const char *name) { return hx_new(h, HX_SCRATCH, n, name); }

hx_buf *hx_labels(hx *h, size_t rows, int64_t k, const char *name) {
  hx_buf *b = hx_new(h, HX_IN, rows, name);
  b->is_int = 1;
  int32_t *l = (int32_t *)(void *)b->init;
  for (size_t r = 0; r < rows; r++) l[r] = (int32_t)hx_int(h, 0, k - 1);
  return b;
}

hx_buf *hx_new16(hx *h, hx_role role, size_t n, const char *name) {
  hx_buf *b = hx_new(h, role, (n + 1) / 2, name);
  b->n16 = n;
  b->tol_cpu = 0.0; /* bfloat16 results are rounded the same way everywhere */
  return b;
}

hx_buf *hx_in16(hx *h, size_t n, float lo, float hi, const char *name) {
  hx_buf *b = hx_new16(h, HX_IN, n, name);
  pmap_bf16 *v = HX_H16(b->init);
  for (size_t i = 0; i < n; i++) v[i] = pmap_bf16_round(hx_uniform(h, lo, hi));
  return b;
}

void hx_release(hx *h) {
  while (h->bufs) {
    hx_buf *b = h->bufs;
    h->bufs = b->next;
    pmap_device_free(h->dev, b->base);
    free(b->init), free(b->got), free(b->again), free(b->cpu), free(b);
  }
  while (h->scratch) {
    scratch *s = h->scratch;
    h->scratch = s->next;
    free(s);
  }
  h->trial[0] = 0;
}

/* ---- one run of an op ---- */

/* What an output starts as: NaN floats, or for bfloat16s NaN bfloat16s (a float NaN holds one
 * in its high half only). */
static float *nan_stage(hx *h, const hx_buf *x) {
  float *s = hx_floats(h, x->n);
  for (size_t i = 0; i < x->n; i++) s[i] = NAN;
  if (x->n16)
    for (size_t i = 0; i < 2 * x->n; i++) HX_H16(s)[i] = 0x7fc1u;
  return s;
}

/* The first element of an output left unwritten (still NaN), or its count. */
static size_t first_nan(const hx_buf *x) {
  size_t i = 0;
  if (x->n16) {
    const pmap_bf16 *v = HX_H16(x->got);
    while (i < x->n16 && (v[i] & 0x7fffu) <= 0x7f80u) i++;
    return i;
  }
  while (i < x->n && !isnan(x->got[i])) i++;
  return i;
}

static int copy_ok(hx *h, pmap_status st, const char *what, const hx_buf *b) {
  h->checks++;
  if (st == PMAP_SUCCESS) return 1;
  fail(h, "%s of %s (%zu elements): %s: %s", what, b->name, b->n, pmap_status_string(st),
       pmap_last_error());
  return 0;
}

/* Every buffer's guards still hold their bits: nothing was written outside a buffer. */
static int guards_kept(hx *h, hx_buf *const *bufs) {
  float g[HX_GUARD];
  for (hx_buf *const *b = bufs; *b; b++)
    for (int side = 0; side < 2; side++) {
      hx_buf *x = *b;
      const float *at = side ? x->dev + x->n : x->base;
      if (!copy_ok(h, pmap_device_download(h->dev, g, at, HX_GUARD), "download of a guard", x))
        return 0;
      int i = 0;
      while (i < HX_GUARD && memcmp(&g[i], &x->guard, sizeof g[i]) == 0) i++;
      HX_CHECK(h, i == HX_GUARD, "%s: written %s its %zu elements (%g at %d of the guard)", x->name,
               side ? "after" : "before", x->n, i < HX_GUARD ? (double)g[i] : 0.0, i);
    }
  return 1;
}

/* One call of fn on the backend from the buffers' starting values; results into got or again. */
static int run_once(hx *h, hx_call fn, void *arg, hx_buf *const *bufs, int pass) {
  for (hx_buf *const *b = bufs; *b; b++) {
    hx_buf *x = *b;
    const float *src = x->role == HX_IN || x->role == HX_INOUT ? x->init : nan_stage(h, x);
    if (!copy_ok(h, pmap_device_upload(h->dev, x->dev, src, x->n), "upload", x)) return 0;
    x->p = x->dev;
  }
  pmap_status st = fn(h->ops, h->q, arg);
  h->checks++;
  if (st != PMAP_SUCCESS) {
    fail(h, "the op failed: %s: %s", pmap_status_string(st), pmap_last_error());
    return 0;
  }
  for (hx_buf *const *b = bufs; *b; b++) {
    hx_buf *x = *b;
    float *dst = x->role == HX_IN ? x->again : pass ? x->again : x->got;
    if (x->role == HX_SCRATCH || (x->role == HX_IN && !pass)) continue;
    if (!copy_ok(h, pmap_device_download(h->dev, dst, x->dev, x->n), "download", x)) return 0;
  }
  return guards_kept(h, bufs);
}

void hx_run(hx *h, hx_call fn, void *arg, hx_buf *const *bufs) {
  if (!run_once(h, fn, arg, bufs, 0) || !run_once(h, fn, arg, bufs, 1)) return;
  char what[160];
  for (hx_buf *const *b = bufs; *b; b++) {
    hx_buf *x = *b;
    if (x->role == HX_SCRATCH) continue;
    if (x->role == HX_IN) {
      snprintf(what, sizeof what, "input %s changed by the op", x->name);
      h->checks++;
      if (memcmp(x->again, x->init, x->n * sizeof(float)) != 0) fail(h, "%s", what);
      continue;
    }
    snprintf(what, sizeof what, "%s: a second run gives other bits", x->name);
    if (x->n16)
      hx_same16(h, what, HX_H16(x->again), HX_H16(x->got), x->n16);
    else
      hx_same(h, what, x->again, x->got, x->n);
    if (x->role == HX_OUT && !x->keep_nan) {
      size_t i = first_nan(x), n = x->n16 ? x->n16 : x->n;
      HX_CHECK(h, i == n, "%s: element %zu of %zu not written (still NaN)", x->name, i, n);
    }
  }
  if (h->oracle) return;
  /* The CPU kernels on the same data: the oracle every backend answers to. */
  for (hx_buf *const *b = bufs; *b; b++) {
    hx_buf *x = *b;
    if (x->role == HX_IN || x->role == HX_INOUT)
      memcpy(x->cpu, x->init, x->n * sizeof(float));
    else
      memcpy(x->cpu, nan_stage(h, x), x->n * sizeof(float));
    x->p = x->cpu;
  }
  pmap_status st = fn(&pmap_cpu_ops, NULL, arg);
  HX_CHECK(h, st == PMAP_SUCCESS, "the CPU kernels failed: %s: %s", pmap_status_string(st),
           pmap_last_error());
  for (hx_buf *const *b = bufs; *b; b++) {
    hx_buf *x = *b;
    if (x->role != HX_OUT && x->role != HX_INOUT) continue;
    snprintf(what, sizeof what, "%s against the CPU kernels", x->name);
    if (x->n16) {
      hx_same16(h, what, HX_H16(x->got), HX_H16(x->cpu), x->n16);
    } else if (x->tol_cpu == 0.0) {
      hx_same(h, what, x->got, x->cpu, x->n);
    } else {
      double *want = xalloc(x->n * sizeof *want);
      for (size_t i = 0; i < x->n; i++) want[i] = x->cpu[i];
      hx_close_scale(h, what, x->got, want, x->n, x->tol_cpu, x->scale_cpu);
      free(want);
    }
  }
}

/* ---- the cases on one backend ---- */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int selected(const char *only, const char *name) {
  if (!only) return 1;
  size_t len = strlen(name);
  for (const char *p = only; *p;) {
    const char *end = strchr(p, ',');
    size_t l = end ? (size_t)(end - p) : strlen(p);
    if (l == len && strncmp(p, name, len) == 0) return 1;
    p += l + (end ? 1 : 0);
  }
  return 0;
}

int hx_only_valid(const char *only) {
  int ok = 1;
  for (const char *p = only; *p;) {
    const char *end = strchr(p, ',');
    size_t l = end ? (size_t)(end - p) : strlen(p);
    int found = 0;
    for (size_t i = 0; i < NCASES; i++)
      found |= strlen(cases[i].name) == l && strncmp(p, cases[i].name, l) == 0;
    if (!found) fprintf(stderr, "test_ops: no op \"%.*s\" in ops/op_list.h\n", (int)l, p), ok = 0;
    p += l + (end ? 1 : 0);
  }
  return ok;
}

static uint64_t case_seed(uint64_t seed, const char *name) {
  uint64_t f = 0xcbf29ce484222325ull; /* FNV-1a of the name: each case its own stream */
  for (const char *c = name; *c; c++) f = (f ^ (uint8_t)*c) * 0x100000001b3ull;
  return mix64(seed ^ f);
}

typedef struct job {
  hx *h; /* (devices) one per device */
  const hx_opts *o;
} job;

static pmap_status queue_alloc(void *owner, size_t bytes, void **out) {
  float *p = NULL;
  pmap_status st = pmap_device_alloc(owner, (bytes + sizeof(float) - 1) / sizeof(float), &p);
  *out = p;
  return st;
}
static void queue_free(void *owner, void *ptr) { pmap_device_free(owner, ptr); }

static void run_cases(hx *h, const hx_opts *o) {
  for (size_t i = 0; i < NCASES; i++) {
    if (!selected(o->only, cases[i].name)) continue;
    h->op = cases[i].name;
    h->rng = case_seed(o->seed, cases[i].name);
    h->trial[0] = 0;
    h->nworst = 0;
    case_failures = 0;
    int c0 = h->checks, f0 = h->failures;
    double t0 = now_s();
    cases[i].run(h);
    hx_release(h);
    if (o->verbose || h->failures > f0)
      printf("  [%s] %-20s %6d checks, %d failed, %.2f s\n", h->label, h->op, h->checks - c0,
             h->failures - f0, now_s() - t0);
    for (int w = 0; o->verbose && w < h->nworst; w++)
      printf("      %.3f of its tolerance: %s\n", h->worst[w].ratio, h->worst[w].what);
    if (h->failures > f0)
      printf("  rerun: test_ops --backend %s --op %s --seed %" PRIu64 "%s%s%.0d\n", h->backend,
             h->op, o->seed, o->quick ? " --quick" : "", h->devices > 1 ? " --devices " : "",
             h->devices > 1 ? h->devices : 0);
  }
}

/* Each device's job: the op backend's queue on the device, every case, and the queue back. */
static pmap_status job_run(pmap_device *dev, void *arg) {
  job *j = arg;
  int d = pmap_local_index(dev);
  hx *h = &j->h[d];
  const op_backend *ob = NULL;
  pmap_status st = ops_backend(h->backend, "test_ops", &ob);
  if (st != PMAP_SUCCESS) return st;
  int saved = ob->enter ? ob->enter() : 0;
  op_queue_init init = {.device = d,
                        .stream = pmap_device_stream(dev),
                        .blas = pmap_device_blas(dev),
                        .alloc = queue_alloc,
                        .free = queue_free,
                        .owner = dev};
  st = ob->queue_create(&init, &h->q);
  if (st == PMAP_SUCCESS) {
    h->dev = dev;
    h->ops = ob->ops;
    run_cases(h, j->o);
    float one = 0.0f, *probe = NULL; /* a download waits for every queued op */
    if (pmap_device_alloc(dev, 1, &probe) == PMAP_SUCCESS) {
      st = pmap_device_download(dev, &one, probe, 1);
      pmap_device_free(dev, probe);
    }
    ob->queue_destroy(h->q);
  }
  if (ob->leave) ob->leave(saved);
  return st;
}

/* A context of n devices for backend `name` into *ctx, the settings of its runs into *base;
 * 1 made, 0 failed (said why), -1 the backend cannot run here. */
static int backend_ctx(const char *name, const hx_opts *o, int n, hx *base, pmap_ctx **ctx) {
  if (strcmp(name, "cpu") == 0) {
    base->oracle = !o->as_device;
    base->large = o->as_device;
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
    pmap_status st = pmap_ctx_create(&cfg, ctx);
    if (st != PMAP_SUCCESS) {
      fprintf(stderr, "FAIL [cpu] a %d-device CPU context: %s: %s\n", n, pmap_status_string(st),
              pmap_last_error());
      return 0;
    }
    return 1;
  }
  if (strcmp(name, "cuda") == 0) {
    int gpus = gpu_count(); /* says why where there is none; PMAP_CUDA_TF32=0 unless set */
    if (gpus == 0) return -1;
    /* Several devices were asked for: a refusal to share a GPU fails, as any other. */
    int ids[PMAP_MAX_DEVICES];
    for (int i = 0; i < n; i++) ids[i] = gpus > 0 ? i % gpus : 0;
    pmap_config cfg = {.backend = PMAP_BACKEND_CUDA, .num_devices = n, .device_ids = ids};
    pmap_status st = gpus < 0 ? PMAP_ERR_DEVICE : pmap_ctx_create(&cfg, ctx);
    if (st != PMAP_SUCCESS) {
      if (gpus > 0)
        fprintf(stderr, "FAIL [cuda] a CUDA context of %d devices on %d GPU%s: %s: %s\n", n, gpus,
                gpus == 1 ? "" : "s", pmap_status_string(st), pmap_last_error());
      return 0;
    }
    const char *tf32 = getenv("PMAP_CUDA_TF32");
    base->large = 1;
    base->tf32 = tf32 && strcmp(tf32, "0") != 0;
    base->tensor16 = 1; /* cuBLAS's bf16 GEMMs: tensor cores with float accumulation */
    return 1;
  }
  fprintf(stderr, "test_ops: no backend \"%s\" (cpu, cuda)\n", name);
  return 0;
}

int hx_backend_run(const char *name, const hx_opts *o, int *checks, int *failures) {
  int n = o->devices > 0 ? o->devices : 1;
  hx base = {.backend = name, .devices = n, .quick = o->quick, .fd_samples = o->quick ? 32 : 96};
  pmap_ctx *ctx = NULL;
  int made = backend_ctx(name, o, n, &base, &ctx);
  if (made <= 0) {
    if (!made && failures) ++*failures;
    return made;
  }
  hx *hs = xalloc((size_t)n * sizeof *hs);
  for (int d = 0; d < n; d++) {
    hs[d] = base;
    if (n > 1)
      snprintf(hs[d].label, sizeof hs[d].label, "%s device %d", name, d);
    else
      snprintf(hs[d].label, sizeof hs[d].label, "%s", name);
  }
  double t0 = now_s();
  job j = {hs, o};
  pmap_status st = pmap_run(ctx, job_run, &j);
  if (st != PMAP_SUCCESS) {
    hs[0].failures++;
    fprintf(stderr, "FAIL [%s] the cases' job: %s: %s\n", name, pmap_status_string(st),
            pmap_last_error());
  }
  pmap_ctx_destroy(ctx);
  int ok = 1;
  for (int d = 0; d < n; d++) {
    hx *h = &hs[d];
    printf("%s: %d checks, %d failed, %.2f s; the largest error %.3f of its tolerance (%s)\n",
           h->label, h->checks, h->failures, now_s() - t0, h->worst_ratio, h->worst_at);
    if (checks) *checks += h->checks;
    if (failures) *failures += h->failures;
    ok &= h->failures == 0;
  }
  free(hs);
  return ok;
}
