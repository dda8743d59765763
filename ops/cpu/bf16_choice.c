/* bf16_choice.c: the bfloat16 instructions pmap may use (cpu_isa.h: the CPU's, capped by
 * PMAP_CPU_ISA), the bf16 GEMM provider chosen once per process (PMAP_GEMM_BF16, else oneDNN's
 * matmul where oneDNN will run it on AVX512_BF16 or AMX and it measures faster, else the
 * portable path), and the bf16 GEMM ops, which run through it (oneDNN's half in
 * bf16_onednn.c, the portable path in bf16.c). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/env.h"
#include "base/error.h"
#include "bf16.h"
#include "cpu_cache.h"
#include "cpu_isa.h"
#include "gemm.h"
#include "ops/op_math.h"

/* ------------------------------------------------------------------------------------------ */
/* The choice                                                                                 */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic int native;         /* 1: oneDNN's matmul */
static const char *_Atomic reason; /* why, for pmap_bf16_reason */
static pmap_status env_status;
static char env_msg[400];

#if defined(PMAP_GEMM_DNNL)
#define ONEDNN_BUILT 1
#else
#define ONEDNN_BUILT 0
#endif

/* ------------------------------------------------------------------------------------------ */
/* The measurement                                                                            */

/* Whether oneDNN's bf16 matmul is faster than the portable path (the operands widened, then the
 * float GEMM in use) on this machine under its cap: its instructions say so on most CPUs, but
 * not on all (an AMX machine capped at AVX512_CORE_BF16 runs its matmul at 0.6x the float
 * GEMM). Timed like the float GEMM's choice (gemm_choice.c): the three GEMMs of an mlp-1024
 * layer at 128 rows, forward, weight gradient and input gradient, single-threaded, the best of
 * two rounds after a warm-up, oneDNN kept unless the portable path is 2 % faster; cached per
 * CPU model, build, oneDNN's ISA and cap (PMAP_GEMM_CACHE=0: neither read nor written). */
static double bf16_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int onednn_faster(void) {
  const char *cache_env = pmap_env_get("PMAP_GEMM_CACHE");
  char key[160];
  snprintf(key, sizeof key, "bf16:onednn,portable oneDNN=%s%s%s", cpu_isa_onednn(),
           cpu_isa_active() != cpu_isa_machine() ? " PMAP_CPU_ISA=" : "",
           cpu_isa_active() != cpu_isa_machine() ? cpu_isa_name(cpu_isa_active()) : "");
  gemm_cache *c = cache_env && strcmp(cache_env, "0") == 0 ? NULL : gemm_cache_open(key);
  const char *cached = gemm_cache_lookup(c);
  if (cached) {
    int fast = strcmp(cached, "portable") != 0;
    gemm_cache_close(c);
    return fast;
  }
  enum { M = 128, K = 1024, N = 1024 };
  pmap_bf16 *a = aligned_alloc(64, (size_t)M * K * sizeof *a);
  pmap_bf16 *b = aligned_alloc(64, (size_t)K * N * sizeof *b);
  float *out = aligned_alloc(64, (size_t)K * N * sizeof *out);
  int fast = 1; /* without memory to measure: the instructions' word */
  char saved[1024];
  pmap_error_save(saved,
                  sizeof saved); /* a failure here is only a choice: the caller's message stays */
  if (a && b && out) {
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = pmap_bf16_round((float)(i % 13) - 6.0f);
    for (size_t i = 0; i < (size_t)K * N; i++) b[i] = pmap_bf16_round((float)(i % 7) / 8.0f);
    memset(out, 0, (size_t)K * N * sizeof *out);
    /* y = x W, dW += x^T dy, dx = dy W^T (a, b, c reused at their shapes' sizes) */
    bf16_gemm g[3];
    memset(g, 0, sizeof g);
    int64_t dims[3][5] = {{0, 0, M, N, K}, {1, 0, K, N, M}, {0, 1, M, K, N}};
    for (int s = 0; s < 3; s++) {
      g[s].ta = (int)dims[s][0], g[s].tb = (int)dims[s][1];
      g[s].m = dims[s][2], g[s].n = dims[s][3], g[s].k = dims[s][4];
      g[s].lda = g[s].ta ? g[s].m : g[s].k, g[s].ldb = g[s].tb ? g[s].k : g[s].n, g[s].ldc = g[s].n;
      g[s].batch = g[s].groups = 1, g[s].alpha = 1.0f, g[s].beta = s == 1 ? 1.0f : 0.0f;
    }
    /* Their scratch in a workspace of the measurement's, as a device's comes from its plan. */
    size_t need = 0;
    for (int s = 0; s < 3; s++) {
      size_t sp = 0;
      int usable = 0;
      (void)cpu_bf16_onednn_scratch(&g[s], &sp, &usable);
      size_t wide = cpu_bf16_portable_scratch(&g[s]);
      need = need > sp ? need : sp;
      need = need > wide ? need : wide;
    }
    bf16_ws ws = {aligned_alloc(64, (need + 63) / 64 * 64), need};
    double best[2] = {INFINITY, INFINITY};
    int failed = !ws.p, threads = cpu_gemm_threads_set(1); /* as on a device thread */
    for (int round = 0; round < 3 && !failed; round++)
      for (int p = 0; p < 2 && !failed; p++) {
        double t0 = bf16_now();
        for (int s = 0; s < 3 && !failed; s++) {
          int done = 1;
          pmap_status st = p == 0 ? cpu_bf16_onednn(&g[s], a, b, out, ws, &done)
                                  : cpu_bf16_portable(&g[s], a, b, out, ws);
          failed = st != PMAP_SUCCESS || !done;
        }
        double t = bf16_now() - t0;
        if (round > 0 && t < best[p]) best[p] = t;
      }
    cpu_gemm_threads_set(threads);
    free(ws.p);
    fast = failed ? 0 : !(best[1] < best[0] * (1.0 - 0.02));
    if (!failed) {
      char times[96];
      snprintf(times, sizeof times, "onednn=%.3f portable=%.3f", 1e3 * best[0], 1e3 * best[1]);
      gemm_cache_store(c, fast ? "onednn" : "portable", times);
    }
  }
  pmap_error_copy(saved);
  free(a), free(b), free(out);
  gemm_cache_close(c);
  return fast;
}

