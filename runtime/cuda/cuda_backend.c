/* cuda_backend.c: the CUDA backend's device half and its table. Each device's thread selects its
 * GPU once and owns a stream and a cuBLAS handle bound to it; memory is stream-ordered, inputs
 * pass through two pinned host buffers into per-slot device buffers with asynchronous copies,
 * and every wait on the GPU goes through cuda_wait (cuda_coll.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"

/* Staging buffers grow in steps of this, so that a slightly larger batch reuses them. */
#define STAGE_ROUND ((size_t)1 << 16)
/* The least time a device's destruction waits for its work to finish. */
#define DRAIN_MIN_NS (10LL * 1000000000LL)

cuda_device *cuda_device_of(pmap_device *dev) { return (cuda_device *)dev->be; }

/* Frees what device_init and later calls set up; safe on a partly initialised device. */
static void device_release(cuda_device *cd) {
  for (int s = 0; s < 2; s++) {
    cuda_stage *st = &cd->stage[s];
    if (st->dev) cuda_mem_free(cd, st->dev);
    memset(st, 0, sizeof *st);
  }
  if (cd->scratch) cuda_mem_free(cd, cd->scratch);
  cuda_fast_device_release(cd);
  if (cd->stream) (void)cudaStreamSynchronize(cd->stream);
  for (int k = 0; k < 2; k++) {
    if (cd->pinned[k]) (void)cudaFreeHost(cd->pinned[k]);
    if (cd->pinned_ev[k]) (void)cudaEventDestroy(cd->pinned_ev[k]);
    cd->pinned[k] = NULL;
    cd->pinned_ev[k] = NULL;
  }
  for (int k = 0; k < cd->cap_marks; k++) (void)cudaEventDestroy(cd->marks[k]);
  free(cd->marks);
  if (cd->mark_end) (void)cudaEventDestroy(cd->mark_end);
  cd->marks = NULL;
  cd->mark_end = NULL;
  cd->n_marks = cd->cap_marks = 0;
  if (cd->down) (void)cudaFreeHost(cd->down);
  if (cd->done) (void)cudaEventDestroy(cd->done);
  cd->down = NULL;
  cd->done = NULL;
  cuda_mem_release(cd);
  if (cd->blas) (void)cublasDestroy(cd->blas);
  if (cd->blas_ws) (void)cudaFree(cd->blas_ws);
  if (cd->stream) (void)cudaStreamDestroy(cd->stream);
  (void)cudaGetLastError();
  cd->scratch = cd->blas_ws = NULL;
  cd->blas = NULL;
  cd->stream = NULL;
}

/* Every device arrives, then one NCCL all-reduce of a float on each of its communicators: they
 * are known to work (and their connections are set up) before the context is handed out. The
 * blocking one's comes once every device has finished the first, so each device reaches it. */
static pmap_status startup_barrier(pmap_device *dev, cuda_device *cd) {
  pmap_ctx *ctx = dev->ctx;
  pmap_wait_policy wait = ctx->wait;
  wait.timeout_ns = cuda_timeout_ns(ctx);
  int r = sync_barrier_wait(&ctx->bar, &wait);
  if (r == PMAP_WAIT_TIMEOUT) {
    pmap_ctx_abort(ctx);
    return PMAP_ERR(PMAP_ERR_TIMEOUT,
                    "startup barrier on device %d: not every device arrived within %.3f s",
                    dev->index, (double)wait.timeout_ns * 1e-9);
  }
  PMAP_TRY(pmap_wait_status(dev, r, "startup barrier"));
  float *one = (float *)cd->scratch;
  CUDA_CHECK(cd, cudaMemsetAsync(one, 0, sizeof *one, cd->stream));
  PMAP_TRY(cuda_nccl_enter(dev, "startup barrier"));
  PMAP_TRY(cuda_nccl_issued(dev,
                            ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, cd->comm, cd->stream),
                            "ncclAllReduce", "startup barrier (NCCL all-reduce)"));
  PMAP_TRY(cuda_wait(dev, "startup barrier (NCCL all-reduce)", 1));
  if (!cd->graph_comm) return PMAP_SUCCESS;
  PMAP_TRY(cuda_nccl_enter(dev, "startup barrier"));
  PMAP_TRY(cuda_nccl_issued(
      dev, ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, cd->graph_comm, cd->stream),
      "ncclAllReduce", "startup barrier (the captured steps' NCCL all-reduce)"));
  return cuda_wait(dev, "startup barrier (the captured steps' NCCL all-reduce)", 1);
}

