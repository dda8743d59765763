/* backend.h: the interface every backend implements (a table of function pointers, one per
 * backend folder: runtime/cpu, runtime/cuda), the context and device structs the runtime builds
 * around it, and for a backend in a plugin (runtime/cuda: libpmap-cuda.so, base/plugin.h) what
 * its entry point receives and gives: for the runtime and its backends only. Everything above
 * the runtime uses it through runtime.h's functions. Backends never know about models. */
#ifndef PMAP_RUNTIME_BACKEND_H
#define PMAP_RUNTIME_BACKEND_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>

#include "base/plugin.h"
#include "pmap.h"
#include "runtime.h"
#include "sync.h"

/* Collectives over the devices of one context. Called by every device, in the same order, with
 * the same count (elements). recv == send is in place. Every device gets bitwise the same result.
 * A collective may return once queued on the device (CUDA); the device's next sync or download
 * completes it and reports its failure. */
typedef struct pmap_coll_i {
  pmap_status (*all_reduce)(pmap_device *dev, const float *send, float *recv, size_t count,
                            pmap_redop op);
  pmap_status (*broadcast)(pmap_device *dev, const float *send, float *recv, size_t count,
                           int root);
  /* recv (N, count) */
  pmap_status (*all_gather)(pmap_device *dev, const float *send, float *recv, size_t count);
  /* In place over buf (N * chunk elements, N the global device count): the device of global
   * index g ends with buf[g * chunk, (g + 1) * chunk) reduced over every device, each element
   * exactly as all_reduce would give it; the rest of buf is left unspecified (optional: NULL
   * means an all_reduce of the whole buffer stands in). */
  pmap_status (*reduce_scatter)(pmap_device *dev, float *buf, size_t chunk, pmap_redop op);
  /* A piece of a reduce-scatter: every device holds in send the elements [lo, lo + count) of a
   * flat vector split into parts of `chunk` elements; the device of global index g gets each
   * element i of the piece that lies in its part [g * chunk, (g + 1) * chunk) reduced over
   * every device, exactly as all_reduce would give it, at recv[i - recv_lo]; nothing else of
   * recv is written, send is left as it was (optional: NULL, and the runtime's caller is told
   * to take its part from send, which an all-reduce in place then holds). */
  pmap_status (*reduce_part)(pmap_device *dev, const float *send, size_t lo, size_t count,
                             size_t chunk, float *recv, size_t recv_lo, pmap_redop op);
  pmap_status (*barrier)(pmap_device *dev);
} pmap_coll_i;

