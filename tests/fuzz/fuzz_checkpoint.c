/* fuzz_checkpoint.c: libFuzzer target for the checkpoint loader. Each input is a file handed to
 * pmap_params_load_user, through an in-memory file, for two training states (linear with SGD,
 * mlp with Adam). A load either succeeds or fails with PMAP_ERR_INVALID_ARGUMENT leaving the
 * state bitwise unchanged; anything else traps. Every input is tried twice: as it is, and with
 * its file length and checksums made consistent, so that mutations reach the checks behind the
 * CRCs (model, optimizer, sizes) instead of all stopping at the first checksum. One device each: the file does not depend on the
 * device count, and a single device's jobs run on the calling thread, which keeps the target
 * fast on a loaded machine (no thread hand-offs per execution). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pmap.h"
#include "pmap_examples.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct target {
  pmap_ctx *ctx;
  pmap_model *model;
  pmap_params *params;
  int n;
  size_t count;
  float *before, *after; /* (n, count) */
} target;

static target targets[2];
static int fd = -1;
static char path[64];

static void open_target(target *t, const char *name, int n) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n};
  pmap_example_info info;
  if (pmap_example_info_get(name, &info) || pmap_ctx_create(&cfg, &t->ctx) ||
      pmap_example_model(name, &t->model) ||
      pmap_params_create(t->ctx, t->model, &info.opt, 1, &t->params)) {
    fprintf(stderr, "fuzz_checkpoint: setup failed: %s\n", pmap_last_error());
    abort();
  }
  t->n = n;
  t->count = pmap_params_count(t->params);
  t->before = malloc((size_t)n * t->count * sizeof(float));
  t->after = malloc((size_t)n * t->count * sizeof(float));
  if (!t->before || !t->after) abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  open_target(&targets[0], "linear", 1);
  open_target(&targets[1], "mlp", 1);
  fd = memfd_create("pmap-fuzz-ckpt", 0);
  if (fd < 0) abort();
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  return 0;
}

/* Bitwise CRC-32C (the harness's own, independent of the library's). */
static uint32_t crc32c(uint32_t crc, const uint8_t *p, size_t n) {
  crc = ~crc;
  while (n--) {
    crc ^= *p++;
    for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Rewrites the file length, the header CRC and the CRC of every section whose frame fits. */
static void fix_checksums(uint8_t *f, size_t n) {
  if (n < 32) return;
  for (int i = 0; i < 8; i++) f[16 + i] = (uint8_t)((uint64_t)n >> (8 * i));
  put32(f + 28, crc32c(0, f, 28));
  for (size_t at = 32; n - at >= 16;) {
    uint64_t len = 0;
    for (int i = 0; i < 8; i++) len |= (uint64_t)f[at + 8 + i] << (8 * i);
    if (len > n - at - 16) break;
    put32(f + at + 4, crc32c(crc32c(0, f + at, 4), f + at + 8, 8 + (size_t)len));
    at += 16 + (size_t)len;
  }
}

static void read_all(target *t, float *dst) {
  for (int d = 0; d < t->n; d++)
    if (pmap_params_read(t->params, d, dst + (size_t)d * t->count, t->count)) abort();
}

static void try_file(const uint8_t *data, size_t size) {
  if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
  for (int i = 0; i < 2; i++) {
    target *t = &targets[i];
    read_all(t, t->before);
    int64_t step = pmap_params_step(t->params);
    unsigned char user[256];
    size_t got = 0;
    pmap_status st = pmap_params_load_user(t->params, path, user, sizeof user, &got);
    if (st == PMAP_SUCCESS) {
      if (got > sizeof user) __builtin_trap();
      if (pmap_params_verify(t->params)) __builtin_trap();
      continue;
    }
    if (st != PMAP_ERR_INVALID_ARGUMENT) {
      fprintf(stderr, "unexpected status %s: %s\n", pmap_status_string(st), pmap_last_error());
      __builtin_trap();
    }
    read_all(t, t->after);
    if (step != pmap_params_step(t->params) ||
        memcmp(t->before, t->after, (size_t)t->n * t->count * sizeof(float)) != 0) {
      fprintf(stderr, "a failed load changed the state: %s\n", pmap_last_error());
      __builtin_trap();
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try_file(data, size);
  uint8_t *fixed = malloc(size ? size : 1);
  if (!fixed) abort();
  memcpy(fixed, data, size);
  fix_checksums(fixed, size);
  if (size >= 32 && memcmp(fixed, data, size) != 0) try_file(fixed, size);
  free(fixed);
  return 0;
}
