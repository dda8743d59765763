/* procs.c: what the runtime knows of the processes of a context: the names messages give devices
 * and processes (global index, process, host), and host values exchanged between processes
 * outside jobs (checks that every process passes the same step, replica checksums, the settings
 * at creation), and the meeting of the processes at the end of every mapped function. */
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "base/error.h"
#include "runtime/dist/dist.h"

const char *pmap_dev_name(const pmap_device *dev, char *buf, size_t size) {
  const pmap_ctx *ctx = dev->ctx;
  if (!ctx->dist)
    snprintf(buf, size, "device %d", dev->index);
  else
    snprintf(buf, size, "device %d (process %d of %d, host %s)", ctx->proc * ctx->n + dev->index,
             ctx->proc, ctx->nproc, dist_host(ctx->dist, ctx->proc));
  return buf;
}

const char *pmap_proc_host(const pmap_ctx *ctx, int proc) { return dist_host(ctx->dist, proc); }

const char *pmap_proc_name(const pmap_ctx *ctx, int proc, char *buf, size_t size) {
  snprintf(buf, size, "process %d (host %s)", proc, dist_host(ctx->dist, proc));
  return buf;
}

pmap_status pmap_ctx_exchange(pmap_ctx *ctx, const char *call, const void *mine, size_t bytes,
                              const void **all) {
  *all = mine;
  if (!ctx->dist) return PMAP_SUCCESS;
  return dist_exchange(ctx->dist, call, mine, bytes, all);
}

/* What each process created its context with, of what changes the collectives of a step. */
typedef struct settings_record {
  int32_t numeric_guard, uneven;
} settings_record;

pmap_status procs_check_settings(pmap_ctx *ctx) {
  if (!ctx->dist) return PMAP_SUCCESS;
  settings_record mine = {ctx->numeric_guard, ctx->uneven};
  const void *got = NULL;
  PMAP_TRY(pmap_ctx_exchange(ctx, "pmap_ctx_create's settings check", &mine, sizeof mine, &got));
  const settings_record *all = got;
  for (int field = 0; field < 2; field++) {
    int differ = 0;
    for (int r = 0; r < ctx->nproc; r++)
      differ |= field ? all[r].uneven != mine.uneven : all[r].numeric_guard != mine.numeric_guard;
    if (!differ) continue;
    char list[700], name[128];
    size_t len = 0;
    list[0] = '\0';
    for (int r = 0; r < ctx->nproc && len < sizeof list; r++) {
      const char *v =
          field ? (all[r].uneven ? "1" : "0")
                : (all[r].numeric_guard == PMAP_GUARD_OFF ? "PMAP_GUARD_OFF" : "PMAP_GUARD_ON");
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%s: %s", r ? "; " : "",
                              pmap_proc_name(ctx, r, name, sizeof name), v);
    }
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: the processes differ in %s (%s): it changes what every "
                    "step exchanges, so every process must create its context with the same",
                    field ? "uneven_batches" : "numeric_guard", list);
  }
  return PMAP_SUCCESS;
}

pmap_status procs_end_job(pmap_ctx *ctx, pmap_status st, int own, uint64_t seq0) {
  /* The job's last exchange failed against processes that all returned from their calls (a
   * collective against pmap_update's step check, say): every process failed, they are in step,
   * and none will meet this end. */
  uint64_t alone = dist_alone_seq(ctx->dist);
  if (st && alone > seq0 && alone == dist_seq(ctx->dist)) return st;
  dist_outcome out;
  memset(&out, 0, sizeof out);
  out.status = st;
  out.own = own;
  if (st) snprintf(out.text, sizeof out.text, "%s", pmap_error_message());
  char who[200];
  snprintf(who, sizeof who, "pmap_run: process %d of %d (host %s)", ctx->proc, ctx->nproc,
           pmap_proc_host(ctx, ctx->proc));
  pmap_status met = dist_end_job(ctx->dist, &out, who);
  /* A meeting that failed broke the transport; the job's own failure says more. */
  if (met) {
    if (st) pmap_error_set(st, "%s", out.text);
    return st ? st : met;
  }
  if (!out.status) return PMAP_SUCCESS;
  out.text[sizeof out.text - 1] = '\0';
  return pmap_error_set((pmap_status)out.status, "%s", out.text);
}
