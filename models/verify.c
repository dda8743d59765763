/* verify.c: pmap_params_verify. Every device checksums its own replica (parameters and optimizer
 * state) through the backend's download into a bounded host buffer, so no device reads another's
 * memory and no full host copy is made; the caller compares the gathered checksums, across
 * processes those of every process (one small host exchange). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "params.h"
#include "runtime/runtime.h"
#include "base/error.h"

#define VERIFY_CHUNK ((size_t)256 * 1024) /* bytes per device per download */

/* CRC-32C of `bytes` bytes of device memory at src, continuing from crc. */
static pmap_status checksum(pmap_device *dev, const void *src, size_t bytes, unsigned char *buf,
                            size_t chunk, uint32_t *crc) {
  const char *s = src;
  for (size_t at = 0; at < bytes; at += chunk) {
    size_t n = bytes - at < chunk ? bytes - at : chunk;
    PMAP_TRY(backend_download(dev, buf, s + at, n));
    *crc = crc32c_update(*crc, buf, n);
  }
  return PMAP_SUCCESS;
}

/* A check's job: the params and, per local device, its checksum and download buffer. */
typedef struct verify_call {
  const pmap_params *p;
  uint32_t *sums;     /* (D) each device's checksum of its replica */
  unsigned char *buf; /* (D, VERIFY_CHUNK) one bounded download buffer per device */
} verify_call;

static pmap_status verify_job(pmap_device *dev, void *arg) {
  const verify_call *c = arg;
  const pmap_params *p = c->p;
  int d = pmap_local_index(dev);
  const replica *r = &p->rep[d];
  unsigned char *buf = c->buf + (size_t)d * VERIFY_CHUNK;
  size_t P = p->n_params;
  uint32_t crc = 0;
  PMAP_TRY(checksum(dev, r->w, P * sizeof(float), buf, VERIFY_CHUNK, &crc));
  /* A sharded optimizer state differs from device to device by design: only the parameters are
   * compared then. */
  if (p->opt_slots && !p->shard)
    PMAP_TRY(
        checksum(dev, r->opt, (size_t)p->opt_slots * P * sizeof(float), buf, VERIFY_CHUNK, &crc));
  c->sums[d] = crc;
  return PMAP_SUCCESS;
}

/* The message naming the global devices whose checksum (of sums, one per global device)
 * differs from global device 0's; 0 when none does. */
static int describe(const pmap_params *p, const uint32_t *sums, char *msg, size_t size) {
  const pmap_ctx *ctx = p->ctx;
  int bad = 0;
  size_t at = 0;
  for (int g = 1; g < p->gl.G; g++) {
    if (sums[g] == sums[0]) continue;
    int w =
        runtime_distributed(ctx)
            ? snprintf(msg + at, size - at, "%s%d (process %d, host %s: 0x%08x)", bad ? ", " : "",
                       g, g / p->n, pmap_proc_host(ctx, g / p->n), (unsigned)sums[g])
            : snprintf(msg + at, size - at, "%s%d (0x%08x)", bad ? ", " : "", g, (unsigned)sums[g]);
    if (w > 0) at = (size_t)w < size - at ? at + (size_t)w : size - 1;
    bad++;
  }
  return bad;
}

static pmap_status verify(pmap_params *p, pmap_status st);

/* Under the context's lock, as every public call. */
pmap_status pmap_params_verify(const pmap_params *cp) {
  const char *call = "pmap_params_verify";
  if (!cp) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: params is NULL", call);
  pmap_params *p = (pmap_params *)cp; /* a torn step is completed: its replicas change */
  PMAP_TRY(pmap_ctx_lock(p->ctx, call));
  pmap_status st = verify(p, params_mend(p, call));
  pmap_ctx_unlock(p->ctx);
  return st;
}

/* st: a failure before the check (completing a torn step); the process takes part in the
 * exchange of checksums all the same, refusing it. */
static pmap_status verify(pmap_params *p, pmap_status st) {
  const char *call = "pmap_params_verify";
  int n = p->n;
  verify_call c = {p, calloc((size_t)n, sizeof *c.sums), malloc((size_t)n * VERIFY_CHUNK)};
  if (!st && (!c.sums || !c.buf))
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory for %d download buffers", call, n);
  if (!st) st = params_dispatch(p, verify_job, &c);
  /* Across processes every process's checksums: (P, D) in process order is the global order. A
   * process that failed before comparing still sends its record, so that every process fails
   * this check rather than pairing it with its next exchange. */
  const void *all = c.sums;
  st =
      pmap_ctx_exchange(p->ctx, "pmap_params_verify", st, c.sums, (size_t)n * sizeof *c.sums, &all);
  const uint32_t *sums = all;
  char list[768], where[160] = "";
  int bad = st ? 0 : describe(p, sums, list, sizeof list);
  if (bad && runtime_distributed(p->ctx))
    snprintf(where, sizeof where, " (process 0, host %s)", pmap_proc_host(p->ctx, 0));
  if (bad)
    st = PMAP_ERR(PMAP_ERR_DEVICE,
                  "%s: %d of %d replicas differ from device 0's%s (checksum 0x%08x) after step "
                  "%lld: device%s %s",
                  call, bad, p->gl.G, where, (unsigned)sums[0], (long long)p->step,
                  bad > 1 ? "s" : "", list);
  free(c.sums);
  free(c.buf);
  return st;
}
