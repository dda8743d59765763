/* runtime.h: the runtime as models/ (and the benchmarks that reach inside) use it: functions on
 * opaque contexts and devices (pmap.h's pmap_ctx and pmap_device). The structs behind them, and
 * the backend interface, are runtime/backend.h's, for the runtime and its backends only. */
#ifndef PMAP_RUNTIME_RUNTIME_H
#define PMAP_RUNTIME_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#include "fault.h"
#include "pmap.h"

typedef enum pmap_redop { PMAP_RED_SUM = 0, PMAP_RED_MEAN = 1, PMAP_RED_MAX = 2 } pmap_redop;

/* Nanoseconds of a monotonic clock (runtime/sync.c). */
int64_t pmap_now_ns(void);

/* ---- contexts ---- */
/* pmap_ctx_create's runtime half: the devices, their workers and the processes (models/context.c
 * binds the ops to them). */
pmap_status runtime_ctx_create(const pmap_config *cfg, pmap_ctx **out);
/* Runs fn on every device (internal form of pmap_run: errors are left in each device). */
pmap_status pmap_ctx_dispatch(pmap_ctx *ctx, pmap_fn fn, void *arg);
/* Takes the context's lock for public call `call`; PMAP_ERR_INVALID_ARGUMENT (lock not taken)
 * when the calling thread is running a mapped function of this context. */
pmap_status pmap_ctx_lock(pmap_ctx *ctx, const char *call);
void pmap_ctx_unlock(pmap_ctx *ctx);
/* Whether the calling thread's work is nested in a job of ctx (then its lock is not to be taken). */
int pmap_ctx_in_job(const pmap_ctx *ctx);
/* Whether the calling process is not the one that created ctx (a forked child): then nothing
 * may wait for ctx's lock or threads. */
int pmap_ctx_foreign(const pmap_ctx *ctx);

/* The context of a device. */
pmap_ctx *runtime_ctx_of(const pmap_device *dev);
/* N = P * D, the devices of every process. */
int runtime_global_devices(const pmap_ctx *ctx);
/* The context's settings: uneven batches (pmap_config.uneven_batches), the numeric guard on,
 * the optimizer's sharding (PMAP_SHARD_AUTO, _OFF or _ON: AUTO resolved by
 * PMAP_SHARD_OPTIMIZER when set), whether it spans processes, its timeout (< 0: none). */
int runtime_uneven(const pmap_ctx *ctx);
int runtime_guard(const pmap_ctx *ctx);
int runtime_shard(const pmap_ctx *ctx);
int runtime_recompute(const pmap_ctx *ctx);     /* pmap_config.recompute */
size_t runtime_max_memory(const pmap_ctx *ctx); /* pmap_config.max_memory (0: none) */
int runtime_distributed(const pmap_ctx *ctx);
int64_t runtime_timeout_ns(const pmap_ctx *ctx);
/* Whether a device of the current job failed (the others are abandoning it). */
int runtime_aborting(const pmap_ctx *ctx);
/* pmap_params alive on the context: pmap_ctx_destroy refuses while there are any. */
void runtime_params_live(pmap_ctx *ctx, int delta);
/* Whether injected fault `kind` (PMAP_FAULT, runtime/fault.h) fires now on this device at update
 * step `step`. */
int runtime_fault(pmap_device *dev, fault_kind kind, int64_t step);
/* Whether faults are injected on the context (PMAP_FAULT); whether the one injected is `kind`. */
int runtime_faults(const pmap_ctx *ctx);
int runtime_fault_is(const pmap_ctx *ctx, fault_kind kind);
/* The number of the last collective the context's processes exchanged (messages). */
uint64_t runtime_coll_seq(const pmap_ctx *ctx);

/* The runtime's view of the processes (runtime/procs.c). */
/* "device 3 (process 1 of 2, host b)" in a distributed context, "device 3" otherwise: how every
 * message names a device (global index), into buf; returns buf. */
const char *pmap_dev_name(const pmap_device *dev, char *buf, size_t size);
/* The host name process `proc` of a distributed context reported ("?" when unknown). */
const char *pmap_proc_host(const pmap_ctx *ctx, int proc);
/* "process 1 (host b)" into buf; returns buf. */
const char *pmap_proc_name(const pmap_ctx *ctx, int proc, char *buf, size_t size);
/* Outside jobs, on the calling thread (the context's lock held): `bytes` bytes of every process,
 * agreed first like a collective (`call` names it in messages); *all (P, bytes) in process
 * order, owned by the context until its next exchange. One process: *all is mine.
 * refused: PMAP_SUCCESS, or this process's own failure of the public call before its exchange
 * (the thread's message says why; mine may then be NULL). The process takes part all the same,
 * and when any process refused, every process fails: a refusing one with its own status and
 * message, the others with PMAP_ERR_INVALID_ARGUMENT naming each process that refused, its host
 * and why. Nothing was exchanged then, and the processes stay in step. */
pmap_status pmap_ctx_exchange(pmap_ctx *ctx, const char *call, pmap_status refused,
                              const void *mine, size_t bytes, const void **all);
/* ---- the timeline and the waits (runtime/trace_ctx.c) ---- */
/* The context's recording (base/trace.h), NULL when off: track pmap_local_index(dev) is a
 * device's, track runtime_trace_caller(ctx) the caller's (outside jobs, the lock held). */
