/* cpu-peak.c: one core's peak multiply-add rate, measured: float FMAs on 256- and 512-bit
 * registers and, where the CPU has AVX512_BF16, its bfloat16 dot products (vdpbf16ps, two
 * multiply-adds per float lane). The ceiling that pmap-bench's GEMM rates (gemm%, GFLOP/s) and
 * the bf16 policy's speed-ups are read against (bench/README.md). x86-64 only.
 *
 *   cpu-peak [--seconds S]     S: about how long each measurement runs (default 0.3) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define CHAINS 12 /* independent accumulators: more than latency x throughput on any core */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Each kernel runs n iterations of CHAINS independent instructions and returns a sum of the
 * accumulators, printed so that the compiler keeps the work. */
__attribute__((target("avx2,fma"))) static float fma256(long n) {
  __m256 a[CHAINS], b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps(1.0f + (float)i * 1e-3f);
  for (long k = 0; k < n; k++)
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
  float s = 0.0f, v[8];
  for (int i = 0; i < CHAINS; i++) {
    _mm256_storeu_ps(v, a[i]);
    s += v[0];
  }
  return s;
}

__attribute__((target("avx512f"))) static float fma512(long n) {
  __m512 a[CHAINS], b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps(1.0f + (float)i * 1e-3f);
  for (long k = 0; k < n; k++)
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
  float s = 0.0f;
  for (int i = 0; i < CHAINS; i++) s += _mm512_reduce_add_ps(a[i]);
  return s;
}

__attribute__((target("avx512f,avx512bf16"))) static float dot_bf16(long n) {
  __m512 a[CHAINS];
  __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3c00);
  for (int i = 0; i < CHAINS; i++) a[i] = _mm512_setzero_ps();
  for (long k = 0; k < n; k++)
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_dpbf16_ps(a[i], x, y);
  float s = 0.0f;
  for (int i = 0; i < CHAINS; i++) s += _mm512_reduce_add_ps(a[i]);
  return s;
}

typedef float (*kernel)(long);

/* The best rate over 5 runs of about `seconds` each, in GFLOP/s (flops per instruction given). */
static double rate(kernel k, double flops_per_insn, double seconds, float *sink) {
  long n = 1000;
  double t = 0.0;
  while (t < 0.01) { /* size a run */
    n *= 4;
    double t0 = now();
    *sink += k(n);
    t = now() - t0;
  }
  n = (long)((double)n * seconds / t) + 1;
  double best = 0.0;
  for (int r = 0; r < 5; r++) {
    double t0 = now();
    *sink += k(n);
    double g = (double)n * CHAINS * flops_per_insn / (now() - t0) / 1e9;
    best = g > best ? g : best;
  }
  return best;
}

static void model_name(char *out, size_t cap) {
  snprintf(out, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) == 0 && colon) {
      snprintf(out, cap, "%s", colon + 2);
      out[strcspn(out, "\n")] = 0;
      break;
    }
  }
  fclose(f);
}

int main(int argc, char **argv) {
  double seconds = 0.3;
  if (argc == 3 && strcmp(argv[1], "--seconds") == 0) {
    char *end = NULL;
    seconds = strtod(argv[2], &end);
    if (!end || *end || !(seconds > 0.0 && seconds <= 60.0)) {
      fprintf(stderr, "cpu-peak: --seconds %s is not a number in (0, 60]\n", argv[2]);
      return 2;
    }
  } else if (argc != 1) {
    fprintf(stderr, "usage: cpu-peak [--seconds S]\n");
    return 2;
  }
  __builtin_cpu_init();
  char name[256];
  model_name(name, sizeof name);
  printf("cpu: %s; one thread, the best of 5 runs of %.2f s\n", name, seconds);
  float sink = 0.0f;
  struct {
    const char *what, *feature;
    kernel k;
    double flops;
    int ok;
  } rows[] = {
      {"fp32 FMA, 256-bit (vfmadd231ps ymm)", "fma", fma256, 16.0,
       __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")},
      {"fp32 FMA, 512-bit (vfmadd231ps zmm)", "avx512f", fma512, 32.0,
       __builtin_cpu_supports("avx512f")},
      {"bf16 dot product, 512-bit (vdpbf16ps zmm)", "avx512bf16", dot_bf16, 64.0,
       __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    if (!rows[i].ok) {
      printf("%-44s -  (no %s)\n", rows[i].what, rows[i].feature);
      continue;
    }
    printf("%-44s %8.1f GFLOP/s\n", rows[i].what, rate(rows[i].k, rows[i].flops, seconds, &sink));
  }
  return sink == 12345.0f ? 3 : 0; /* never: keeps the sums alive */
}
#else
int main(void) {
  fprintf(stderr, "cpu-peak: x86-64 only\n");
  return 77;
}
#endif
