/* gemm_choice.c: which CPU GEMM provider runs, chosen once per process at the first need (the
 * first CPU context, or the first library-sized GEMM of code that runs the CPU ops without one):
 * the one PMAP_GEMM names, the only one built, this machine's cached choice (gemm_cache.c), or
 * the fastest in a short measurement at the GEMMs of the example models' steps; and the op
 * cpu_gemm, which runs through it. One provider serves every shape: docs/cpu-gemm.md says why. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm.h"
#include "base/env.h"
#include "cpu_isa.h"
#include "base/error.h"

/* ------------------------------------------------------------------------------------------ */
/* The measurement                                                                            */

/* One GEMM shape of a step: c (m, n) = op(a) op(b) + beta c, run `repeat` times per timing and
 * counted `count` times in the step (the step's time takes the timing times count / repeat, so
 * that identical layers and per-example GEMMs are timed once or a few times, not all). */
typedef struct gemm_shape {
  int ta, tb;
  int64_t m, n, k;
  float beta;
  int repeat, count;
} gemm_shape;

/* The GEMMs of one training step (models/layers.c, ops/cpu/conv.c: forward, weight gradient,
 * input gradient but for the first layer) of each GEMM-bound example model, at its default
 * batch on 4 devices. The choice minimises their summed time: where the time goes in a step. */
static const gemm_shape dense_step[] = {
    /* mlp-1024, 128 rows per device: 3 hidden layers 1024 -> 1024, output 1024 -> 10 */
    {0, 0, 128, 1024, 1024, 0.0f, 1, 3}, /* y = x W */
    {1, 0, 1024, 1024, 128, 1.0f, 1, 3}, /* dW += x^T dy */
    {0, 1, 128, 1024, 1024, 0.0f, 1, 2}, /* dx = dy W^T */
    {0, 0, 128, 10, 1024, 0.0f, 4, 1},   {1, 0, 1024, 10, 128, 1.0f, 4, 1},
    {0, 1, 128, 1024, 10, 0.0f, 4, 1},
};
static const gemm_shape conv_step[] = {
    /* cifar-cnn, 16 examples per device, per example (im2col): y = W col, dW += dy col^T,
     * dcol = W^T dy; (3, 32, 32) -> 16 -> 32 stride 2 -> 32 stride 2 -> dense 10 */
    {0, 0, 16, 1024, 27, 0.0f, 4, 16}, {0, 1, 16, 27, 1024, 1.0f, 4, 16},
    {0, 0, 32, 256, 144, 0.0f, 4, 16}, {0, 1, 32, 144, 256, 1.0f, 4, 16},
    {1, 0, 144, 256, 32, 0.0f, 4, 16}, {0, 0, 32, 49, 288, 0.0f, 4, 16},
    {0, 1, 32, 288, 49, 1.0f, 4, 16},  {1, 0, 288, 49, 32, 0.0f, 4, 16},
    {0, 0, 16, 10, 1568, 0.0f, 4, 1},  {1, 0, 1568, 10, 16, 1.0f, 4, 1},
    {0, 1, 16, 1568, 10, 0.0f, 4, 1},
};
typedef struct gemm_step {
  const char *name;
  const gemm_shape *g;
  int n;
} gemm_step;
static const gemm_step steps[] = {
    {"mlp-1024", dense_step, (int)(sizeof dense_step / sizeof dense_step[0])},
    {"cifar-cnn", conv_step, (int)(sizeof conv_step / sizeof conv_step[0])},
};
#define NSTEPS ((int)(sizeof steps / sizeof steps[0]))
#define MAX_PROVIDERS 8

/* Rounds over every provider in turn, after one warm-up round (oneDNN's code generation,
 * OpenBLAS's buffers, first touches); fewer when MEASURE_BUDGET_S has passed. */
#define ROUNDS 3
#define MEASURE_BUDGET_S 0.4
/* A provider replaces a more preferred one only when its score is lower by this fraction: where
 * two tie, the choice stays the same from one measurement to the next. */
#define PICK_MARGIN 0.02
/* A provider slower than this many times the fastest at a step is dropped at once. */
#define DROP_FACTOR 3.0

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct operands {
  void *raw[3];
  float *a, *b, *c;
} operands;

static void operands_free(operands *o) {
  for (int i = 0; i < 3; i++) free(o->raw[i]);
}

/* Operands large enough for every shape, placed as cpu_alloc places device memory (16 bytes past
 * a cache line, see runtime/cpu/cpu_backend.c: oneDNN's speed depends on it), with values in
 * [-1, 1). */
