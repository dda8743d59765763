/* conv_choice.c: which path each CPU convolution takes (conv.h): the one PMAP_CONV forces, else
 * a choice per shape, pass (forward, backward) and rows, made once per process at the shape's
 * first call and kept: im2col where oneDNN's primitives do not serve the shape or run the pass
 * on their reference implementation, else this machine's cached choice (conv_cache.c), else the
 * faster in a short measurement of both (conv_measure.c). docs/cpu-gemm.md says why per shape. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"
#include "conv.h"
#include "cpu_isa.h"
#include "gemm.h"

#if defined(PMAP_CONV_DNNL)
#include <dnnl.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* The mode: PMAP_CONV                                                                        */

enum { MODE_AUTO = -1 }; /* else a conv_path, forced */
static const char *const path_names[] = {"onednn", "im2col"};

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static _Atomic int mode = MODE_AUTO;
static pmap_status env_status;
static char env_msg[256];

/* The mode `name` names into *out; a status and env_msg's text when it names no path built. */
static pmap_status mode_of(const char *name, const char *what, int *out) {
  if (!name || !*name || strcmp(name, "auto") == 0) {
    *out = MODE_AUTO;
    return PMAP_SUCCESS;
  }
  if (strcmp(name, "im2col") == 0) {
    *out = CONV_IM2COL;
    return PMAP_SUCCESS;
  }
  if (strcmp(name, "onednn") == 0) {
#if defined(PMAP_CONV_DNNL)
    *out = CONV_ONEDNN;
    return PMAP_SUCCESS;
#else
    snprintf(env_msg, sizeof env_msg,
             "%s\"%s\" asks for oneDNN's convolutions, which this build does not contain "
             "(built: %s; or auto)",
             what, name, cpu_conv_paths());
    return PMAP_ERR_UNAVAILABLE;
#endif
  }
  snprintf(env_msg, sizeof env_msg, "%s\"%s\" names no CPU convolution (built: %s; or auto)", what,
           name, cpu_conv_paths());
  return PMAP_ERR_INVALID_ARGUMENT;
}

static void read_env(void) {
  int m = MODE_AUTO;
  env_status = mode_of(pmap_env_get("PMAP_CONV"), "environment variable PMAP_CONV=", &m);
  if (!env_status) atomic_store(&mode, m);
}

pmap_status cpu_conv_ready(const char *call) {
  pthread_once(&env_once, read_env);
  if (env_status) return PMAP_ERR(env_status, "%s: %s", call, env_msg);
  return PMAP_SUCCESS;
}

pmap_status cpu_conv_force(const char *name) {
  pthread_once(&env_once, read_env);
  int m = MODE_AUTO;
  pmap_status st = mode_of(name, "cpu_conv_force: ", &m);
  if (st) return PMAP_ERR(st, "%s", env_msg);
  env_status = PMAP_SUCCESS; /* a forced path overrides a bad PMAP_CONV */
  atomic_store(&mode, m);
  return PMAP_SUCCESS;
}

const char *cpu_conv_path(void) {
  pthread_once(&env_once, read_env);
  int m = atomic_load(&mode);
  if (env_status) return "none";
#if !defined(PMAP_CONV_DNNL)
  if (m == MODE_AUTO) return "im2col";
#endif
  return m == MODE_AUTO ? "auto" : path_names[m];
}

const char *cpu_conv_paths(void) {
#if defined(PMAP_CONV_DNNL)
  return "onednn,im2col";
#else
  return "im2col";
#endif
}

/* ------------------------------------------------------------------------------------------ */
/* The process's choices                                                                      */

/* The rows a measurement times both paths on: oneDNN's first piece of the call's rows (what its
 * primitives run, with the piece's cache behaviour: a small shape's time per row grows once its
 * rows leave the core's cache, im2col's does not), fewer where that takes more than
 * MEASURE_MACS_MOST multiply-adds, more up to MEASURE_MACS; one row at least, MEASURE_ROWS at
 * most. Both paths' time grows with the rows in proportion beyond that (im2col runs them one by
 * one, oneDNN piece by piece), so the choice holds for more rows. */