/* Page-locked host memory and the events: allocated before the startup barrier, while no
 * collective of any device is in flight (a page-locked allocation may synchronize the GPU, and
 * on a GPU shared by several devices that could wait on a collective waiting for this one).
 * Each is an optimization with a plain fallback, so a machine that refuses one still runs:
 * without `done` waits poll, without pinned buffers copies go from pageable memory. */
static void host_buffers(cuda_device *cd, const cuda_ctx *cc) {
  unsigned flags = cudaEventBlockingSync | cudaEventDisableTiming;
  if (cc->wait_mode == CUDA_WAIT_BLOCK && cudaEventCreateWithFlags(&cd->done, flags) != cudaSuccess)
    cd->done = NULL;
  if (cudaMallocHost(&cd->down, CUDA_DOWN_BYTES) != cudaSuccess) cd->down = NULL;
  /* Only queried, never slept on: no blocking-sync flag, which a machine may refuse. */
  for (int k = 0; k < 2 && cc->pinned_bytes; k++) {
    if (cudaEventCreateWithFlags(&cd->pinned_ev[k], cudaEventDisableTiming) != cudaSuccess)
      cd->pinned_ev[k] = NULL;
    if (cudaMallocHost(&cd->pinned[k], cc->pinned_bytes) != cudaSuccess) cd->pinned[k] = NULL;
  }
  if (!cd->pinned_ev[0] || !cd->pinned_ev[1] || !cd->pinned[0] || !cd->pinned[1])
    for (int k = 0; k < 2; k++) {
      if (cd->pinned[k]) (void)cudaFreeHost(cd->pinned[k]);
      if (cd->pinned_ev[k]) (void)cudaEventDestroy(cd->pinned_ev[k]);
      cd->pinned[k] = NULL;
      cd->pinned_ev[k] = NULL;
    }
  (void)cudaGetLastError();
}

