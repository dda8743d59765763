/* backend.c: the list of backends (the CUDA backend's table comes from its plugin, opened the
 * first time a context wants it), and the only code outside the backends that calls a backend's
 * table. Optional members are handled here, once, and the allocation fault hook lives here. */
#include "backend.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/trace.h"
#include "fault.h"
#include "runtime/dist/dist.h"

static int cpu_device_count(void) { return PMAP_MAX_DEVICES; }

#if defined(PMAP_HAVE_CUDA)
/* A GPU needs NVIDIA's driver library: where it is missing, AUTO need not load the CUDA plugin
 * (CUDA, cuBLAS and NCCL) to learn that there is no GPU. It stays loaded: the plugin would load
 * it anyway. */
static int cuda_driver_here(void) {
  return dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE) != NULL;
}
#endif

static const backend_entry backends[] = {
#if defined(PMAP_HAVE_CUDA)
    {PMAP_BACKEND_CUDA,
     "CUDA",
     {NULL, NULL, NULL},
     PMAP_PLUGIN_CUDA,
     "pmap_cuda_backend_entry",
     NULL,
     cuda_driver_here},
#endif
    {PMAP_BACKEND_CPU,
     "CPU",
     {&pmap_cpu_backend, cpu_device_count, NULL},
     NULL,
     NULL,
     pmap_cpu_default_devices,
     NULL},
};

/* What a backend plugin calls of the core (backend_core_i). */
static const backend_core_i plugin_core = {
    &pmap_base_table, pmap_now_ns,     sync_barrier_wait, pmap_wait_status,
    pmap_ctx_abort,   pmap_abandonedv, dist_rank,         dist_broadcast_bytes,
};

/* The implementations the plugins gave, by index into backends[]; set once under the lock. */
static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static backend_impl loaded[sizeof backends / sizeof backends[0]];
static _Atomic int is_loaded[sizeof backends / sizeof backends[0]];

const backend_entry *backend_list(int *count) {
  *count = (int)(sizeof backends / sizeof backends[0]);
  return backends;
}

const backend_entry *backend_find(pmap_backend kind) {
  for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
    if (backends[i].kind == kind) return &backends[i];
  return NULL;
}

/* Opens e's plugin and calls its entry point into loaded[i]. */
static pmap_status load_plugin(const backend_entry *e, size_t i, const char *what) {
  void *sym = NULL;
  PMAP_TRY(pmap_plugin_symbol(e->plugin, e->entry, 0, what, &sym));
  backend_plugin_entry entry;
  memcpy(&entry, &sym, sizeof entry); /* dlsym's data pointer to a function's */
  backend_impl impl = {NULL, NULL, NULL};
  uint64_t theirs = entry(backend_plugin_abi(), &plugin_core, &impl);
  PMAP_TRY(pmap_plugin_abi_check(what, e->plugin, theirs, backend_plugin_abi()));
  if (!impl.table || !impl.device_count)
    return PMAP_ERR(PMAP_ERR_INTERNAL, "%s: the plugin %s gave no backend", what, e->plugin);
  loaded[i] = impl;
  return PMAP_SUCCESS;
}

pmap_status backend_load(const backend_entry *e, const char *what, const backend_impl **out) {
  if (!e->plugin) {
    *out = &e->impl;
    return PMAP_SUCCESS;
  }
  size_t i = (size_t)(e - backends);
  if (!atomic_load(&is_loaded[i])) {
    pthread_mutex_lock(&load_lock);
    pmap_status st = atomic_load(&is_loaded[i]) ? PMAP_SUCCESS : load_plugin(e, i, what);
    if (!st) atomic_store(&is_loaded[i], 1);
    pthread_mutex_unlock(&load_lock);
    if (st) return st;
  }
  *out = &loaded[i];
  return PMAP_SUCCESS;
}

