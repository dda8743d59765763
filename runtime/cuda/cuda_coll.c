/* cuda_coll.c: the collectives of the CUDA backend on NCCL (one non-blocking communicator rank
 * per logical device, and a blocking one for captured steps, each used only by its device's
 * thread; a collective is queued on the stream, not waited for), and the wait that every wait on
 * a GPU goes through, so that a failed device or a stuck collective ends in an error, never a
 * hang or a silent garbage result. */
#include <sched.h>
#include <stdio.h>
#include <time.h>

#include "cuda_backend.h"

/* Poll the async NCCL error every this many polls of the stream (it takes a call into NCCL). */
#define ASYNC_POLL_EVERY 16
/* Sleep this long between the polls of a stream after its spin phase. */
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
    st = pmap_abandoned(dev,
                        "%s on device %d abandoned: another device failed while this one waited in "
                        "NCCL, so the NCCL communicators were aborted",
                        call, dev->index);
  return coll_failed(dev, st);
}

/* What cuda_nccl_issued does up to the count: settles the call, leaves NCCL and reports a
 * failure, all before the collective may count as issued. */
static pmap_status issue_settle(pmap_device *dev, ncclResult_t r, const char *text,
                                const char *call) {
  cuda_device *cd = dev->be;
  cuda_ctx *cc = dev->ctx->be_ctx;
  pmap_status st = PMAP_SUCCESS;
  if (r == ncclInProgress) {
    /* A non-blocking communicator still setting the call up (e.g. a first connection): its
     * kernel is not yet on the stream. */
    int64_t t = cuda_timeout_ns(dev->ctx);
    r = cuda_nccl_settle(cc, cuda_comm_of(cd), t >= 0 ? pmap_now_ns() + t : -1);
    if (r == ncclInProgress) {
      cuda_nccl_leave(dev);
      if (atomic_load(&cc->dead))
        return cuda_nccl_failed(dev,
                                pmap_abandoned(dev,
                                               "%s on device %d abandoned: the NCCL "
                                               "communicators were aborted",
                                               call, dev->index),
                                call);
      return coll_failed(dev, PMAP_ERR(PMAP_ERR_TIMEOUT,
                                       "%s on device %d: NCCL did not finish issuing %s within "
                                       "%.3f s; the NCCL communicators were aborted: destroy "
                                       "the context",
                                       call, dev->index, text, (double)t * 1e-9));
    }
  }
  CUDA_CHECK_GEN(cd, CUDA_LIB_NCCL, ncclSuccess, r, text, {
    st = cuda_chk_s_;
    goto fail;
  });
  cuda_nccl_leave(dev);
  return PMAP_SUCCESS;
fail:
  cuda_nccl_leave(dev);
  return cuda_nccl_failed(dev, st, call);
}

pmap_status cuda_nccl_issued(pmap_device *dev, ncclResult_t r, const char *text, const char *call) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  pmap_status st = issue_settle(dev, r, text, call);
  /* Counted only now: with ncclInProgress the kernel was not on the stream yet, and a peer on
   * the same GPU waiting for this count before an allocation that synchronizes the GPU
   * (cuda_mem.c) must not get in before it. Counted on failure too, after the abort that tells
   * the peers: they go on and find it. */
  atomic_fetch_add(&cc->issued[dev->index], 1);
  if (st != PMAP_SUCCESS) return st;
  /* Stream-ordered: the next wait of this device covers the collective. */
  atomic_store(&cc->pending[dev->index], 1);
  return cc->coll_wait ? cuda_wait(dev, call, 1) : PMAP_SUCCESS;
}

/* 1 when an asynchronous NCCL error was found on either of the device's communicators
 * (recorded in st). */
static int async_error(pmap_device *dev, cuda_device *cd, const char *call, pmap_status *st) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  if (atomic_load(&cc->dead)) return 0; /* nothing to ask: the collective was aborted */
  if (cuda_nccl_enter(dev, call) != PMAP_SUCCESS) return 0;
  ncclResult_t async = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(cd->comm, &async);
  if (r == ncclSuccess && (async == ncclSuccess || async == ncclInProgress) && cd->graph_comm)
    r = ncclCommGetAsyncError(cd->graph_comm, &async);
  cuda_nccl_leave(dev);
  if (r != ncclSuccess) {
    *st = cuda_fail(&cd->where, CUDA_LIB_NCCL, (int)r, "ncclCommGetAsyncError(comm, &async)",
                    __FILE__, __LINE__, __func__);
    return 1;
  }
  if (async == ncclSuccess || async == ncclInProgress) return 0;
  *st = cuda_fail(&cd->where, CUDA_LIB_NCCL, (int)async, call, __FILE__, __LINE__, __func__);
  return 1;
}

