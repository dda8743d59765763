/* cuda_mem.c: device memory of the CUDA backend. Stream-ordered allocations (cudaMallocAsync)
 * wherever the GPU has memory pools, from a pool of the device's own where logical devices share
 * the GPU; elsewhere, or with the test hook PMAP_CUDA_NO_MEMPOOL=1, plain cudaMalloc whose blocks
 * are kept for reuse by the same device and returned to CUDA only when the device stops, since
 * cudaFree waits for the whole GPU. */
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend.h"

/* One plain allocation of a device without memory pools. */
typedef struct cuda_block {
  void *ptr;
  size_t bytes;
  int live; /* handed out; 0: free for reuse */
} cuda_block;

/* A free block serves a request of at least this fraction of its size, so that a small buffer
 * does not hold on to a large one. */
#define REUSE_SLACK 2

/* The GPU's default pool is one for every device on it, and CUDA may hand one stream memory that
 * another stream freed with its pending work as a dependency (ReuseAllowInternalDependencies): an
 * allocation of this device could then wait for another device's collective, which waits for
 * this device's. So where devices share the GPU each allocates from a pool of its own that makes
 * no such dependency, and that keeps what is freed (a release threshold of the most there is)
 * instead of handing it back to the system at each synchronization, to be mapped anew by the next
 * allocation. cudaSuccess, or the error that leaves the device without a pool of its own. */
static cudaError_t own_pool_create(cuda_device *cd) {
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = cd->where.gpu;
  cudaError_t e = cudaMemPoolCreate(&cd->pool, &props);
  if (e != cudaSuccess) {
    cd->pool = NULL;
    return e;
  }
  uint64_t most = UINT64_MAX;
  int off = 0;
  e = cudaMemPoolSetAttribute(cd->pool, cudaMemPoolAttrReleaseThreshold, &most);
  if (e == cudaSuccess)
    e = cudaMemPoolSetAttribute(cd->pool, cudaMemPoolReuseAllowInternalDependencies, &off);
  if (e != cudaSuccess) {
    (void)cudaMemPoolDestroy(cd->pool);
    cd->pool = NULL;
  }
  return e;
}

pmap_status cuda_mem_init(cuda_device *cd, const cuda_ctx *cc) {
  int pools = 0;
  if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, cd->where.gpu) != cudaSuccess)
    pools = 0;
  (void)cudaGetLastError();
  cd->no_pool = !pools || cc->no_pool;
  cd->pool = NULL;
  /* A GPU that refuses a pool of the device's own gets the fallback made for GPUs without pools,
   * which waits for its peers before it allocates, rather than the shared default pool. */
  if (!cd->no_pool && cd->shared && own_pool_create(cd) != cudaSuccess) cd->no_pool = 1;
  (void)cudaGetLastError();
  return PMAP_SUCCESS;
}

/* Without memory pools an allocation synchronizes the GPU implicitly: work issued after it
 * starts only once all work issued before it has finished. On a GPU shared by several logical
 * devices, a collective kernel that one device issued before the allocation would then wait
 * for ever for the same collective of a device that issues it after. Every device issues a
 * collective right after its rendezvous, so this device waits until each device on its GPU has
 * issued as many as it has. None can have issued more: its next collective's rendezvous needs
 * this device, and the one kind issued without a rendezvous, a step's graph launch, comes in a
 * step that allocates nothing (a graph is captured and replayed at the batch it was warmed up
 * with, so every buffer it uses exists). */
static pmap_status wait_peers_issued(pmap_device *dev, cuda_device *cd) {
  pmap_ctx *ctx = dev->ctx;
  cuda_ctx *cc = ctx->be_ctx;
  uint64_t mine = atomic_load(&cc->issued[dev->index]);
  int64_t start = pmap_now_ns(), timeout = cuda_timeout_ns(ctx);
  for (int k = 0; k < cc->n; k++) {
    if (k == dev->index || cc->gpus[k] != cd->where.gpu) continue;
    while (atomic_load(&cc->issued[k]) < mine) {
      if (atomic_load(&ctx->abort) || atomic_load(&cc->dead))
        return pmap_abandoned(
            dev,
            "device %d: allocation abandoned: another device failed before issuing "
            "its collective",
            dev->index);
      if (timeout >= 0 && pmap_now_ns() - start > timeout)
        return PMAP_ERR(PMAP_ERR_TIMEOUT,
                        "device %d: allocation on GPU %d waited %.3f s for device %d to issue its "
                        "collective",
                        dev->index, cd->where.gpu, (double)timeout * 1e-9, k);
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
  return PMAP_SUCCESS;
}

static pmap_status block_alloc(pmap_device *dev, cuda_device *cd, size_t bytes, void **out) {
  cuda_block *best = NULL;
  for (size_t i = 0; i < cd->n_blocks; i++) {
    cuda_block *b = &cd->blocks[i];
    if (!b->live && b->bytes >= bytes && b->bytes / REUSE_SLACK <= bytes &&
        (!best || b->bytes < best->bytes))
      best = b;
  }
  if (best) {
    /* Stream order: the work that last used it was queued on this device's stream (or joined
     * into it) before anything that uses it now. */
    best->live = 1;
    *out = best->ptr;
    return PMAP_SUCCESS;
  }
  if (cd->n_blocks == cd->cap_blocks) {
    size_t cap = cd->cap_blocks ? 2 * cd->cap_blocks : 16;
    cuda_block *grown = realloc(cd->blocks, cap * sizeof *grown);
    if (!grown)
      return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "device %d: out of host memory", cd->where.index);
    cd->blocks = grown;
    cd->cap_blocks = cap;
  }
  if (cd->shared && dev) PMAP_TRY(wait_peers_issued(dev, cd));
  void *p = NULL;
  CUDA_CHECK(cd, cudaMalloc(&p, bytes));
  cd->blocks[cd->n_blocks++] = (cuda_block){p, bytes, 1};
  *out = p;
  return PMAP_SUCCESS;
}

pmap_status cuda_mem_alloc(pmap_device *dev, cuda_device *cd, size_t bytes, void **out) {
  *out = NULL;
  if (!bytes) bytes = 256;
  if (cd->no_pool)
    PMAP_TRY(block_alloc(dev, cd, bytes, out));
  else if (cd->pool)
    CUDA_CHECK(cd, cudaMallocFromPoolAsync(out, bytes, cd->pool, cd->stream));
  else
    CUDA_CHECK(cd, cudaMallocAsync(out, bytes, cd->stream));
  cuda_alloc_counted(cd);
  return PMAP_SUCCESS;
}

void cuda_mem_free(cuda_device *cd, void *ptr) {
  if (!ptr) return;
  if (!cd->no_pool) {
    if (cudaFreeAsync(ptr, cd->stream) != cudaSuccess) (void)cudaGetLastError();
    return;
  }
  for (size_t i = 0; i < cd->n_blocks; i++)
    if (cd->blocks[i].ptr == ptr) {
      cd->blocks[i].live = 0;
      return;
    }
}

void cuda_mem_release(cuda_device *cd) {
  for (size_t i = 0; i < cd->n_blocks; i++) (void)cudaFree(cd->blocks[i].ptr);
  /* Returns at once: what the pool still holds goes once its last free has run. */
  if (cd->pool) (void)cudaMemPoolDestroy(cd->pool);
  cd->pool = NULL;
  (void)cudaGetLastError();
  free(cd->blocks);
  cd->blocks = NULL;
  cd->n_blocks = cd->cap_blocks = 0;
}
