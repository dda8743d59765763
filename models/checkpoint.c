/* checkpoint.c: pmap_params_save and pmap_params_load: the whole training state between the
 * devices and a file of the format of checkpoint_format.c, written atomically (temporary file,
 * fsync, rename, fsync of the folder) and validated completely before any replica changes. */
#include <stdlib.h>
#include <string.h>

#include "base/atomic_file.h"
#include "base/error.h"
#include "base/trace.h"
#include "checkpoint.h"
#include "runtime/runtime.h"

/* The optimizer state a device holds: all of it, or (sharded) its part of each slot, slot s of
 * the part at r->opt + s * len; *lo is where the part starts in the whole. */
static void state_part(const pmap_params *p, int d, size_t *lo, size_t *len) {
  *lo = 0;
  *len = p->n_params;
  if (p->shard) params_part(p, params_global(p, d), lo, len);
}

/* A save's or load's job: the params and the host copies of their state. */
typedef struct ckpt_call {
  const pmap_params *p;
  ckpt_host h;
} ckpt_call;

static pmap_status download_job(pmap_device *dev, void *arg) {
  const ckpt_call *c = arg;
  const pmap_params *p = c->p;
  int d = pmap_local_index(dev);
  const replica *r = &p->rep[d];
  size_t P = p->n_params, lo = 0, len = 0;
  state_part(p, d, &lo, &len);
  /* Replicas are identical: device 0 speaks for all, and each device for its part of a sharded
   * optimizer state. */
  if (p->opt_slots && (p->shard || d == 0))
    for (int s = 0; s < p->opt_slots && len; s++)
      PMAP_TRY(backend_download(dev, c->h.opt + (size_t)s * P + lo, r->opt + (size_t)s * len,
                                len * sizeof(float)));
  if (d != 0) return PMAP_SUCCESS;
  return backend_download(dev, c->h.w, r->w, P * sizeof(float));
}

static pmap_status upload_job(pmap_device *dev, void *arg) {
  const ckpt_call *c = arg;
  const pmap_params *p = c->p;
  int d = pmap_local_index(dev);
  replica *r = &p->rep[d];
  size_t P = p->n_params, lo = 0, len = 0;
  state_part(p, d, &lo, &len);
  PMAP_TRY(backend_upload(dev, r->w, c->h.w, P * sizeof(float)));
  replica_w_changed(r);
  for (int s = 0; s < p->opt_slots && len; s++)
    PMAP_TRY(backend_upload(dev, r->opt + (size_t)s * len, c->h.opt + (size_t)s * P + lo,
                            len * sizeof(float)));
  return backend_sync(dev);
}

/* Host buffers for the parameters and the optimizer state (h->opt NULL without state). */
static pmap_status host_state(const pmap_params *p, ckpt_host *h, const char *call) {
  size_t P = p->n_params, S = (size_t)p->opt_slots * P;
  h->w = malloc(P * sizeof(float));
  h->opt = S ? malloc(S * sizeof(float)) : NULL;
  if (!h->w || (S && !h->opt)) {
    free(h->w);
    free(h->opt);
    h->w = h->opt = NULL;
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "%s: out of memory for %zu parameters and %zu "
                    "optimizer state values",
                    call, P, S);
  }
  return PMAP_SUCCESS;
}

static void host_state_free(ckpt_host *h) {
  free(h->w);
  free(h->opt);
  h->w = h->opt = NULL;
}

static pmap_status save(const pmap_params *cp, const char *path, const void *user,
                        size_t user_bytes, const char *call) {
  if (!cp || !path || (!user && user_bytes))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !cp     ? "params"
                    : !path ? "path"
                            : "user (with user_bytes > 0)");
  if (!*path) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: path is empty", call);
  pmap_params *p = (pmap_params *)cp; /* its jobs only read it */
  ckpt_call c = {p, {NULL, NULL}};
  PMAP_TRY(host_state(p, &c.h, call));
  pmap_status st = params_dispatch(p, download_job, &c);
  unsigned char *bytes = NULL;
  size_t n = 0;
  if (!st) st = ckpt_encode(p, &c.h, user, user_bytes, &bytes, &n, call);
  host_state_free(&c.h);
  if (!st) st = atomic_file_write(path, bytes, n, call);
  free(bytes);
  return st;
}