static int operands_alloc(operands *o) {
  size_t need[3] = {0, 0, 0};
  for (int s = 0; s < NSTEPS; s++)
    for (int i = 0; i < steps[s].n; i++) {
      const gemm_shape *g = &steps[s].g[i];
      size_t mk = (size_t)(g->m * g->k), kn = (size_t)(g->k * g->n), mn = (size_t)(g->m * g->n);
      need[0] = mk > need[0] ? mk : need[0];
      need[1] = kn > need[1] ? kn : need[1];
      need[2] = mn > need[2] ? mn : need[2];
    }
  memset(o, 0, sizeof *o);
  float *p[3];
  uint32_t x = 12345;
  for (int i = 0; i < 3; i++) {
    size_t bytes = (need[i] * sizeof(float) + 16 + 63) / 64 * 64;
    o->raw[i] = aligned_alloc(64, bytes);
    if (!o->raw[i]) {
      operands_free(o);
      return -1;
    }
    p[i] = (float *)((char *)o->raw[i] + 16);
    for (size_t j = 0; j < need[i]; j++) {
      x = x * 1664525u + 1013904223u;
      p[i][j] = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
  }
  o->a = p[0], o->b = p[1], o->c = p[2];
  return 0;
}

/* The time of one step with provider p, in seconds (each shape's timing scaled to its count);
 * stops early, returning what it took so far, once past `bound`. Negative when a GEMM fails. */
static double time_step(const cpu_gemm_provider *p, const gemm_step *s, const operands *o,
                        double bound) {
  double t = 0.0;
  for (int i = 0; i < s->n && t <= bound; i++) {
    const gemm_shape *g = &s->g[i];
    double t0 = now_s();
    for (int r = 0; r < g->repeat; r++)
      if (cpu_gemm_with(p, g->ta, g->tb, g->m, g->n, g->k, 1.0f, o->a, g->ta ? g->m : g->k, o->b,
                        g->tb ? g->k : g->n, g->beta, o->c, g->n))
        return -1.0;
    t += (now_s() - t0) * g->count / g->repeat;
  }
  return t;
}

/* printf into buf (cap bytes) at *len, which it advances; what does not fit is cut. */
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...) PMAP_PRINTF(4, 5);
static void append(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
  if (*len + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
  va_end(ap);
  if (n > 0) *len = *len + (size_t)n < cap ? *len + (size_t)n : cap - 1;
}

/* The fastest of the n providers: the least summed time of the steps, each step's time the best
 * over the rounds; within PICK_MARGIN, the earlier (preferred) one. Writes the step times in
 * milliseconds, "name=mlp-1024/cifar-cnn ..." ("-" for a dropped provider), into times. NULL
 * when the operands do not fit in memory. A provider slower than DROP_FACTOR times the fastest
 * at a step in the warm-up round, or whose GEMM fails, is dropped. */
static const cpu_gemm_provider *measure(const cpu_gemm_provider *list, int n, char *times,
                                        size_t cap) {
  operands o;
  if (n > MAX_PROVIDERS || operands_alloc(&o)) return NULL;
  /* warm: the warm-up round's times, which only set the bound that drops a provider. */
  double best[MAX_PROVIDERS][NSTEPS], warm[MAX_PROVIDERS][NSTEPS];
  int dropped[MAX_PROVIDERS] = {0}, saved[MAX_PROVIDERS];
  for (int i = 0; i < n; i++) {
    for (int s = 0; s < NSTEPS; s++) best[i][s] = warm[i][s] = INFINITY;
    /* Single-threaded, as on a device thread. */
    saved[i] = list[i].threads_set ? list[i].threads_set(1) : 1;
  }
  double start = now_s();
  for (int round = 0; round <= ROUNDS; round++) {
    if (round > 1 && now_s() - start > MEASURE_BUDGET_S) break;
    /* Each round starts with another provider, so that none always follows the same one. */
    for (int j = 0; j < n; j++) {
      int i = (j + round) % n;
      for (int s = 0; s < NSTEPS && !dropped[i]; s++) {
        double fastest = INFINITY;
        for (int q = 0; q < n; q++) fastest = fmin(fastest, fmin(warm[q][s], best[q][s]));
        double bound = DROP_FACTOR * fastest;
        double t = time_step(&list[i], &steps[s], &o, bound);
        if (t < 0.0 || (round == 0 && t > bound))
          dropped[i] = 1;
        else if (t > bound)
          continue; /* a slow spell of the machine, cut short: not a time */
        else if (round == 0)
          warm[i][s] = t;
        else
          best[i][s] = fmin(best[i][s], t);
      }
    }
  }
  for (int i = 0; i < n; i++)
    if (list[i].threads_set) list[i].threads_set(saved[i]);
  operands_free(&o);

  int pick = -1;
  double pick_score = INFINITY;
  size_t len = 0;
  times[0] = '\0';
  for (int i = 0; i < n; i++) {
    double score = 0.0;
    for (int s = 0; s < NSTEPS; s++) score += best[i][s];
    if (!dropped[i] && score < pick_score * (1.0 - PICK_MARGIN)) pick = i, pick_score = score;
    append(times, cap, &len, "%s%s=%s", i ? " " : "", list[i].name, dropped[i] ? "-" : "");
    for (int s = 0; s < NSTEPS && !dropped[i]; s++)
      append(times, cap, &len, "%s%.3f", s ? "/" : "", 1e3 * best[i][s]);
  }
  return pick >= 0 ? &list[pick] : &list[0];
}

/* ------------------------------------------------------------------------------------------ */
/* The choice                                                                                 */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static const cpu_gemm_provider *_Atomic active;
static const char *_Atomic why = "";
static _Atomic int forced; /* cpu_gemm_force was called: the choice measures nothing */
/* An invalid PMAP_GEMM or PMAP_GEMM_CACHE: its status and message (without the caller). */
static pmap_status env_status;
static char env_msg[512];

/* The built providers, ", "-separated, for messages. */
static void built_names(char *out, size_t cap) {
  int n = 0;
  const cpu_gemm_provider *list = cpu_gemm_list(&n);
  size_t len = 0;
  out[0] = '\0';
  for (int i = 0; i < n && len < cap; i++)
    len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? ", " : "", list[i].name);
}

