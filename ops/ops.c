/* ops.c: the op backends of this build, by the name of the runtime backend they run on: built
 * in (the CPU), or given by a plugin's entry point the first time they are asked for (CUDA: the
 * same plugin file as the runtime's CUDA backend, base/plugin.h). A new op backend is one folder
 * and one entry here. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "ops.h"

typedef struct ops_entry {
  const char *name;
  const op_backend *builtin; /* NULL for a plugin's */
  const char *plugin;        /* the plugin file, NULL when built in */
  const char *entry;         /* the name of its op_plugin_entry */
} ops_entry;

static const ops_entry list[] = {
    {"cpu", &pmap_cpu_op_backend, NULL, NULL},
#if defined(PMAP_HAVE_CUDA)
    {"cuda", NULL, PMAP_PLUGIN_CUDA, "pmap_cuda_ops_entry"},
#endif
};

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static const op_backend *_Atomic loaded[sizeof list / sizeof list[0]];

/* The op backend of list[i], from its plugin's entry point the first time. */
static pmap_status load(size_t i, const char *call, const op_backend **out) {
  const ops_entry *e = &list[i];
  if (e->builtin || !e->plugin) { /* built in, or (never) neither */
    *out = e->builtin;
    return e->builtin
               ? PMAP_SUCCESS
               : PMAP_ERR(PMAP_ERR_INTERNAL, "%s: the %s op backend has no code", call, e->name);
  }
  pthread_mutex_lock(&load_lock);
  pmap_status st = PMAP_SUCCESS;
  if (!atomic_load(&loaded[i])) {
    char what[64];
    snprintf(what, sizeof what, "%s: the %s op backend", call, e->name);
    void *sym = NULL;
    st = pmap_plugin_symbol(e->plugin, e->entry, 0, what, &sym);
    if (!st) {
      op_plugin_entry entry;
      memcpy(&entry, &sym, sizeof entry); /* dlsym's data pointer to a function's */
      const op_backend *ob = NULL;
      uint64_t theirs = entry(op_plugin_abi(), &pmap_base_table, &ob);
      st = pmap_plugin_abi_check(what, e->plugin, theirs, op_plugin_abi());
      if (!st && !ob)
        st = PMAP_ERR(PMAP_ERR_INTERNAL, "%s: the plugin %s gave no ops", what, e->plugin);
      else if (!st)
        atomic_store(&loaded[i], ob);
    }
  }
  pthread_mutex_unlock(&load_lock);
  *out = atomic_load(&loaded[i]);
  return st;
}

pmap_status ops_backend(const char *name, const char *call, const op_backend **out) {
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
    if (strcmp(list[i].name, name) != 0) continue;
    const op_backend *ob = NULL;
    PMAP_TRY(load(i, call, &ob));
    if (ob->ready) PMAP_TRY(ob->ready(call));
    *out = ob;
    return PMAP_SUCCESS;
  }
  return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: no ops for backend %s in this build", call, name);
}