static void choose(void) {
  cpu_isa isa = cpu_isa_active();
  static const char *const names[] = {"auto", "onednn", "portable", NULL};
  int pick = 0;
  /* The reader's message is kept for cpu_bf16_ready; the calling thread's stays as it was. */
  char saved[1024];
  pmap_error_save(saved, sizeof saved);
  env_status = pmap_env_choice("PMAP_GEMM_BF16", names, 0, &pick);
  if (env_status != PMAP_SUCCESS) {
    snprintf(env_msg, sizeof env_msg, "%s", pmap_error_message());
    pmap_error_copy(saved);
    atomic_store(&reason, "invalid PMAP_GEMM_BF16");
    return;
  }
  if (pick == 1 && !ONEDNN_BUILT) {
    env_status = PMAP_ERR_UNAVAILABLE;
    snprintf(env_msg, sizeof env_msg,
             "environment variable PMAP_GEMM_BF16=\"onednn\" asks for oneDNN's bf16 matmul, "
             "which this build does not contain (built: portable; or auto)");
    atomic_store(&reason, "invalid PMAP_GEMM_BF16");
    return;
  }
  if (pick == 1 || pick == 2) {
    atomic_store(&native, pick == 1);
    atomic_store(&reason, "forced by PMAP_GEMM_BF16");
  } else if (!ONEDNN_BUILT) {
    atomic_store(&reason, "no oneDNN in this build");
  } else if (isa < CPU_ISA_AVX512_BF16) {
    atomic_store(&reason, cpu_isa_machine() >= CPU_ISA_AVX512_BF16
                              ? "PMAP_CPU_ISA caps the CPU below its bf16 instructions"
                              : "the CPU has no bf16 instructions");
  } else if (!cpu_isa_onednn_bf16()) {
    /* oneDNN would emulate bf16 on float instructions (ONEDNN_MAX_CPU_ISA below
     * AVX512_CORE_BF16), several times slower than the portable path. */
    atomic_store(&reason, "oneDNN's ISA has no bf16 instructions (ONEDNN_MAX_CPU_ISA)");
  } else if (!onednn_faster()) {
    atomic_store(&reason, "oneDNN's bf16 matmul measured slower than the portable path");
  } else {
    atomic_store(&native, 1);
    atomic_store(&reason, strcmp(cpu_isa_onednn(), "avx512_core_amx") == 0
                              ? "the CPU has AMX"
                              : "the CPU has AVX512_BF16");
  }
}

pmap_status cpu_bf16_ready(const char *call) {
  pthread_once(&once, choose);
  if (env_status != PMAP_SUCCESS) return PMAP_ERR(env_status, "%s: %s", call, env_msg);
  return PMAP_SUCCESS;
}

pmap_status cpu_bf16_native(int *out) {
  PMAP_TRY(cpu_bf16_ready("gemm_bf16"));
  *out = atomic_load(&native);
  return PMAP_SUCCESS;
}