/* Reads PMAP_GEMM (*p: the provider it forces, NULL for auto) and PMAP_GEMM_CACHE. */
static pmap_status read_env(const cpu_gemm_provider **p, int *use_cache) {
  const char *name = pmap_env_get("PMAP_GEMM"), *cache = pmap_env_get("PMAP_GEMM_CACHE");
  char built[128];
  built_names(built, sizeof built);
  *p = NULL;
  *use_cache = !cache || !*cache || strcmp(cache, "1") == 0;
  if (cache && *cache && strcmp(cache, "0") != 0 && strcmp(cache, "1") != 0) {
    snprintf(env_msg, sizeof env_msg,
             "environment variable PMAP_GEMM_CACHE=\"%s\" is neither 0 (measure the CPU GEMMs "
             "in every process) nor 1 (keep the choice in the cache, the default)",
             cache);
    return PMAP_ERR_INVALID_ARGUMENT;
  }
  if (!name || !*name || strcmp(name, "auto") == 0) return PMAP_SUCCESS;
  *p = cpu_gemm_find(name);
  if (*p) return PMAP_SUCCESS;
  if (strcmp(name, "onednn") == 0 || strcmp(name, "cblas") == 0 || strcmp(name, "portable") == 0) {
    snprintf(env_msg, sizeof env_msg,
             "environment variable PMAP_GEMM=\"%s\" asks for a CPU GEMM this build does not "
             "contain (built: %s; or auto; meson setup -Dgemm=auto builds every one found)",
             name, built);
    return PMAP_ERR_UNAVAILABLE;
  }
  snprintf(env_msg, sizeof env_msg,
           "environment variable PMAP_GEMM=\"%s\" names no CPU GEMM (built: %s; or auto)", name,
           built);
  return PMAP_ERR_INVALID_ARGUMENT;
}

/* The measured or cached choice among several providers. */
static const cpu_gemm_provider *choose_among(const cpu_gemm_provider *list, int n, int use_cache,
                                             const char **reason) {
  /* The cap is part of the key: a choice measured on the CPU's own instructions is not the
   * choice under PMAP_CPU_ISA. The providers are those within it. */
  char key[128];
  size_t len = 0;
  key[0] = '\0';
  for (int i = 0; i < n; i++) append(key, sizeof key, &len, "%s%s", i ? "," : "", list[i].name);
  if (cpu_isa_active() != cpu_isa_machine())
    append(key, sizeof key, &len, " PMAP_CPU_ISA=%s", cpu_isa_name(cpu_isa_active()));
  gemm_cache *c = use_cache ? gemm_cache_open(key) : NULL;
  /* Only a provider of the key's list: a line naming another is as good as corrupt. */
  const char *cached = gemm_cache_lookup(c);
  const cpu_gemm_provider *p = NULL;
  for (int i = 0; cached && i < n; i++)
    if (strcmp(cached, list[i].name) == 0) p = cpu_gemm_find(list[i].name);
  if (p) {
    *reason = "cached";
  } else {
    char times[256] = "";
    p = measure(list, n, times, sizeof times);
    *reason = "measured";
    if (p)
      gemm_cache_store(c, p->name, times);
    else
      p = &list[0], *reason = "preferred (no memory to measure)";
  }
  gemm_cache_close(c);
  return p;
}

