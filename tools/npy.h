/* npy.h: a small, strict reader of NumPy .npy files (format versions 1.0, 2.0, 3.0) for the
 * command-line programs: little-endian f4, f8, i4 or i8, C order, rank 1..4; f8 is converted to
 * f32 and i8 to i32 once, on load. Anything else is a clear error, never a crash. */
#ifndef PMAP_TOOLS_NPY_H
#define PMAP_TOOLS_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "pmap.h"

typedef struct npy_array {
  void *data; /* owned: float (PMAP_F32) or int32_t (PMAP_I32), shape's element count */
  pmap_dtype dtype;
  int rank;
  int64_t shape[PMAP_MAX_RANK];
  char descr[8]; /* the file's dtype, e.g. "<f8" */
} npy_array;

/* Parses a whole .npy image of len bytes into *out (which owns its data on success). On error
 * returns -1 with a message (naming what is wrong and where) in msg, and *out empty. */
int npy_parse(const unsigned char *buf, size_t len, npy_array *out, char *msg, size_t msg_size);
/* Reads and parses the file at path; a file over max_bytes is refused. */
int npy_load(const char *path, size_t max_bytes, npy_array *out, char *msg, size_t msg_size);
void npy_free(npy_array *a); /* accepts NULL and empty arrays */

/* Elements of a (the product of its shape). */
int64_t npy_numel(const npy_array *a);

#endif
