/* precision.c: the parameters' side of the bf16 policy (docs/precision.md): the precision names,
 * pmap_params_set_precision and its replicas' bfloat16 weights (what the layers call to run
 * their GEMMs under either policy is layer_gemm.c's; the model's layout under it model.c's). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "params.h"
#include "runtime/runtime.h"

const char *pmap_precision_name(pmap_precision p) {
  return p == PMAP_PRECISION_FP32 ? "fp32" : p == PMAP_PRECISION_BF16 ? "bf16" : NULL;
}

pmap_status pmap_precision_parse(const char *name, pmap_precision *out) {
  if (!out) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_precision_parse: out is NULL");
  if (name && strcmp(name, "fp32") == 0) {
    *out = PMAP_PRECISION_FP32;
  } else if (name && strcmp(name, "bf16") == 0) {
    *out = PMAP_PRECISION_BF16;
  } else {
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_precision_parse: \"%s\" is no precision (fp32 or bf16)",
                    name ? name : "(null)");
  }
  return PMAP_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ */
/* pmap_params_set_precision                                                                  */

typedef struct precision_call {
  pmap_params *p;
  int bf16;
  pmap_bf16 **fresh; /* (D) the new bfloat16 weights of each device (bf16) */
  int commit;        /* 0: allocate fresh; 1: swap them in */
} precision_call;

static pmap_status precision_job(pmap_device *dev, void *arg) {
  precision_call *c = arg;
  pmap_params *p = c->p;
  int d = pmap_local_index(dev);
  replica *r = &p->rep[d];
  if (!c->commit) {
    /* The activations go first (their layout changes anyway: the next step sizes them anew), so
     * that the switch never holds them and the new copy at once: under pmap_config.max_memory
     * it fits wherever a step at either precision does. */
    replica_release(dev, r);
    void *w16 = NULL;
    PMAP_TRY(backend_alloc(dev, p->n_params * sizeof(pmap_bf16), &w16));
    c->fresh[d] = w16;
    return PMAP_SUCCESS;
  }
  /* The arena's layout changes: the next step sizes it anew. */
  replica_release(dev, r);
  backend_free(dev, r->w16);
  r->w16 = c->bf16 ? c->fresh[d] : NULL;
  replica_w_changed(r);
  return PMAP_SUCCESS;
}

static pmap_status free_job(pmap_device *dev, void *arg) {
  precision_call *c = arg;
  backend_free(dev, c->fresh[pmap_local_index(dev)]);
  return PMAP_SUCCESS;
}

pmap_status params_precision_set(pmap_params *p, pmap_precision precision, const char *call) {
  if (precision == p->precision) return PMAP_SUCCESS;
  precision_call c = {p, precision == PMAP_PRECISION_BF16, NULL, 0};
  c.fresh = calloc((size_t)p->n, sizeof *c.fresh);
  if (!c.fresh) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  pmap_status st = c.bf16 ? params_dispatch(p, precision_job, &c) : PMAP_SUCCESS;
  if (st) { /* nothing changed: what was allocated goes, the message stays */
    char msg[1024];
    pmap_error_save(msg, sizeof msg);
    (void)params_dispatch(p, free_job, &c);
    pmap_error_copy(msg);
  } else {
    c.commit = 1;
    st = params_dispatch(p, precision_job, &c);
    model_set_precision(p->model, c.bf16);
    p->precision = precision;
  }
  free(c.fresh);
  return st;
}

pmap_status pmap_params_set_precision(pmap_params *p, pmap_precision precision) {
  const char *call = "pmap_params_set_precision";
  if (!p) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: params is NULL", call);
  if (precision != PMAP_PRECISION_FP32 && precision != PMAP_PRECISION_BF16)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: precision %d is neither PMAP_PRECISION_FP32 (0) nor PMAP_PRECISION_BF16 "
                    "(1)",
                    call, (int)precision);
  if (p->grad_fn && precision != PMAP_PRECISION_FP32)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: params of pmap_params_create_custom compute their own gradients; the "
                    "precision policy is that of the built-in layers",
                    call);
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_status st = params_mend(p, call);
  if (!st) st = params_precision_set(p, precision, call);
  pmap_ctx_unlock(p->ctx);
  return st;
}

pmap_precision pmap_params_precision(const pmap_params *p) {
  return p ? p->precision : PMAP_PRECISION_FP32;
}
