/* gpu_spin.cu: a kernel that keeps one thread of the GPU busy for a given time, for
 * tests/gpu/gpu_probe.c: an event recorded behind it completes only when it ends, so a wait on
 * that event really has to wait (on an idle stream it would return at once, hang or not). */
#include <cuda_runtime.h>

static __device__ unsigned long long spin_now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

static __global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0 = spin_now_ns();
  while (spin_now_ns() - t0 < ns) {
  }
}

/* Queues the spin of `seconds` on stream s; the launch's error, cudaSuccess when it is queued. */
extern "C" cudaError_t gpu_probe_spin(cudaStream_t s, double seconds) {
  spin_kernel<<<1, 1, 0, s>>>((unsigned long long)(seconds * 1e9));
  return cudaGetLastError();
}
