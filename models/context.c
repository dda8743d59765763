/* context.c: pmap_ctx_create: the runtime's devices (runtime/ctx.c), then the op backend of
 * their kind made ready to run on them (ops/ops.c: the CPU chooses its GEMM here, while the
 * devices are idle, and a bad PMAP_GEMM fails the creation), so that every params made on the
 * context can run its ops; and models_dispatch, how every job of the models runs on the devices. */
#include <stdio.h>

#include "context.h"

#include "base/error.h"
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

typedef struct ops_job {
  pmap_fn fn;
  void *arg;
  const op_backend *ob;
} ops_job;

/* Device 0 runs on the caller's thread: the op backend's enter and leave around its work. */
static pmap_status ops_job_run(pmap_device *dev, void *arg) {
  const ops_job *j = arg;
  if (pmap_local_index(dev) != 0 || !j->ob->enter) return j->fn(dev, j->arg);
  int saved = j->ob->enter();
  pmap_status st = j->fn(dev, j->arg);
  j->ob->leave(saved);
  return st;
}

pmap_status models_dispatch(pmap_ctx *ctx, const op_backend *ob, pmap_fn fn, void *arg) {
  ops_job j = {fn, arg, ob};
  return pmap_ctx_dispatch(ctx, ops_job_run, &j);
}
