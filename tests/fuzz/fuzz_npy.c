/* fuzz_npy.c: libFuzzer target for the tools' .npy reader (tools/npy.c): any bytes either parse
 * into an array whose element count matches its data, or fail with a message; never a crash. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tools/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  npy_array a;
  char msg[512];
  if (npy_parse(data, size, &a, msg, sizeof msg) == 0) {
    int64_t n = npy_numel(&a);
    volatile unsigned char sink = 0;
    for (int64_t i = 0; i < n * 4; i++) sink ^= ((const unsigned char *)a.data)[i];
    (void)sink;
    if (a.rank < 1 || a.rank > PMAP_MAX_RANK || (a.dtype != PMAP_F32 && a.dtype != PMAP_I32))
      abort();
    npy_free(&a);
  } else if (!memchr(msg, '\0', sizeof msg) || msg[0] == '\0' || a.data) {
    abort();
  }
  return 0;
}