struct trace_rec *runtime_trace(const pmap_ctx *ctx);
int runtime_trace_caller(const pmap_ctx *ctx);
/* A span of a device's own work (a layer, the optimizer), with the recording on: begin before
 * queueing the work, end after. Where the backend marks its queue (CUDA), the span is the time
 * the device spent on it, placed on the host's clock when the job ends (runtime_trace_flush);
 * elsewhere it is the host's time around the call. */
typedef struct runtime_span {
  int64_t host;
  int mark;
} runtime_span;
runtime_span runtime_span_begin(pmap_device *dev);
void runtime_span_end(pmap_device *dev, runtime_span begin, const char *name, const char *detail,
                      int index, const char *cat, int64_t bytes);
/* From on != 0 to on == 0 the device's spans (its collectives and their waits, its own work) are
 * the step's own: a step past the span limit keeps them (base/trace.h TRACE_SPANS_KEPT). */
void runtime_trace_keep(pmap_device *dev, int on);
/* At the end of a device's job: the spans timed on its queue into the recording (keep 0: a
 * failed job, they are dropped). */
void runtime_trace_flush(pmap_device *dev, int keep);
/* At the end of pmap_ctx_create: PMAP_TRACE (the file) and PMAP_TRACE_STEPS (the window). */
pmap_status runtime_trace_env(pmap_ctx *ctx);
/* At pmap_ctx_destroy: writes the recording still on, then frees it. */
void runtime_trace_close(pmap_ctx *ctx);
/* The bytes the backend's allocator holds for the device and what the device has free
 * (SIZE_MAX: not known; in_use SIZE_MAX too where the backend does not count). */
void runtime_device_memory(pmap_device *dev, size_t *in_use, size_t *free_bytes);
/* Whether the backend stages host input into device buffers (backend_stage copies). */
int runtime_stages(const pmap_ctx *ctx);
/* A device of the context by local index (0..n-1). */
pmap_device *runtime_device(pmap_ctx *ctx, int local);

/* ---- memory, copies, collectives ---- */
/* The wrappers over a backend's table (runtime/backend.c): models and the public collectives
 * call these, never dev->ctx->be directly. backend_alloc: device memory (fault hook: alloc);
 * upload may run asynchronously until the next sync or download; download is complete on
 * return; sync waits for the device's queued work (a no-op where the backend has none);
 * backend_stage: a device-readable copy of host input for slot 0 (inputs) or 1 (labels),
 * valid until the next stage of the slot (the host pointer itself where devices read host
 * memory). */
pmap_status backend_alloc(pmap_device *dev, size_t bytes, void **out);
void backend_free(pmap_device *dev, void *ptr); /* accepts NULL */
pmap_status backend_upload(pmap_device *dev, void *dst, const void *src, size_t bytes);
pmap_status backend_download(pmap_device *dev, void *dst, const void *src, size_t bytes);
pmap_status backend_sync(pmap_device *dev);
pmap_status backend_stage(pmap_device *dev, int slot, const void *host, size_t bytes,
                          const void **out);
/* The backend's collectives (pmap_coll_i), after a rendezvous that checks every device called
 * the same one (call names it in messages, e.g. "pmap_psum" or "pmap_update's all-reduce"); the
 * argument checks of the public collectives are runtime/coll.c's. */
pmap_status backend_all_reduce(pmap_device *dev, const char *call, const float *send, float *recv,
                               size_t count, pmap_redop op);
pmap_status backend_broadcast(pmap_device *dev, const char *call, const float *send, float *recv,
                              size_t count, int root);
pmap_status backend_all_gather(pmap_device *dev, const char *call, const float *send, float *recv,
                               size_t count);
pmap_status backend_barrier(pmap_device *dev, const char *call);
/* pmap_coll_i.reduce_scatter (chunk elements per device), or the all-reduce standing in. */
pmap_status backend_reduce_scatter(pmap_device *dev, const char *call, float *buf, size_t chunk,
                                   pmap_redop op);
/* pmap_coll_i.reduce_part (*taken 1: recv holds this device's elements of the piece), or
 * where the backend has none an all-reduce of send in place (*taken 0: the caller copies its
 * elements from send). */
pmap_status backend_reduce_part(pmap_device *dev, const char *call, float *send, size_t lo,
                                size_t count, size_t chunk, float *recv, size_t recv_lo,
                                pmap_redop op, int *taken);

/* The step's fast paths (models/step_fast.c) on a backend that has them (CUDA, its pmap_fast_i
 * in backend.h): runtime_fast_modes says what the context asked for (all 0 where the backend has
 * none); the allocation generation a captured step was taken at; capture of a device's queued
 * work, the launch of a captured graph, its release; backend_bucket_reduce: the mean all-reduce
 * of a bucket on a second queue, after meeting the other devices at the rendezvous as every
 * collective does; backend_bucket_join: the device's queue waits for every bucket issued. */
void runtime_fast_modes(const pmap_ctx *ctx, int *graphs, int *overlap, size_t *bucket_bytes);
uint64_t runtime_generation(const pmap_ctx *ctx);
pmap_status runtime_capture_begin(pmap_device *dev);
void runtime_capture_end(pmap_device *dev, pmap_status body, void **graph, char *why,
                         size_t whylen);
pmap_status runtime_launch(pmap_device *dev, void *graph);
void runtime_graph_free(pmap_device *dev, void *graph);
pmap_status backend_bucket_reduce(pmap_device *dev, const char *call, float *buf, size_t count);
pmap_status backend_bucket_join(pmap_device *dev);
/* Meets the other devices on the host only (the rendezvous of a collective without the
 * collective): nothing is queued on the device, so a capture in progress is not disturbed. */
pmap_status backend_meet(pmap_device *dev, const char *call);

#endif
