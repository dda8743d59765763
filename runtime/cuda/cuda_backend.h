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

/* The start-up barrier (first NCCL connections, cuBLAS loading on every GPU at once) may take
 * seconds; a context's timeout shorter than this does not apply to it. */
#define CUDA_STARTUP_TIMEOUT_NS (60LL * 1000000000LL)

typedef struct cuda_ctx {
  int n;
  int *gpus;             /* (n) physical GPU of each logical device */
  cuda_device *devs;     /* (n) dev[i].be of the context */
  ncclComm_t *comms;     /* (n) rank i serves logical device i */
  int comms_live;        /* comms[] exist and were neither aborted nor destroyed */
  /* Once set, every NCCL call fails: the communicators were aborted after a failure or a
   * timeout and the context must be destroyed. */
  _Atomic int dead;
  /* (n) when device i's thread entered its current call on comms[i] (pmap_now_ns), 0 outside
   * one. An abort waits briefly for the thread to leave, so that no call runs on a freed
   * communicator; the watchdog aborts under a thread that stays inside too long. */
  _Atomic int64_t *nccl_since;
  pthread_mutex_t abort_lock;
  /* A blocking NCCL call can wait on the host for a peer that never comes (connections are set
   * up at first use), where no poll of ours runs: this thread watches for that. */
  pthread_t watchdog;
  int watchdog_started;
  _Atomic int watchdog_stop;
  _Atomic int watchdog_fired; /* why the watchdog aborted: CUDA_WATCHDOG_* */
  _Atomic int starting;       /* devices not yet through device_init */
  pmap_ctx *ctx;
  int nccl_version;      /* ncclGetVersion() of the library loaded at run time */
  int tf32;              /* cuBLAS may use TF32 tensor cores for FP32 GEMMs */
} cuda_ctx;

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

/* Waits until everything queued on dev's stream is done, polling so that it can give up: on a
 * CUDA error, an asynchronous NCCL error, the context's timeout (PMAP_ERR_TIMEOUT) and, when
 * `collective` says an NCCL operation of this device is in flight, another device's failure
 * (PMAP_ERR_ABORTED, since that operation can no longer complete). Except for a plain CUDA error
 * each of these aborts the communicators. `call` names the operation in the message. */
pmap_status cuda_wait(pmap_device *dev, const char *call, int collective);
/* Finishes an NCCL collective issued after cuda_nccl_enter: r is what the NCCL call (source text
 * `text`) returned. Leaves NCCL, then waits for the collective, or reports its failure. */
pmap_status cuda_nccl_issued(pmap_device *dev, ncclResult_t r, const char *text, const char *call);

#endif