typedef struct pmap_backend_i {
  const char *name;
  /* Context-wide setup on the creating thread, after ctx->n and ctx->dev[] are set, before the
   * workers start (optional). Failure aborts the context's creation. */
  pmap_status (*ctx_init)(pmap_ctx *ctx, const pmap_config *cfg);
  /* Undoes ctx_init after the workers stopped (optional). */
  void (*ctx_fini)(pmap_ctx *ctx);
  /* Per-device setup and teardown, once, on the device's own thread (optional). Device 0 runs
   * on the calling thread of each job (unless the caller only waits), so these run there inside
   * enter/leave. */
  pmap_status (*device_init)(pmap_device *dev);
  void (*device_fini)(pmap_device *dev);
  /* Around each job of device 0 on the caller's thread: make the thread the device's, then give
   * it back as it was (optional). A failed enter fails device 0's job (leave is not called). */
  pmap_status (*enter)(pmap_device *dev, int saved[2]);
  void (*leave)(pmap_device *dev, const int saved[2]);
  /* Device memory. */
  pmap_status (*alloc)(pmap_device *dev, size_t bytes, void **out);
  void (*free)(pmap_device *dev, void *ptr);
  /* Host to device; may run asynchronously until the device's next sync or download. */
  pmap_status (*upload)(pmap_device *dev, void *dst, const void *src, size_t bytes);
  /* Device to host; complete on return. */
  pmap_status (*download)(pmap_device *dev, void *dst, const void *src, size_t bytes);
  /* A device-readable pointer to host input of `bytes` bytes, valid until the next stage call
   * on this device with the same slot (0 inputs, 1 labels) (optional: NULL means the device
   * reads host memory directly, as on CPU). */
  pmap_status (*stage)(pmap_device *dev, int slot, const void *host, size_t bytes, void **out);
  /* Waits for the device's queued work (optional). */
  pmap_status (*sync)(pmap_device *dev);
  /* The device's native handles for user code (optional): what 0 is the stream, 1 the BLAS
   * handle; NULL where the backend has none. */
  void *(*native)(pmap_device *dev, int what);
  const pmap_coll_i *coll;
  /* Graph capture and overlapped gradient buckets of pmap_update (optional: NULL where the
   * backend has neither, as on CPU; see pmap_fast_i at the end of this file). */
  const struct pmap_fast_i *fast;
  /* The device's memory (optional): *in_use the bytes this backend's allocator holds for the
   * device, *free_bytes what the device has free (SIZE_MAX when it is not known). */
  pmap_status (*memory)(pmap_device *dev, size_t *in_use, size_t *free_bytes);
  /* Spans timed on the device's queue, for the trace (optional: NULL, spans are host times).
   * mark records a point on the device's queue after the work queued so far and returns its
   * number in the job (0, 1, ...), or -1 when it cannot (then the span is timed on the host);
   * mark_times waits for the queue and gives the `count` marks of the job their times on the
   * host's clock (pmap_now_ns), then forgets them (ns NULL: forgets them without waiting, after
   * a failed job). Both on the device's thread. */
  int (*mark)(pmap_device *dev);
  pmap_status (*mark_times)(pmap_device *dev, int64_t *ns, int count);
} pmap_backend_i;

/* What a device called at a collective's rendezvous (runtime/coll.c). */
typedef struct coll_desc {
  const char *call; /* "pmap_psum", ...; NULL: not called */
  size_t count;
  int root;          /* broadcast's root; all-reduce's operation */
  uint32_t seq;      /* the device's collective number in the job */
  uint32_t job;      /* the job (ctx->job_gen) */
  int64_t arrive_ns; /* when the device arrived (pmap_now_ns): who kept the others waiting */
} coll_desc;

/* What a device's collectives cost it (pmap_ctx_waits): summed over the collectives it met. */
typedef struct dev_waits {
  int64_t collectives;
  int64_t busy_ns; /* from its job's start, or its previous collective's end, to arriving */
  int64_t wait_ns; /* from arriving to every device (and process) having arrived */
  int64_t held_ns; /* the others' waiting at the collectives it arrived at last */
} dev_waits;

struct pmap_device {
  pmap_ctx *ctx;
  int index;
  void *be;           /* the backend's per-device state */
  pmap_status status; /* result of the current job on this device */
  int own_failure;    /* status is this device's own failure, not PMAP_ERR_ABORTED from a
                         collective it abandoned because another device failed */
  int abandoned;      /* this job, the device abandoned a collective (pmap_abandoned) */
  char msg[1024];     /* its message when status != PMAP_SUCCESS */
  int initialised;    /* device_init ran on this device */
  uint32_t coll_seq;  /* public collectives called in the current job */
  /* Barriers of ctx->bar this device arrived at in the current job (pmap_barrier_arrive): every
   * device passes the same barriers in the same order, so a device that timed out names those
   * with fewer arrivals as the ones that did not arrive. */
  _Atomic uint32_t arrivals;
  int names_others; /* msg is about other devices (those that did not arrive), so the job's
                       report does not name this device as the failing one */
  uint64_t xseq;    /* distributed: the number of the current collective's inter-process
                         exchange, the same on every process (dist_seq + 1 at its rendezvous) */
  int64_t mark_ns;  /* the start of its job, or the end of its last collective */
  dev_waits waits;  /* written by the device's own thread (held_ns: by local device 0's) */
  /* Spans of this job timed by marks on the device's queue, given their times at its end
   * (runtime/trace_ctx.c); marks: the backend's marks made in the job. */
  struct queued_span *queued;
  int n_queued, cap_queued, marks;
  int trace_keep; /* its spans are the step's own, kept past the span limit (runtime_trace_keep) */
};

