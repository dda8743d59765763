/* trace_ctx.c: a context's timeline recording (pmap_trace_start / pmap_trace_stop, PMAP_TRACE),
 * its devices' waits at the collectives (pmap_ctx_waits) and their memory as the backend sees
 * it. The recorder is base/trace.h's; the runtime records its own spans (the waits at each
 * rendezvous, the collectives, staging) and the rooms above record theirs on the same tracks. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "base/env.h"
#include "base/error.h"
#include "base/trace.h"
#include "runtime/dist/dist.h"

struct trace_rec *runtime_trace(const pmap_ctx *ctx) {
  return ctx->trace;
}
int runtime_trace_caller(const pmap_ctx *ctx) { return ctx->n; }
pmap_device *runtime_device(pmap_ctx *ctx, int local) { return &ctx->dev[local]; }
int runtime_stages(const pmap_ctx *ctx) { return ctx->be->stage != NULL; }

/* The file of this process: path itself for one process, else "<stem>.p<proc><ext>" (ext a
 * trailing ".json", when there is one), so that processes sharing a folder never collide. */
static char *process_path(const pmap_ctx *ctx, const char *path) {
  size_t len = strlen(path), cut = len;
  if (len >= 5 && !strcmp(path + len - 5, ".json")) cut = len - 5;
  size_t size = len + 32;
  char *out = malloc(size);
  if (!out) return NULL;
  if (ctx->nproc > 1)
    snprintf(out, size, "%.*s.p%d%s", (int)cut, path, ctx->proc, path + cut);
  else
    snprintf(out, size, "%s", path);
  return out;
}

/* Writes the recording to ctx->trace_path: tracks named by global device, process and host. */
static pmap_status write_trace(const pmap_ctx *ctx, const char *call) {
  int n = ctx->n;
  char(*names)[192] = calloc((size_t)n + 1, sizeof *names);
  const char **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
  if (!names || !ptrs) {
    free(names);
    free(ptrs);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  }
  const char *host = ctx->dist ? dist_host(ctx->dist, ctx->proc) : NULL;
  for (int i = 0; i < n; i++) {
    pmap_dev_name(&ctx->dev[i], names[i], sizeof names[i]);
    ptrs[i] = names[i];
  }
  if (host)
    snprintf(names[n], sizeof names[n], "caller (process %d, host %s)", ctx->proc, host);
  else
    snprintf(names[n], sizeof names[n], "caller");
  ptrs[n] = names[n];
  char pname[192];
  if (host)
    snprintf(pname, sizeof pname, "pmap %s, process %d of %d (host %s)", ctx->be->name, ctx->proc,
             ctx->nproc, host);
  else
    snprintf(pname, sizeof pname, "pmap %s, %d devices", ctx->be->name, n);
  pmap_status st = trace_write(ctx->trace, ctx->trace_path, ctx->proc, pname, ptrs);
  free(names);
  free(ptrs);
  if (!st) return PMAP_SUCCESS;
  char why[1024]; /* the writer's message, moved out of the buffer it is formatted into */
  pmap_error_save(why, sizeof why);
  return pmap_error_set(st, "%s: cannot write the trace: %s", call, why);
}

static void trace_free(pmap_ctx *ctx) {
  trace_destroy(ctx->trace);
  free(ctx->trace_path);
  ctx->trace = NULL;
  ctx->trace_path = NULL;
}

/* Starts a recording; the lock is held. The file is written empty at once, so that a path that
 * cannot be written fails here rather than after the run. */
static pmap_status start(pmap_ctx *ctx, const char *path, const char *steps, const char *what,
                         const char *call) {
  trace_window w;
  PMAP_TRY(trace_window_parse(steps, what, &w));
  if (ctx->trace)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: a trace of this context is already being recorded (to \"%s\"); stop it "
                    "first",
                    call, ctx->trace_path);
  ctx->trace_path = process_path(ctx, path);
  pmap_status st = ctx->trace_path ? trace_create(ctx->n + 1, w, pmap_now_ns(), &ctx->trace)
                                   : PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  if (!st) st = write_trace(ctx, call);
  if (st) trace_free(ctx);
  return st;
}

pmap_status pmap_trace_start(pmap_ctx *ctx, const char *path, const char *steps) {
  const char *call = "pmap_trace_start";
  if (!ctx || !path || !*path)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: %s", call,
                    !ctx ? "ctx is NULL" : "path is NULL or empty");
  PMAP_TRY(pmap_ctx_lock(ctx, call));
  char what[64];
  snprintf(what, sizeof what, "%s: steps", call);
  pmap_status st = start(ctx, path, steps, what, call);
  pmap_ctx_unlock(ctx);
  return st;
}

pmap_status pmap_trace_stop(pmap_ctx *ctx) {
  const char *call = "pmap_trace_stop";
  if (!ctx) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", call);
  PMAP_TRY(pmap_ctx_lock(ctx, call));
  pmap_status st = PMAP_SUCCESS;
  if (!ctx->trace)
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: no trace is being recorded", call);
  else
    st = write_trace(ctx, call);
  trace_free(ctx);
  pmap_ctx_unlock(ctx);
  return st;
}

