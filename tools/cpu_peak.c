/* cpu_peak.c: the CPU's peak multiply-add rate for MFU (cpu_peak.h). Per core and cycle, from the
 * instruction set pmap runs (pmap_cpu_isa, pmap_cpu_bf16) and the CPU (CPUID): two SIMD
 * multiply-add units (the most any x86-64 core has: the peak is an upper bound, never below what
 * a GEMM can reach), half of it where AMD's Zen 4 splits a 512-bit instruction in two, AMX's
 * 1024 bf16 flops a cycle (a 16 x 16 x 32 tile product every 16 cycles); times the clock,
 * measured on a chain of dependent additions (one a cycle on every x86-64 core), the best of
 * several runs (turbo included). bench/cpu-peak measures the same rates directly. */
#include "cpu_peak.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pmap.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

static double seconds_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* GHz: the best of 24 runs of n iterations of 8 dependent register additions (8 cycles; the
 * loop's own count runs beside). Additions of a register, not of a constant, which newer cores
 * fold at renaming. Short runs, most of them free of the scheduler's interruptions; the first
 * warms the core up. At least CPUID's maximum clock where it gives one (leaf 16h). */
static double clock_ghz(void) {
  enum { N = 100000 };
  double best = 0.0;
  unsigned long one = (unsigned long)(seconds_now() > 0.0); /* 1, unknown to the compiler */
  for (int run = 0; run < 24; run++) {
    unsigned long n = N, x = 0;
    double t0 = seconds_now();
    __asm__ volatile(
        "1:\n\t"
        "add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\t"
        "add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\t"
        "sub $1, %1\n\tjnz 1b"
        : "+r"(x), "+r"(n)
        : "r"(one)
        : "cc");
    double t = seconds_now() - t0;
    double ghz = t > 0 ? 8.0 * N / t / 1e9 : 0.0;
    if (run > 0 && ghz > best) best = ghz;
  }
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, NULL) >= 0x16 && __get_cpuid(0x16, &a, &b, &c, &d) && b > 0 &&
      b / 1000.0 > best)
    best = b / 1000.0;
  return best;
}

/* AMD's Zen 4 (family 19h) runs a 512-bit FMA as two 256-bit halves. */
static int split_512(void) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  int amd = b == 0x68747541u; /* "Auth" of AuthenticAMD */
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
  unsigned family = ((a >> 8) & 0xf) + ((a >> 20) & 0xff);
  return family == 0x19;
}

int cpu_peak_get(int devices, int bf16, cpu_peak *out, char *why, size_t why_size) {
  memset(out, 0, sizeof *out);
  why[0] = '\0';
  const char *isa = pmap_cpu_isa(), *b16 = pmap_cpu_bf16();
  int half = split_512();
  int wide = !strcmp(isa, "avx512") || !strcmp(isa, "avx512_bf16") || !strcmp(isa, "amx");
  if (bf16 && !strcmp(b16, "amx_bf16")) {
    out->flops_per_cycle = 1024.0;
    snprintf(out->what, sizeof out->what, "bf16 AMX tile products, 1024 flops a cycle");
  } else if (bf16 && !strcmp(b16, "avx512_bf16")) {
    out->flops_per_cycle = half ? 64.0 : 128.0;
    snprintf(out->what, sizeof out->what, "bf16 dot products on 512-bit registers, %s a cycle",
             half ? "1" : "2");
  } else if (wide) {
    out->flops_per_cycle = half ? 32.0 : 64.0;
    snprintf(out->what, sizeof out->what, "fp32 FMA on 512-bit registers, %s a cycle",
             half ? "1" : "2");
  } else if (!strcmp(isa, "avx2")) {
    out->flops_per_cycle = 32.0;
    snprintf(out->what, sizeof out->what, "fp32 FMA on 256-bit registers, 2 a cycle");
  } else {
    out->flops_per_cycle = 16.0;
    snprintf(out->what, sizeof out->what,
             "fp32 multiplies and adds on 128-bit registers, 4 a cycle");
  }
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  out->cores = online > 0 && online < devices ? (int)online : devices;
  out->ghz = clock_ghz();
  if (!(out->ghz > 0.0)) {
    snprintf(why, why_size, "the clock could not be measured");
    return -1;
  }
  out->gflops = out->cores * out->flops_per_cycle * out->ghz;
  return 0;
}
#else
int cpu_peak_get(int devices, int bf16, cpu_peak *out, char *why, size_t why_size) {
  (void)devices, (void)bf16;
  memset(out, 0, sizeof *out);
  snprintf(why, why_size, "the peak is known on x86-64 only");
  return -1;
}
#endif
