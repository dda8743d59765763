/* test_gemm.c: unit test of the CPU GEMM providers: every provider of the build, forced in turn,
 * runs the op harness's GEMM-based cases on the CPU (gemm with every transpose, alpha, beta and
 * padding, k == 0, as a dense layer against finite differences; conv2d forward and backward on
 * the im2col path, whose GEMMs they are) against their float64 references, then the bf16 GEMMs'
 * cases on each bf16 provider; forcing a provider that is not built is refused. oneDNN's own
 * convolutions are tests/ops/test_conv.c's. Which provider a process picks (PMAP_GEMM, the
 * measured choice and its cache) is tests/test_gemm_choice.c's. */
#include "ops/cpu/bf16.h"
#include "ops/cpu/conv.h"
#include "ops/cpu/gemm.h"
#include "ops/harness.h"
#include "testutil.h"

int main(void) {
  int n = 0;
  const cpu_gemm_provider *list = cpu_gemm_list(&n);
  /* Verbose: each case's largest errors against their bounds (in the reduction length). */
  hx_opts o = {.only = "gemm,conv2d_forward,conv2d_backward", .seed = 7, .verbose = 1};
  CHECK_OK(cpu_conv_force("im2col"));
  for (int i = 0; i < n; i++) {
    CHECK_OK(cpu_gemm_force(list[i].name));
    CHECK(strcmp(pmap_gemm_provider(), list[i].name) == 0, "forcing %s: %s in use", list[i].name,
          pmap_gemm_provider());
    int checks = 0, failures = 0;
    int r = hx_backend_run("cpu", &o, &checks, &failures);
    CHECK(r == 1 && checks > 1000, "gemm provider %s: %d of %d checks failed", list[i].name,
          failures, checks);
    printf("gemm provider %s: %s\n", list[i].name, r == 1 ? "ok" : "FAILED");
  }
  CHECK_FAILS(cpu_gemm_force("bogus"), PMAP_ERR_INVALID_ARGUMENT, "bogus");
  /* The bf16 GEMMs on each of their providers (oneDNN's matmul where built, the portable path on
   * every float provider just forced last). */
  hx_opts o16 = {.only = "gemm_bf16,gemm_strided_bf16", .seed = 7, .verbose = 1};
  static const char *const bf16[] = {"onednn", "portable"};
  for (int i = 0; i < 2; i++) {
    if (cpu_bf16_force(bf16[i]) != PMAP_SUCCESS) {
      printf("bf16 gemm %s: not built\n", bf16[i]);
      continue;
    }
    CHECK(strcmp(pmap_bf16_provider(), bf16[i]) == 0, "forcing %s: %s in use", bf16[i],
          pmap_bf16_provider());
    int checks = 0, failures = 0;
    int r = hx_backend_run("cpu", &o16, &checks, &failures);
    CHECK(r == 1 && checks > 1000, "bf16 gemm %s: %d of %d checks failed", bf16[i], failures,
          checks);
    printf("bf16 gemm %s: %s\n", bf16[i], r == 1 ? "ok" : "FAILED");
    /* The harness's GEMMs ran on this thread (the CPU backend's device 0 is the caller's), its
     * largest past the portable path's bound: the widened operands stayed within it. */
    size_t held = cpu_bf16_scratch_floats();
    CHECK(held <= CPU_BF16_SCRATCH,
          "bf16 gemm %s: the thread's scratch holds %zu floats, over "
          "the bound of %d",
          bf16[i], held, CPU_BF16_SCRATCH);
    /* The cut shapes went through it: 1 019 250 floats for the largest. */
    if (i == 1)
      CHECK(held > CPU_BF16_SCRATCH / 2, "the portable path's scratch holds only %zu floats", held);
  }
  CHECK_FAILS(cpu_bf16_force("bogus"), PMAP_ERR_INVALID_ARGUMENT, "bogus");
  CHECK(n >= 1, "no CPU GEMM provider listed");
  return test_exit("gemm");
}
