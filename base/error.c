/* error.c: status strings and the thread-local last-error message. */
#include "error.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#define PMAP_ERROR_LEN 1024

static _Thread_local char last_error[PMAP_ERROR_LEN];

const char *pmap_status_string(pmap_status s) {
  switch (s) {
  case PMAP_SUCCESS: return "success";
  case PMAP_ERR_INVALID_ARGUMENT: return "invalid argument";
  case PMAP_ERR_OUT_OF_MEMORY: return "out of memory";
  case PMAP_ERR_UNAVAILABLE: return "unavailable";
  case PMAP_ERR_DEVICE: return "device error";
  case PMAP_ERR_TIMEOUT: return "timeout";
  case PMAP_ERR_ABORTED: return "aborted";
  case PMAP_ERR_INTERNAL: return "internal error";
  case PMAP_ERR_NUMERIC: return "non-finite numbers";
  }
  return "unknown status";
}

#define PMAP_STR2(x) #x
#define PMAP_STR(x) PMAP_STR2(x)
const char *pmap_version(void) {
  return PMAP_STR(PMAP_VERSION_MAJOR) "." PMAP_STR(PMAP_VERSION_MINOR) "." PMAP_STR(
      PMAP_VERSION_PATCH);
}

const char *pmap_last_error(void) { return last_error; }
const char *pmap_error_message(void) { return last_error; }
void pmap_error_clear(void) { last_error[0] = '\0'; }

/* Both on every job of a context (runtime/ctx.c): a copy, not a formatted print. */
void pmap_error_copy(const char *msg) {
  if (msg == last_error) return;
  size_t n = strnlen(msg, sizeof last_error - 1);
  memmove(last_error, msg, n);
  last_error[n] = '\0';
}

pmap_status pmap_error_named(pmap_status s, const char *call) {
  size_t lc = strlen(call);
  if (s == PMAP_SUCCESS || (strncmp(last_error, call, lc) == 0 && last_error[lc] == ':')) return s;
  if (lc + 2 >= sizeof last_error) return s;
  size_t n = strnlen(last_error, sizeof last_error - 1);
  if (n > sizeof last_error - 1 - (lc + 2)) n = sizeof last_error - 1 - (lc + 2); /* cut to fit */
  memmove(last_error + lc + 2, last_error, n);
  memcpy(last_error, call, lc);
  last_error[lc] = ':', last_error[lc + 1] = ' ', last_error[lc + 2 + n] = '\0';
  return s;
}

void pmap_error_save(char *buf, size_t size) {
  if (!size) return;
  size_t n = strnlen(last_error, size - 1);
  memcpy(buf, last_error, n);
  buf[n] = '\0';
}

pmap_status pmap_set_error(pmap_status status, const char *fmt, ...) {
  if (!fmt) {
    last_error[0] = '\0';
    return status;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return status;
}

pmap_status pmap_error_setv(pmap_status s, const char *fmt, va_list ap) {
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  return s;
}

pmap_status pmap_error_set(pmap_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pmap_error_setv(s, fmt, ap);
  va_end(ap);
  return s;
}

/* Source trails are for bugs: a user's error reads as the message alone, unless PMAP_DEBUG is
 * set in the environment. */
static int want_trail(pmap_status s) {
  static _Atomic int debug = -1;
  int d = atomic_load(&debug);
  if (d < 0) {
    const char *e = getenv("PMAP_DEBUG");
    d = e && *e && strcmp(e, "0") != 0;
    atomic_store(&debug, d);
  }
  return d || s == PMAP_ERR_INTERNAL;
}

pmap_status pmap_error_trail(pmap_status s, const char *file, int line, const char *func) {
  if (!want_trail(s)) return s;
  size_t len = strlen(last_error);
  if (len < sizeof last_error - 1)
    snprintf(last_error + len, sizeof last_error - len, " -> at %s:%d (%s)", file, line, func);
  return s;
}
