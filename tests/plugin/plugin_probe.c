/* plugin_probe.c: what tests/plugin/test_plugin.sh runs against libpmap.so with its plugins
 * hidden, broken or foreign. Modes:
 *   cpu [LIB...]     a CPU context computes a psum, and none of the libraries LIB (substrings of
 *                    file names: "libcudart", "libmpi", ...) is loaded in the process;
 *   auto             PMAP_BACKEND_AUTO gives a CPU context and leaves pmap_last_error() alone;
 *   cuda NEEDLE...   a CUDA context is refused with PMAP_ERR_UNAVAILABLE and every NEEDLE in
 *                    the message;
 *   mpi NEEDLE...    the same for a context across processes (dist PMAP_DIST_MPI);
 *   launched NEEDLE...  the same for a CPU context with dist PMAP_DIST_AUTO (the test sets a
 *                    launcher's variables).
 * Exits non-zero on any mismatch. */
#include <stdio.h>
#include <string.h>

#include "../testutil.h"

static pmap_status psum_job(pmap_device *dev, void *arg) {
  float *out = arg;
  float v = (float)(pmap_axis_index(dev) + 1);
  pmap_status st = pmap_psum(dev, &v, &v, 1);
  out[pmap_axis_index(dev)] = v;
  return st;
}

/* Whether a file whose name contains lib is mapped into this process. */
static int mapped(const char *lib) {
  FILE *f = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, lib) != NULL;
  if (f) fclose(f);
  return found;
}

static void cpu(int argc, char **argv) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 3};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  float out[3] = {0, 0, 0};
  if (ctx) CHECK_OK(pmap_run(ctx, psum_job, out));
  for (int i = 0; i < 3; i++) CHECK(out[i] == 6.0f, "device %d: psum %g, want 6", i, out[i]);
  for (int i = 0; i < argc; i++) CHECK(!mapped(argv[i]), "%s is loaded in a CPU process", argv[i]);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

static void auto_backend(void) {
  pmap_set_error(PMAP_ERR_INTERNAL, "marker");
  pmap_config cfg = {.backend = PMAP_BACKEND_AUTO, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  if (ctx) {
    CHECK(pmap_ctx_backend(ctx) == PMAP_BACKEND_CPU, "AUTO chose %s",
          pmap_backend_name(pmap_ctx_backend(ctx)));
    CHECK(!strcmp(pmap_last_error(), "marker"), "AUTO left the message \"%s\"", pmap_last_error());
  }
  CHECK_OK(pmap_ctx_destroy(ctx));
}

static void refused(pmap_config cfg, int argc, char **argv) {
  pmap_ctx *ctx = NULL;
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  CHECK(st == PMAP_ERR_UNAVAILABLE, "got %s (%s), want unavailable", pmap_status_string(st),
        pmap_last_error());
  CHECK(ctx == NULL, "a refused context was returned");
  for (int i = 0; i < argc; i++)
    CHECK(strstr(pmap_last_error(), argv[i]) != NULL, "the message \"%s\" lacks \"%s\"",
          pmap_last_error(), argv[i]);
  if (ctx) pmap_ctx_destroy(ctx);
  printf("message: %s\n", pmap_last_error());
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: plugin_probe cpu|auto|cuda|mpi|launched [ARG...]\n");
    return 2;
  }
  const char *mode = argv[1];
  if (!strcmp(mode, "cpu")) {
    cpu(argc - 2, argv + 2);
  } else if (!strcmp(mode, "auto")) {
    auto_backend();
  } else if (!strcmp(mode, "cuda")) {
    refused((pmap_config){.backend = PMAP_BACKEND_CUDA, .num_devices = 1}, argc - 2, argv + 2);
  } else if (!strcmp(mode, "mpi")) {
    refused((pmap_config){.backend = PMAP_BACKEND_CPU, .num_devices = 1, .dist = PMAP_DIST_MPI},
            argc - 2, argv + 2);
  } else if (!strcmp(mode, "launched")) {
    refused((pmap_config){.backend = PMAP_BACKEND_CPU, .num_devices = 1}, argc - 2, argv + 2);
  } else {
    fprintf(stderr, "plugin_probe: unknown mode %s\n", mode);
    return 2;
  }
  return test_exit(mode);
}
