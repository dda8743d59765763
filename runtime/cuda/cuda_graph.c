/* cuda_graph.c: the CUDA backend's half of the fast steps (models/step_fast.c): the per-step
 * values that kernels read from device memory, the capture of a device's step into a CUDA graph
 * (thread-local capture of its stream, NCCL included) and its replay, and gradient buckets
 * all-reduced on a second stream while backward still runs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "cuda_backend.h"

/* Gradient bucket size unless PMAP_CUDA_BUCKET_MB or pmap_config.cuda_bucket_mb says otherwise
 * (PyTorch DDP's default). */
#define BUCKET_MB_DEFAULT 25

/* A switch: cfg's value 1 on, -1 off, 0 the environment variable (0 or 1), else off. */
static pmap_status fast_switch(int cfg, const char *field, const char *env, int *out) {
  *out = 0;
  if (cfg != 0 && cfg != 1 && cfg != -1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: %s %d is none of 0 (default), 1 (on), -1 (off)", field, cfg);
  if (cfg) {
    *out = cfg == 1;
    return PMAP_SUCCESS;
  }
  return pmap_env_flag(env, 0, out);
}

pmap_status cuda_bucket_bytes_parse(const char *s, size_t *bytes) {
  *bytes = (size_t)BUCKET_MB_DEFAULT << 20;
  if (!s || !*s) return PMAP_SUCCESS;
  char *end = NULL;
  errno = 0;
  double mb = strtod(s, &end);
  /* Whole bytes from 1 KiB (several buckets even for a model of a few MiB) to 4 GiB. */
  if (end == s || *end || errno || !(mb >= 1.0 / 1024.0 && mb <= 4096.0))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: environment variable PMAP_CUDA_BUCKET_MB=\"%s\" is not a "
                    "number of MiB from 0.0009765625 (1 KiB) to 4096",
                    s);
  *bytes = (size_t)(mb * 1048576.0 + 0.5);
  return PMAP_SUCCESS;
}

pmap_status cuda_fast_switches(cuda_ctx *cc, const pmap_config *cfg) {
  PMAP_TRY(fast_switch(cfg->cuda_graphs, "cuda_graphs", "PMAP_CUDA_GRAPHS", &cc->graphs));
  PMAP_TRY(fast_switch(cfg->cuda_overlap, "cuda_overlap", "PMAP_CUDA_OVERLAP", &cc->overlap));
  long mb = cfg->cuda_bucket_mb;
  if (mb < 0 || mb > 4096)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: cuda_bucket_mb %ld is outside [0, 4096] (0: default)", mb);
  if (mb)
    cc->bucket_bytes = (size_t)mb << 20;
  else
    PMAP_TRY(cuda_bucket_bytes_parse(pmap_env_get("PMAP_CUDA_BUCKET_MB"), &cc->bucket_bytes));
  long fail = -1;
  PMAP_TRY(pmap_env_long("PMAP_CUDA_GRAPH_FAIL", -1, PMAP_MAX_DEVICES - 1, -1, &fail));
  cc->graph_fail = (int)fail;
  return PMAP_SUCCESS;
}

pmap_status cuda_fast_device_init(cuda_device *cd) {
  pmap_status st = PMAP_SUCCESS;
  unsigned flags = cudaEventDisableTiming;
  CUDA_CHECK_GOTO(cd, st, cudaStreamCreateWithFlags(&cd->comm_stream, cudaStreamNonBlocking), fail);
  CUDA_CHECK_GOTO(cd, st, cudaEventCreateWithFlags(&cd->bucket_ready, flags), fail);
  CUDA_CHECK_GOTO(cd, st, cudaEventCreateWithFlags(&cd->bucket_done, flags), fail);
  (void)cudaGetLastError();
  return PMAP_SUCCESS;
fail:
  return st; /* device_release frees what exists */
}

void cuda_fast_device_release(cuda_device *cd) {
  if (cd->comm_stream) (void)cudaStreamSynchronize(cd->comm_stream);
  if (cd->bucket_ready) (void)cudaEventDestroy(cd->bucket_ready);
  if (cd->bucket_done) (void)cudaEventDestroy(cd->bucket_done);
  if (cd->comm_stream) (void)cudaStreamDestroy(cd->comm_stream);
  (void)cudaGetLastError();
  cd->bucket_ready = cd->bucket_done = NULL;
  cd->comm_stream = NULL;
}

static void fast_modes(const pmap_ctx *ctx, int *graphs, int *overlap, size_t *bucket_bytes) {
  const cuda_ctx *cc = ctx->be_ctx;
  *graphs = cc->graphs;
  *overlap = cc->overlap;
  *bucket_bytes = cc->bucket_bytes;
}

static uint64_t fast_generation(const pmap_ctx *ctx) {
  cuda_ctx *cc = ctx->be_ctx;
  return __atomic_load_n(&cc->alloc_gen, __ATOMIC_SEQ_CST);
}