static pmap_status timed_out(pmap_device *dev, const char *call, int64_t timeout) {
  cuda_device *cd = dev->be;
  return coll_failed(dev, PMAP_ERR(PMAP_ERR_TIMEOUT,
                                   "%s on device %d (GPU %d) did not complete within %.3f s; "
                                   "the NCCL communicators were aborted: destroy the context",
                                   call, dev->index, cd->where.gpu, (double)timeout * 1e-9));
}

/* The stream finished, but a collective of it may have been cut short by an abort (its kernel
 * ends early and leaves garbage): then this device must not go on as if it had the result. */
static pmap_status collective_verdict(pmap_device *dev, const char *call) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  cuda_device *cd = dev->be;
  pmap_status st = PMAP_SUCCESS;
  if (atomic_load(&cc->dead)) {
    if (atomic_load(&cc->watchdog_fired) == CUDA_WATCHDOG_TIMEOUT)
      return PMAP_ERR(PMAP_ERR_TIMEOUT,
                      "%s on device %d: a collective did not complete within %.3f s; the NCCL "
                      "communicators were aborted: destroy the context",
                      call, dev->index, (double)cuda_timeout_ns(dev->ctx) * 1e-9);
    return pmap_abandoned(dev,
                          "%s on device %d abandoned: the NCCL communicators were aborted after a "
                          "failure on another device, so its collective's result is not valid",
                          call, dev->index);
  }
  if (async_error(dev, cd, call, &st)) return coll_failed(dev, st);
  atomic_store(&cc->pending[dev->index], 0);
  return PMAP_SUCCESS;
}

/* PMAP_CUDA_WAIT=poll: query the stream, spinning briefly, then in short sleeps; every check is
 * made here. */
static pmap_status wait_poll(pmap_device *dev, cuda_device *cd, const char *call, int collective) {
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
      st = cuda_fail(&cd->where, CUDA_LIB_RUNTIME, (int)e, call, __FILE__, __LINE__, __func__);
      /* A collective of this device will not finish: the others must not wait for it. */
      return collective ? coll_failed(dev, st) : st;
    }
    if (collective && it % ASYNC_POLL_EVERY == 0 && async_error(dev, cd, call, &st))
      return coll_failed(dev, st);
    if (collective && atomic_load(&cc->dead))
      return pmap_abandoned(
          dev,
          "%s on device %d abandoned: the NCCL communicators were aborted after a "
          "failure on another device",
          call, dev->index);
    if (collective && atomic_load_explicit(&ctx->abort, memory_order_acquire))
      return coll_failed(dev,
                         pmap_abandoned(dev,
                                        "%s on device %d abandoned: another device failed, so the "
                                        "NCCL communicators were aborted",
                                        call, dev->index));
    int64_t waited = pmap_now_ns() - start;
    if (timeout >= 0 && waited > timeout) return timed_out(dev, call, timeout);
    if (waited < spin) {
      sched_yield();
    } else {
      struct timespec ts = {0, POLL_SLEEP_NS};
      nanosleep(&ts, NULL);
    }
  }
}

/* A blocking-sync wait failed with e. A machine may refuse the sleep itself (a sandbox's
 * driver interface) while the stream is fine: then the stream's own state, asked without
 * sleeping, is unaffected, and this device polls from now on (one line on stderr says so).
 * 1 when it fell back; 0 when the failure is the stream's. */
static int wait_fallback(pmap_device *dev, cuda_device *cd, cudaError_t e) {
  cudaError_t q = cudaStreamQuery(cd->stream);
  if (q != cudaSuccess && q != cudaErrorNotReady) return 0;
  (void)cudaGetLastError();
  fprintf(stderr,
          "pmap: device %d (GPU %d): a blocking-sync wait failed (%s: %s); this device's waits "
          "poll from now on\n",
          dev->index, cd->where.gpu, cudaGetErrorName(e), cudaGetErrorString(e));
  (void)cudaEventDestroy(cd->done);
  (void)cudaGetLastError();
  cd->done = NULL;
  return 1;
}

/* PMAP_CUDA_WAIT=block (the default): sleep on a blocking-sync event behind the stream's work;
 * the watchdog (cuda_ctx.c) aborts the communicators on a timeout or, when this wait covers a
 * collective, on another device's failure, which ends the collective and so the wait. */
