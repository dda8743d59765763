/* context.h: running a job of the models on every device of a context, with the context's op
 * backend entered on the calling thread (models/context.c). */
#ifndef PMAP_MODELS_CONTEXT_H
#define PMAP_MODELS_CONTEXT_H

#include "ops/ops.h"
#include "pmap.h"

/* Runs fn(dev, arg) on every device of ctx, ob's enter and leave around device 0's work (it runs
 * on the calling thread). */
pmap_status models_dispatch(pmap_ctx *ctx, const op_backend *ob, pmap_fn fn, void *arg);

#endif