pmap_status backend_check(const pmap_backend_i *be) {
  const char *missing = !be->alloc              ? "alloc"
                        : !be->free             ? "free"
                        : !be->upload           ? "upload"
                        : !be->download         ? "download"
                        : !be->coll             ? "coll"
                        : !be->coll->all_reduce ? "coll->all_reduce"
                        : !be->coll->broadcast  ? "coll->broadcast"
                        : !be->coll->all_gather ? "coll->all_gather"
                        : !be->coll->barrier    ? "coll->barrier"
                                                : NULL;
  if (!missing) return PMAP_SUCCESS;
  return PMAP_ERR(PMAP_ERR_INTERNAL, "backend %s: its table has no %s", be->name, missing);
}

pmap_status backend_ctx_init(pmap_ctx *ctx, const pmap_config *cfg) {
  return ctx->be->ctx_init ? ctx->be->ctx_init(ctx, cfg) : PMAP_SUCCESS;
}

void backend_ctx_fini(pmap_ctx *ctx) {
  if (ctx->be && ctx->be->ctx_fini) ctx->be->ctx_fini(ctx);
}

pmap_status backend_device_init(pmap_device *dev) {
  return dev->ctx->be->device_init ? dev->ctx->be->device_init(dev) : PMAP_SUCCESS;
}

void backend_device_fini(pmap_device *dev) {
  if (dev->ctx->be->device_fini) dev->ctx->be->device_fini(dev);
}

pmap_status backend_enter(pmap_device *dev, int saved[2]) {
  return dev->ctx->be->enter ? dev->ctx->be->enter(dev, saved) : PMAP_SUCCESS;
}

void backend_leave(pmap_device *dev, const int saved[2]) {
  if (dev->ctx->be->leave) dev->ctx->be->leave(dev, saved);
}

pmap_status backend_alloc(pmap_device *dev, size_t bytes, void **out) {
  *out = NULL;
  if (pmap_fault_fires(dev->ctx->fault, FAULT_ALLOC, dev->index, -1))
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "device %d: allocation of %zu bytes failed (injected by PMAP_FAULT)",
                    dev->index, bytes);
  return dev->ctx->be->alloc(dev, bytes, out);
}

void backend_free(pmap_device *dev, void *ptr) {
  if (ptr) dev->ctx->be->free(dev, ptr);
}

pmap_status backend_upload(pmap_device *dev, void *dst, const void *src, size_t bytes) {
  if (!bytes) return PMAP_SUCCESS;
  return dev->ctx->be->upload(dev, dst, src, bytes);
}

pmap_status backend_download(pmap_device *dev, void *dst, const void *src, size_t bytes) {
  if (!bytes) return PMAP_SUCCESS;
  return dev->ctx->be->download(dev, dst, src, bytes);
}

pmap_status backend_sync(pmap_device *dev) {
  return dev->ctx->be->sync ? dev->ctx->be->sync(dev) : PMAP_SUCCESS;
}

pmap_status backend_stage(pmap_device *dev, int slot, const void *host, size_t bytes,
                          const void **out) {
  if (!dev->ctx->be->stage) {
    *out = host;
    return PMAP_SUCCESS;
  }
  void *d = NULL;
  int64_t t0 = dev->ctx->trace ? pmap_now_ns() : 0;
  PMAP_TRY(dev->ctx->be->stage(dev, slot, host, bytes, &d));
  if (dev->ctx->trace)
    trace_span(dev->ctx->trace, dev->index, "stage", slot ? "labels" : "inputs", -1, "staging", t0,
               pmap_now_ns(), (int64_t)bytes);
  *out = d;
  return PMAP_SUCCESS;
}

/* Two records of one rendezvous: the same call, count, root and place in the job (a record
 * left from an earlier collective or job never matches). */
static int same_desc(const coll_desc *a, const coll_desc *b) {
  return a->call && b->call && !strcmp(a->call, b->call) && a->count == b->count &&
         a->root == b->root && a->seq == b->seq && a->job == b->job;
}

/* "device 0: pmap_psum(count 4); devices 1-3: pmap_barrier" into buf; devices numbered from
 * base (their global index across processes). */