pmap_status cpu_bf16_force(const char *name) {
  pthread_once(&once, choose);
  int on = name && strcmp(name, "onednn") == 0;
  if (!name || (!on && strcmp(name, "portable") != 0) || (on && !ONEDNN_BUILT))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "cpu_bf16_force: no bf16 GEMM \"%s\" (built: %sportable)",
                    name ? name : "(null)", ONEDNN_BUILT ? "onednn, " : "");
  atomic_store(&native, on);
  atomic_store(&reason, "forced");
  return PMAP_SUCCESS;
}

const char *pmap_cpu_bf16(void) {
  cpu_isa isa = cpu_isa_active();
  return isa == CPU_ISA_AMX ? "amx_bf16" : isa == CPU_ISA_AVX512_BF16 ? "avx512_bf16" : "none";
}

const char *pmap_bf16_provider(void) {
  pthread_once(&once, choose);
  if (env_status != PMAP_SUCCESS) return "none";
  return atomic_load(&native) ? "onednn" : "portable";
}

const char *pmap_bf16_reason(void) {
  pthread_once(&once, choose);
  return atomic_load(&reason);
}

/* ------------------------------------------------------------------------------------------ */
/* The bf16 GEMM ops, through the provider in use                                             */

/* Whether g goes to oneDNN's matmul: tiny shapes and k == 0 (c = beta c) always take the
 * portable path, where a library call costs more than the work. */
static pmap_status to_onednn(const bf16_gemm *g, int *on) {
  PMAP_TRY(cpu_bf16_native(on));
  *on = *on && g->k > 0 && g->m * g->n * g->k > CPU_BF16_SMALL_MACS;
  return PMAP_SUCCESS;
}

/* g through the provider in use, its scratch in ws where it fits. */
static pmap_status run(const bf16_gemm *g, const pmap_bf16 *a, const pmap_bf16 *b, float *c,
                       bf16_ws ws) {
  if (g->m <= 0 || g->n <= 0 || g->batch <= 0 || g->groups <= 0) return PMAP_SUCCESS;
  int on = 0;
  PMAP_TRY(to_onednn(g, &on));
  if (on) {
    int done = 0;
    PMAP_TRY(cpu_bf16_onednn(g, a, b, c, ws, &done));
    if (done) return PMAP_SUCCESS;
  }
  return cpu_bf16_portable(g, a, b, c, ws);
}

pmap_status cpu_bf16_workspace(const bf16_gemm *g, size_t *bytes) {
  *bytes = 0;
  if (g->m <= 0 || g->n <= 0 || g->batch <= 0 || g->groups <= 0) return PMAP_SUCCESS;
  int on = 0, usable = 0;
  PMAP_TRY(to_onednn(g, &on));
  if (on) PMAP_TRY(cpu_bf16_onednn_scratch(g, bytes, &usable));
  if (!usable) *bytes = cpu_bf16_portable_scratch(g);
  return PMAP_SUCCESS;
}

/* The workspace q's GEMMs were given (none without a queue). */
static bf16_ws ws_of(const op_queue *q) {
  return q ? (bf16_ws){q->ws, q->ws_bytes} : (bf16_ws){NULL, 0};
}

pmap_status cpu_gemm_bf16(op_queue *q, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                          const pmap_bf16 *a, int64_t lda, const pmap_bf16 *b, int64_t ldb,
                          float beta, float *c, int64_t ldc) {
  bf16_gemm g;
  memset(&g, 0, sizeof g); /* the cache compares keys bytewise */
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.batch = g.groups = 1, g.alpha = alpha, g.beta = beta;
  return run(&g, a, b, c, ws_of(q));
}

pmap_status cpu_gemm_strided_bf16(op_queue *q, int ta, int tb, int64_t m, int64_t n, int64_t k,
                                  float alpha, const pmap_bf16 *a, int64_t lda, int64_t stride_a,
                                  const pmap_bf16 *b, int64_t ldb, int64_t stride_b, float beta,
                                  float *c, int64_t ldc, int64_t stride_c, int64_t batch,
                                  int64_t groups, int64_t group_a, int64_t group_b,
                                  int64_t group_c) {
  bf16_gemm g;
  memset(&g, 0, sizeof g);
  g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  g.sa = stride_a, g.sb = stride_b, g.sc = stride_c, g.batch = batch;
  g.ga = group_a, g.gb = group_b, g.gc = group_c, g.groups = groups;
  g.alpha = alpha, g.beta = beta;
  return run(&g, a, b, c, ws_of(q));
}
