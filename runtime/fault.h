/* fault.h: fault injection for tests, from the environment variable PMAP_FAULT, read when a
 * context is created:  kind[:device=K][:step=S][:after=A]
 *   alloc       the A-th (default 0: first) device allocation of device K fails (out of memory)
 *   collective  device K's gradient all-reduce in update step S fails (device error)
 *   stall       device K stalls before that all-reduce until the others give up (timeout)
 *   nan         device K's local gradients of step S become NaN (the numeric guard's case)
 *   drift       device K's replica is perturbed (one parameter, one ulp) after step S
 *   gather      device K's all-gather of the parameters (sharded optimizer) in step S fails
 *               (device error), and so do the next A attempts to complete it (default 0)
 * Each fault but gather fires once. device defaults to 0 and step to the first step that reaches
 * the hook. Each key at most once; after only for alloc and gather, step for all but alloc;
 * gather only where an optimizer can be sharded (refused otherwise: it would never fire). Steps count from 1: step S is the S-th update (pmap_params_step() is S - 1 before
 * it), as in pmap's messages and traces.
 * K is a global device index, as every device index: across processes process p holds devices
 * p * D .. p * D + D - 1, and only that process's device fires. Without PMAP_FAULT the hooks
 * cost one NULL test. */
#ifndef PMAP_RUNTIME_FAULT_H
#define PMAP_RUNTIME_FAULT_H

#include <stdint.h>

#include "pmap.h"

typedef enum fault_kind {
  FAULT_ALLOC,
  FAULT_COLLECTIVE,
  FAULT_STALL,
  FAULT_NAN,
  FAULT_DRIFT,
  FAULT_GATHER,
} fault_kind;

typedef struct pmap_fault pmap_fault;

/* Parses spec (NULL or "" : no fault, *out NULL); PMAP_ERR_INVALID_ARGUMENT naming the text. */
pmap_status pmap_fault_parse(const char *spec, pmap_fault **out);
void pmap_fault_free(pmap_fault *f); /* accepts NULL */
/* Binds f (may be NULL) to this process of a context of nproc processes of n devices: K must be
 * a global device index below nproc * n, and a gather fault needs a context that may shard the
 * optimizer (more than one device, one process, shard_off 0: not PMAP_SHARD_OFF);
 * PMAP_ERR_INVALID_ARGUMENT otherwise, since the fault would never fire. The hooks then take
 * the local index, and a K of another process never fires here. */
pmap_status pmap_fault_bind(pmap_fault *f, int n, int proc, int nproc, int shard_off);
/* Whether f (may be NULL) is a fault of that kind. */
int pmap_fault_is(const pmap_fault *f, fault_kind kind);
/* Whether fault `kind` fires now on device `device` at update step `step` (-1: not a step hook,
 * e.g. an allocation). Fires at most once. f may be NULL. */
int pmap_fault_fires(pmap_fault *f, fault_kind kind, int device, int64_t step);

#endif