static pmap_status wait_block(pmap_device *dev, cuda_device *cd, const char *call, int collective) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  int i = dev->index;
  int64_t start = pmap_now_ns(), timeout = cuda_timeout_ns(dev->ctx);
  cudaError_t e = cudaEventRecord(cd->done, cd->stream);
  if (e == cudaSuccess) {
    atomic_store(&cc->wait_coll[i], collective);
    atomic_store(&cc->wait_since[i], start);
    /* The test hook stands in for a machine that refuses the sleep. */
    e = cc->wait_fail == i ? cudaErrorNotSupported : cudaEventSynchronize(cd->done);
    atomic_store(&cc->wait_since[i], 0);
  }
  if (e != cudaSuccess && wait_fallback(dev, cd, e)) return wait_poll(dev, cd, call, collective);
  if (e != cudaSuccess) {
    pmap_status st =
        cuda_fail(&cd->where, CUDA_LIB_RUNTIME, (int)e, call, __FILE__, __LINE__, __func__);
    return collective ? coll_failed(dev, st) : st;
  }
  if (timeout >= 0 && pmap_now_ns() - start > timeout &&
      atomic_load(&cc->watchdog_fired) == CUDA_WATCHDOG_TIMEOUT)
    return timed_out(dev, call, timeout);
  return PMAP_SUCCESS;
}

pmap_status cuda_wait(pmap_device *dev, const char *call, int collective) {
  cuda_device *cd = dev->be;
  cuda_ctx *cc = dev->ctx->be_ctx;
  collective = collective || atomic_load(&cc->pending[dev->index]);
  /* Once the communicators are aborted the watchdog no longer ends waits: poll, within the
   * timeout. */
  int poll = cc->wait_mode == CUDA_WAIT_POLL || !cd->done || atomic_load(&cc->dead);
  PMAP_TRY(poll ? wait_poll(dev, cd, call, collective) : wait_block(dev, cd, call, collective));
  return collective ? collective_verdict(dev, call) : PMAP_SUCCESS;
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
      dev, ncclAllReduce(send, recv, count, ncclFloat32, nccl_op(op), cuda_comm_of(cd), cd->stream),
      "ncclAllReduce", "all_reduce");
}

static pmap_status cuda_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                                  int root) {
  cuda_device *cd = dev->be;
  if (count == 0) return PMAP_SUCCESS;
  PMAP_TRY(cuda_nccl_enter(dev, "broadcast"));
  return cuda_nccl_issued(
      dev, ncclBroadcast(send, recv, count, ncclFloat32, root, cuda_comm_of(cd), cd->stream),
      "ncclBroadcast", "broadcast");
}

static pmap_status cuda_all_gather(pmap_device *dev, const float *send, float *recv, size_t count) {
  cuda_device *cd = dev->be;
  if (count == 0) return PMAP_SUCCESS;
  /* In place is NCCL's form, send == recv + index * count (checked in runtime/coll.c). */
  PMAP_TRY(cuda_nccl_enter(dev, "all_gather"));
  return cuda_nccl_issued(
      dev, ncclAllGather(send, recv, count, ncclFloat32, cuda_comm_of(cd), cd->stream),
      "ncclAllGather", "all_gather");
}

/* NCCL's in-place form: the device's chunk is its place in buf (rank = global index). */
static pmap_status cuda_reduce_scatter(pmap_device *dev, float *buf, size_t chunk, pmap_redop op) {
  cuda_device *cd = dev->be;
  if (chunk == 0) return PMAP_SUCCESS;
  size_t rank = (size_t)dev->ctx->proc * (size_t)dev->ctx->n + (size_t)dev->index;
  PMAP_TRY(cuda_nccl_enter(dev, "reduce_scatter"));
  return cuda_nccl_issued(dev,
                          ncclReduceScatter(buf, buf + rank * chunk, chunk, ncclFloat32,
                                            nccl_op(op), cuda_comm_of(cd), cd->stream),
                          "ncclReduceScatter", "reduce_scatter");
}

/* Drain this device's stream, then meet the other threads: every device's earlier work is done
 * when any of them leaves. */
static pmap_status cuda_barrier(pmap_device *dev) {
  pmap_ctx *ctx = dev->ctx;
  PMAP_TRY(cuda_wait(dev, "barrier", 0));
  PMAP_TRY(pmap_wait_status(dev, sync_barrier_wait(&ctx->bar, &ctx->wait), "barrier"));
  if (ctx->nproc <= 1) return PMAP_SUCCESS;
  /* Across processes: a one-float all-reduce over the global communicator, waited for. */
  cuda_device *cd = dev->be;
  float *one = (float *)cd->scratch;
  PMAP_TRY(cuda_all_reduce(dev, one, one, 1, PMAP_RED_SUM));
  return cuda_wait(dev, "barrier", 1);
}

const pmap_coll_i pmap_cuda_coll = {
    .all_reduce = cuda_all_reduce,
    .broadcast = cuda_broadcast,
    .all_gather = cuda_all_gather,
    .reduce_scatter = cuda_reduce_scatter,
    .barrier = cuda_barrier,
};
