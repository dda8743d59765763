/* atomic_file.h: replacing a file atomically and durably (base/atomic_file.c). */
#ifndef PMAP_BASE_ATOMIC_FILE_H
#define PMAP_BASE_ATOMIC_FILE_H

#include <stddef.h>

#include "pmap.h"

/* Writes buf (n bytes) to path through a temporary file beside it, fsync, rename and an fsync of
 * the folder. A regular file already there keeps its permissions (a new one gets 0644); through
 * a symbolic link the file it names is replaced, the link stays. Failures are
 * PMAP_ERR_UNAVAILABLE (a device, FIFO, folder or socket at path, never replaced; a file we may
 * not write; the system's reason) or OUT_OF_MEMORY, in a message starting with `call`; the
 * previous file at path is then untouched. */
pmap_status atomic_file_write(const char *path, const unsigned char *buf, size_t n,
                              const char *call);

#endif
