/* ops.c: the op backends of this build, by the name of the runtime backend they run on. A new
 * op backend is one folder and one entry here. */
#include <string.h>

#include "base/error.h"
#include "ops.h"

#if defined(PMAP_HAVE_CUDA)
extern const op_backend pmap_cuda_op_backend;
#endif

pmap_status ops_backend(const char *name, const char *call, const op_backend **out) {
  static const op_backend *const list[] = {
    &pmap_cpu_op_backend,
#if defined(PMAP_HAVE_CUDA)
    &pmap_cuda_op_backend,
#endif
  };
  for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
    if (strcmp(list[i]->name, name) != 0) continue;
    if (list[i]->ready) PMAP_TRY(list[i]->ready(call));
    *out = list[i];
    return PMAP_SUCCESS;
  }
  return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: no ops for backend %s in this build", call, name);
}
