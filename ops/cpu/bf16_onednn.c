/* bf16_onednn.c: each thread's own scratch for the bf16 GEMMs (where the workspace they are
 * given is too small) and its cache of oneDNN matmul primitives, one per GEMM shape, made at its
 * first use and kept (a step's shapes repeat every step), each with a user-managed scratchpad
 * (so that the memory plan holds it): the oneDNN half of the bf16 GEMM (bf16.h). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "bf16.h"
#include "cpu_isa.h"

#if defined(PMAP_GEMM_DNNL)
#include <dnnl.h>
#endif
#if defined(PMAP_HAVE_OPENMP)
#include <omp.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* Each thread's scratch and primitives                                                       */

#define CACHE_ENTRIES 64

#if defined(PMAP_GEMM_DNNL)
typedef struct mm_entry {
  bf16_gemm key;
  int usable; /* 0: no bf16 implementation but oneDNN's reference one: the portable path */
  dnnl_primitive_t prim;
  dnnl_memory_t a, b, c;
  dnnl_memory_t sp; /* its scratchpad (NULL when it needs none), of sp_bytes */
  size_t sp_bytes;
  uint64_t used; /* the thread's clock at its last use, for eviction */
} mm_entry;
#endif

typedef struct bf16_tls {
  float *buf;
  size_t cap;
#if defined(PMAP_GEMM_DNNL)
  dnnl_engine_t eng;
  dnnl_stream_t stream;
  mm_entry e[CACHE_ENTRIES];
  int n;
  uint64_t clock;
#endif
} bf16_tls;

static pthread_key_t tls_key;
static pthread_once_t tls_once = PTHREAD_ONCE_INIT;

#if defined(PMAP_GEMM_DNNL)
static void entry_free(mm_entry *e) {
  if (e->prim) dnnl_primitive_destroy(e->prim);
  if (e->a) dnnl_memory_destroy(e->a);
  if (e->b) dnnl_memory_destroy(e->b);
  if (e->c) dnnl_memory_destroy(e->c);
  if (e->sp) dnnl_memory_destroy(e->sp);
  memset(e, 0, sizeof *e);
}
#endif

static void tls_free(void *p) {
  bf16_tls *t = p;
  if (!t) return;
#if defined(PMAP_GEMM_DNNL)
  for (int i = 0; i < t->n; i++) entry_free(&t->e[i]);
  if (t->stream) dnnl_stream_destroy(t->stream);
  if (t->eng) dnnl_engine_destroy(t->eng);
#endif
  free(t->buf);
  free(t);
}

static void tls_make_key(void) { (void)pthread_key_create(&tls_key, tls_free); }

static bf16_tls *tls_get(void) {
  pthread_once(&tls_once, tls_make_key);
  bf16_tls *t = pthread_getspecific(tls_key);
  if (t) return t;
  t = calloc(1, sizeof *t);
  if (t && pthread_setspecific(tls_key, t) != 0) {
    free(t);
    t = NULL;
  }
  return t;
}

static _Atomic uint64_t unplanned;

uint64_t cpu_bf16_unplanned(void) { return atomic_load(&unplanned); }

void *cpu_bf16_scratch_in(bf16_ws ws, size_t bytes) {
  if (ws.p && bytes <= ws.bytes) return ws.p;
  atomic_fetch_add(&unplanned, 1);
  return cpu_bf16_scratch((bytes + sizeof(float) - 1) / sizeof(float));
}

float *cpu_bf16_scratch(size_t n) {
  bf16_tls *t = tls_get();
  if (!t) return NULL;
  if (n <= t->cap) return t->buf;
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  float *p = aligned_alloc(64, bytes);
  if (!p) return NULL;
  free(t->buf);
  t->buf = p;
  t->cap = n;
  return p;
}

size_t cpu_bf16_scratch_floats(void) {
  bf16_tls *t = tls_get();
  return t ? t->cap : 0;
}

#if !defined(PMAP_GEMM_DNNL)
pmap_status cpu_bf16_onednn(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b, float *c,
                            bf16_ws ws, int *done) {
  (void)g, (void)a, (void)b, (void)c, (void)ws;
  *done = 0;
  return PMAP_SUCCESS;
}

pmap_status cpu_bf16_onednn_scratch(const bf16_gemm *g, size_t *bytes, int *usable) {
  (void)g;
  *bytes = 0;
  *usable = 0;
  return PMAP_SUCCESS;
}
#else
/* The memory descriptor of one operand: rows x cols as stored (trans: the op's (r, c) element at
 * c * ld + r), a leading batch axis of stride `stride` when batch > 1, and before it the groups'
 * axis of stride `group` when groups > 1. */
