/* coll.c: the public face of mapped functions: axis queries, device memory and collectives.
 * Each collective is validated here, then every device meets the others at a rendezvous that
 * checks they all called the same collective with the same count and root (runtime/backend.c),
 * then the context's backend runs it. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "base/error.h"

int pmap_axis_index(const pmap_device *dev) {
  return dev ? dev->ctx->proc * dev->ctx->n + dev->index : -1;
}
int pmap_axis_size(const pmap_device *dev) { return dev ? dev->ctx->nproc * dev->ctx->n : 0; }
int pmap_local_index(const pmap_device *dev) { return dev ? dev->index : -1; }
int pmap_process_index(const pmap_device *dev) { return dev ? dev->ctx->proc : -1; }

void *pmap_device_stream(pmap_device *dev) {
  return dev && dev->ctx->be->native ? dev->ctx->be->native(dev, 0) : NULL;
}

void *pmap_device_blas(pmap_device *dev) {
  return dev && dev->ctx->be->native ? dev->ctx->be->native(dev, 1) : NULL;
}

pmap_status pmap_device_alloc(pmap_device *dev, size_t count, float **out) {
  char name[160];
  if (!dev || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_device_alloc: %s is NULL",
                    dev ? "out" : "dev");
  *out = NULL;
  if (count > PTRDIFF_MAX / sizeof(float))
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "pmap_device_alloc: %zu floats on %s is more than the address space holds",
                    count, pmap_dev_name(dev, name, sizeof name));
  void *p = NULL;
  pmap_status st = backend_alloc(dev, count * sizeof(float), &p);
  if (st) return pmap_error_named(st, "pmap_device_alloc");
  *out = p;
  return PMAP_SUCCESS;
}

void pmap_device_free(pmap_device *dev, float *ptr) {
  if (dev) backend_free(dev, ptr);
}

static pmap_status check_copy(const char *call, pmap_device *dev, const void *dst, const void *src,
                              size_t count) {
  char name[160];
  if (!dev) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: dev is NULL", call);
  if (count > PTRDIFF_MAX / sizeof(float))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: count %zu floats on %s is too large", call,
                    count, pmap_dev_name(dev, name, sizeof name));
  if (count && (!dst || !src))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL with count %zu on %s", call,
                    dst ? "src" : "dst", count, pmap_dev_name(dev, name, sizeof name));
  return PMAP_SUCCESS;
}

pmap_status pmap_device_upload(pmap_device *dev, float *dst, const float *src, size_t count) {
  pmap_status st = check_copy("pmap_device_upload", dev, dst, src, count);
  if (st || !count) return st;
  st = backend_upload(dev, dst, src, count * sizeof(float));
  if (!st) st = backend_sync(dev);
  return pmap_error_named(st, "pmap_device_upload");
}

pmap_status pmap_device_download(pmap_device *dev, float *dst, const float *src, size_t count) {
  pmap_status st = check_copy("pmap_device_download", dev, dst, src, count);
  if (st || !count) return st;
  return pmap_error_named(backend_download(dev, dst, src, count * sizeof(float)),
                          "pmap_device_download");
}

/* Whether [a, a + na) and [b, b + nb) share an element. */
static int overlap(const float *a, size_t na, const float *b, size_t nb) {
  uintptr_t a0 = (uintptr_t)a, a1 = a0 + na * sizeof *a, b0 = (uintptr_t)b,
            b1 = b0 + nb * sizeof *b;
  return a0 < b1 && b0 < a1;
}

/* Whether `count` floats, `times` times over (all_gather's recv holds one count per device),
 * fit an object: the bytes of a count past PTRDIFF_MAX would wrap. */
