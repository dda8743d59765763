/* cuda_coll.c: the collectives of the CUDA backend on NCCL (one communicator rank per logical
 * device, each used only by its device's thread), and the timed wait that every wait on a GPU
 * goes through, so that a failed device or a stuck collective ends in an error, never a hang. */
#include <sched.h>
#include <time.h>

#include "cuda_backend.h"

/* Poll the async NCCL error every this many polls of the stream (it takes a call into NCCL). */
#define ASYNC_POLL_EVERY 16
/* After the spin phase, sleep this long between polls. */
#define POLL_SLEEP_NS 20000L

/* Records failure st of an NCCL operation: the operation can no longer complete on every rank,
 * so the communicators are aborted and the other devices told. */
static pmap_status coll_failed(pmap_device *dev, pmap_status st) {
  cuda_comms_abort(dev->ctx->be_ctx);
  pmap_ctx_abort(dev->ctx);
  return st;
}

pmap_status cuda_nccl_failed(pmap_device *dev, pmap_status st, const char *call) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  int why = atomic_load(&cc->watchdog_fired);
  if (why == CUDA_WATCHDOG_TIMEOUT)
    st = PMAP_ERR(PMAP_ERR_TIMEOUT,
                  "%s on device %d was stuck in NCCL for longer than %.3f s; the NCCL "
                  "communicators were aborted: destroy the context",
                  call, dev->index, (double)cuda_timeout_ns(dev->ctx) * 1e-9);
  else if (why == CUDA_WATCHDOG_PEER_FAILED)
    st = PMAP_ERR(PMAP_ERR_ABORTED,
                  "%s on device %d abandoned: another device failed while this one waited in "
                  "NCCL, so the NCCL communicators were aborted",
                  call, dev->index);
  return coll_failed(dev, st);
}

pmap_status cuda_nccl_issued(pmap_device *dev, ncclResult_t r, const char *text,
                             const char *call) {
  cuda_device *cd = dev->be;
  pmap_status st = PMAP_SUCCESS;
  CUDA_CHECK_GEN(cd, CUDA_LIB_NCCL, ncclSuccess, r, text, {
    st = cuda_chk_s_;
    goto fail;
  });
  cuda_nccl_leave(dev);
  return cuda_wait(dev, call, 1);
fail:
  cuda_nccl_leave(dev);
  return cuda_nccl_failed(dev, st, call);
}

/* 1 when an asynchronous NCCL error was found (recorded in st). */
static int async_error(pmap_device *dev, cuda_device *cd, const char *call, pmap_status *st) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  if (atomic_load(&cc->dead)) return 0; /* nothing to ask: the collective was aborted */
  if (cuda_nccl_enter(dev, call) != PMAP_SUCCESS) return 0;
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(cd->comm, &async);
  cuda_nccl_leave(dev);
  if (r != ncclSuccess) {
    *st = cuda_fail(cd, CUDA_LIB_NCCL, (int)r, "ncclCommGetAsyncError(comm, &async)", __FILE__,
                    __LINE__, __func__);
    return 1;
  }
  if (async == ncclSuccess || async == ncclInProgress) return 0;
  *st = cuda_fail(cd, CUDA_LIB_NCCL, (int)async, call, __FILE__, __LINE__, __func__);
  return 1;
}