static pmap_status cuda_device_init(pmap_device *dev) {
  cuda_device *cd = dev->be;
  cuda_ctx *cc = dev->ctx->be_ctx;
  pmap_status st = PMAP_SUCCESS;
  /* Once per thread: a worker keeps its GPU for life; device 0's caller gets it in enter. */
  CUDA_CHECK_GOTO(cd, st, cudaSetDevice(cd->where.gpu), fail);
  CUDA_CHECK_GOTO(cd, st, cudaStreamCreateWithFlags(&cd->stream, cudaStreamNonBlocking), fail);
  CUBLAS_CHECK_GOTO(cd, st, cublasCreate(&cd->blas), fail);
  CUBLAS_CHECK_GOTO(cd, st, cublasSetStream(cd->blas, cd->stream), fail);
  /* An explicit workspace: no GEMM allocates, and results do not depend on a shared pool. */
  CUDA_CHECK_GOTO(cd, st, cudaMalloc(&cd->blas_ws, CUDA_BLAS_WORKSPACE_BYTES), fail);
  CUBLAS_CHECK_GOTO(cd, st, cublasSetWorkspace(cd->blas, cd->blas_ws, CUDA_BLAS_WORKSPACE_BYTES),
                    fail);
  CUBLAS_CHECK_GOTO(
      cd, st,
      cublasSetMathMode(cd->blas, cc->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
      fail);
  PMAP_TRY_GOTO(st, cuda_mem_init(cd, cc), fail);
  PMAP_TRY_GOTO(st, cuda_mem_alloc(dev, cd, CUDA_SCRATCH_BYTES, &cd->scratch), fail);
  host_buffers(cd, cc);
  PMAP_TRY_GOTO(st, cuda_fast_device_init(cd), fail);
  PMAP_TRY_GOTO(st, startup_barrier(dev, cd), fail);
  atomic_fetch_sub(&cc->starting, 1);
  return PMAP_SUCCESS;
fail:
  atomic_fetch_sub(&cc->starting, 1);
  device_release(cd);
  /* Nothing of it is left to wait for: the others' destruction need not wait for this one. */
  atomic_store(&cc->drained[cd->where.index], 1);
  return st;
}

/* Polls until the device's streams are idle or deadline passes; 1 when they are (a stream in
 * error runs nothing more either). */
static int drain(cuda_device *cd, int64_t deadline) {
  for (;;) {
    cudaError_t a = cd->stream ? cudaStreamQuery(cd->stream) : cudaSuccess;
    cudaError_t b = cd->comm_stream ? cudaStreamQuery(cd->comm_stream) : cudaSuccess;
    if (a != cudaErrorNotReady && b != cudaErrorNotReady) break;
    if (pmap_now_ns() > deadline) return 0;
    struct timespec ts = {0, 100000};
    nanosleep(&ts, NULL);
  }
  (void)cudaGetLastError();
  return 1;
}

/* The devices other than dev on its GPU whose work did not finish, waiting until deadline for
 * each to say (they drain at the same time, each on its own thread), into busy (a list for a
 * message); their count. */
static int gpu_peers_busy(pmap_device *dev, cuda_device *cd, int64_t deadline, char *busy,
                          size_t len) {
  cuda_ctx *cc = dev->ctx->be_ctx;
  int count = 0;
  busy[0] = '\0';
  for (int j = 0; j < cc->n; j++) {
    if (j == dev->index || cc->gpus[j] != cd->where.gpu) continue;
    while (!atomic_load(&cc->drained[j]) && pmap_now_ns() <= deadline) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
    if (atomic_load(&cc->drained[j]) == 1) continue;
    size_t at = strlen(busy);
    snprintf(busy + at, len - at, "%s%d", count ? ", " : "", j);
    count++;
  }
  return count;
}

static void cuda_device_fini(pmap_device *dev) {
  cuda_device *cd = dev->be;
  if (!cd) return;
  cuda_ctx *cc = dev->ctx->be_ctx;
  /* Destroying never hangs: everything below ends by one deadline, the context's timeout (at
   * least 10 s). Nothing is freed under a running kernel, and freeing device memory waits for the
   * whole GPU, so a device frees nothing while a device on its GPU has work that did not finish
   * (a collective kernel that no abort ended spins for ever): it leaves its memory, streams and
   * handles to the process, and one line on stderr says what was left and why. */
  int64_t limit = cuda_timeout_ns(dev->ctx);
  if (limit >= 0 && limit < DRAIN_MIN_NS) limit = DRAIN_MIN_NS;
  int64_t deadline = limit < 0 ? INT64_MAX : pmap_now_ns() + limit;
  /* A rank that an abort left out (its thread was inside an NCCL call then) is stopped now that
   * this thread, its only user, is outside every call: that ends its kernels. */
  pthread_mutex_lock(&cc->abort_lock);
  int left_out = atomic_load(&cc->dead) && !atomic_load(&cc->comm_gone[dev->index]);
  if (left_out) cuda_rank_stop(cc, dev->index);
  pthread_mutex_unlock(&cc->abort_lock);
  int own = drain(cd, deadline);
  atomic_store(&cc->drained[dev->index], own ? 1 : -1);
  char busy[128];
  int peers = gpu_peers_busy(dev, cd, deadline, busy, sizeof busy);
  if (!own)
    fprintf(stderr,
            "pmap: device %d (GPU %d): its GPU work did not finish within %.0f s of the "
            "context's destruction; its memory, streams and handles are left to the process\n",
            dev->index, cd->where.gpu, (double)limit * 1e-9);
  else if (peers)
    fprintf(stderr,
            "pmap: device %d (GPU %d): its memory, streams and handles are left to the process: "
            "the work of device%s %s on that GPU did not finish within %.0f s of the context's "
            "destruction, and freeing would wait for it\n",
            dev->index, cd->where.gpu, peers == 1 ? "" : "s", busy, (double)limit * 1e-9);
  if (!own || peers) return;
  if (left_out) {
    pthread_mutex_lock(&cc->abort_lock);
    cuda_rank_abort(cc, dev->index);
    pthread_mutex_unlock(&cc->abort_lock);
  }
  device_release(cd);
}

/* Device 0's work runs on the caller's thread: lend it the GPU, then give back its own. Without
 * its GPU the job would launch on another device's context, so a failure fails the job. */
static pmap_status cuda_enter(pmap_device *dev, int saved[2]) {
  cuda_device *cd = dev->be;
  saved[0] = -1;
  if (!cd) return PMAP_SUCCESS;
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  (void)cudaGetLastError();
  saved[0] = cur;
  if (cur != cd->where.gpu) CUDA_CHECK(cd, cudaSetDevice(cd->where.gpu));
  return PMAP_SUCCESS;
}

static void cuda_leave(pmap_device *dev, const int saved[2]) {
  cuda_device *cd = dev->be;
  if (!cd || saved[0] < 0 || saved[0] == cd->where.gpu) return;
  (void)cudaSetDevice(saved[0]);
  (void)cudaGetLastError();
}

/* Stream-ordered allocations (cuda_mem.c): unlike cudaMalloc/cudaFree they never wait for the
 * whole GPU, which could otherwise wait on another rank's collective when logical devices share
 * a GPU. */
static pmap_status cuda_alloc(pmap_device *dev, size_t bytes, void **out) {
  return cuda_mem_alloc(dev, dev->be, bytes, out);
}

static void cuda_free(pmap_device *dev, void *ptr) {
  cuda_device *cd = dev->be;
  if (cd) cuda_mem_free(cd, ptr);
}

static pmap_status cuda_upload(pmap_device *dev, void *dst, const void *src, size_t bytes) {
  cuda_device *cd = dev->be;
  if (!bytes) return PMAP_SUCCESS;
  CUDA_CHECK(cd, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cd->stream));
  return PMAP_SUCCESS;
}