#define MEASURE_MACS ((double)(1 << 22))
#define MEASURE_MACS_MOST ((double)(1 << 25))
#define MEASURE_ROWS 32
/* im2col replaces oneDNN only when it measures this much faster: near-ties keep the preferred
 * path, so that a measurement repeated in another process (no cache) tends to the same. */
#define PICK_MARGIN 0.03

enum { FLAG_BIAS = 1, FLAG_RELU = 2, FLAG_DX = 4 };

/* Compared bytewise: made from a zeroed struct. */
typedef struct choice_key {
  int32_t backward, flags;
  int64_t rows; /* the rows measured: the call's, up to the measurement's bound */
  int64_t c, h, w, oc, oh, ow;
  int32_t kh, kw, stride, pad;
} choice_key;

struct conv_choice {
  choice_key key;
  int path;           /* a conv_path; -1 until chosen (a forced mode chooses nothing) */
  const char *reason; /* why, for tests and the cache */
  double spent_ms;    /* the measurement's CPU time; 0 for none */
  _Atomic int ran;    /* the path of the entry's last call; -1 before the first */
  conv_choice *next;
};

/* Entries are never freed: a shape's choice holds for the process (the same bits every step).
 * The rows in the key stop at the measurement's, so a program that predicts with many batch
 * sizes adds at most MEASURE_ROWS entries per layer. */
#define BUCKETS 256
static conv_choice *table[BUCKETS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int measurements;

/* Rows within a budget of multiply-adds per call, one at least. */
static int64_t rows_within(double budget, double macs) {
  double fit = budget / macs;
  return fit >= (double)MEASURE_ROWS ? MEASURE_ROWS : fit >= 1.0 ? (int64_t)fit : 1;
}

static int64_t measured_rows(const conv_call *c) {
  const pmap_conv_shape *s = c->s;
  double macs = (double)(s->oc * s->c * s->kh * s->kw) * (double)(s->oh * s->ow) *
                (c->backward && c->dx ? 2.0 : 1.0);
  if (macs <= 0.0) return c->bd < MEASURE_ROWS ? c->bd : MEASURE_ROWS;
  int64_t piece = conv_dnnl_piece_rows(s, c->bd), most = rows_within(MEASURE_MACS_MOST, macs);
  int64_t rows = piece < most ? piece : most, least = rows_within(MEASURE_MACS, macs);
  if (rows < least) rows = least;
  return c->bd < rows ? c->bd : rows;
}

static choice_key key_of(const conv_call *c) {
  const pmap_conv_shape *s = c->s;
  choice_key k;
  memset(&k, 0, sizeof k);
  k.backward = c->backward;
  if (c->backward)
    k.flags = (c->db ? FLAG_BIAS : 0) | (c->ry ? FLAG_RELU : 0) | (c->dx ? FLAG_DX : 0);
  else
    k.flags = (c->b ? FLAG_BIAS : 0) | (c->relu ? FLAG_RELU : 0);
  k.rows = measured_rows(c);
  k.c = s->c, k.h = s->h, k.w = s->w, k.oc = s->oc, k.oh = s->oh, k.ow = s->ow;
  k.kh = s->kh, k.kw = s->kw, k.stride = s->stride, k.pad = s->pad;
  return k;
}

static size_t bucket_of(const choice_key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof *k; i++) h = (h ^ p[i]) * 1099511628211ull;
  return (size_t)(h % BUCKETS);
}

/* The entry of k (table_lock held); NULL when there is none. */
static conv_choice *find(const choice_key *k) {
  for (conv_choice *e = table[bucket_of(k)]; e; e = e->next)
    if (memcmp(&e->key, k, sizeof *k) == 0) return e;
  return NULL;
}