static void describe(const coll_desc *desc, int n, int base, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && len < size;) {
    int j = i + 1;
    while (j < n && same_desc(&desc[j], &desc[i])) j++;
    char what[96];
    const coll_desc *d = &desc[i];
    if (!d->call || d->job != desc[0].job)
      snprintf(what, sizeof what, "nothing yet in this job");
    else if (!strcmp(d->call, "pmap_barrier"))
      snprintf(what, sizeof what, "%s", d->call);
    else if (!strcmp(d->call, "pmap_broadcast"))
      snprintf(what, sizeof what, "%s(count %zu, root %d)", d->call, d->count, d->root);
    else
      snprintf(what, sizeof what, "%s(count %zu)", d->call, d->count);
    if (j - i == 1)
      len +=
          (size_t)snprintf(buf + len, size - len, "%sdevice %d: %s", i ? "; " : "", base + i, what);
    else
      len += (size_t)snprintf(buf + len, size - len, "%sdevices %d-%d: %s", i ? "; " : "", base + i,
                              base + j - 1, what);
    i = j;
  }
}

pmap_wait_policy pmap_patient_wait(const pmap_ctx *ctx) {
  pmap_wait_policy w = ctx->wait;
  if (w.timeout_ns >= 0) w.timeout_ns = 2 * w.timeout_ns + 1000000000;
  return w;
}

/* Across processes, after the devices of this process met: local device 0 sends what they
 * called (or, when they differ, the list of what each called) to the other processes and
 * compares theirs, exactly as the devices of one process compare their records; the other
 * devices wait for its verdict. A difference fails every device of every process with the
 * same list; the sequence numbers still agree, so the processes stay in step. */
static pmap_status rendezvous_processes(pmap_device *dev, const char *call, size_t count, int root,
                                        const char *differ) {
  pmap_ctx *ctx = dev->ctx;
  char who[256], name[160];
  if (dev->index != 0 && differ) {
    pmap_ctx_abort(ctx);
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s on %s: the devices called different collectives (each must call the "
                    "same ones, in the same order, with the same count and root): %s",
                    call, pmap_dev_name(dev, name, sizeof name), differ);
  }
  if (dev->index == 0) {
    snprintf(who, sizeof who, "%s on %s", call, pmap_dev_name(dev, name, sizeof name));
    dist_call c = {call, count, root, DIST_F32, 0, ctx->meets};
    if (differ) c = (dist_call){differ, 0, ctx->proc, DIST_DEVICES_DIFFER, 0, ctx->meets};
    pmap_status st = dist_agree(ctx->dist, &c, who);
    if (!st && differ) /* every process has a different record then: not reached */
      st = PMAP_ERR(PMAP_ERR_INTERNAL, "%s: the devices differ but the processes agreed", who);
    if (st) {
      if (!dist_broken(ctx->dist)) atomic_store(&ctx->dist_agreed, 1);
      pmap_ctx_abort(ctx);
      return st;
    }
  }
  if (ctx->n == 1) return PMAP_SUCCESS;
  pmap_wait_policy w = pmap_patient_wait(ctx);
  return pmap_wait_status(dev, pmap_barrier_arrive(dev, &w, NULL), call);
}

/* Every collective, public or the runtime's own, starts here: every device records what it
 * called, meets the others, and compares. The records are the same on every device, so a
 * mismatch fails every device with the same message, before any device touches another's
 * buffers. Every barrier of ctx->bar outside a collective is one of these, so the barriers of
 * a collective only ever meet each other. The records are double-buffered by call parity (a
 * device can be one collective ahead of a slow reader, not two: the next rendezvous waits for
 * the reader) and carry the job and the call's number in it, so a stale one never matches.
 * Across processes the records of the processes are compared too (rendezvous_processes). */
static void blame(pmap_ctx *ctx, const coll_desc *desc);

