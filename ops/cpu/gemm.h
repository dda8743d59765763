/* gemm.h: the CPU GEMM providers built into the library (ops/cpu/gemm.c) and the run-time choice
 * of the one in use (ops/cpu/gemm_choice.c, its cache in ops/cpu/gemm_cache.c). cpu_gemm
 * (cpu_ops.h) calls the provider in use. */
#ifndef PMAP_CPU_GEMM_H
#define PMAP_CPU_GEMM_H

#include "cpu_ops.h"

/* One GEMM library. */
typedef struct cpu_gemm_provider {
  const char *name; /* "onednn", "cblas", "portable": the value of PMAP_GEMM that forces it */
  /* c (m, n) = alpha op(a) op(b) + beta c: ops.h's gemm contract, for shapes past the small-shape
   * cut-off (cpu_gemm_with takes the others). */
  pmap_status (*run)(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                     const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc);
  /* Sets the library's thread count and returns the previous one (optional: NULL where the
   * library runs on the calling thread only). */
  int (*threads_set)(int n);
  /* Whether threads_set changes the count of the whole process, not only of the calling thread
   * (optional: NULL means per thread); a device thread cannot give such a count back while
   * other devices run GEMMs. */
  int (*threads_process_wide)(void);
  /* The highest instruction set the library's kernels use, which PMAP_CPU_ISA cannot lower
   * (optional: NULL for a library that keeps within the cap, cpu_isa.h). A provider above the
   * cap takes no part in the measured choice. */
  int (*isa)(void);
} cpu_gemm_provider;

/* The providers of this build, most preferred first (the order of ties and of a choice that
 * could not measure): oneDNN, a CBLAS, the portable loop. *count >= 1. */
const cpu_gemm_provider *cpu_gemm_list(int *count);
/* The built provider named `name`; NULL when there is none. */
const cpu_gemm_provider *cpu_gemm_find(const char *name);
/* cpu_gemm through provider p: shapes of at most CPU_GEMM_SMALL_MACS multiply-adds (or k == 0)
 * take the portable loop, the rest p->run. */
pmap_status cpu_gemm_with(const cpu_gemm_provider *p, int trans_a, int trans_b, int64_t m,
                          int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                          const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* Below this many multiply-adds the loop beats a library call. */
#define CPU_GEMM_SMALL_MACS 4096

/* The provider in use, chosen at the first call from any thread (the others wait for it): the
 * one PMAP_GEMM names, the only one built, the cached choice for this machine, or the fastest
 * of a short measurement (gemm_choice.c). NULL when PMAP_GEMM or PMAP_GEMM_CACHE is invalid;
 * cpu_gemm_ready then says why. */
const cpu_gemm_provider *cpu_gemm_active(void);
/* Makes the choice if not made; PMAP_SUCCESS, or the error of an invalid PMAP_GEMM or
 * PMAP_GEMM_CACHE with a message starting with `call`. */
pmap_status cpu_gemm_ready(const char *call);
/* Makes `name` the provider in use from now on (reason "forced"), for tests and benchmarks that
 * compare providers in one process. PMAP_ERR_INVALID_ARGUMENT when no such provider is built. */
pmap_status cpu_gemm_force(const char *name);

/* The measured choice's cache (gemm_cache.c): one line per CPU model, library version and
 * provider list. A missing, unreadable or corrupt cache reads as a miss; one that cannot be
 * written is left alone; neither is an error. */
typedef struct gemm_cache gemm_cache;
/* Opens the cache of this machine, creating its folder, and takes its lock (waiting a few
 * seconds at most: a process measuring holds it). NULL when there is no usable folder. */
gemm_cache *gemm_cache_open(const char *providers);
/* The cached choice for this machine and build, or NULL. */
const char *gemm_cache_lookup(gemm_cache *c);
/* Records `choice` with the measured times (text for a person); best effort. */
void gemm_cache_store(gemm_cache *c, const char *choice, const char *times);
/* Releases the lock and frees c. Accepts NULL. */
void gemm_cache_close(gemm_cache *c);
/* What the measured choices' caches share (this one and the convolutions', conv_cache.c): the
 * folder, created ($XDG_CACHE_HOME/pmap when absolute, else $HOME/.cache/pmap; -1 when there is
 * none); the CPU model from /proc/cpuinfo as printable text without tabs ("unknown" where the
 * system does not say); and the lock file `name` in dir, taken (waiting a few seconds at most
 * for a process that measures): its descriptor, which close() releases, or -1 without a lock. */
int gemm_cache_dir(char *out, size_t cap);
void gemm_cache_cpu_model(char *out, size_t cap);
int gemm_cache_lock(const char *dir, const char *name);

#endif
