/* cpu_isa.c: the CPU's instruction sets (CPUID and XCR0) and PMAP_CPU_ISA's cap over them,
 * decided once per process and handed to oneDNN before its first primitive (cpu_isa.h). */
#include "cpu_isa.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"

#if defined(PMAP_GEMM_DNNL)
#include <dnnl.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

static const char *const names[] = {"sse41", "avx2", "avx512", "avx512_bf16", "amx"};
#define NLEVELS ((int)(sizeof names / sizeof names[0]))

const char *cpu_isa_name(cpu_isa isa) {
  return (int)isa >= 0 && (int)isa < NLEVELS ? names[isa] : "unknown";
}

/* ------------------------------------------------------------------------------------------ */
/* The CPU                                                                                    */

#if defined(__x86_64__) && defined(__GNUC__)
/* The register state the OS saves (XCR0): AVX-512 needs bits 1, 2, 5, 6, 7; AMX also 17, 18. */
static uint64_t xcr0(void) {
  uint32_t a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* no OSXSAVE */
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

static cpu_isa detect(void) {
  /* AVX2 and x86-64-v4 as the compiler's own dispatch tests them (OS support included). */
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) return CPU_ISA_BASELINE;
  int v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
  uint64_t os = xcr0();
  const uint64_t avx512 = 0xe6, amx = 0x60000;
  if (!v4 || (os & avx512) != avx512) return CPU_ISA_AVX2;
  uint32_t a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, NULL) < 7) return CPU_ISA_AVX512;
  __cpuid_count(7, 0, a, b, c, d);
  int amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  __cpuid_count(7, 1, a, b, c, d);
  int avx512_bf16 = (a >> 5) & 1;
  if (amx_bf16 && amx_tile && (os & amx) == amx) return CPU_ISA_AMX;
  return avx512_bf16 ? CPU_ISA_AVX512_BF16 : CPU_ISA_AVX512;
}
#else
static cpu_isa detect(void) { return CPU_ISA_BASELINE; }
#endif

/* ------------------------------------------------------------------------------------------ */
/* The cap                                                                                    */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cpu_isa machine, active;
static pmap_status env_status;
static char env_msg[400];
_Atomic int cpu_simd_level_now = -1;

#if defined(PMAP_GEMM_DNNL)
static const struct {
  dnnl_cpu_isa_t isa;
  const char *name;
} dnnl_names[] = {
    {dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
    {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
    {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
    {dnnl_cpu_isa_avx512_core, "avx512_core"},
    {dnnl_cpu_isa_avx2_vnni, "avx2_vnni"},
    {dnnl_cpu_isa_avx2, "avx2"},
    {dnnl_cpu_isa_avx, "avx"},
    {dnnl_cpu_isa_sse41, "sse41"},
};
static const dnnl_cpu_isa_t dnnl_caps[] = {dnnl_cpu_isa_sse41, dnnl_cpu_isa_avx2,
                                           dnnl_cpu_isa_avx512_core, dnnl_cpu_isa_avx512_core_bf16,
                                           dnnl_cpu_isa_avx512_core_amx};
static const char *onednn_name = "none";
static int onednn_bf16;
#endif

pmap_status cpu_isa_cap_check(cpu_isa cpu, int pick, char *msg, size_t size) {
  if (pick >= NLEVELS || (cpu_isa)pick <= cpu) return PMAP_SUCCESS;
  snprintf(msg, size,
           "environment variable PMAP_CPU_ISA=\"%s\" asks for instructions this CPU lacks (it "
           "has up to %s; the caps below it: %s%s%s%s)",
           names[pick], names[cpu], names[0], cpu >= CPU_ISA_AVX2 ? ", avx2" : "",
           cpu >= CPU_ISA_AVX512 ? ", avx512" : "",
           cpu >= CPU_ISA_AVX512_BF16 ? ", avx512_bf16" : "");
  return PMAP_ERR_UNAVAILABLE;
}

static void decide(void) {
  machine = active = detect();
  static const char *const choices[] = {"sse41", "avx2",   "avx512", "avx512_bf16",
                                        "amx",   "native", NULL};
  int pick = NLEVELS; /* native */
  char saved[1024];
  pmap_error_save(saved, sizeof saved); /* the reader's message is kept for cpu_isa_ready */
  env_status = pmap_env_choice("PMAP_CPU_ISA", choices, NLEVELS, &pick);
  if (env_status != PMAP_SUCCESS) {
    snprintf(env_msg, sizeof env_msg, "%s (this CPU has up to %s)", pmap_error_message(),
             names[machine]);
  } else if ((env_status = cpu_isa_cap_check(machine, pick, env_msg, sizeof env_msg))) {
    /* a level above the CPU's: refused, the message made */
  } else if (pick < NLEVELS) {
    active = (cpu_isa)pick;
  }
  pmap_error_copy(saved);
#if defined(PMAP_GEMM_DNNL)
  /* Before any other oneDNN call (this is the first: every path to oneDNN passes here). It
   * overrides ONEDNN_MAX_CPU_ISA; without PMAP_CPU_ISA that variable keeps its effect. */
  if (env_status == PMAP_SUCCESS && pick < NLEVELS &&
      dnnl_set_max_cpu_isa(dnnl_caps[pick]) != dnnl_success) {
    env_status = PMAP_ERR_DEVICE;
    snprintf(env_msg, sizeof env_msg,
             "oneDNN refused the cap PMAP_CPU_ISA=\"%s\" (dnnl_set_max_cpu_isa: oneDNN was used "
             "before pmap, in this process)",
             names[pick]);
  }
  dnnl_cpu_isa_t eff = dnnl_get_effective_cpu_isa();
  for (size_t i = 0; i < sizeof dnnl_names / sizeof dnnl_names[0]; i++)
    if ((eff & dnnl_names[i].isa) == dnnl_names[i].isa) {
      onednn_name = dnnl_names[i].name;
      break;
    }
  onednn_bf16 = (eff & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
#endif
  int level = active >= CPU_ISA_AVX512 ? 2 : active == CPU_ISA_AVX2 ? 1 : 0;
  atomic_store_explicit(&cpu_simd_level_now, level, memory_order_relaxed);
}

pmap_status cpu_isa_ready(const char *call) {
  pthread_once(&once, decide);
  if (env_status != PMAP_SUCCESS) return PMAP_ERR(env_status, "%s: %s", call, env_msg);
  return PMAP_SUCCESS;
}

cpu_isa cpu_isa_machine(void) {
  pthread_once(&once, decide);
  return machine;
}

cpu_isa cpu_isa_active(void) {
  pthread_once(&once, decide);
  return active;
}

int cpu_simd_level_init(void) {
  pthread_once(&once, decide);
  return atomic_load_explicit(&cpu_simd_level_now, memory_order_relaxed);
}

#if defined(PMAP_GEMM_DNNL)
const char *cpu_isa_onednn(void) {
  pthread_once(&once, decide);
  return onednn_name;
}

int cpu_isa_onednn_bf16(void) {
  pthread_once(&once, decide);
  return onednn_bf16;
}
#else
const char *cpu_isa_onednn(void) { return "none"; }
int cpu_isa_onednn_bf16(void) { return 0; }
#endif

const char *pmap_cpu_isa(void) { return cpu_isa_name(cpu_isa_active()); }