static pmap_status fast_capture_begin(pmap_device *dev) {
  cuda_device *cd = dev->be;
  cuda_ctx *cc = dev->ctx->be_ctx;
  /* A wait after every collective cannot be captured (and would fail the collective). */
  if (cc->coll_wait)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "device %d: a step cannot be captured with PMAP_CUDA_COLL_WAIT=1", dev->index);
  /* Thread-local: only this thread's calls that could not be captured are refused; the other
   * devices' threads capture their own streams at the same time. The collectives go to the
   * device's blocking communicator meanwhile (cuda_comm_of): a non-blocking one would launch
   * them from a thread of NCCL's, outside this thread's capture. */
  CUDA_CHECK(cd, cudaStreamBeginCapture(cd->stream, cudaStreamCaptureModeThreadLocal));
  cd->capturing = 1;
  return PMAP_SUCCESS;
}

static void fast_capture_end(pmap_device *dev, pmap_status body, void **graph, char *why,
                             size_t whylen) {
  cuda_device *cd = dev->be;
  cuda_ctx *cc = dev->ctx->be_ctx;
  cudaGraph_t g = NULL;
  cudaGraphExec_t exec = NULL;
  *graph = NULL;
  cd->capturing = 0;
  /* Always ends the capture, even one that an illegal call invalidated. */
  cudaError_t e = cudaStreamEndCapture(cd->stream, &g);
  if (body)
    snprintf(why, whylen, "capturing the step failed: %s", pmap_last_error());
  else if (e != cudaSuccess)
    snprintf(why, whylen, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
  else if (cc->graph_fail == dev->index)
    snprintf(why, whylen, "cudaGraphInstantiate failed (injected by PMAP_CUDA_GRAPH_FAIL=%d)",
             dev->index);
  else if ((e = cudaGraphInstantiateWithFlags(&exec, g, 0)) != cudaSuccess)
    snprintf(why, whylen, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
  else
    *graph = exec;
  if (g) (void)cudaGraphDestroy(g);
  (void)cudaGetLastError(); /* a failed capture leaves no error behind for the plain step */
}

static pmap_status fast_launch(pmap_device *dev, void *graph) {
  cuda_device *cd = dev->be;
  cuda_ctx *cc = dev->ctx->be_ctx;
  if (atomic_load(&cc->dead))
    return PMAP_ERR(PMAP_ERR_DEVICE,
                    "pmap_update on device %d: the NCCL communicators were aborted after an "
                    "earlier failure or timeout; destroy the context and create a new one",
                    dev->index);
  CUDA_CHECK(cd, cudaGraphLaunch((cudaGraphExec_t)graph, cd->stream));
  /* The graph holds the step's collectives: the next wait covers them. Every device launches
   * its graph once per step, so the counts of issued collectives stay in step (cuda_mem.c). */
  atomic_fetch_add(&cc->issued[dev->index], 1);
  atomic_store(&cc->pending[dev->index], 1);
  return cc->coll_wait ? cuda_wait(dev, "pmap_update (CUDA graph)", 1) : PMAP_SUCCESS;
}

static void fast_graph_free(pmap_device *dev, void *graph) {
  if (!graph) return;
  /* Not under a launch still running: a plain drain first (its failure is the next call's). */
  (void)cuda_wait(dev, "freeing a CUDA graph", 0);
  (void)cudaGraphExecDestroy((cudaGraphExec_t)graph);
  (void)cudaGetLastError();
}

static pmap_status fast_bucket_reduce(pmap_device *dev, float *buf, size_t count) {
  cuda_device *cd = dev->be;
  if (count == 0) return PMAP_SUCCESS;
  /* The bucket's gradients are complete once the work queued so far is done. */
  CUDA_CHECK(cd, cudaEventRecord(cd->bucket_ready, cd->stream));
  CUDA_CHECK(cd, cudaStreamWaitEvent(cd->comm_stream, cd->bucket_ready, 0));
  PMAP_TRY(cuda_nccl_enter(dev, "gradient bucket all-reduce"));
  return cuda_nccl_issued(
      dev, ncclAllReduce(buf, buf, count, ncclFloat32, ncclAvg, cuda_comm_of(cd), cd->comm_stream),
      "ncclAllReduce", "gradient bucket all-reduce");
}

static pmap_status fast_bucket_join(pmap_device *dev) {
  cuda_device *cd = dev->be;
  cuda_ctx *cc = dev->ctx->be_ctx;
  CUDA_CHECK(cd, cudaEventRecord(cd->bucket_done, cd->comm_stream));
  CUDA_CHECK(cd, cudaStreamWaitEvent(cd->stream, cd->bucket_done, 0));
  /* The device's stream now waits for the buckets: its next wait covers their collectives. */
  atomic_store(&cc->pending[dev->index], 1);
  return PMAP_SUCCESS;
}

const pmap_fast_i pmap_cuda_fast = {
    .modes = fast_modes,
    .generation = fast_generation,
    .capture_begin = fast_capture_begin,
    .capture_end = fast_capture_end,
    .launch = fast_launch,
    .graph_free = fast_graph_free,
    .bucket_reduce = fast_bucket_reduce,
    .bucket_join = fast_bucket_join,
};
