/* cpu_ops.h: the CPU op backend's kernels, one per op of ops/op_list.h (cpu_<op>), and what the
 * files of ops/cpu share. Its queue holds nothing a kernel reads: CPU kernels run on the calling
 * thread, in order. */
#ifndef PMAP_CPU_OPS_H
#define PMAP_CPU_OPS_H

#include "ops/ops.h"

#define PMAP_OP(name, args) pmap_status cpu_##name args;
#include "ops/op_list.h"
#undef PMAP_OP

/* The portable blocked GEMM, also the small-shape path of the others. cpu_gemm's contract. */
void cpu_gemm_portable(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc);

/* The GEMM library runs single-threaded on each device thread: the devices are the parallelism.
 * cpu_gemm_threads_set sets the thread count of the provider in use and returns the setting to
 * restore the caller's thread with: the previous one, or n for a count of the whole process
 * (OpenBLAS's pthread build), which one device thread cannot give back while others run. */
int cpu_gemm_threads_set(int n);

/* Element-wise loops are written for the vectorizer (ops/op_math.h's transcendentals are
 * straight-line code). CPU_KERNEL builds a kernel three times, for x86-64-v4 (AVX-512: F, BW, CD,
 * DQ, VL), for AVX2 and for the baseline, and calls the one of cpu_simd_level() (cpu_isa.h: the
 * CPU's level capped by PMAP_CPU_ISA, decided once per process). All do the same float
 * operations in the same order (C11 mode contracts no FMA, and no reduction is reassociated),
 * so they give the same bits (tests/ops/simd_check.c compares them).
 *
 *   CPU_KERNEL(extern, pmap_status, cpu_fill, (op_queue *q, float *x, size_t n), (q, x, n)) {
 *     ...the body, once...
 *   }
 *
 * `link` is extern or static; CPU_KERNEL_VOID is the form of a kernel that returns nothing.
 * CPU_SIMD_ONLY (a target string) or CPU_SIMD_BASELINE builds one target alone, without a
 * dispatcher: the clone check's copies of the kernels. CPU_IVDEP: the loop after it has no
 * dependence between iterations (outputs may equal inputs element for element, which the
 * vectorizer cannot prove). */
#define CPU_KERNEL(link, ret, name, params, args) \
  CPU_KERNEL_(link, ret, name, params, args, return )
#define CPU_KERNEL_VOID(link, name, params, args) CPU_KERNEL_(link, void, name, params, args, )
#if defined(CPU_SIMD_BASELINE)
#define CPU_KERNEL_(link, ret, name, params, args, r) link ret name params
#elif defined(CPU_SIMD_ONLY)
#define CPU_KERNEL_(link, ret, name, params, args, r) \
  link ret __attribute__((target(CPU_SIMD_ONLY))) name params
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#include "cpu_isa.h"
#if __GNUC__ >= 12
#define CPU_TARGET_V4 __attribute__((target("arch=x86-64-v4")))
#else
#define CPU_TARGET_V4 __attribute__((target("avx512f,avx512bw,avx512cd,avx512dq,avx512vl")))
#endif
#define CPU_KERNEL_(link, ret, name, params, args, r)                                   \
  CPU_INLINE ret name##_body params;                                                    \
  CPU_TARGET_V4 static ret name##_v4 params { r name##_body args; }                     \
  __attribute__((target("avx2"))) static ret name##_avx2 params { r name##_body args; } \
  static ret name##_base params { r name##_body args; }                                 \
  link ret name params {                                                                \
    int level_ = cpu_simd_level();                                                      \
    if (level_ == 2)                                                                    \
      r name##_v4 args;                                                                 \
    else if (level_ == 1)                                                               \
      r name##_avx2 args;                                                               \
    else                                                                                \
      r name##_base args;                                                               \
  }                                                                                     \
  CPU_INLINE ret name##_body params
#else
#define CPU_KERNEL_(link, ret, name, params, args, r) link ret name params
#endif
/* CPU_INLINE: a helper of a kernel, inlined into each of its builds so that it is compiled for
 * that build's target (left out of line, gcc compiles it once, for the baseline alone). */
#if defined(__GNUC__)
#define CPU_INLINE static inline __attribute__((always_inline))
#else
#define CPU_INLINE static inline
#endif
/* A row's sum in double, in a fixed order that vectorizes: element j goes to partial sum j mod
 * CPU_LANES while CPU_LANES elements remain, the partial sums are then added pairwise
 * (cpu_lanes_total) and the last n mod CPU_LANES elements after them in order. The partial
 * sums are two vectors of 4 doubles (GCC's vector extension), which every target computes lane
 * by lane in its own registers (a ymm each with AVX2 and AVX-512; wider generic vectors would
 * go through the stack under AVX2): the same bits on every SIMD width, without a chain of
 * dependent additions as long as the row. Vectors are passed by pointer, never by value (a
 * vector argument's ABI differs between the clones' targets). */
#define CPU_LANES 8
typedef float cpu_f4
    __attribute__((vector_size(4 * sizeof(float)), aligned(sizeof(float)), may_alias));
typedef double cpu_d4 __attribute__((vector_size(4 * sizeof(double))));
typedef struct cpu_lanes {
  cpu_d4 lo, hi; /* partial sums 0-3 and 4-7 */
} cpu_lanes;
/* The 4 floats at x (any alignment) as a vector, and widened to double. */
#define CPU_F4(x) (*(const cpu_f4 *)(const void *)(x))
#define CPU_WIDEN4(v) __builtin_convertvector((v), cpu_d4)
CPU_INLINE double cpu_lanes_total(const cpu_lanes *p) {
  return ((p->lo[0] + p->lo[1]) + (p->lo[2] + p->lo[3])) +
         ((p->hi[0] + p->hi[1]) + (p->hi[2] + p->hi[3]));
}
#if defined(__GNUC__) && !defined(__clang__)
#define CPU_IVDEP _Pragma("GCC ivdep")
#else
#define CPU_IVDEP
#endif

#endif
