/* cuda_nccl.c: what every NCCL call of the CUDA backend goes through: entering and leaving one
 * (so the watchdog sees a thread inside), waiting for a non-blocking call to settle, the
 * context's timeout, and aborting the communicators. Used by the context (cuda_ctx.c), the
 * collectives (cuda_coll.c) and the graphs (cuda_graph.c); calls none of them. */
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "cuda_backend.h"

/* A non-blocking NCCL call still in progress is asked this many times before the polls sleep. */
#define SETTLE_SPINS 64
/* After the spin phase, sleep this long between polls. */
#define POLL_SLEEP_NS 20000L
/* How long an abort waits for the threads inside NCCL calls to leave them. On non-blocking
 * communicators every call but abort and destroy returns at once (ncclInProgress where it is not
 * done), and the backend's own polls of one look at `dead` before each call, so a thread leaves
 * within microseconds; only one that never does outlasts this. */
#define ABORT_WAIT_NS (10LL * 1000000000LL)

int64_t cuda_timeout_of(cuda_ctx *cc) {
  int64_t t = cc->ctx->wait.timeout_ns;
  if (atomic_load(&cc->starting) > 0 && t >= 0 && t < CUDA_STARTUP_TIMEOUT_NS)
    t = CUDA_STARTUP_TIMEOUT_NS;
  return t;
}

int64_t cuda_timeout_ns(pmap_ctx *ctx) { return cuda_timeout_of(ctx->be_ctx); }

ncclResult_t cuda_nccl_settle(cuda_ctx *cc, ncclComm_t comm, int64_t deadline_ns) {
  for (unsigned it = 0;; it++) {
    /* Look before each call: an aborter frees the communicator once this thread has left. */
    if (atomic_load(&cc->dead)) return ncclInProgress;
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (deadline_ns >= 0 && pmap_now_ns() > deadline_ns) return ncclInProgress;
    if (it < SETTLE_SPINS) {
      sched_yield();
    } else {
      struct timespec ts = {0, POLL_SLEEP_NS};
      nanosleep(&ts, NULL);
    }
  }
}

pmap_status cuda_nccl_enter(pmap_device *dev, const char *call) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  /* Announce first, then look: an aborter sets `dead` first, then looks, so one of the two
   * always sees the other (both sequentially consistent). */
  atomic_store(&cc->nccl_since[dev->index], pmap_now_ns());
  if (!atomic_load(&cc->dead)) return PMAP_SUCCESS;
  atomic_store(&cc->nccl_since[dev->index], 0);
  return PMAP_ERR(PMAP_ERR_DEVICE,
                  "%s on device %d: the NCCL communicators were aborted after an earlier failure "
                  "or timeout; destroy the context and create a new one",
                  call, dev->index);
}

void cuda_nccl_leave(pmap_device *dev) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  atomic_store(&cc->nccl_since[dev->index], 0);
}

void cuda_rank_stop(cuda_ctx *cc, int i) {
  if (atomic_load(&cc->comm_gone[i]) || !cc->comms[i]) return;
#if defined(NCCL_REVOKE_DEFAULT)
  (void)ncclCommRevoke(cc->comms[i], NCCL_REVOKE_DEFAULT);
  if (cc->graph_comms && cc->graph_comms[i])
    (void)ncclCommRevoke(cc->graph_comms[i], NCCL_REVOKE_DEFAULT);
#else
  cuda_rank_abort(cc, i);
#endif
}

void cuda_rank_abort(cuda_ctx *cc, int i) {
  if (atomic_load(&cc->comm_gone[i])) return;
  if (cc->comms[i]) (void)ncclCommAbort(cc->comms[i]);
  if (cc->graph_comms && cc->graph_comms[i]) (void)ncclCommAbort(cc->graph_comms[i]);
  atomic_store(&cc->comm_gone[i], 1);
}

void cuda_comms_abort(cuda_ctx *cc) {
  pthread_mutex_lock(&cc->abort_lock);
  atomic_store(&cc->dead, 1);
  if (cc->comms_live) {
    /* A thread that entered an NCCL call before it saw `dead` leaves it before its communicator
     * is freed: an abort frees the communicator, and freeing it under a call is a use after
     * free. A rank whose thread is still inside after ABORT_WAIT_NS (never seen: NCCL promises
     * otherwise) is left out, and one line on stderr says so; its device's destruction stops
     * and frees it once that thread has left (cuda_backend.c). */
    int64_t deadline = pmap_now_ns() + ABORT_WAIT_NS;
    int saved = -1, kept = 0;
    if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
    for (int i = 0; i < cc->n; i++) {
      while (atomic_load(&cc->nccl_since[i]) && pmap_now_ns() < deadline) {
        struct timespec ts = {0, POLL_SLEEP_NS};
        nanosleep(&ts, NULL);
      }
      if (atomic_load(&cc->nccl_since[i])) {
        kept++;
        continue;
      }
      cuda_rank_abort(cc, i);
    }
    if (saved >= 0) (void)cudaSetDevice(saved);
    (void)cudaGetLastError();
    if (kept)
      fprintf(stderr,
              "pmap: %d NCCL communicator rank%s not aborted: %s thread stayed inside an NCCL "
              "call for %.0f s after the abort began; the context's destruction ends %s\n",
              kept, kept == 1 ? "" : "s", kept == 1 ? "its" : "their", (double)ABORT_WAIT_NS * 1e-9,
              kept == 1 ? "it" : "them");
    cc->comms_live = 0;
  }
  pthread_mutex_unlock(&cc->abort_lock);
}