/* The entry of k, added unchosen if there is none (table_lock held); NULL when out of memory. */
static conv_choice *find_or_add(const choice_key *k) {
  conv_choice *e = find(k);
  if (e) return e;
  e = calloc(1, sizeof *e);
  if (!e) return NULL;
  e->key = *k;
  e->path = -1;
  e->reason = "";
  atomic_store(&e->ran, -1);
  size_t b = bucket_of(k);
  e->next = table[b];
  table[b] = e;
  return e;
}

/* ------------------------------------------------------------------------------------------ */
/* A choice                                                                                   */

/* What else the paths' speed depends on: the cap, the GEMM in use (im2col's), oneDNN's version. */
static void context_of(char *out, size_t cap) {
  int n =
      snprintf(out, cap, "isa=%s gemm=%s", cpu_isa_name(cpu_isa_active()), pmap_gemm_provider());
#if defined(PMAP_CONV_DNNL)
  const dnnl_version_t *v = dnnl_version();
  if (n > 0 && (size_t)n < cap)
    snprintf(out + n, cap - (size_t)n, " onednn=%d.%d.%d", v->major, v->minor, v->patch);
#else
  (void)n;
#endif
}

/* The key as the cache's text: "forward c5 h40 w44 oc17 k3x3 s1 p1 rows3 bias relu". */
static void shape_text(const choice_key *k, char *out, size_t cap) {
  snprintf(out, cap, "%s c%lld h%lld w%lld oc%lld k%dx%d s%d p%d rows%lld%s%s%s",
           k->backward ? "backward" : "forward", (long long)k->c, (long long)k->h, (long long)k->w,
           (long long)k->oc, k->kh, k->kw, k->stride, k->pad, (long long)k->rows,
           k->flags & FLAG_BIAS ? " bias" : "", k->flags & FLAG_RELU ? " relu" : "",
           k->flags & FLAG_DX ? " dx" : "");
}

/* This machine's cached choice for e, else a measurement (recorded in the cache). */
static pmap_status measured_choice(op_queue *q, const conv_call *c, conv_choice *e) {
  const char *cache_env = pmap_env_get("PMAP_GEMM_CACHE");
  char context[128], shape[160];
  context_of(context, sizeof context);
  shape_text(&e->key, shape, sizeof shape);
  conv_cache *cache =
      cache_env && strcmp(cache_env, "0") == 0 ? NULL : conv_cache_open(context, shape);
  const char *hit = conv_cache_lookup(cache);
  if (hit) {
    e->path = strcmp(hit, "im2col") == 0 ? CONV_IM2COL : CONV_ONEDNN;
    e->reason = "cached";
    conv_cache_close(cache);
    return PMAP_SUCCESS;
  }
  conv_timing t = {{0.0, 0.0}, 0.0};
  int measured = 0;
  pmap_status st = conv_measure(q, c, e->key.rows, &t, &measured);
  const double *ms = t.ms;
  if (st == PMAP_SUCCESS && !measured) {
    e->path = CONV_ONEDNN;
    e->reason = "preferred (no memory to measure)";
  } else if (st == PMAP_SUCCESS) {
    e->path = ms[CONV_IM2COL] < ms[CONV_ONEDNN] * (1.0 - PICK_MARGIN) ? CONV_IM2COL : CONV_ONEDNN;
    e->reason = "measured";
    e->spent_ms = t.spent_ms;
    atomic_fetch_add(&measurements, 1);
    char times[96];
    snprintf(times, sizeof times, "onednn=%.4f im2col=%.4f spent=%.2f", ms[CONV_ONEDNN],
             ms[CONV_IM2COL], t.spent_ms);
    conv_cache_store(cache, shape, path_names[e->path], times);
  }
  conv_cache_close(cache);
  return st;
}

