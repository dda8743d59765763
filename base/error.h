/* error.h: recording failures. Every internal failure goes through pmap_error_set (a new error
 * with a message) or PMAP_TRY (passes an error up, adding "-> at file:line" to its trail). The
 * message lives in a thread-local buffer that pmap_last_error() returns. */
#ifndef PMAP_BASE_ERROR_H
#define PMAP_BASE_ERROR_H

#include <stdarg.h>

#include "pmap.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define PMAP_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define PMAP_PRINTF(f, a)
#endif

/* Records status s with a printf-style message on this thread; returns s. */
pmap_status pmap_error_set(pmap_status s, const char *fmt, ...) PMAP_PRINTF(2, 3);
/* pmap_error_set over a va_list (for the plugins' forwarders, base/plugin.h). */
pmap_status pmap_error_setv(pmap_status s, const char *fmt, va_list ap) PMAP_PRINTF(2, 0);
/* Appends " -> at file:line (func)" to this thread's message; returns s. */
pmap_status pmap_error_trail(pmap_status s, const char *file, int line, const char *func);
/* Clears this thread's message. */
void pmap_error_clear(void);
/* Copies msg into this thread's message (to move a worker's error to the caller). */
void pmap_error_copy(const char *msg);
/* For a public call returning status s from an internal one: puts "call: " before this thread's
 * message unless it already starts so (every message a caller sees names what it called). */
pmap_status pmap_error_named(pmap_status s, const char *call);
/* The thread's message into buf (size bytes, cut to fit), to give back with pmap_error_copy. */
void pmap_error_save(char *buf, size_t size);
const char *pmap_error_message(void);

#define PMAP_ERR(s, ...) pmap_error_set((s), __VA_ARGS__)

#define PMAP_TRY(expr)                                                    \
  do {                                                                    \
    pmap_status pmap_try_s_ = (expr);                                     \
    if (pmap_try_s_ != PMAP_SUCCESS)                                      \
      return pmap_error_trail(pmap_try_s_, __FILE__, __LINE__, __func__); \
  } while (0)

/* As PMAP_TRY, but stores the status in `st` and jumps to `label` for cleanup. */
#define PMAP_TRY_GOTO(st, expr, label)                      \
  do {                                                      \
    (st) = (expr);                                          \
    if ((st) != PMAP_SUCCESS) {                             \
      pmap_error_trail((st), __FILE__, __LINE__, __func__); \
      goto label;                                           \
    }                                                       \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
