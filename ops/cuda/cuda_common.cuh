/* cuda_common.cuh: what the CUDA kernels of ops/cuda share: launch geometry, a block-wide sum
 * and the per-element math of ops/op_math.h (the same formulas as the CPU kernels). Included by
 * the .cu files only. */
#ifndef PMAP_CUDA_COMMON_CUH
#define PMAP_CUDA_COMMON_CUH

#include <cuda_runtime.h>

#include "cuda_ops.h"

#include "ops/op_math.h"

#define CUDA_BLOCK 256u
/* Grids are capped; kernels loop with a grid stride past it. */
#define CUDA_MAX_GRID 65535u

/* Blocks of CUDA_BLOCK threads for n elements (0 for none: skip the launch). */
static inline unsigned cuda_grid(size_t n) {
  size_t g = (n + CUDA_BLOCK - 1) / CUDA_BLOCK;
  return g < CUDA_MAX_GRID ? (unsigned)g : CUDA_MAX_GRID;
}

/* The first index of this thread and the stride of a grid-stride loop. */
static __device__ __forceinline__ size_t cuda_thread_index() {
  return (size_t)blockIdx.x * blockDim.x + threadIdx.x;
}
static __device__ __forceinline__ size_t cuda_grid_stride() {
  return (size_t)gridDim.x * blockDim.x;
}

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024), valid in thread 0. The
 * order is fixed by the thread layout, so the result is the same on every run. */
template <typename T>
static __device__ __forceinline__ T cuda_block_sum(T v) {
  __shared__ T warp_sums[32];
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  unsigned lane = threadIdx.x & 31u, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  unsigned warps = blockDim.x >> 5;
  v = threadIdx.x < warps ? warp_sums[threadIdx.x] : T(0);
  if (warp == 0)
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

#endif
