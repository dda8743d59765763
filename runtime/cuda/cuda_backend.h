/* cuda_backend.h: the CUDA backend's context-wide state and what its C files share: the timed
 * wait on a device's stream and the abort of the NCCL communicators. C only; the kernels in
 * ops/cuda see just cuda_device.h. */
#ifndef PMAP_CUDA_BACKEND_H
#define PMAP_CUDA_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>

#include "cuda_device.h"
#include "runtime/backend.h"

enum { CUDA_WATCHDOG_IDLE = 0, CUDA_WATCHDOG_TIMEOUT = 1, CUDA_WATCHDOG_PEER_FAILED = 2 };

/* How a thread waits for its stream (PMAP_CUDA_WAIT): `block` sleeps in cudaEventSynchronize on
 * a blocking-sync event while the watchdog enforces the timeout; `poll` queries the stream in a
 * loop of short sleeps and checks everything itself. */
typedef enum cuda_wait_mode { CUDA_WAIT_BLOCK = 0, CUDA_WAIT_POLL = 1 } cuda_wait_mode;

/* The start-up barrier (first NCCL connections, cuBLAS loading on every GPU at once) may take
 * seconds; a context's timeout shorter than this does not apply to it. */
#define CUDA_STARTUP_TIMEOUT_NS (60LL * 1000000000LL)

typedef struct cuda_ctx {
  int n;
  int *gpus;         /* (n) physical GPU of each logical device */
  cuda_device *devs; /* (n) dev[i].be of the context */
  ncclComm_t *comms; /* (n) rank i serves logical device i */
  int comms_live;    /* comms[] exist and were neither aborted nor destroyed */
  /* Once set, every NCCL call fails: the communicators were aborted after a failure or a
   * timeout and the context must be destroyed. */
  _Atomic int dead;
  /* (n) when device i's thread entered its current call on comms[i] (pmap_now_ns), 0 outside
   * one. An abort waits briefly for the thread to leave, so that no call runs on a freed
   * communicator; the watchdog aborts under a thread that stays inside too long. */
  _Atomic int64_t *nccl_since;
  /* (n) when device i's thread began to wait for its stream (0: not waiting), and whether that
   * wait covers a collective (one issued and not yet seen complete: pending). */
  _Atomic int64_t *wait_since;
  _Atomic int *wait_coll;
  _Atomic int *pending;
  pthread_mutex_t abort_lock;
  /* A thread asleep in a blocking wait runs no check of its own, and an NCCL call can wait on
   * the host for a peer that never comes: this thread watches both. */
  pthread_t watchdog;
  int watchdog_started;
  _Atomic int watchdog_stop;
  _Atomic int watchdog_fired; /* why the watchdog aborted: CUDA_WATCHDOG_* */
  _Atomic int starting;       /* devices not yet through device_init */
  pmap_ctx *ctx;
  int nccl_version; /* ncclGetVersion() of the library loaded at run time */
  int tf32;         /* cuBLAS may use TF32 tensor cores for FP32 GEMMs */
  cuda_wait_mode wait_mode;
  int coll_wait;       /* PMAP_CUDA_COLL_WAIT=1: the host waits for every collective */
  size_t pinned_bytes; /* per staging buffer (2 per device); 0: pageable copies */
  /* The fast steps (cuda_graph.c): pmap_config.cuda_graphs / PMAP_CUDA_GRAPHS,
   * cuda_overlap / PMAP_CUDA_OVERLAP, the bucket size, and the test hook PMAP_CUDA_GRAPH_FAIL
   * (the device whose graph fails to instantiate, -1 none). */
  int graphs, overlap;
  size_t bucket_bytes;
  int graph_fail;
  uint64_t alloc_gen; /* allocations on any device (atomic builtins; cuda_device.alloc_gen) */
} cuda_ctx;

extern const pmap_fast_i pmap_cuda_fast;

/* Reads the fast steps' switches from cfg and the environment into cc (cuda_graph.c). */
pmap_status cuda_fast_switches(cuda_ctx *cc, const pmap_config *cfg);
/* Creates and frees a device's part of the fast steps (second stream, events, pinned values);
 * create runs in device_init before any collective (page-locked allocation). */
pmap_status cuda_fast_device_init(cuda_device *cd);
void cuda_fast_device_release(cuda_device *cd);
/* Counts an allocation of cd's context (a captured graph taken before it is stale). */
static inline void cuda_alloc_counted(cuda_device *cd) {
  if (cd->alloc_gen) __atomic_fetch_add(cd->alloc_gen, 1, __ATOMIC_SEQ_CST);
}

extern const pmap_coll_i pmap_cuda_coll;

/* The context half of the backend table (cuda_ctx.c): ctx_init validates the device list and
 * creates the communicators on the creating thread; ctx_fini destroys them after the workers
 * stopped and every device_fini drained its stream. */
pmap_status cuda_ctx_init(pmap_ctx *ctx, const pmap_config *cfg);
void cuda_ctx_fini(pmap_ctx *ctx);

/* Marks the communicators dead and aborts every one of them, once; callable from any thread
 * any number of times. Kernels of collectives still in flight on any GPU end. */
void cuda_comms_abort(cuda_ctx *cc);

/* Brackets one NCCL call on dev's communicator. Enter fails with PMAP_ERR_DEVICE and a message
 * naming `call` once the communicators are dead; only a successful enter needs a leave. */
pmap_status cuda_nccl_enter(pmap_device *dev, const char *call);
void cuda_nccl_leave(pmap_device *dev);

/* An NCCL call on dev's communicator returned failure st: aborts the communicators, tells the
 * other devices, and returns the error to report (a timeout or another device's failure where
 * the watchdog aborted under the call, else st). */
pmap_status cuda_nccl_failed(pmap_device *dev, pmap_status st, const char *call);

/* The timeout in force for waits and NCCL calls of ctx (ns, < 0 never): the context's, raised to
 * CUDA_STARTUP_TIMEOUT_NS while a device is still starting. */
int64_t cuda_timeout_ns(pmap_ctx *ctx);

/* Waits until everything queued on dev's stream is done (the one host wait of a step), giving
 * up on a CUDA error, an asynchronous NCCL error, the context's timeout (PMAP_ERR_TIMEOUT) and,
 * when a collective of this device is in flight (`collective`, or one issued since the last
 * wait), another device's failure (PMAP_ERR_ABORTED, since that collective cannot complete).
 * Except for a plain CUDA error each of these aborts the communicators. A stream that finished
 * is not enough: a collective cut short by an abort ends early with garbage, so the abort flag
 * and NCCL's asynchronous error are checked after it too. `call` names the operation. */
pmap_status cuda_wait(pmap_device *dev, const char *call, int collective);
/* Finishes an NCCL collective issued after cuda_nccl_enter: r is what the NCCL call (source text
 * `text`) returned. Waits while the non-blocking communicator says ncclInProgress, leaves NCCL
 * and returns with the collective queued on the stream (marked pending: the next cuda_wait
 * covers it; PMAP_CUDA_COLL_WAIT=1 waits here), or reports its failure. */
pmap_status cuda_nccl_issued(pmap_device *dev, ncclResult_t r, const char *text, const char *call);

/* Polls comm's asynchronous state while it is ncclInProgress (a call on a non-blocking
 * communicator still running), up to deadline_ns (pmap_now_ns; < 0 none) and while the
 * communicators are alive; returns the final state (ncclInProgress when it gave up). */
ncclResult_t cuda_nccl_settle(cuda_ctx *cc, ncclComm_t comm, int64_t deadline_ns);

#endif
