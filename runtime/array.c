/* array.c: the host array descriptor helpers of the public API. */
#include <string.h>

#include "pmap.h"

static pmap_array make(void *data, pmap_dtype dtype, int rank, const int64_t *shape) {
  pmap_array a;
  memset(&a, 0, sizeof a);
  a.data = data;
  a.dtype = dtype;
  a.rank = rank;
  for (int i = 0; shape && i < rank && i < PMAP_MAX_RANK; i++) a.shape[i] = shape[i];
  return a;
}

pmap_array pmap_array_f32(float *data, int rank, const int64_t *shape) {
  return make(data, PMAP_F32, rank, shape);
}

pmap_array pmap_array_i32(int32_t *data, int rank, const int64_t *shape) {
  return make(data, PMAP_I32, rank, shape);
}

int64_t pmap_array_numel(const pmap_array *a) {
  if (!a || a->rank < 1 || a->rank > PMAP_MAX_RANK) return 0;
  int64_t n = 1;
  int zero = 0; /* an extent of 0 makes the product 0, whatever the others multiply to */
  for (int i = 0; i < a->rank; i++) {
    if (a->shape[i] < 0) return -1;
    zero |= a->shape[i] == 0;
  }
  if (zero) return 0;
  for (int i = 0; i < a->rank; i++)
    if (__builtin_mul_overflow(n, a->shape[i], &n)) return -1;
  return n;
}