static void choose(void) {
  const cpu_gemm_provider *p = NULL;
  int use_cache = 1, n = 0;
  const cpu_gemm_provider *built = cpu_gemm_list(&n);
  cpu_gemm_provider list[MAX_PROVIDERS];
  int within = 0, above = 0;
  for (int i = 0; i < n && within < MAX_PROVIDERS; i++)
    if (built[i].isa && built[i].isa() > (int)cpu_isa_active())
      above++;
    else
      list[within++] = built[i];
  n = within;
  env_status = read_env(&p, &use_cache);
  if (env_status != PMAP_SUCCESS) {
    atomic_store(
        &why, strstr(env_msg, "PMAP_GEMM_CACHE") ? "invalid PMAP_GEMM_CACHE" : "invalid PMAP_GEMM");
    return;
  }
  if (p && p->isa && p->isa() > (int)cpu_isa_active()) {
    /* A library that picks its kernels itself, above the cap: the cap would not hold. */
    env_status = PMAP_ERR_INVALID_ARGUMENT;
    snprintf(env_msg, sizeof env_msg,
             "environment variable PMAP_GEMM=\"%s\" forces a GEMM whose kernels use %s "
             "instructions, above PMAP_CPU_ISA=\"%s\" (within it: %s%s%s)",
             p->name, cpu_isa_name((cpu_isa)p->isa()), cpu_isa_name(cpu_isa_active()),
             within ? list[0].name : "none", within > 1 ? ", " : "",
             within > 1 ? list[1].name : "");
    atomic_store(&why, "PMAP_GEMM above PMAP_CPU_ISA");
    return;
  }
  if (atomic_load(&forced)) return;
  const char *reason = "forced by PMAP_GEMM";
  if (!p && n == 1)
    p = cpu_gemm_find(list[0].name),
    reason = above ? "only one within PMAP_CPU_ISA" : "only one built";
  else if (!p)
    p = cpu_gemm_find(choose_among(list, n, use_cache, &reason)->name);
  atomic_store(&why, reason);
  atomic_store_explicit(&active, p, memory_order_release);
}

const cpu_gemm_provider *cpu_gemm_active(void) {
  const cpu_gemm_provider *p = atomic_load_explicit(&active, memory_order_acquire);
  if (p) return p;
  pthread_once(&once, choose);
  return atomic_load_explicit(&active, memory_order_acquire);
}

pmap_status cpu_gemm_ready(const char *call) {
  pthread_once(&once, choose);
  if (env_status != PMAP_SUCCESS) return PMAP_ERR(env_status, "%s: %s", call, env_msg);
  return PMAP_SUCCESS;
}

pmap_status cpu_gemm_force(const char *name) {
  const cpu_gemm_provider *p = cpu_gemm_find(name);
  if (!p) {
    char built[128];
    built_names(built, sizeof built);
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "cpu_gemm_force: no CPU GEMM \"%s\" (built: %s)",
                    name ? name : "(null)", built);
  }
  atomic_store(&forced, 1);
  pthread_once(&once, choose);
  atomic_store(&why, "forced");
  atomic_store_explicit(&active, p, memory_order_release);
  return PMAP_SUCCESS;
}

const char *pmap_gemm_provider(void) {
  const cpu_gemm_provider *p = cpu_gemm_active();
  return p ? p->name : "none";
}

const char *pmap_gemm_reason(void) {
  cpu_gemm_active();
  return atomic_load(&why);
}

pmap_status cpu_gemm(op_queue *q, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc) {
  (void)q;
  if (m <= 0 || n <= 0) return PMAP_SUCCESS;
  if (k <= 0 || m * n * k <= CPU_GEMM_SMALL_MACS) {
    cpu_gemm_portable(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return PMAP_SUCCESS;
  }
  const cpu_gemm_provider *p = cpu_gemm_active();
  if (!p) return cpu_gemm_ready("cpu gemm");
  return p->run(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

int cpu_gemm_threads_set(int n) {
  const cpu_gemm_provider *p = cpu_gemm_active();
  if (!p || !p->threads_set) return n;
  int old = p->threads_set(n);
  /* A count of the whole process cannot be given back by one device thread while the others
   * still run GEMMs: it stays at n. */
  return p->threads_process_wide && p->threads_process_wide() ? n : old;
}