static dnnl_status_t operand_md(dnnl_memory_desc_t *md, dnnl_data_type_t dt, int64_t groups,
                                int64_t group, int64_t batch, int64_t stride, int64_t rows,
                                int64_t cols, int trans, int64_t ld) {
  int64_t in_row = trans ? 1 : ld, in_col = trans ? ld : 1;
  if (groups > 1) {
    dnnl_dims_t dims = {groups, batch, rows, cols}, str = {group, stride, in_row, in_col};
    return dnnl_memory_desc_init_by_strides(md, 4, dims, dt, str);
  }
  if (batch > 1) {
    dnnl_dims_t dims = {batch, rows, cols}, str = {stride, in_row, in_col};
    return dnnl_memory_desc_init_by_strides(md, 3, dims, dt, str);
  }
  dnnl_dims_t dims = {rows, cols}, str = {in_row, in_col};
  return dnnl_memory_desc_init_by_strides(md, 2, dims, dt, str);
}

/* oneDNN 2.x's AMX bf16 matmul executes an illegal instruction at k = 63 (2.6.3 on an Emerald
 * Rapids Xeon, at every m and n of 1-17 and 24 tried but multiples of 16, with no other k from 1
 * to 300 failing; oneDNN's issue 1661 reports the same at k = 63 for 2.7.3), killing the process:
 * such a primitive is not used (the GEMM takes pmap's own path). */
static int amx_k_fails(const char *impl, int64_t k) {
  const dnnl_version_t *v = dnnl_version();
  return v && v->major < 3 && k == 63 && strstr(impl, "amx") != NULL;
}

/* Makes e's primitive for its key: c = alpha a b (output scale) + beta c (a sum post-op), with
 * a scratchpad the caller gives it. A shape oneDNN cannot do in bf16 but with its reference code,
 * or only with a kernel that fails (amx_k_fails), is marked unusable. */
static pmap_status entry_make(bf16_tls *t, mm_entry *e) {
  const bf16_gemm *g = &e->key;
  dnnl_memory_desc_t ad, bd, cd;
  dnnl_matmul_desc_t md;
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_status_t s =
      operand_md(&ad, dnnl_bf16, g->groups, g->ga, g->batch, g->sa, g->m, g->k, g->ta, g->lda);
  if (s == dnnl_success)
    s = operand_md(&bd, dnnl_bf16, g->groups, g->gb, g->batch, g->sb, g->k, g->n, g->tb, g->ldb);
  if (s == dnnl_success)
    s = operand_md(&cd, dnnl_f32, g->groups, g->gc, g->batch, g->sc, g->m, g->n, 0, g->ldc);
  if (s == dnnl_success) s = dnnl_matmul_desc_init(&md, &ad, &bd, NULL, &cd);
  if (s == dnnl_success) s = dnnl_primitive_attr_create(&attr);
  if (s == dnnl_success)
    s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  if (s == dnnl_success && g->alpha != 1.0f)
    s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &g->alpha);
  if (s == dnnl_success && g->beta != 0.0f) {
    s = dnnl_post_ops_create(&po);
    if (s == dnnl_success) s = dnnl_post_ops_append_sum(po, g->beta);
    if (s == dnnl_success) s = dnnl_primitive_attr_set_post_ops(attr, po);
  }
  if (s == dnnl_success) s = dnnl_primitive_desc_create(&pd, &md, attr, t->eng, NULL);
  const char *impl = "";
  if (s == dnnl_success) dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  e->usable = s == dnnl_success && strncmp(impl, "ref", 3) != 0 && !amx_k_fails(impl, g->k);
  if (e->usable) s = dnnl_primitive_create(&e->prim, pd);
  if (e->usable && s == dnnl_success) s = dnnl_memory_create(&e->a, &ad, t->eng, DNNL_MEMORY_NONE);
  if (e->usable && s == dnnl_success) s = dnnl_memory_create(&e->b, &bd, t->eng, DNNL_MEMORY_NONE);
  if (e->usable && s == dnnl_success) s = dnnl_memory_create(&e->c, &cd, t->eng, DNNL_MEMORY_NONE);
  if (e->usable && s == dnnl_success) {
    const dnnl_memory_desc_t *sd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    e->sp_bytes = sd ? dnnl_memory_desc_get_size(sd) : 0;
    if (e->sp_bytes) s = dnnl_memory_create(&e->sp, sd, t->eng, DNNL_MEMORY_NONE);
  }
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (po) dnnl_post_ops_destroy(po);
  if (attr) dnnl_primitive_attr_destroy(attr);
  if (!e->usable || s == dnnl_success) return PMAP_SUCCESS;
  entry_free(e);
  return PMAP_ERR(PMAP_ERR_DEVICE,
                  "oneDNN's bf16 matmul (m %lld n %lld k %lld, batch %lld) could not be made: "
                  "status %d",
                  (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->batch, (int)s);
}