static pmap_status check_count(const char *call, pmap_device *dev, size_t count, size_t times) {
  if (count <= PTRDIFF_MAX / sizeof(float) / times) return PMAP_SUCCESS;
  char name[160];
  if (times > 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: count %zu on %s: recv (%zu x %zu floats) would take more bytes than an "
                    "object can hold (at most %td)",
                    call, count, pmap_dev_name(dev, name, sizeof name), times, count,
                    (ptrdiff_t)PTRDIFF_MAX);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: count %zu on %s: that many floats take more bytes than an object can hold "
                  "(at most %td)",
                  call, count, pmap_dev_name(dev, name, sizeof name), (ptrdiff_t)PTRDIFF_MAX);
}

/* send (count) and recv (recv_count) must be non-NULL, and either the in-place layout (send ==
 * in_place) or apart: a partial overlap would be read and written at once. The counts are
 * checked first (check_count), so the byte ranges compared here do not wrap. */
static pmap_status check_coll(const char *call, pmap_device *dev, const float *send,
                              const float *recv, size_t count, size_t recv_count,
                              const float *in_place) {
  char name[160];
  if (!dev) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: dev is NULL", call);
  PMAP_TRY(check_count(call, dev, count, 1));
  if (count && (!send || !recv))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s is NULL with count %zu on %s", call,
                    send ? "recv" : "send", count, pmap_dev_name(dev, name, sizeof name));
  if (count && send != in_place && overlap(send, count, recv, recv_count))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: send and recv overlap on %s without being in place (in place "
                    "means send == recv%s)",
                    call, pmap_dev_name(dev, name, sizeof name),
                    in_place == recv ? "" : " + axis_index * count");
  return PMAP_SUCCESS;
}

/* A backend's collective may only be queued (CUDA: stream-ordered, so that a training step
 * waits once); a public one has completed, or failed, when it returns. */
static pmap_status finish(pmap_device *dev) { return backend_sync(dev); }

static pmap_status reduce(const char *call, pmap_device *dev, const float *send, float *recv,
                          size_t count, pmap_redop op) {
  pmap_status st = check_coll(call, dev, send, recv, count, count, recv);
  if (st) return st;
  PMAP_TRY(backend_all_reduce(dev, call, send, recv, count, op));
  return finish(dev);
}

pmap_status pmap_psum(pmap_device *dev, const float *send, float *recv, size_t count) {
  return reduce("pmap_psum", dev, send, recv, count, PMAP_RED_SUM);
}

pmap_status pmap_pmean(pmap_device *dev, const float *send, float *recv, size_t count) {
  return reduce("pmap_pmean", dev, send, recv, count, PMAP_RED_MEAN);
}

pmap_status pmap_pmax(pmap_device *dev, const float *send, float *recv, size_t count) {
  return reduce("pmap_pmax", dev, send, recv, count, PMAP_RED_MAX);
}

pmap_status pmap_all_gather(pmap_device *dev, const float *send, float *recv, size_t count) {
  const char *call = "pmap_all_gather";
  if (!dev) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: dev is NULL", call);
  size_t n = (size_t)pmap_axis_size(dev);
  PMAP_TRY(check_count(call, dev, count, n));
  pmap_status st = check_coll(call, dev, send, recv, count, count * n,
                              recv ? recv + count * (size_t)pmap_axis_index(dev) : NULL);
  if (st) return st;
  PMAP_TRY(backend_all_gather(dev, "pmap_all_gather", send, recv, count));
  return finish(dev);
}

pmap_status pmap_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                           int root) {
  pmap_status st = check_coll("pmap_broadcast", dev, send, recv, count, count, recv);
  if (st) return st;
  if (root < 0 || root >= pmap_axis_size(dev))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_broadcast: root %d is outside [0, %d)", root,
                    pmap_axis_size(dev));
  PMAP_TRY(backend_broadcast(dev, "pmap_broadcast", send, recv, count, root));
  return finish(dev);
}

pmap_status pmap_barrier(pmap_device *dev) {
  if (!dev) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_barrier: dev is NULL");
  return backend_barrier(dev, "pmap_barrier");
}
