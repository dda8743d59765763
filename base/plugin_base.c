/* plugin_base.c: inside a plugin (base/plugin.h), base/'s functions that its code calls, under
 * their own names, forwarded to the core's: the message a plugin records is the one
 * pmap_last_error() of libpmap returns, and the environment is read by the core's one reader.
 * Linked into every plugin, never into libpmap. */
#include <stdatomic.h>

#include "env.h"
#include "error.h"
#include "plugin.h"

/* Set by the first entry point called, before any other code of the plugin runs. */
static const pmap_base_i *_Atomic core;

void pmap_plugin_bind_base(const pmap_base_i *base) { atomic_store(&core, base); }

pmap_status pmap_error_setv(pmap_status s, const char *fmt, va_list ap) {
  return atomic_load(&core)->error_setv(s, fmt, ap);
}

pmap_status pmap_error_set(pmap_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  s = atomic_load(&core)->error_setv(s, fmt, ap);
  va_end(ap);
  return s;
}

pmap_status pmap_error_trail(pmap_status s, const char *file, int line, const char *func) {
  return atomic_load(&core)->error_trail(s, file, line, func);
}

const char *pmap_error_message(void) { return atomic_load(&core)->error_message(); }
const char *pmap_last_error(void) { return atomic_load(&core)->error_message(); }

const char *pmap_env_get(const char *name) { return atomic_load(&core)->env_get(name); }

pmap_status pmap_env_long(const char *name, long lo, long hi, long dflt, long *out) {
  return atomic_load(&core)->env_long(name, lo, hi, dflt, out);
}

pmap_status pmap_env_flag(const char *name, int dflt, int *out) {
  return atomic_load(&core)->env_flag(name, dflt, out);
}

pmap_status pmap_env_choice(const char *name, const char *const *names, int dflt, int *out) {
  return atomic_load(&core)->env_choice(name, names, dflt, out);
}