/* On this thread alone, as every GEMM of a device: oneDNN runs on OpenMP, whose thread count is
 * the calling thread's setting (the float provider may be another library). one_thread returns
 * what threads_back restores. */
static int one_thread(void) {
#if defined(PMAP_HAVE_OPENMP)
  int threads = omp_get_max_threads();
  if (threads != 1) omp_set_num_threads(1);
  return threads;
#else
  return 1;
#endif
}

static void threads_back(int threads) {
#if defined(PMAP_HAVE_OPENMP)
  if (threads != 1) omp_set_num_threads(threads);
#else
  (void)threads;
#endif
}

/* The thread's entry for g, made now when it is new (the least recently used one gives way
 * once the cache is full). NULL with an error set when it cannot be made. */
static pmap_status entry_of(bf16_tls *t, const bf16_gemm *g, mm_entry **out) {
  t->clock++;
  for (int i = 0; i < t->n; i++)
    if (memcmp(&t->e[i].key, g, sizeof *g) == 0) {
      t->e[i].used = t->clock;
      *out = &t->e[i];
      return PMAP_SUCCESS;
    }
  if (!t->eng && dnnl_engine_create(&t->eng, dnnl_cpu, 0) != dnnl_success) t->eng = NULL;
  if (t->eng && !t->stream &&
      dnnl_stream_create(&t->stream, t->eng, dnnl_stream_default_flags) != dnnl_success)
    t->stream = NULL;
  if (!t->eng || !t->stream)
    return PMAP_ERR(PMAP_ERR_DEVICE, "oneDNN: no CPU engine or stream for the bf16 matmul");
  int slot = t->n;
  if (slot == CACHE_ENTRIES) {
    slot = 0;
    for (int i = 1; i < t->n; i++)
      if (t->e[i].used < t->e[slot].used) slot = i;
    entry_free(&t->e[slot]);
  } else {
    t->n++;
  }
  mm_entry *e = &t->e[slot];
  memset(e, 0, sizeof *e);
  e->key = *g;
  e->used = t->clock;
  /* Made for one thread, as it runs (its scratchpad is sized by the threads it is made for). */
  int threads = one_thread();
  pmap_status st = entry_make(t, e);
  threads_back(threads);
  if (st) {
    e->key.batch = -1; /* matches no call: the slot is reused first */
    e->used = 0;
    return st;
  }
  *out = e;
  return PMAP_SUCCESS;
}

pmap_status cpu_bf16_onednn_scratch(const bf16_gemm *g, size_t *bytes, int *usable) {
  bf16_tls *t = tls_get();
  if (!t) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "gemm_bf16: out of memory for a thread's cache");
  mm_entry *e = NULL;
  PMAP_TRY(entry_of(t, g, &e));
  *usable = e->usable;
  *bytes = e->usable ? e->sp_bytes : 0;
  return PMAP_SUCCESS;
}

pmap_status cpu_bf16_onednn(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b, float *c,
                            bf16_ws ws, int *done) {
  *done = 0;
  bf16_tls *t = tls_get();
  if (!t) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "gemm_bf16: out of memory for a thread's cache");
  mm_entry *e = NULL;
  PMAP_TRY(entry_of(t, g, &e));
  if (!e->usable) return PMAP_SUCCESS;
  void *sp = e->sp ? cpu_bf16_scratch_in(ws, e->sp_bytes) : NULL;
  if (e->sp && !sp)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "gemm_bf16: out of memory for oneDNN's scratchpad of %zu bytes (m %lld n %lld "
                    "k %lld)",
                    e->sp_bytes, (long long)g->m, (long long)g->n, (long long)g->k);
  dnnl_status_t s = dnnl_memory_set_data_handle(e->a, (void *)a);
  if (s == dnnl_success) s = dnnl_memory_set_data_handle(e->b, (void *)b);
  if (s == dnnl_success) s = dnnl_memory_set_data_handle(e->c, c);
  if (s == dnnl_success && sp) s = dnnl_memory_set_data_handle(e->sp, sp);
  int threads = one_thread();
  dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, e->a},
                             {DNNL_ARG_WEIGHTS, e->b},
                             {DNNL_ARG_DST, e->c},
                             {DNNL_ARG_SCRATCHPAD, e->sp}};
  if (s == dnnl_success) s = dnnl_primitive_execute(e->prim, t->stream, sp ? 4 : 3, args);
  if (s == dnnl_success) s = dnnl_stream_wait(t->stream);
  threads_back(threads);
  if (s != dnnl_success)
    return PMAP_ERR(PMAP_ERR_DEVICE,
                    "oneDNN's bf16 matmul (%c%c m %lld n %lld k %lld, batch %lld) failed: status "
                    "%d",
                    g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', (long long)g->m, (long long)g->n,
                    (long long)g->k, (long long)g->batch, (int)s);
  *done = 1;
  return PMAP_SUCCESS;
}
#endif
