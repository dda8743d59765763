/* cpu_cache.h: what the CPU kernels make once per shape and keep (oneDNN's convolution
 * primitives), with the workspace they share: one cache per op queue, freed with it, and one per
 * thread for the kernels called without a queue (tests, host replicas), freed when the thread
 * ends. A cache is used by one thread at a time (a queue's ops run in order on its device's
 * thread, or on the caller's for device 0), so it takes no lock. */
#ifndef PMAP_CPU_CACHE_H
#define PMAP_CPU_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_ops.h"

/* What an entry is made for; compared byte for byte, so a key is built from a zeroed struct. */
typedef enum cpu_cache_kind { CPU_CACHE_CONV = 1 } cpu_cache_kind;
typedef struct cpu_cache_key {
  int32_t kind;     /* cpu_cache_kind */
  int32_t dtype;    /* the computation's element type (pmap_dtype: PMAP_F32 today) */
  int32_t flags;    /* the kind's variant (conv: with a bias) */
  int32_t unused;   /* 0 */
  int64_t dims[14]; /* the kind's sizes (conv: the shape and the batch) */
} cpu_cache_key;

typedef struct cpu_cache cpu_cache;

/* Entries past this many evict the least recently used (a program that predicts with many
 * batch sizes must not grow without bound). */
#define CPU_CACHE_ENTRIES 64

cpu_cache *cpu_cache_create(void);    /* NULL when out of memory */
void cpu_cache_destroy(cpu_cache *c); /* frees every entry and the workspace; accepts NULL */
/* The cache of queue q, or this thread's when q is NULL (made at its first use); NULL when out
 * of memory. */
cpu_cache *cpu_cache_of(op_queue *q);
/* The CPU op queue, made and freed with its cache by cpu_queue.c; declared here so that finding
 * a queue's cache calls nothing in the file that makes queues (it calls the kernels). */
struct op_queue {
  int device;
  cpu_cache *cache; /* the primitives its convolutions made, and their workspace */
  void *ws;         /* its bf16 GEMMs' workspace (op_backend.gemm16_set_workspace), of */
  size_t ws_bytes;  /* bytes (NULL, 0: none) */
};

/* The entry kept under key, now the most recently used; NULL when there is none. */
void *cpu_cache_find(cpu_cache *c, const cpu_cache_key *key);
/* Keeps entry under key (no entry under it yet); destroy(entry) frees it when it is evicted or
 * the cache destroyed. On PMAP_ERR_OUT_OF_MEMORY it frees entry at once. */
pmap_status cpu_cache_add(cpu_cache *c, const cpu_cache_key *key, void *entry,
                          void (*destroy)(void *entry));
/* *out = at least `bytes` of scratch, 64-byte aligned, shared by every entry of c: valid until
 * the next call asks for more. It grows only when asked for more than ever before (an entry's
 * first use), so the steady state allocates nothing. PMAP_ERR_OUT_OF_MEMORY naming `what`. */
pmap_status cpu_cache_workspace(cpu_cache *c, size_t bytes, const char *what, void **out);
/* The bytes c's workspace holds now (0 before its first use), for the test of its bound. */
size_t cpu_cache_workspace_bytes(const cpu_cache *c);

#endif
