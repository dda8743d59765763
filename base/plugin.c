/* plugin.c: the core's side of the plugins (plugin.h): where a plugin file is looked for, its
 * opening (once per process; never closed) and the table of base/'s functions for it. */
#include "plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "env.h"
#include "error.h"

/* The install's library folder (where `meson install` puts libpmap.so and the plugins). */
#if !defined(PMAP_PLUGIN_LIBDIR)
#define PMAP_PLUGIN_LIBDIR ""
#endif

#define MAX_PLUGINS 4

const pmap_base_i pmap_base_table = {
    pmap_error_setv, pmap_error_trail, pmap_error_message, pmap_env_get,
    pmap_env_long,   pmap_env_flag,    pmap_env_choice,
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
typedef struct open_plugin {
  const char *file;
  void *handle;
} open_plugin;
static open_plugin open_plugins[MAX_PLUGINS];
static int n_open;

/* The folder of the file that holds this code, into dir; 0 when it cannot be told. */
static int own_folder(char *dir, size_t size) {
  Dl_info info;
  char exe[PATH_MAX];
  const char *path = NULL;
  if (dladdr((void *)(uintptr_t)own_folder, &info) && info.dli_fname && strchr(info.dli_fname, '/'))
    path = info.dli_fname;
  if (!path) { /* in the program itself (the static library), whose name dladdr may not give */
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return 0;
    exe[len] = '\0';
    path = exe;
  }
  const char *slash = strrchr(path, '/');
  int len = (int)(slash - path);
  if (len == 0) len = 1; /* "/" */
  return snprintf(dir, size, "%.*s", len, path) < (int)size;
}

/* Opens dir/file into *handle; 1 when the file is there (opened or not: *why says what the
 * loader said), 0 when it is not (the loader's reason in *why too). */
static int try_open(const char *dir, const char *file, int global, void **handle, char *why,
                    size_t size) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  *handle = dlopen(path, RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
  if (*handle) return 1;
  const char *err = dlerror();
  snprintf(why, size, "%s", err ? err : "unknown reason");
  return access(path, F_OK) == 0;
}

static void *find_open(const char *file) {
  for (int i = 0; i < n_open; i++)
    if (!strcmp(open_plugins[i].file, file)) return open_plugins[i].handle;
  return NULL;
}

int pmap_plugin_is_open(const char *file) {
  pthread_mutex_lock(&lock);
  int open = find_open(file) != NULL;
  pthread_mutex_unlock(&lock);
  return open;
}

/* Looks for file where plugin.h says, opens it into *handle or records why not. */
static pmap_status search(const char *file, int global, const char *what, void **handle) {
  char dirs[3][PATH_MAX];
  const char *labels[3];
  int n = 0;
  const char *env = pmap_env_get("PMAP_PLUGIN_DIR");
  if (env) {
    snprintf(dirs[n], sizeof dirs[n], "%s", env);
    labels[n++] = "$PMAP_PLUGIN_DIR";
  } else {
    if (own_folder(dirs[n], sizeof dirs[n])) labels[n++] = "beside libpmap";
    if (PMAP_PLUGIN_LIBDIR[0] && (n == 0 || strcmp(dirs[0], PMAP_PLUGIN_LIBDIR))) {
      snprintf(dirs[n], sizeof dirs[n], "%s", PMAP_PLUGIN_LIBDIR);
      labels[n++] = "the install's library folder";
    }
  }
  char tried[768] = "", why[512];
  size_t len = 0;
  for (int i = 0; i < n; i++) {
    int found = try_open(dirs[i], file, global, handle, why, sizeof why);
    if (*handle) return PMAP_SUCCESS;
    if (found)
      return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                      "%s needs the plugin %s, found in %s (%s) but it does not load: %s", what,
                      file, dirs[i], labels[i], why);
    if (len < sizeof tried)
      len += (size_t)snprintf(tried + len, sizeof tried - len, "%s%s (%s): %s", i ? "; " : "",
                              dirs[i], labels[i], why);
  }
  return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                  "%s needs the plugin %s, which is not in %s: %s (PMAP_PLUGIN_DIR names the "
                  "folder that holds it)",
                  what, file, n == 1 ? "the folder looked in" : "any of the folders looked in",
                  n ? tried : "no folder to look in");
}

pmap_status pmap_plugin_abi_check(const char *what, const char *file, uint64_t theirs,
                                  uint64_t ours) {
  if (theirs == ours) return PMAP_SUCCESS;
  return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                  "%s needs the plugin %s, whose copy here was built for another libpmap "
                  "(interface %016llx, this library %016llx): install the plugin of the same "
                  "build beside libpmap",
                  what, file, (unsigned long long)theirs, (unsigned long long)ours);
}

pmap_status pmap_plugin_symbol(const char *file, const char *symbol, int global, const char *what,
                               void **out) {
  *out = NULL;
  pthread_mutex_lock(&lock);
  void *handle = find_open(file);
  pmap_status st = PMAP_SUCCESS;
  if (!handle) {
    st = search(file, global, what, &handle);
    if (!st && n_open < MAX_PLUGINS) open_plugins[n_open++] = (open_plugin){file, handle};
  }
  pthread_mutex_unlock(&lock);
  if (st) return st;
  void *sym = dlsym(handle, symbol);
  if (!sym) {
    const char *err = dlerror();
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s needs the plugin %s, which has no %s: %s", what, file,
                    symbol, err ? err : "unknown reason");
  }
  *out = sym;
  return PMAP_SUCCESS;
}
