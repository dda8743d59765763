/* cpu_cache.c: the CPU kernels' caches of per-shape objects (cpu_cache.h): a short list in
 * order of use, and one workspace that grows to the largest request. */
#include "cpu_cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

typedef struct cache_entry {
  cpu_cache_key key;
  void *entry;
  void (*destroy)(void *entry);
  struct cache_entry *next; /* the next less recently used */
} cache_entry;

struct cpu_cache {
  cache_entry *head; /* the most recently used first */
  int count;
  void *work;
  size_t work_cap;
};

cpu_cache *cpu_cache_create(void) { return calloc(1, sizeof(cpu_cache)); }

void cpu_cache_destroy(cpu_cache *c) {
  if (!c) return;
  for (cache_entry *e = c->head, *next; e; e = next) {
    next = e->next;
    e->destroy(e->entry);
    free(e);
  }
  free(c->work);
  free(c);
}

void *cpu_cache_find(cpu_cache *c, const cpu_cache_key *key) {
  for (cache_entry **at = &c->head; *at; at = &(*at)->next) {
    cache_entry *e = *at;
    if (memcmp(&e->key, key, sizeof *key) != 0) continue;
    *at = e->next; /* to the front */
    e->next = c->head;
    c->head = e;
    return e->entry;
  }
  return NULL;
}

pmap_status cpu_cache_add(cpu_cache *c, const cpu_cache_key *key, void *entry,
                          void (*destroy)(void *entry)) {
  cache_entry *e = malloc(sizeof *e);
  if (!e) {
    destroy(entry);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "out of memory for a CPU kernel's cache entry");
  }
  *e = (cache_entry){.key = *key, .entry = entry, .destroy = destroy, .next = c->head};
  c->head = e;
  if (++c->count <= CPU_CACHE_ENTRIES) return PMAP_SUCCESS;
  cache_entry **last = &c->head; /* evict the least recently used, never the new one */
  while ((*last)->next) last = &(*last)->next;
  cache_entry *old = *last;
  *last = NULL;
  old->destroy(old->entry);
  free(old);
  c->count--;
  return PMAP_SUCCESS;
}

pmap_status cpu_cache_workspace(cpu_cache *c, size_t bytes, const char *what, void **out) {
  if (bytes > c->work_cap) {
    size_t cap = (bytes + 63) / 64 * 64;
    void *p = cap >= bytes ? aligned_alloc(64, cap) : NULL;
    if (!p)
      return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory for a workspace of %zu bytes",
                      what, bytes);
    free(c->work);
    c->work = p;
    c->work_cap = cap;
  }
  *out = c->work;
  return PMAP_SUCCESS;
}

size_t cpu_cache_workspace_bytes(const cpu_cache *c) { return c ? c->work_cap : 0; }

/* The caches of threads that call the kernels without a queue, freed when the thread ends. */
static pthread_key_t thread_key;
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;
static int thread_key_ok;

static void thread_cache_free(void *c) { cpu_cache_destroy(c); }
static void thread_key_make(void) {
  thread_key_ok = pthread_key_create(&thread_key, thread_cache_free) == 0;
}

cpu_cache *cpu_cache_of(op_queue *q) {
  if (q) return q->cache;
  pthread_once(&thread_once, thread_key_make);
  if (!thread_key_ok) return NULL;
  cpu_cache *c = pthread_getspecific(thread_key);
  if (c) return c;
  c = cpu_cache_create();
  if (c && pthread_setspecific(thread_key, c) != 0) {
    cpu_cache_destroy(c);
    c = NULL;
  }
  return c;
}