pmap_status cuda_wait(pmap_device *dev, const char *call, int collective) {
  cuda_device *cd = dev->be;
  pmap_ctx *ctx = dev->ctx;
  cuda_ctx *cc = ctx->be_ctx;
  int64_t start = pmap_now_ns(), timeout = cuda_timeout_ns(ctx);
  /* GPU work runs much longer than a barrier wait: spin ten barrier spins, then sleep. */
  int64_t spin = 10 * ctx->wait.spin_ns;
  pmap_status st = PMAP_SUCCESS;
  for (unsigned it = 1;; it++) {
    cudaError_t e = cudaStreamQuery(cd->stream);
    if (e == cudaSuccess) return PMAP_SUCCESS;
    if (e != cudaErrorNotReady) {
      st = cuda_fail(cd, CUDA_LIB_RUNTIME, (int)e, call, __FILE__, __LINE__, __func__);
      /* A collective of this device will not finish: the others must not wait for it. */
      return collective ? coll_failed(dev, st) : st;
    }
    if (it % ASYNC_POLL_EVERY == 0 && async_error(dev, cd, call, &st)) return coll_failed(dev, st);
    if (collective && atomic_load(&cc->dead))
      return PMAP_ERR(PMAP_ERR_ABORTED,
                      "%s on device %d abandoned: the NCCL communicators were aborted after a "
                      "failure on another device",
                      call, dev->index);
    if (collective && atomic_load_explicit(&ctx->abort, memory_order_acquire))
      return coll_failed(dev, PMAP_ERR(PMAP_ERR_ABORTED,
                                       "%s on device %d abandoned: another device failed, so the "
                                       "NCCL communicators were aborted",
                                       call, dev->index));
    int64_t waited = pmap_now_ns() - start;
    if (timeout >= 0 && waited > timeout)
      return coll_failed(dev, PMAP_ERR(PMAP_ERR_TIMEOUT,
                                       "%s on device %d (GPU %d) did not complete within %.3f s; "
                                       "the NCCL communicators were aborted: destroy the context",
                                       call, dev->index, cd->gpu, (double)timeout * 1e-9));
    if (waited < spin) {
      sched_yield();
    } else {
      struct timespec ts = {0, POLL_SLEEP_NS};
      nanosleep(&ts, NULL);
    }
  }
}

static ncclRedOp_t nccl_op(pmap_redop op) {
  switch (op) {
  case PMAP_RED_SUM: return ncclSum;
  case PMAP_RED_MEAN: return ncclAvg;
  case PMAP_RED_MAX: return ncclMax;
  }
  return ncclSum;
}

static pmap_status cuda_all_reduce(pmap_device *dev, const float *send, float *recv, size_t count,
                                   pmap_redop op) {
  cuda_device *cd = dev->be;
  if (count == 0) return PMAP_SUCCESS;
  PMAP_TRY(cuda_nccl_enter(dev, "all_reduce"));
  return cuda_nccl_issued(
      dev, ncclAllReduce(send, recv, count, ncclFloat32, nccl_op(op), cd->comm, cd->stream),
      "ncclAllReduce", "all_reduce");
}

static pmap_status cuda_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                                  int root) {
  cuda_device *cd = dev->be;
  if (count == 0) return PMAP_SUCCESS;
  PMAP_TRY(cuda_nccl_enter(dev, "broadcast"));
  return cuda_nccl_issued(
      dev, ncclBroadcast(send, recv, count, ncclFloat32, root, cd->comm, cd->stream),
      "ncclBroadcast", "broadcast");
}

static pmap_status cuda_all_gather(pmap_device *dev, const float *send, float *recv,
                                   size_t count) {
  cuda_device *cd = dev->be;
  if (count == 0) return PMAP_SUCCESS;
  /* In place is NCCL's form, send == recv + index * count (checked in runtime/coll.c). */
  PMAP_TRY(cuda_nccl_enter(dev, "all_gather"));
  return cuda_nccl_issued(dev, ncclAllGather(send, recv, count, ncclFloat32, cd->comm, cd->stream),
                          "ncclAllGather", "all_gather");
}

/* Drain this device's stream, then meet the other threads: every device's earlier work is done
 * when any of them leaves. */
static pmap_status cuda_barrier(pmap_device *dev) {
  pmap_ctx *ctx = dev->ctx;
  PMAP_TRY(cuda_wait(dev, "barrier", 0));
  return pmap_wait_status(dev, sync_barrier_wait(&ctx->bar, &ctx->wait), "barrier");
}

const pmap_coll_i pmap_cuda_coll = {
    .all_reduce = cuda_all_reduce,
    .broadcast = cuda_broadcast,
    .all_gather = cuda_all_gather,
    .barrier = cuda_barrier,
};
