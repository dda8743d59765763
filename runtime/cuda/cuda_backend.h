/* cuda_backend.h: the CUDA backend's context-wide state and what its C files share: the timed
 * wait on a device's stream and the abort of the NCCL communicators. C only; the kernels in
 * ops/cuda see just cuda_device.h. */
#ifndef PMAP_CUDA_BACKEND_H
#define PMAP_CUDA_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>

#include "cuda_device.h"
#include "runtime/backend.h"

/* The backend (runtime/backend.h), as the plugin's entry point gives it (cuda_plugin.c). */
extern const pmap_backend_i pmap_cuda_backend;
/* Number of usable CUDA devices, 0 where there are none (no driver, no GPU). */
int pmap_cuda_device_count(void);
/* Why the last pmap_cuda_device_count on this thread found none, in CUDA's words (e.g. the
 * driver is older than the runtime, or there is no device). */
const char *pmap_cuda_unavailable_reason(void);

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
  ncclComm_t *comms; /* (n) rank i serves logical device i: non-blocking, so it can be aborted */
  /* (n) the captured steps' ranks, blocking (NULL where the context does not capture): NCCL
   * launches a collective of a non-blocking communicator from a thread of its own, which a
   * thread-local capture of the device's stream does not see; a blocking one launches it on the
   * calling thread. Aborted and destroyed with comms[i]. */
  ncclComm_t *graph_comms;
  int comms_live; /* comms[] exist and were neither aborted nor destroyed */
  /* (n) device i's ranks were aborted or destroyed: an abort leaves out a rank whose thread stays
   * inside an NCCL call (cuda_comms_abort), which its device's destruction then aborts. */
  _Atomic int *comm_gone;
  /* (n) how device i's destruction found its streams (cuda_backend.c): 0 not yet known, 1
   * drained, -1 their work did not finish in time. Freeing device memory waits for the whole
   * GPU, so a device frees nothing while another device on its GPU has work left. */
  _Atomic int *drained;
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
  /* (n) NCCL collectives device i has issued (cuda_nccl_issued, graph launches): an allocation
   * without memory pools on a shared GPU waits for its peers' counts (cuda_mem.c). */
  _Atomic uint64_t *issued;
  /* ncclConfig_t minCTAs and maxCTAs given to every rank where ranks share a GPU (0: NCCL's
   * own choice, where none does); see cuda_nccl_cta_limits. */
  int cta_min, cta_max;
  /* Test hooks: PMAP_CUDA_WAIT_FAIL=D makes device D's blocking-sync waits fail as a machine
   * that refuses them would (-1: none); PMAP_CUDA_NO_MEMPOOL=1 makes every device allocate as
   * on a GPU without memory pools. */
  int wait_fail;
  int no_pool;
} cuda_ctx;

extern const pmap_fast_i pmap_cuda_fast;

/* PMAP_CUDA_BUCKET_MB's text s (NULL or empty: the default, 25 MiB) as bytes: a number of MiB,
 * whole or not, from 1 KiB to 4096 MiB; PMAP_ERR_INVALID_ARGUMENT naming the text otherwise. */
pmap_status cuda_bucket_bytes_parse(const char *s, size_t *bytes);
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

/* Device memory (cuda_mem.c). init decides, when the device starts, whether cd allocates from
 * a memory pool (cudaMallocAsync, stream-ordered; a pool of its own where it shares its GPU) or,
 * where the GPU has none, with cudaMalloc into blocks kept for reuse; alloc takes 256 bytes for 0
 * (dev may be NULL only before any collective); free is stream-ordered and accepts NULL; release
 * returns every kept block and the device's pool to CUDA once the device's work is drained. */
pmap_status cuda_mem_init(cuda_device *cd, const cuda_ctx *cc);
pmap_status cuda_mem_alloc(pmap_device *dev, cuda_device *cd, size_t bytes, void **out);
void cuda_mem_free(cuda_device *cd, void *ptr);
void cuda_mem_release(cuda_device *cd);

/* ncclConfig_t's minCTAs and maxCTAs for every rank of a communicator of which up to
 * ranks_per_gpu ranks share one GPU of `sms` multiprocessors: each rank's collective kernel
 * takes a multiprocessor per channel, and the kernels of every rank on the GPU must be resident
 * at once (each waits for the others), so all of them together get at most half the GPU. Both
 * 0 (NCCL's own choice) for ranks_per_gpu <= 1. */
void cuda_nccl_cta_limits(int sms, int ranks_per_gpu, int *min_ctas, int *max_ctas);

/* Whether CUDA loads kernels lazily in this process: 1 lazy, 0 eagerly, -1 unknown (a driver
 * without cuModuleGetLoadingMode). Needs CUDA initialised. */
int cuda_module_loading_lazy(void);
/* The hardware queues (CUDA_DEVICE_MAX_CONNECTIONS) where logical devices may share a GPU. */
#define CUDA_SHARED_MAX_CONNECTIONS "32"
/* Before this process's first CUDA call: where several logical devices may share a GPU
 * (NCCL_MULTI_RANK_GPU_ENABLE set), sets CUDA_MODULE_LOADING to EAGER and
 * CUDA_DEVICE_MAX_CONNECTIONS to CUDA_SHARED_MAX_CONNECTIONS where they are unset. Once. */
void cuda_module_loading_prepare(void);

/* The context half of the backend table (cuda_ctx.c): ctx_init validates the device list and
 * creates the communicators on the creating thread; ctx_fini destroys them after the workers
 * stopped and every device_fini drained its stream. */
pmap_status cuda_ctx_init(pmap_ctx *ctx, const pmap_config *cfg);
void cuda_ctx_fini(pmap_ctx *ctx);

/* cuda_nccl.c: what every NCCL call goes through. */
/* Marks the communicators dead and aborts every one of them, once, each after the thread inside
 * a call on it (cuda_nccl_enter) has left; callable from any thread but one inside such a call,
 * any number of times. Kernels of collectives still in flight on any GPU end. */
void cuda_comms_abort(cuda_ctx *cc);

/* The communicator of dev's collectives now: its blocking rank while its stream is captured,
 * where the context made one, else its non-blocking rank. */
static inline ncclComm_t cuda_comm_of(const cuda_device *cd) {
  return cd->capturing && cd->graph_comm ? cd->graph_comm : cd->comm;
}

/* Aborts device i's ranks (both, where it has a blocking one) unless they are gone already;
 * the caller holds cc->abort_lock and no thread is inside an NCCL call on them. */
void cuda_rank_abort(cuda_ctx *cc, int i);
/* Ends the kernels of device i's ranks without freeing anything (ncclCommRevoke, where this
 * NCCL has it; else an abort), under the same conditions: a device's destruction stops a rank
 * that an abort left out, and frees it only once no work is left on its GPU. */
void cuda_rank_stop(cuda_ctx *cc, int i);

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
int64_t cuda_timeout_of(cuda_ctx *cc);

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
