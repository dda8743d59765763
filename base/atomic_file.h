/* atomic_file.h: replacing a file atomically and durably (base/atomic_file.c). */
#ifndef PMAP_BASE_ATOMIC_FILE_H
#define PMAP_BASE_ATOMIC_FILE_H

#include <stddef.h>

#include "pmap.h"

/* Writes buf (n bytes) to path through a temporary file beside it, fsync, rename and an fsync of
 * the folder. A regular file already there keeps its permissions (a new one gets 0644); through
 * a symbolic link the file it names is replaced, the link stays, and a link to a file that does
 * not exist yet has that file created (its folder must exist). Failures are
 * PMAP_ERR_UNAVAILABLE (a device, FIFO, folder or socket at path, never replaced; a file we may
 * not write; a link to nothing usable: a loop, a missing folder; the system's reason) or
 * OUT_OF_MEMORY, in a message starting with `call`; the previous file at path is then untouched. */
pmap_status atomic_file_write(const char *path, const unsigned char *buf, size_t n,
                              const char *call);

/* Whether atomic_file_write could write path now: the same checks, and the temporary file
 * created beside the file and removed at once; nothing else is written, nothing left behind.
 * Returns what atomic_file_write would (the failures above before any byte is written). */
pmap_status atomic_file_check(const char *path, const char *call);

#endif
