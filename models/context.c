/* context.c: pmap_ctx_create: the runtime's devices (runtime/ctx.c), then the op backend of
 * their kind made ready to run on them (ops/ops.c: the CPU chooses its GEMM here, while the
 * devices are idle, and a bad PMAP_GEMM fails the creation), so that every params made on the
 * context can run its ops. */
#include <stdio.h>

#include "base/error.h"
#include "ops/ops.h"
#include "runtime/runtime.h"

pmap_status pmap_ctx_create(const pmap_config *cfg, pmap_ctx **out) {
  if (!out) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_ctx_create: out is NULL");
  pmap_ctx *ctx = NULL;
  PMAP_TRY(runtime_ctx_create(cfg, &ctx));
  const op_backend *ob = NULL;
  pmap_status st = ops_backend(pmap_backend_name(pmap_ctx_backend(ctx)), "pmap_ctx_create", &ob);
  if (st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pmap_last_error());
    (void)pmap_ctx_destroy(ctx);
    return pmap_error_set(st, "%s", msg);
  }
  *out = ctx;
  return PMAP_SUCCESS;
}
