/* atomic_file.h: replacing a file atomically and durably (base/atomic_file.c). */
#ifndef PMAP_BASE_ATOMIC_FILE_H
#define PMAP_BASE_ATOMIC_FILE_H

#include <stddef.h>

#include "pmap.h"

/* Writes buf (n bytes) to path through a temporary file beside it (mode 0644), fsync, rename and
 * an fsync of the folder. Failures are PMAP_ERR_UNAVAILABLE (or OUT_OF_MEMORY) with the system's
 * reason in a message starting with `call`; the previous file at path is then untouched. */
pmap_status atomic_file_write(const char *path, const unsigned char *buf, size_t n,
                              const char *call);

#endif