struct pmap_ctx {
  const pmap_backend_i *be;
  pmap_backend kind;
  int n;
  pmap_device *dev; /* (n) */
  void *be_ctx;     /* the backend's context-wide state */
  pmap_wait_policy wait;
  int numeric_guard;       /* pmap_config.numeric_guard */
  int uneven;              /* pmap_config.uneven_batches */
  size_t max_memory;       /* pmap_config.max_memory (0: none): the CPU allocator's limit */
  int recompute;           /* pmap_config.recompute, for the params created here */
  int shard;               /* pmap_config.shard_optimizer, AUTO resolved by PMAP_SHARD_OPTIMIZER
                              when set: PMAP_SHARD_AUTO, _OFF or _ON */
  _Atomic int abort;       /* set when a device failed in the current job */
  _Atomic int busy;        /* a job is running: pmap_run is not re-entrant */
  _Atomic int left;        /* devices whose function returned in the current job */
  _Atomic int left_device; /* the first of them */
  _Atomic int dist_agreed; /* distributed: the current job failed in a way every process saw
                              alike (collectives that differ), so the processes stay in step */
  /* Every public call on the context holds this (recursive) lock, so calls from several host
   * threads are serialised; a call from inside a mapped function is refused, not deadlocked. */
  pthread_mutex_t lock;
  int lock_ready;
  int lock_depth;   /* nesting of the lock by its holder */
  const char *call; /* the public call holding the lock (outermost), for the messages of jobs */
  int meets;        /* distributed: the current job is a mapped function (pmap_run) whose end the
                       processes meet at (runtime/procs.c) */
  _Atomic int live_params; /* pmap_params alive on the context */
  /* Workers: thread i serves device i for i >= first_worker, 1 unless the caller only waits
   * (pmap_config.caller_waits: then 0, and device 0 has a thread of its own); started of them
   * run. */
  int first_worker;
  pthread_t *threads;
  int started;
  pmap_event job;   /* bumped to start a job */
  uint32_t job_gen; /* jobs dispatched so far */
  pmap_ctx *parent; /* during a job: the job its dispatching thread was in (or NULL) */
  pmap_fn fn;
  void *arg;
  int stop;
  _Atomic uint32_t done_count;
  pmap_event done; /* bumped when the last worker finished the job */
  sync_barrier bar;
  coll_desc *desc; /* (2, n): what each device called, double-buffered by coll_seq parity */
  struct pmap_fault *fault; /* injected faults (PMAP_FAULT), NULL when none */
  /* Across processes (runtime/dist): the transport, NULL for one process; this process's index
   * and the process count. Global device index = proc * n + local index. */
  struct pmap_dist *dist;
  int proc, nproc;
  unsigned char *xsend, *xall; /* pmap_ctx_exchange's record out and every process's payload */
  size_t xsend_cap, xall_cap;
  /* The process that created the context. Its worker threads exist only there (fork copies
   * the calling thread alone), so every call from another process is refused at once. */
  long pid;
  /* The timeline recording (runtime/trace_ctx.c): NULL when off; tracks 0..n-1 the devices,
   * track n the caller. Written to trace_path when it stops (or the context is destroyed). */
  struct trace_rec *trace;
  char *trace_path;
};

extern const pmap_backend_i pmap_cpu_backend;
/* The CPU backend's default device count: PMAP_CPU_DEVICES, else 4 (runtime/cpu). */
pmap_status pmap_cpu_default_devices(int *out);