static pmap_status meet(pmap_device *dev, const char *call, size_t count, int root,
                        int64_t arrive) {
  pmap_ctx *ctx = dev->ctx;
  int n = ctx->n;
  /* Device 0 moves the count on only after every device of the process arrived below. */
  if (ctx->dist) dev->xseq = dist_seq(ctx->dist) + 1;
  if (n == 1 && !ctx->dist) return PMAP_SUCCESS;
  /* Once the job failed here, a collective the function still calls is not exchanged: the other
   * processes meet this process's next exchange at the job's end (runtime/procs.c). */
  if (ctx->dist && atomic_load(&ctx->abort)) {
    char name[160];
    return pmap_abandoned(dev, "%s on %s abandoned: the mapped function already failed", call,
                          pmap_dev_name(dev, name, sizeof name));
  }
  int same = 1;
  char what[640];
  if (n > 1) {
    uint32_t seq = dev->coll_seq++;
    coll_desc *desc = ctx->desc + (size_t)(seq & 1u) * (size_t)n;
    desc[dev->index] = (coll_desc){call, count, root, seq, ctx->job_gen, arrive};
    pmap_status st = pmap_wait_status(dev, pmap_barrier_arrive(dev, &ctx->wait, NULL), call);
    if (st) return st;
    for (int k = 1; k < n; k++) same &= same_desc(&desc[k], &desc[0]);
    if (!same) describe(desc, n, ctx->dist ? ctx->proc * n : 0, what, sizeof what);
    if (same && dev->index == 0) blame(ctx, desc);
  }
  if (ctx->dist) return rendezvous_processes(dev, call, count, root, same ? NULL : what);
  if (same) return PMAP_SUCCESS;
  pmap_ctx_abort(ctx);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s on device %d: the devices called different collectives (each must call the "
                  "same ones, in the same order, with the same count and root): %s",
                  call, dev->index, what);
}

/* The device that arrived last at a collective kept every other device waiting: local device 0
 * charges it with their waits once all arrived (the records stay until the next collective). */
static void blame(pmap_ctx *ctx, const coll_desc *desc) {
  int last = 0;
  for (int k = 1; k < ctx->n; k++)
    if (desc[k].arrive_ns > desc[last].arrive_ns) last = k;
  int64_t held = 0;
  for (int k = 0; k < ctx->n; k++) held += desc[last].arrive_ns - desc[k].arrive_ns;
  ctx->dev[last].waits.held_ns += held;
}

/* meet, counted: the device's time since its last collective (busy) and its wait here; the wait
 * is a span of the trace. *arrive: when it arrived. */
static pmap_status rendezvous(pmap_device *dev, const char *call, size_t count, int root,
                              int64_t *arrive) {
  int64_t t0 = pmap_now_ns();
  *arrive = t0;
  pmap_status st = meet(dev, call, count, root, t0);
  int64_t t1 = pmap_now_ns();
  dev_waits *w = &dev->waits;
  w->collectives++;
  if (dev->mark_ns) w->busy_ns += t0 - dev->mark_ns;
  w->wait_ns += t1 - t0;
  if (dev->ctx->trace)
    (dev->trace_keep ? trace_span_kept : trace_span)(dev->ctx->trace, dev->index, "wait", call, -1,
                                                     "wait", t0, t1, -1);
  return st;
}

/* After the backend's collective: its span (from the arrival, so the wait nests in it). */
static pmap_status coll_end(pmap_device *dev, const char *call, int64_t t0, size_t bytes,
                            pmap_status st) {
  int64_t t1 = pmap_now_ns();
  dev->mark_ns = t1;
  if (dev->ctx->trace)
    (dev->trace_keep ? trace_span_kept : trace_span)(dev->ctx->trace, dev->index, call, NULL, -1,
                                                     "collective", t0, t1, (int64_t)bytes);
  return st;
}

pmap_status backend_all_reduce(pmap_device *dev, const char *call, const float *send, float *recv,
                               size_t count, pmap_redop op) {
  int64_t t0 = 0;
  PMAP_TRY(rendezvous(dev, call, count, (int)op, &t0));
  return coll_end(dev, call, t0, count * sizeof(float),
                  dev->ctx->be->coll->all_reduce(dev, send, recv, count, op));
}

pmap_status backend_broadcast(pmap_device *dev, const char *call, const float *send, float *recv,
                              size_t count, int root) {
  int64_t t0 = 0;
  PMAP_TRY(rendezvous(dev, call, count, root, &t0));
  return coll_end(dev, call, t0, count * sizeof(float),
                  dev->ctx->be->coll->broadcast(dev, send, recv, count, root));
}