pmap_status runtime_trace_env(pmap_ctx *ctx) {
  const char *path = pmap_env_get("PMAP_TRACE");
  if (!path) return PMAP_SUCCESS;
  return start(ctx, path, pmap_env_get("PMAP_TRACE_STEPS"), "environment variable PMAP_TRACE_STEPS",
               "environment variable PMAP_TRACE");
}

void runtime_trace_close(pmap_ctx *ctx) {
  /* Nothing can report a failure here: the file written at the start (or the last stop) stays
   * as it was, and the thread's last error too. */
  if (ctx->trace) {
    char last[1024];
    pmap_error_save(last, sizeof last);
    (void)write_trace(ctx, "pmap_ctx_destroy");
    pmap_error_copy(last);
  }
  trace_free(ctx);
}

/* A span waiting for its marks' times. */
typedef struct queued_span {
  const char *name, *detail, *cat;
  int index, m0, m1, kept;
  int64_t bytes;
} queued_span;

void runtime_trace_keep(pmap_device *dev, int on) { dev->trace_keep = on; }

runtime_span runtime_span_begin(pmap_device *dev) {
  runtime_span s = {pmap_now_ns(), -1};
  if (dev->ctx->be->mark && (s.mark = dev->ctx->be->mark(dev)) >= 0) dev->marks = s.mark + 1;
  return s;
}

void runtime_span_end(pmap_device *dev, runtime_span b, const char *name, const char *detail,
                      int index, const char *cat, int64_t bytes) {
  trace_rec *t = dev->ctx->trace;
  int m1 = b.mark >= 0 ? dev->ctx->be->mark(dev) : -1;
  if (m1 >= 0) dev->marks = m1 + 1;
  if (m1 >= 0 && dev->n_queued == dev->cap_queued) {
    int cap = dev->cap_queued ? 2 * dev->cap_queued : 64;
    queued_span *q = realloc(dev->queued, (size_t)cap * sizeof *q);
    if (q) {
      dev->queued = q;
      dev->cap_queued = cap;
    }
  }
  if (m1 < 0 || dev->n_queued == dev->cap_queued) { /* timed on the host */
    (dev->trace_keep ? trace_span_kept : trace_span)(t, dev->index, name, detail, index, cat,
                                                     b.host, pmap_now_ns(), bytes);
    return;
  }
  dev->queued[dev->n_queued++] =
      (queued_span){name, detail, cat, index, b.mark, m1, dev->trace_keep, bytes};
}

void runtime_trace_flush(pmap_device *dev, int keep) {
  pmap_ctx *ctx = dev->ctx;
  int n = keep ? dev->marks : 0;
  int64_t *ns = n > 0 ? calloc((size_t)n, sizeof *ns) : NULL;
  if (n > 0 && ctx->be->mark_times) {
    pmap_status st = PMAP_ERR_OUT_OF_MEMORY;
    if (ns)
      st = ctx->be->mark_times(dev, ns, n);
    else
      ctx->be->mark_times(dev, NULL, 0);
    if (st) pmap_error_clear(); /* the spans are lost, the job's result is not the trace's */
    for (int i = 0; !st && ctx->trace && i < dev->n_queued; i++) {
      const queued_span *q = &dev->queued[i];
      (q->kept ? trace_span_kept : trace_span)(ctx->trace, dev->index, q->name, q->detail, q->index,
                                               q->cat, ns[q->m0], ns[q->m1], q->bytes);
    }
  } else if (dev->marks && ctx->be->mark_times)
    ctx->be->mark_times(dev, NULL, 0); /* forgotten without waiting */
  free(ns);
  dev->n_queued = 0;
  dev->marks = 0;
}

pmap_status pmap_ctx_waits(pmap_ctx *ctx, pmap_device_waits *out, int count) {
  const char *call = "pmap_ctx_waits";
  if (!ctx) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: ctx is NULL", call);
  PMAP_TRY(pmap_ctx_lock(ctx, call));
  int n = ctx->n, total = ctx->n * ctx->nproc;
  dev_waits *mine = calloc((size_t)n, sizeof *mine);
  pmap_status st = PMAP_SUCCESS;
  if (!out)
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s: out is NULL", call);
  else if (count != total)
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: count %d is not the context's %d devices (of every process)", call, count,
                  total);
  else if (!mine)
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  for (int i = 0; !st && i < n; i++) mine[i] = ctx->dev[i].waits;
  /* Every process's records, in process order (one process: its own); a process that refused
   * the call takes part all the same, so every process refuses it. */
  const void *all = NULL;
  st = pmap_ctx_exchange(ctx, call, st, mine, (size_t)n * sizeof *mine, &all);
  if (!st) {
    const dev_waits *w = all;
    for (int g = 0; g < total; g++)
      out[g] = (pmap_device_waits){.device = g,
                                   .collectives = w[g].collectives,
                                   .busy_s = (double)w[g].busy_ns / 1e9,
                                   .wait_s = (double)w[g].wait_ns / 1e9,
                                   .held_s = (double)w[g].held_ns / 1e9};
  }
  pmap_ctx_unlock(ctx);
  free(mine);
  return st;
}

void runtime_device_memory(pmap_device *dev, size_t *in_use, size_t *free_bytes) {
  *in_use = *free_bytes = SIZE_MAX;
  if (dev->ctx->be->memory && dev->ctx->be->memory(dev, in_use, free_bytes)) {
    pmap_error_clear();
    *in_use = *free_bytes = SIZE_MAX;
  }
}