/* A backend's implementation: built in (the CPU), or what its plugin's entry point gives. */
typedef struct backend_impl {
  const pmap_backend_i *table;
  int (*device_count)(void); /* usable devices here; 0: not usable */
  /* Why device_count() found none, in the platform's words (optional). */
  const char *(*unavailable_reason)(void);
} backend_impl;

/* One entry of the list of backends of this build (runtime/backend.c), in the order
 * PMAP_BACKEND_AUTO tries them. A new backend is one folder and one entry. */
typedef struct backend_entry {
  pmap_backend kind;
  const char *label;  /* "CPU", "CUDA": for messages */
  backend_impl impl;  /* a backend built into libpmap; empty for a plugin */
  const char *plugin; /* the plugin file that holds it (base/plugin.h), NULL when built in */
  const char *entry;  /* the name of the plugin's backend_plugin_entry */
  /* The count PMAP_DEVICES_DEFAULT stands for (optional: NULL means device_count()). */
  pmap_status (*default_devices)(int *out);
  /* Looks for a device before opening the plugin, for PMAP_BACKEND_AUTO: 0 when there can be
   * none here, so that AUTO does not load the plugin for nothing (optional). */
  int (*may_have_devices)(void);
} backend_entry;

/* What the runtime hands a backend plugin: the core functions the backend's code calls, which
 * the plugin forwards to under their own names (runtime/cuda/cuda_plugin.c). */
typedef struct backend_core_i {
  const pmap_base_i *base;
  int64_t (*now_ns)(void);
  int (*barrier_wait)(sync_barrier *b, const pmap_wait_policy *p);
  pmap_status (*wait_status)(pmap_device *dev, int wait_result, const char *call);
  void (*ctx_abort)(pmap_ctx *ctx);
  pmap_status (*abandonedv)(pmap_device *dev, const char *fmt, va_list ap);
  /* The NCCL bootstrap across processes (runtime/dist/dist_nccl.c). */
  int (*dist_rank)(const struct pmap_dist *d);
  pmap_status (*dist_broadcast_bytes)(struct pmap_dist *d, void *buf, size_t bytes, int root);
} backend_core_i;

/* A backend plugin's entry point: returns backend_plugin_abi() as the plugin was built, and only
 * when that equals abi (the same build) binds core and fills *out. */
typedef uint64_t (*backend_plugin_entry)(uint64_t abi, const backend_core_i *core,
                                         backend_impl *out);
static inline uint64_t backend_plugin_abi(void) {
  const size_t sizes[] = {sizeof(pmap_base_i),    sizeof(backend_core_i), sizeof(backend_impl),
                          sizeof(pmap_backend_i), sizeof(pmap_coll_i),    sizeof(pmap_ctx),
                          sizeof(pmap_device),    sizeof(sync_barrier),   sizeof(pmap_config)};
  return pmap_plugin_abi(sizes, (int)(sizeof sizes / sizeof sizes[0]));
}

/* The backends built in, *count of them. */
const backend_entry *backend_list(int *count);
/* The entry of kind, NULL when this build lacks it. */
const backend_entry *backend_find(pmap_backend kind);
/* The implementation of e, opening its plugin the first time; PMAP_ERR_UNAVAILABLE naming the
 * plugin file and the loader's reason when it cannot be had (what: "pmap_ctx_create: backend
 * cuda", for the message). */
pmap_status backend_load(const backend_entry *e, const char *what, const backend_impl **out);
/* PMAP_ERR_INTERNAL naming the first required member of be that is NULL. */
pmap_status backend_check(const pmap_backend_i *be);

/* The table's context-wide and per-device hooks, optional members handled here. */
pmap_status backend_ctx_init(pmap_ctx *ctx, const pmap_config *cfg);
void backend_ctx_fini(pmap_ctx *ctx);
pmap_status backend_device_init(pmap_device *dev);
void backend_device_fini(pmap_device *dev);
pmap_status backend_enter(pmap_device *dev, int saved[2]);
void backend_leave(pmap_device *dev, const int saved[2]);