/* Under the context's lock, as every public call: two saves, or a save and a step, from two
 * threads run one after the other. */
static pmap_status save_locked(const pmap_params *cp, const char *path, const void *user,
                               size_t user_bytes, const char *call) {
  if (!cp) return save(cp, path, user, user_bytes, call);
  pmap_params *p = (pmap_params *)cp;
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_status st = params_mend(p, call);
  trace_rec *tr = runtime_trace(p->ctx);
  int64_t t0 = tr ? pmap_now_ns() : 0;
  if (!st) st = save(cp, path, user, user_bytes, call);
  if (tr)
    trace_span(tr, runtime_trace_caller(p->ctx), "checkpoint save", NULL, -1, "checkpoint", t0,
               pmap_now_ns(), -1);
  pmap_ctx_unlock(p->ctx);
  return st;
}

pmap_status pmap_params_save_user(const pmap_params *p, const char *path, const void *user,
                                  size_t user_bytes) {
  return save_locked(p, path, user, user_bytes, "pmap_params_save_user");
}

pmap_status pmap_params_save(const pmap_params *p, const char *path) {
  return save_locked(p, path, NULL, 0, "pmap_params_save");
}

pmap_status pmap_params_save_check(const char *path) {
  if (!path || !*path)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_params_save_check: path is %s",
                    path ? "empty" : "NULL");
  return atomic_file_check(path, "pmap_params_save_check");
}

static pmap_status load(pmap_params *p, const char *path, void *user, size_t user_cap,
                        size_t *user_bytes, int want_user) {
  const char *call = want_user ? "pmap_params_load_user" : "pmap_params_load";
  if (!p || !path || (want_user && !user && user_cap))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL", call,
                    !p      ? "params"
                    : !path ? "path"
                            : "user (with user_cap > 0)");
  ckpt_file f;
  PMAP_TRY(ckpt_read(p, path, call, &f));
  ckpt_call c = {p, {NULL, NULL}};
  pmap_status st = PMAP_SUCCESS;
  if (want_user && f.user_bytes > user_cap)
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: \"%s\" holds a user section of %zu bytes; the buffer holds %zu", call, path,
                  f.user_bytes, user_cap);
  if (!st) st = host_state(p, &c.h, call);
  /* The policy the state was trained under comes back with it, before any replica changes (a
   * failure to make its buffers changes nothing). */
  if (!st) st = params_precision_set(p, f.precision, call);
  if (!st) {
    ckpt_decode(p, &f, &c.h);
    st = params_dispatch(p, upload_job, &c);
  }
  host_state_free(&c.h);
  if (!st) {
    p->step = f.step;
    if (want_user && f.user_bytes) memcpy(user, f.user, f.user_bytes);
    if (want_user && user_bytes) *user_bytes = f.user_bytes;
  }
  ckpt_file_free(&f);
  return st;
}

/* Under the context's lock; a load sets every replica whole, so it also ends a torn step. */
static pmap_status load_locked(pmap_params *p, const char *path, void *user, size_t user_cap,
                               size_t *user_bytes, int want_user) {
  if (!p) return load(p, path, user, user_cap, user_bytes, want_user);
  PMAP_TRY(pmap_ctx_lock(p->ctx, want_user ? "pmap_params_load_user" : "pmap_params_load"));
  pmap_status st = load(p, path, user, user_cap, user_bytes, want_user);
  if (!st) p->torn = 0;
  pmap_ctx_unlock(p->ctx);
  return st;
}

pmap_status pmap_params_load(pmap_params *p, const char *path) {
  return load_locked(p, path, NULL, 0, NULL, 0);
}

pmap_status pmap_params_load_user(pmap_params *p, const char *path, void *user, size_t user_cap,
                                  size_t *user_bytes) {
  return load_locked(p, path, user, user_cap, user_bytes, 1);
}