/* Chooses e's path for calls like c (table_lock held). */
static pmap_status decide(op_queue *q, const conv_call *c, conv_choice *e) {
  int kinds = 0, bias = (e->key.flags & FLAG_BIAS) != 0;
  PMAP_TRY(conv_dnnl_kinds(q, c->s, e->key.rows, bias, &kinds)); /* 0 without oneDNN */
  int ref = c->backward ? (kinds & CONV_DNNL_REF_WEIGHTS) || (c->dx && (kinds & CONV_DNNL_REF_DATA))
                        : (kinds & CONV_DNNL_REF_FORWARD) != 0;
  if (!kinds) {
    e->path = CONV_IM2COL;
    e->reason =
        strchr(cpu_conv_paths(), ',') ? "oneDNN does not serve the shape" : "only im2col built";
  } else if (ref) {
    /* Plain loops, 190-2100 times slower than im2col (bench/README.md): not worth timing. */
    e->path = CONV_IM2COL;
    e->reason = "oneDNN has only its reference implementation";
  } else {
    PMAP_TRY(measured_choice(q, c, e));
  }
  return PMAP_SUCCESS;
}

pmap_status conv_choose(op_queue *q, const conv_call *c, conv_path *path, conv_choice **entry) {
  PMAP_TRY(cpu_conv_ready("conv2d"));
  choice_key k = key_of(c);
  int m = atomic_load(&mode);
  pmap_status st = PMAP_SUCCESS;
  /* Held while a choice measures: the other devices wait for it rather than disturb its timing
   * or measure the same shape again. */
  pthread_mutex_lock(&table_lock);
  conv_choice *e = find_or_add(&k);
  if (!e)
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "conv2d: out of memory for the choice of its path");
  else if (m == MODE_AUTO && e->path < 0)
    st = decide(q, c, e);
  if (!st) *path = m == MODE_AUTO ? (conv_path)e->path : (conv_path)m;
  pthread_mutex_unlock(&table_lock);
  *entry = e;
  return st;
}

void conv_choice_ran(conv_choice *entry, conv_path ran) {
  if (entry) atomic_store(&entry->ran, (int)ran);
}

int conv_choice_find(const conv_call *c, const char **reason, double *spent_ms) {
  choice_key k = key_of(c);
  pthread_mutex_lock(&table_lock);
  conv_choice *e = find(&k);
  int path = e ? e->path : -1;
  *reason = e && e->path >= 0 ? e->reason : "";
  if (spent_ms) *spent_ms = e ? e->spent_ms : 0.0;
  pthread_mutex_unlock(&table_lock);
  return path;
}

int conv_choice_measurements(void) { return atomic_load(&measurements); }

int conv_choice_report(char *out, size_t cap) {
  int n = 0;
  size_t len = 0;
  if (cap) out[0] = '\0';
  pthread_mutex_lock(&table_lock);
  for (int b = 0; b < BUCKETS; b++)
    for (const conv_choice *e = table[b]; e; e = e->next, n++) {
      char shape[160];
      shape_text(&e->key, shape, sizeof shape);
      int ran = atomic_load(&e->ran);
      int k = snprintf(out + len, cap - len, "%s\t%s\t%s\t%s\n", shape,
                       e->path < 0 ? "-" : path_names[e->path], e->path < 0 ? "-" : e->reason,
                       ran < 0 ? "-" : path_names[ran]);
      if (k > 0 && len + (size_t)k < cap) len += (size_t)k;
    }
  pthread_mutex_unlock(&table_lock);
  return n;
}

int pmap_conv_choices(const char *pass, const char *path) {
  int backward = !pass ? -1 : !strcmp(pass, "forward") ? 0 : !strcmp(pass, "backward") ? 1 : -1;
  int p = !path                     ? -1
          : !strcmp(path, "onednn") ? CONV_ONEDNN
          : !strcmp(path, "im2col") ? CONV_IM2COL
                                    : -1;
  if (backward < 0 || p < 0) return -1;
  int n = 0;
  pthread_mutex_lock(&table_lock);
  for (int b = 0; b < BUCKETS; b++)
    for (const conv_choice *e = table[b]; e; e = e->next)
      n += e->key.backward == backward && atomic_load(&e->ran) == p;
  pthread_mutex_unlock(&table_lock);
  return n;
}
