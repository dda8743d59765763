/* plugin.h: backends in shared objects of their own (libpmap-cuda.so, libpmap-mpi.so), opened
 * when a context first needs one, so that libpmap.so loads without CUDA or MPI. The core opens
 * a plugin here and hands its entry point tables of the few core functions the plugin's code
 * calls; inside the plugin, functions of the same names forward to them (base/plugin_base.c for
 * base/'s; the plugin's own file for the rest), so its code calls them as if linked with them.
 * Usable from C and CUDA C++. */
#ifndef PMAP_BASE_PLUGIN_H
#define PMAP_BASE_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "pmap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A plugin exports its entry points and nothing else (a version script makes the rest local). */
#if defined(__GNUC__)
#define PMAP_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define PMAP_PLUGIN_EXPORT
#endif

/* The plugin files, looked for beside libpmap.so (see pmap_plugin_symbol). */
#define PMAP_PLUGIN_CUDA "libpmap-cuda.so"
#define PMAP_PLUGIN_MPI "libpmap-mpi.so"

/* base/'s functions that plugins call, as the core hands them over. */
typedef struct pmap_base_i {
  pmap_status (*error_setv)(pmap_status s, const char *fmt, va_list ap);
  pmap_status (*error_trail)(pmap_status s, const char *file, int line, const char *func);
  const char *(*error_message)(void);
  const char *(*env_get)(const char *name);
  pmap_status (*env_long)(const char *name, long lo, long hi, long dflt, long *out);
  pmap_status (*env_flag)(const char *name, int dflt, int *out);
  pmap_status (*env_choice)(const char *name, const char *const *names, int dflt, int *out);
} pmap_base_i;

/* What an entry point and its caller compare before anything else: pmap's version and the sizes
 * of the structs they share (n of them), mixed into one number. A plugin from another build
 * (another version, or structs laid out otherwise) is refused instead of misread. */
static inline uint64_t pmap_plugin_abi(const size_t *sizes, int n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  uint64_t v[4] = {PMAP_VERSION_MAJOR, PMAP_VERSION_MINOR, PMAP_VERSION_PATCH, (uint64_t)n};
  for (int i = 0; i < 4 + n; i++) {
    h ^= i < 4 ? v[i] : (uint64_t)sizes[i - 4];
    h *= 1099511628211ull;
  }
  return h;
}

/* The core's side (base/plugin.c). */

/* The core's base/ functions, for plugins' entry points. */
extern const pmap_base_i pmap_base_table;

/* The address of entry point `symbol` of plugin `file`, opening the plugin the first time (with
 * RTLD_GLOBAL when global: Open MPI's own components need libmpi's symbols global). The file is
 * looked for in $PMAP_PLUGIN_DIR alone when that is set; else in the folder of the file that
 * holds this code (libpmap.so, or a program linked with the static library), then in the
 * install's library folder. A plugin that is found but does not load stops the search.
 * PMAP_ERR_UNAVAILABLE when it cannot be had: "<what> needs the plugin <file>: " then each path
 * tried with the loader's reason (dlerror). Plugins are never closed. Thread-safe. */
pmap_status pmap_plugin_symbol(const char *file, const char *symbol, int global, const char *what,
                               void **out);
/* A plugin's entry point answered interface `theirs` where this library has `ours`: PMAP_SUCCESS
 * when they are equal, else PMAP_ERR_UNAVAILABLE naming the plugin file and both numbers (it was
 * built for another libpmap). */
pmap_status pmap_plugin_abi_check(const char *what, const char *file, uint64_t theirs,
                                  uint64_t ours);
/* Whether plugin `file` is already open in this process. */
int pmap_plugin_is_open(const char *file);

/* The plugin's side (base/plugin_base.c, linked into every plugin). */

/* Points the plugin's base/ functions at the core's; every entry point calls it first. */
void pmap_plugin_bind_base(const pmap_base_i *base);

#ifdef __cplusplus
}
#endif
#endif