/* Marks the current job failed on every device and wakes every waiter. */
void pmap_ctx_abort(pmap_ctx *ctx);

/* PMAP_ERR_ABORTED with the printf-style message, for a device that abandons a collective
 * because another device failed: the job then reports that other device's failure. */
pmap_status pmap_abandoned(pmap_device *dev, const char *fmt, ...) PMAP_PRINTF_LIKE(2, 3);
pmap_status pmap_abandonedv(pmap_device *dev, const char *fmt, va_list ap) PMAP_PRINTF_LIKE(2, 0);

/* Arrives at the context's barrier (sync_barrier_wait_touch on ctx->bar, counted in the
 * device's arrivals): every barrier of a job goes through here or skips the count on every
 * device alike. */
int pmap_barrier_arrive(pmap_device *dev, const pmap_wait_policy *w, _Atomic int *touch);

/* Turns a barrier wait result into a status with a message naming the device and call (a
 * timeout: the devices that did not arrive). */
pmap_status pmap_wait_status(pmap_device *dev, int wait_result, const char *call);

/* The wait of a device while local device 0 exchanges with the other processes: longer than the
 * context's timeout, since that exchange is bounded by it and names the process it waits for,
 * which a local "device 0 did not arrive" would hide. */
pmap_wait_policy pmap_patient_wait(const pmap_ctx *ctx);

/* Distributed, outside jobs: the settings of the context that change what a step exchanges
 * (numeric_guard, uneven_batches) are the same on every process, else
 * PMAP_ERR_INVALID_ARGUMENT naming the setting and each process's value. */
pmap_status procs_check_settings(pmap_ctx *ctx);
/* Distributed, after the job of a mapped function (pmap_run) ended with st (own: the failure is
 * this process's own, not a collective abandoned because another process failed; its message
 * is the thread's): the processes meet, so that a process whose devices returned while another
 * waits in a collective, and a failure of one process, fail every process's pmap_run alike
 * and leave them in step (runtime/dist dist_end_job). Returns the job's verdict. */
pmap_status procs_end_job(pmap_ctx *ctx, pmap_status st, int own, uint64_t seq0);

/* The step's fast paths (models/step_fast.c), implemented by the CUDA backend
 * (runtime/cuda/cuda_graph.c). Every member is required when the table is there. */
typedef struct pmap_fast_i {
  /* What the context asked for: captured steps, overlapped buckets, their size in bytes. */
  void (*modes)(const pmap_ctx *ctx, int *graphs, int *overlap, size_t *bucket_bytes);
  /* Bumped by every device allocation of the context: a captured step names the buffers it was
   * captured with, so one taken at another generation must be captured again. */
  uint64_t (*generation)(const pmap_ctx *ctx);
  /* Capture of the device's queued work: begin, then end with the result of the work queued in
   * between (body: its status); *graph is the instantiated graph, or NULL with the reason in
   * why (size whylen) when capture or instantiation failed (not an error: the step then runs
   * without a graph). While capturing, stage returns the slot's buffer without copying: the
   * inputs are staged before the capture. */
  pmap_status (*capture_begin)(pmap_device *dev);
  void (*capture_end)(pmap_device *dev, pmap_status body, void **graph, char *why, size_t whylen);
  /* Queues a captured graph on the device (its collectives count as issued). */
  pmap_status (*launch)(pmap_device *dev, void *graph);
  void (*graph_free)(pmap_device *dev, void *graph); /* accepts NULL */
  /* The mean all-reduce of buf (count, in place) on a second queue, after the work queued so
   * far on the device; join makes the device's queue wait for every bucket issued. */
  pmap_status (*bucket_reduce)(pmap_device *dev, float *buf, size_t count);
  pmap_status (*bucket_join)(pmap_device *dev);
} pmap_fast_i;

#endif