static pmap_status cuda_download(pmap_device *dev, void *dst, const void *src, size_t bytes) {
  cuda_device *cd = dev->be;
  if (!bytes) return PMAP_SUCCESS;
  if (cd->down && bytes <= CUDA_DOWN_BYTES) {
    /* A small result (the step's loss): queued into pinned memory, then the one wait. */
    CUDA_CHECK(cd, cudaMemcpyAsync(cd->down, src, bytes, cudaMemcpyDeviceToHost, cd->stream));
    PMAP_TRY(cuda_wait(dev, "download", 0));
    memcpy(dst, cd->down, bytes);
    return PMAP_SUCCESS;
  }
  /* A copy into pageable memory blocks until the stream gets to it: wait for the queued work
   * first with the timed wait, so that a stuck collective cannot hang the copy. */
  PMAP_TRY(cuda_wait(dev, "download", 0));
  CUDA_CHECK(cd, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cd->stream));
  CUDA_CHECK(cd, cudaStreamSynchronize(cd->stream));
  return PMAP_SUCCESS;
}

/* Copies `bytes` of host rows to dst through the two pinned buffers in turns, in pieces of at
 * most pinned_bytes: the host fills one while the other's copy runs. A buffer whose last copy is
 * still queued (only within one large input: a step ends in a wait) is waited for with the
 * timed wait. The buffers never grow: their size is fixed when the device starts (see
 * host_buffers), so no page-locked allocation happens in the middle of a job. */
static pmap_status stage_pinned(pmap_device *dev, cuda_device *cd, size_t chunk, void *dst,
                                const void *host, size_t bytes) {
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t len = bytes - off < chunk ? bytes - off : chunk;
    int k = cd->pinned_next;
    cd->pinned_next ^= 1;
    cudaError_t e = cudaEventQuery(cd->pinned_ev[k]);
    if (e == cudaErrorNotReady)
      PMAP_TRY(cuda_wait(dev, "input staging", 0));
    else
      CUDA_CHECK(cd, e);
    memcpy(cd->pinned[k], (const char *)host + off, len);
    CUDA_CHECK(cd, cudaMemcpyAsync((char *)dst + off, cd->pinned[k], len, cudaMemcpyHostToDevice,
                                   cd->stream));
    CUDA_CHECK(cd, cudaEventRecord(cd->pinned_ev[k], cd->stream));
  }
  return PMAP_SUCCESS;
}

/* host -> device buffer, asynchronous on the stream (like upload: done by the job's closing sync
 * or download): through the pinned buffers, or with PMAP_CUDA_PINNED_MB=0 straight from the
 * pageable rows (the driver then stages them through its own pinned memory). */
static pmap_status cuda_stage_input(pmap_device *dev, int slot, const void *host, size_t bytes,
                                    void **out) {
  cuda_device *cd = dev->be;
  cuda_stage *s = &cd->stage[slot];
  *out = NULL;
  if (cd->capturing) {
    /* A captured step reads the buffer its inputs were staged into before the capture. */
    if (!s->dev || bytes > s->cap)
      return PMAP_ERR(PMAP_ERR_INTERNAL,
                      "device %d: input slot %d holds %zu bytes, a captured step reads %zu",
                      dev->index, slot, s->cap, bytes);
    *out = s->dev;
    return PMAP_SUCCESS;
  }
  if (bytes > s->cap) {
    size_t cap = (bytes + STAGE_ROUND - 1) / STAGE_ROUND * STAGE_ROUND;
    cuda_mem_free(cd, s->dev);
    s->dev = NULL;
    s->cap = 0;
    PMAP_TRY(cuda_mem_alloc(dev, cd, cap, &s->dev));
    s->cap = cap;
  }
  /* Stream order keeps the kernels that read the previous contents ahead of this copy. */
  cuda_ctx *cc = dev->ctx->be_ctx;
  if (bytes && cd->pinned[0] && cd->pinned[1])
    PMAP_TRY(stage_pinned(dev, cd, cc->pinned_bytes, s->dev, host, bytes));
  else if (bytes)
    CUDA_CHECK(cd, cudaMemcpyAsync(s->dev, host, bytes, cudaMemcpyHostToDevice, cd->stream));
  *out = s->dev;
  return PMAP_SUCCESS;
}