pmap_status backend_all_gather(pmap_device *dev, const char *call, const float *send, float *recv,
                               size_t count) {
  int64_t t0 = 0;
  PMAP_TRY(rendezvous(dev, call, count, 0, &t0));
  return coll_end(dev, call, t0, count * sizeof(float),
                  dev->ctx->be->coll->all_gather(dev, send, recv, count));
}

pmap_status backend_reduce_scatter(pmap_device *dev, const char *call, float *buf, size_t chunk,
                                   pmap_redop op) {
  pmap_ctx *ctx = dev->ctx;
  size_t total = chunk * (size_t)ctx->n * (size_t)ctx->nproc;
  int64_t t0 = 0;
  PMAP_TRY(rendezvous(dev, call, total, (int)op, &t0));
  if (!ctx->be->coll->reduce_scatter)
    return coll_end(dev, call, t0, total * sizeof(float),
                    ctx->be->coll->all_reduce(dev, buf, buf, total, op));
  return coll_end(dev, call, t0, total * sizeof(float),
                  ctx->be->coll->reduce_scatter(dev, buf, chunk, op));
}

pmap_status backend_reduce_part(pmap_device *dev, const char *call, float *send, size_t lo,
                                size_t count, size_t chunk, float *recv, size_t recv_lo,
                                pmap_redop op, int *taken) {
  pmap_ctx *ctx = dev->ctx;
  int64_t t0 = 0;
  *taken = ctx->be->coll->reduce_part != NULL;
  PMAP_TRY(rendezvous(dev, call, count, (int)op, &t0));
  if (!*taken)
    return coll_end(dev, call, t0, count * sizeof(float),
                    ctx->be->coll->all_reduce(dev, send, send, count, op));
  return coll_end(dev, call, t0, count * sizeof(float),
                  ctx->be->coll->reduce_part(dev, send, lo, count, chunk, recv, recv_lo, op));
}

pmap_status backend_barrier(pmap_device *dev, const char *call) {
  int64_t t0 = 0;
  PMAP_TRY(rendezvous(dev, call, 0, 0, &t0));
  return coll_end(dev, call, t0, 0, dev->ctx->be->coll->barrier(dev));
}

void runtime_fast_modes(const pmap_ctx *ctx, int *graphs, int *overlap, size_t *bucket_bytes) {
  *graphs = *overlap = 0;
  *bucket_bytes = 0;
  if (ctx->be->fast) ctx->be->fast->modes(ctx, graphs, overlap, bucket_bytes);
}

uint64_t runtime_generation(const pmap_ctx *ctx) {
  return ctx->be->fast ? ctx->be->fast->generation(ctx) : 0;
}

pmap_status runtime_capture_begin(pmap_device *dev) {
  if (!dev->ctx->be->fast)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "device %d: the %s backend captures no graphs",
                    dev->index, dev->ctx->be->name);
  return dev->ctx->be->fast->capture_begin(dev);
}

void runtime_capture_end(pmap_device *dev, pmap_status body, void **graph, char *why,
                         size_t whylen) {
  *graph = NULL;
  if (dev->ctx->be->fast) dev->ctx->be->fast->capture_end(dev, body, graph, why, whylen);
}

pmap_status runtime_launch(pmap_device *dev, void *graph) {
  return dev->ctx->be->fast->launch(dev, graph);
}

void runtime_graph_free(pmap_device *dev, void *graph) {
  if (graph && dev->ctx->be->fast) dev->ctx->be->fast->graph_free(dev, graph);
}

pmap_status backend_bucket_join(pmap_device *dev) { return dev->ctx->be->fast->bucket_join(dev); }

pmap_status backend_bucket_reduce(pmap_device *dev, const char *call, float *buf, size_t count) {
  int64_t t0 = 0;
  PMAP_TRY(rendezvous(dev, call, count, (int)PMAP_RED_MEAN, &t0));
  return dev->ctx->be->fast->bucket_reduce(dev, buf, count);
}

pmap_status backend_meet(pmap_device *dev, const char *call) {
  int64_t t0 = 0;
  return rendezvous(dev, call, 0, 0, &t0);
}
