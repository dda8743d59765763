/* test_ops.c: the op harness's program (tests/ops/harness.h): every op on every backend built,
 * or on the one --backend names.
 *
 *   test_ops [--backend cpu|cuda] [--op NAME[,NAME...]] [--seed N] [--quick] [--verbose]
 *            [--as-device] [--devices N]
 *
 * --as-device runs the CPU as a device backend is run (the large sizes, every output compared
 * with the CPU kernels' too), so that this half of the harness is exercised where there is no
 * GPU. --devices N runs every case on N logical devices at once, each with its own queue and
 * buffers (on CUDA spread over the GPUs there are, several on one where NCCL allows it: the
 * kernels of devices sharing a GPU side by side); each device's results are held to the same
 * checks.
 * Exit status: 0 every backend that ran passed; 1 a check failed; 77 (skip) the backend that
 * --backend names is not built or has no usable device here. Without --backend a backend that
 * cannot run here is reported "not run" (never passed) and the others decide. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static int usage(const char *why) {
  fprintf(stderr,
          "test_ops: %s\nusage: test_ops [--backend cpu|cuda] [--op NAME[,NAME...]] [--seed N] "
          "[--quick] [--verbose] [--as-device] [--devices N]\n",
          why);
  return 1;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a test killed at its limit keeps what it printed */
  hx_opts o = {.seed = 20240611};
  const char *backend = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--quick")) {
      o.quick = 1;
    } else if (!strcmp(a, "--as-device")) {
      o.as_device = 1;
    } else if (!strcmp(a, "--verbose")) {
      o.verbose = 1;
    } else if (i + 1 < argc && !strcmp(a, "--backend")) {
      backend = argv[++i];
      if (strcmp(backend, "cpu") && strcmp(backend, "cuda")) return usage("--backend: cpu or cuda");
    } else if (i + 1 < argc && !strcmp(a, "--op")) {
      o.only = argv[++i];
      if (!hx_only_valid(o.only)) return usage("--op names an op that does not exist");
    } else if (i + 1 < argc && !strcmp(a, "--devices")) {
      char *end = NULL;
      long v = strtol(argv[++i], &end, 10);
      if (!*argv[i] || *end || v < 1 || v > PMAP_MAX_DEVICES)
        return usage("--devices: an integer from 1 to PMAP_MAX_DEVICES");
      o.devices = (int)v;
    } else if (i + 1 < argc && !strcmp(a, "--seed")) {
      char *end = NULL;
      o.seed = strtoull(argv[++i], &end, 0);
      if (!*argv[i] || *end) return usage("--seed: an integer");
    } else {
      return usage(a);
    }
  }
  printf("op harness: seed %" PRIu64 "%s", o.seed, o.quick ? ", quick" : "");
  if (o.devices > 1) printf(", %d devices at once", o.devices);
  printf("\n");
  int checks = 0, failures = 0;
  if (backend) {
    int r = hx_backend_run(backend, &o, &checks, &failures);
    if (r < 0) {
      printf("%s: not run (skipped)\n", backend);
      return 77;
    }
    printf("ops: %d checks, %d failed; %s %s\n", checks, failures, backend,
           r ? "passed" : "FAILED");
    return r ? 0 : 1;
  }
  const char *names[] = {"cpu", "cuda"};
  char verdict[128] = "";
  int ran = 0;
  for (int b = 0; b < 2; b++) {
    int r = hx_backend_run(names[b], &o, &checks, &failures);
    size_t len = strlen(verdict);
    snprintf(verdict + len, sizeof verdict - len, "%s%s %s", b ? ", " : "", names[b],
             r > 0    ? "passed"
             : r == 0 ? "FAILED"
                      : "not run");
    ran += r >= 0;
  }
  printf("ops: %d checks, %d failed; %s\n", checks, failures, verdict);
  return failures || !ran ? 1 : 0;
}