static pmap_status cuda_sync(pmap_device *dev) { return cuda_wait(dev, "sync", 0); }

/* For user code (pmap_device_stream, pmap_device_blas): the stream and the cuBLAS handle. */
static void *cuda_native(pmap_device *dev, int what) {
  cuda_device *cd = dev->be;
  return what == 0 ? (void *)cd->stream : what == 1 ? (void *)cd->blas : NULL;
}

/* The GPU's free memory (cudaMemGetInfo on the device's GPU, from any thread: the calling
 * thread's current device is put back). What pmap holds is not counted here (SIZE_MAX). */
static pmap_status cuda_memory(pmap_device *dev, size_t *in_use, size_t *free_bytes) {
  cuda_device *cd = dev->be;
  *in_use = *free_bytes = SIZE_MAX;
  int cur = -1;
  CUDA_CHECK(cd, cudaGetDevice(&cur));
  if (cur != cd->where.gpu) CUDA_CHECK(cd, cudaSetDevice(cd->where.gpu));
  size_t avail = 0, total = 0;
  cudaError_t e = cudaMemGetInfo(&avail, &total);
  if (cur != cd->where.gpu) (void)cudaSetDevice(cur);
  CUDA_CHECK(cd, e);
  *free_bytes = avail;
  return PMAP_SUCCESS;
}

/* The most marks of one job: past them, spans are timed on the host. */
#define CUDA_MARKS_MAX 16384

/* A timing event on the stream after the work queued so far (not while capturing: a graph's
 * events are not the step's times). Events are made as needed and kept for later jobs. */
static int cuda_mark(pmap_device *dev) {
  cuda_device *cd = dev->be;
  if (cd->capturing || cd->n_marks >= CUDA_MARKS_MAX) return -1;
  if (!cd->mark_end && cudaEventCreate(&cd->mark_end) != cudaSuccess) {
    cd->mark_end = NULL;
    (void)cudaGetLastError();
    return -1;
  }
  if (cd->n_marks == cd->cap_marks) {
    int cap = cd->cap_marks ? 2 * cd->cap_marks : 256;
    cudaEvent_t *ev = realloc(cd->marks, (size_t)cap * sizeof *ev);
    if (!ev) return -1;
    cd->marks = ev;
    for (; cd->cap_marks < cap; cd->cap_marks++)
      if (cudaEventCreate(&cd->marks[cd->cap_marks]) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
      }
  }
  if (cudaEventRecord(cd->marks[cd->n_marks], cd->stream) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return cd->n_marks++;
}

/* Once the stream is idle (cuda_wait: bounded by the context's timeout, like every wait), an
 * event recorded now completes at once: each mark's time is now less its distance to it. */
static pmap_status cuda_mark_times(pmap_device *dev, int64_t *ns, int count) {
  cuda_device *cd = dev->be;
  int n = cd->n_marks;
  cd->n_marks = 0;
  if (!ns) return PMAP_SUCCESS;
  if (count != n)
    return PMAP_ERR(PMAP_ERR_INTERNAL, "device %d: %d trace marks asked for, %d made", dev->index,
                    count, n);
  PMAP_TRY(cuda_wait(dev, "the trace's marks", 0));
  CUDA_CHECK(cd, cudaEventRecord(cd->mark_end, cd->stream));
  CUDA_CHECK(cd, cudaEventSynchronize(cd->mark_end));
  int64_t now = pmap_now_ns();
  for (int i = 0; i < n; i++) {
    float ms = 0.0f;
    CUDA_CHECK(cd, cudaEventElapsedTime(&ms, cd->marks[i], cd->mark_end));
    ns[i] = now - (int64_t)((double)ms * 1e6);
  }
  return PMAP_SUCCESS;
}

const pmap_backend_i pmap_cuda_backend = {
    .name = "cuda",
    .ctx_init = cuda_ctx_init,
    .ctx_fini = cuda_ctx_fini,
    .device_init = cuda_device_init,
    .device_fini = cuda_device_fini,
    .enter = cuda_enter,
    .leave = cuda_leave,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .stage = cuda_stage_input,
    .sync = cuda_sync,
    .native = cuda_native,
    .coll = &pmap_cuda_coll,
    .fast = &pmap_cuda_fast,
    .memory = cuda_memory,
    .mark = cuda_mark,
    .mark_times = cuda_mark_times,
};
