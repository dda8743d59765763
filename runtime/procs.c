/* procs.c: what the runtime knows of the processes of a context: the names messages give devices
 * and processes (global index, process, host), and host values exchanged between processes
 * outside jobs (checks that every process passes the same step, replica checksums, the settings
 * at creation), and the meeting of the processes at the end of every mapped function. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* What every process's record of a host exchange starts with: whether the process refused the
 * call itself (its status) and why. A process whose own checks refused still sends it: had it
 * stayed away, the others' exchange would pair with its next call. */
typedef struct refusal {
  int64_t status;
  char text[440];
} refusal;

/* *buf holds at least `bytes` (grown once, kept for the context's later exchanges). */
static int grow(unsigned char **buf, size_t *cap, size_t bytes) {
  if (bytes <= *cap) return 1;
  unsigned char *b = realloc(*buf, bytes);
  if (!b) return 0;
  *buf = b;
  *cap = bytes;
  return 1;
}

/* The refusal's text: the message without the public call's name before it, nor a trail. */
static void refusal_text(const char *msg, const char *call, char *out, size_t size) {
  size_t lc = call ? strlen(call) : 0;
  if (lc && strncmp(msg, call, lc) == 0 && msg[lc] == ':' && msg[lc + 1] == ' ') msg += lc + 2;
  const char *trail = strstr(msg, " -> at ");
  int len = trail ? (int)(trail - msg) : (int)strlen(msg);
  snprintf(out, size, "%.*s", len, msg);
}

/* Every process's verdict once the records arrived (rec bytes each, at got): the refusing
 * process's own failure, else a failure naming every process that refused, else success with
 * their payloads gathered into ctx->xall. */
static pmap_status refusal_verdict(pmap_ctx *ctx, const char *call, pmap_status refused,
                                   const char *own, const unsigned char *got, size_t rec,
                                   size_t bytes) {
  if (refused) return pmap_error_set(refused, "%s", own);
  char list[1400], name[128];
  size_t len = 0;
  int count = 0;
  for (int r = 0; r < ctx->nproc; r++) {
    const refusal *x = (const refusal *)(got + (size_t)r * rec);
    if (!x->status) continue;
    if (len < sizeof list)
      len += (size_t)snprintf(list + len, sizeof list - len, "%son %s: %.*s", count ? "; " : "",
                              pmap_proc_name(ctx, r, name, sizeof name), (int)sizeof x->text - 1,
                              x->text);
    count++;
  }
  if (count)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: refused %s; every process refuses the call, nothing was changed on any "
                    "of them, and they stay in step",
                    ctx->call ? ctx->call : call, list);
  for (int r = 0; r < ctx->nproc; r++)
    memcpy(ctx->xall + (size_t)r * bytes, got + (size_t)r * rec + sizeof(refusal), bytes);
  return PMAP_SUCCESS;
}

pmap_status pmap_ctx_exchange(pmap_ctx *ctx, const char *call, pmap_status refused,
                              const void *mine, size_t bytes, const void **all) {
  *all = mine;
  /* A failure that broke the transport told the others already. */
  if (!ctx->dist || (refused && dist_broken(ctx->dist))) return refused;
  char own[1024] = "";
  if (refused) pmap_error_save(own, sizeof own);
  /* Each record padded to 16 bytes, so that every process's refusal and payload are aligned
   * where they arrive, one after the other. */
  size_t nproc = (size_t)ctx->nproc, rec = sizeof(refusal) + (bytes + 15) / 16 * 16;
  if (bytes > SIZE_MAX / nproc - sizeof(refusal) - 16 || !grow(&ctx->xsend, &ctx->xsend_cap, rec) ||
      !grow(&ctx->xall, &ctx->xall_cap, nproc * bytes + 1)) {
    /* Staying away would leave the others' exchange paired with this process's next one: the
     * processes are out of step, and the others are told at once. */
    char msg[512];
    snprintf(msg, sizeof msg, "%s: process %d: out of memory for the %zu bytes of its record", call,
             ctx->proc, rec);
    dist_abandon(ctx->dist, PMAP_ERR_OUT_OF_MEMORY, msg);
    return refused ? pmap_error_set(refused, "%s", own)
                   : PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s", msg);
  }
  memset(ctx->xsend, 0, rec);
  refusal *h = (refusal *)ctx->xsend;
  h->status = refused;
  if (refused)
    refusal_text(own, ctx->call, h->text, sizeof h->text);
  else if (bytes)
    memcpy(ctx->xsend + sizeof *h, mine, bytes);
  const void *got = NULL;
  pmap_status st = dist_exchange(ctx->dist, call, ctx->xsend, rec, &got);
  if (st && refused) {
    char why[400];
    refusal_text(pmap_error_message(), NULL, why, sizeof why);
    return pmap_error_set(refused, "%s (and its exchange with the other processes failed: %s)", own,
                          why);
  }
  if (st) return st;
  st = refusal_verdict(ctx, call, refused, own, got, rec, bytes);
  if (!st) *all = ctx->xall;
  return st;
}

/* What each process created its context with, of what changes the collectives of a step. */
typedef struct settings_record {
  int32_t numeric_guard, uneven;
} settings_record;

pmap_status procs_check_settings(pmap_ctx *ctx) {
  if (!ctx->dist) return PMAP_SUCCESS;
  settings_record mine = {ctx->numeric_guard, ctx->uneven};
  const void *got = NULL;
  PMAP_TRY(pmap_ctx_exchange(ctx, "pmap_ctx_create's settings check", PMAP_SUCCESS, &mine,
                             sizeof mine, &got));
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
