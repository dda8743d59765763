/* test_gemm_choice.c: the run-time choice of the CPU GEMM, made once per process, so each case
 * runs this program again as a child with its own environment: PMAP_GEMM forces a provider, or
 * fails the context's creation naming the value and the built providers; the cache is written
 * and read by the next process, survives corruption and a folder it cannot write, keeps other
 * machines' lines; PMAP_GEMM_CACHE=0 skips it; threads asking at once get one answer; the bf16
 * GEMM is oneDNN's matmul exactly where the CPU has bf16 instructions, PMAP_GEMM_BF16 forces it
 * or the portable path, and a bad value fails the context naming it; PMAP_CPU_ISA caps all of
 * it, refusing a level the CPU lacks. */
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pmap.h"
#include "ops/cpu/cpu_isa.h"
#include "ops/cpu/gemm.h"
#include "child_run.h"
#include "testutil.h"

#define OUT_CAP 8192
#define THREADS 16

/* ------------------------------------------------------------------------------------------ */
/* The child: reports what it chose                                                           */

static pthread_barrier_t start;
static const char *seen[THREADS];

static void *ask(void *arg) {
  pthread_barrier_wait(&start);
  seen[(intptr_t)arg] = pmap_gemm_provider();
  return NULL;
}

/* "threads": THREADS threads ask for the provider at once, before any context. Then a context
 * of one CPU device; prints one "key value" line each. */
static int child(const char *mode) {
  alarm(120); /* a child that hangs (waiting on a FIFO, say) fails instead of holding the test */
  if (strcmp(mode, "threads") == 0) {
    pthread_t t[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (intptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, ask, (void *)i);
    int same = 1;
    for (int i = 0; i < THREADS; i++) {
      pthread_join(t[i], NULL);
      same &= strcmp(seen[i], seen[0]) == 0;
    }
    printf("threads_same %d\n", same);
  }
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
  pmap_ctx *ctx = NULL;
  pmap_status st = pmap_ctx_create(&cfg, &ctx);
  printf(
      "status %d\nprovider %s\nreason %s\nbf16 %s\nbf16_reason %s\ncpu_bf16 %s\ncpu_isa "
      "%s\nerror %s\n",
      (int)st, pmap_gemm_provider(), pmap_gemm_reason(), pmap_bf16_provider(), pmap_bf16_reason(),
      pmap_cpu_bf16(), pmap_cpu_isa(), st ? pmap_last_error() : "");
  pmap_ctx_destroy(ctx);
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The parent: runs children and checks their reports                                         */

typedef struct report {
  char out[OUT_CAP];
  int status;
  char provider[64], reason[64];
  char bf16[64], bf16_reason[80], cpu_bf16[64]; /* the bf16 GEMM's choice */
  char cpu_isa[64];                             /* pmap_cpu_isa() */
  const char *error;                            /* into out */
} report;

static char tmp[64];

/* Runs this program as a child in mode `mode` with XDG_CACHE_HOME set to `cache` and the environment settings of `env` ("NAME=VALUE", NULL-terminated), PMAP_GEMM and
 * PMAP_GEMM_CACHE unset otherwise; fills r from its output. */
static void run_child(const char *mode, const char *cache, const char *const *env, report *r) {
  memset(r, 0, sizeof *r);
  r->status = -1;
  static const char *const unset[] = {"PMAP_GEMM", "PMAP_GEMM_CACHE", "PMAP_GEMM_BF16", NULL};
  child_run("test_gemm_choice", mode, cache, unset, env, r->out, sizeof r->out);
  const char *s = strstr(r->out, "status ");
  if (s) sscanf(s, "status %d", &r->status);
  s = strstr(r->out, "provider ");
  if (s) sscanf(s, "provider %63s", r->provider);
  s = strstr(r->out, "reason ");
  if (s) sscanf(s, "reason %63[^\n]", r->reason);
  s = strstr(r->out, "\nbf16 ");
  if (s) sscanf(s, "\nbf16 %63s", r->bf16);
  s = strstr(r->out, "bf16_reason ");
  if (s) sscanf(s, "bf16_reason %79[^\n]", r->bf16_reason);
  s = strstr(r->out, "cpu_bf16 ");
  if (s) sscanf(s, "cpu_bf16 %63s", r->cpu_bf16);
  s = strstr(r->out, "cpu_isa ");
  if (s) sscanf(s, "cpu_isa %63s", r->cpu_isa);
  r->error = strstr(r->out, "error ");
  if (!r->error) r->error = "";
}

static int built(const char *name) {
  char list[128];
  snprintf(list, sizeof list, ",%s,", pmap_gemm_providers());
  char want[sizeof list];
  snprintf(want, sizeof want, ",%.64s,", name);
  return strstr(list, want) != NULL;
}

static void expect(const report *r, int status, const char *provider, const char *reason,
                   const char *what) {
  CHECK(r->status == status, "%s: status %d, want %d (%s)", what, r->status, status, r->error);
  if (provider)
    CHECK(strcmp(r->provider, provider) == 0, "%s: provider %s, want %s", what, r->provider,
          provider);
  if (reason)
    CHECK(strcmp(r->reason, reason) == 0, "%s: reason \"%s\", want \"%s\"", what, r->reason,
          reason);
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 16);
  if (buf) buf[fread(buf, 1, (1 << 16) - 1, f)] = '\0';
  fclose(f);
  return buf;
}

static void write_file(const char *path, const char *data, size_t n) {
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL, "cannot write %s", path);
  if (!f) return;
  fwrite(data, 1, n, f);
  fclose(f);
}

/* This machine's key (CPU model, version, providers: the line's first three fields) from a
 * cache file with one entry. */
static void entry_key(const char *file, char *key, size_t cap) {
  key[0] = '\0';
  const char *line = file;
  while (line && *line == '#') line = strchr(line, '\n'), line = line ? line + 1 : NULL;
  if (!line) return;
  const char *p = line;
  for (int tabs = 0; *p && *p != '\n'; p++)
    if (*p == '\t' && ++tabs == 3) break;
  size_t n = (size_t)(p - line);
  if (n >= cap) n = cap - 1;
  memcpy(key, line, n);
  key[n] = '\0';
}

static void test_env_values(void) {
  report r;
  char names[128];
  snprintf(names, sizeof names, "%s", pmap_gemm_providers());
  const char *bogus[] = {"PMAP_GEMM=bogus", NULL};
  run_child("plain", tmp, bogus, &r);
  expect(&r, PMAP_ERR_INVALID_ARGUMENT, "none", "invalid PMAP_GEMM", "PMAP_GEMM=bogus");
  CHECK(strstr(r.error, "PMAP_GEMM=\"bogus\"") != NULL, "PMAP_GEMM=bogus: message %s", r.error);
  for (char *save = NULL, *n = strtok_r(names, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
    CHECK(strstr(r.error, n) != NULL, "PMAP_GEMM=bogus: message does not name %s: %s", n, r.error);
    char set[64];
    snprintf(set, sizeof set, "PMAP_GEMM=%s", n);
    const char *force[] = {set, NULL};
    report f;
    run_child("plain", tmp, force, &f);
    expect(&f, PMAP_SUCCESS, n, "forced by PMAP_GEMM", set);
  }
  static const char *const known[] = {"onednn", "cblas", "portable"};
  for (int i = 0; i < 3; i++) {
    if (built(known[i])) continue;
    char set[64];
    snprintf(set, sizeof set, "PMAP_GEMM=%s", known[i]);
    const char *force[] = {set, NULL};
    run_child("plain", tmp, force, &r);
    expect(&r, PMAP_ERR_UNAVAILABLE, "none", "invalid PMAP_GEMM", set);
    CHECK(strstr(r.error, pmap_gemm_providers()) || strstr(r.error, "built:"),
          "%s: message does not name the built providers: %s", set, r.error);
  }
  const char *cache2[] = {"PMAP_GEMM_CACHE=2", NULL};
  run_child("plain", tmp, cache2, &r);
  expect(&r, PMAP_ERR_INVALID_ARGUMENT, "none", "invalid PMAP_GEMM_CACHE", "PMAP_GEMM_CACHE=2");
}

/* Whether oneDNN runs bf16 on bf16 instructions under the environment's ONEDNN_MAX_CPU_ISA
 * (or its older name), as far as the variable goes: the CPU's own instructions are cpu_bf16. */
static int onednn_cap_has_bf16(void) {
  const char *v = getenv("ONEDNN_MAX_CPU_ISA");
  if (!v || !*v) v = getenv("DNNL_MAX_CPU_ISA");
  return !v || !*v || !strcmp(v, "ALL") || !strcmp(v, "AVX512_CORE_BF16") ||
         !strcmp(v, "AVX512_CORE_AMX");
}

/* The bf16 GEMM a child chose without PMAP_GEMM_BF16: where oneDNN may run bf16 instructions
 * (`candidate`), its matmul, unless measured slower than the portable path (said so); elsewhere
 * the portable path. */
static int bf16_choice_ok(const report *r, int candidate) {
  if (!candidate) return !strcmp(r->bf16, "portable");
  if (!strcmp(r->bf16, "portable")) return strstr(r->bf16_reason, "measured slower") != NULL;
  return !strcmp(r->bf16, "onednn") && strstr(r->bf16_reason, "the CPU has") != NULL;
}

/* PMAP_GEMM_BF16: unset, oneDNN's matmul exactly where pmap may use bf16 instructions
 * (pmap_cpu_bf16), oneDNN's own cap keeps them, and the build has oneDNN; each value forces its
 * provider; a bad one fails the context naming it. */
static void test_bf16_env(void) {
  report r;
  int onednn = built("onednn");
  run_child("plain", tmp, NULL, &r);
  int has = strcmp(r.cpu_bf16, "none") != 0 && (getenv("PMAP_CPU_ISA") || onednn_cap_has_bf16());
  CHECK(r.status == PMAP_SUCCESS && bf16_choice_ok(&r, onednn && has),
        "bf16 GEMM %s (%s) on a CPU with %s", r.bf16, r.bf16_reason, r.cpu_bf16);
  printf("bf16: CPU %s, GEMM %s (%s)\n", r.cpu_bf16, r.bf16, r.bf16_reason);
  static const char *const set[] = {"PMAP_GEMM_BF16=portable", "PMAP_GEMM_BF16=onednn",
                                    "PMAP_GEMM_BF16=auto", "PMAP_GEMM_BF16=bogus"};
  for (int i = 0; i < 4; i++) {
    const char *env[] = {set[i], NULL};
    run_child("plain", tmp, env, &r);
    if (i == 3 || (i == 1 && !onednn)) {
      CHECK(r.status == (i == 3 ? PMAP_ERR_INVALID_ARGUMENT : PMAP_ERR_UNAVAILABLE) &&
                !strcmp(r.bf16, "none") && strstr(r.error, "PMAP_GEMM_BF16=\"") &&
                strstr(r.error, "pmap_ctx_create"),
            "%s: status %d, bf16 %s, message %s", set[i], r.status, r.bf16, r.error);
    } else if (i < 2) {
      CHECK(r.status == PMAP_SUCCESS && !strcmp(r.bf16, i ? "onednn" : "portable") &&
                !strcmp(r.bf16_reason, "forced by PMAP_GEMM_BF16"),
            "%s: status %d, bf16 %s (%s)", set[i], r.status, r.bf16, r.bf16_reason);
    } else {
      CHECK(r.status == PMAP_SUCCESS && bf16_choice_ok(&r, onednn && has),
            "%s: status %d, bf16 %s (%s)", set[i], r.status, r.bf16, r.bf16_reason);
    }
  }
}

/* PMAP_CPU_ISA: each level up to the CPU's is taken (pmap_cpu_isa names it, the bf16 GEMM is
 * oneDNN's exactly from avx512_bf16 up, and pmap_cpu_bf16 follows), one above it and a bad
 * name fail the context naming the value; the float GEMM's choice is measured and cached per
 * cap. And oneDNN's own cap (ONEDNN_MAX_CPU_ISA) below its bf16 instructions, with pmap's
 * left alone, sends bf16 to the portable path: oneDNN would emulate it. */
static void test_isa_env(void) {
  static const char *const levels[] = {"sse41", "avx2", "avx512", "avx512_bf16", "amx"};
  const char *native_env[] = {"PMAP_CPU_ISA=native", "ONEDNN_MAX_CPU_ISA=", NULL};
  report r;
  run_child("plain", tmp, native_env, &r);
  int machine = -1;
  for (int i = 0; i < 5; i++)
    if (!strcmp(r.cpu_isa, levels[i])) machine = i;
  CHECK(r.status == PMAP_SUCCESS && machine >= 0, "PMAP_CPU_ISA=native: status %d, isa \"%s\"",
        r.status, r.cpu_isa);
  printf("CPU instruction set: %s\n", r.cpu_isa);
  int onednn = built("onednn");
  for (int i = 0; i < 5; i++) {
    char var[64], cache[160];
    snprintf(var, sizeof var, "PMAP_CPU_ISA=%s", levels[i]);
    snprintf(cache, sizeof cache, "%s/isa-%s", tmp, levels[i]);
    const char *env[] = {var, NULL};
    run_child("plain", cache, env, &r);
    if (i > machine) { /* the message quotes the value: PMAP_CPU_ISA="amx" */
      char quoted[80];
      snprintf(quoted, sizeof quoted, "PMAP_CPU_ISA=\"%s\"", levels[i]);
      CHECK(r.status == PMAP_ERR_UNAVAILABLE && strstr(r.error, "pmap_ctx_create") &&
                strstr(r.error, quoted) && strstr(r.error, "lacks"),
            "%s on a CPU of %s: status %d, message %s", var, levels[machine], r.status, r.error);
      continue;
    }
    int bf16 = i >= 3;
    CHECK(r.status == PMAP_SUCCESS && !strcmp(r.cpu_isa, levels[i]), "%s: status %d, isa %s (%s)",
          var, r.status, r.cpu_isa, r.error);
    CHECK(!strcmp(r.cpu_bf16, i == 4   ? "amx_bf16"
                              : i == 3 ? "avx512_bf16"
                                       : "none"),
          "%s: pmap_cpu_bf16 %s", var, r.cpu_bf16);
    CHECK(bf16_choice_ok(&r, onednn && bf16), "%s: bf16 GEMM %s (%s)", var, r.bf16, r.bf16_reason);
    if (i < machine && strchr(pmap_gemm_providers(), ','))
      CHECK(!strcmp(r.reason, "measured") || !strcmp(r.reason, "only one within PMAP_CPU_ISA"),
            "%s in a fresh cache: the GEMM %s (%s), not measured under the cap", var, r.provider,
            r.reason);
    if (i == machine - 1 && strchr(pmap_gemm_providers(), ',')) {
      /* The machine's own choice cached in the same folder is not this cap's. */
      run_child("plain", cache, native_env, &r);
      CHECK(!strcmp(r.reason, "measured"), "uncapped after %s: reason %s", var, r.reason);
      run_child("plain", cache, env, &r);
      CHECK(!strcmp(r.reason, "cached") || !strcmp(r.reason, "only one within PMAP_CPU_ISA"),
            "%s again: reason %s", var, r.reason);
    }
  }
  const char *bogus[] = {"PMAP_CPU_ISA=avx1024", NULL};
  run_child("plain", tmp, bogus, &r);
  CHECK(r.status == PMAP_ERR_INVALID_ARGUMENT && strstr(r.error, "PMAP_CPU_ISA=\"avx1024\"") &&
            strstr(r.error, "avx512_bf16") && strstr(r.error, "pmap_ctx_create"),
        "PMAP_CPU_ISA=avx1024: status %d, message %s", r.status, r.error);
  char level[64]; /* and it names the CPU's own level */
  snprintf(level, sizeof level, "this CPU has up to %s", machine >= 0 ? levels[machine] : "?");
  CHECK(strstr(r.error, level) != NULL, "PMAP_CPU_ISA=avx1024: message %s lacks \"%s\"", r.error,
        level);
  /* A provider that picks its kernels itself (OpenBLAS, by the CPU or OPENBLAS_CORETYPE) cannot
   * be forced above the cap: AVX2 kernels under sse41 are refused, naming both. */
  const cpu_gemm_provider *cblas = cpu_gemm_find("cblas");
  if (cblas && cblas->isa && machine >= 1) {
    const char *env[] = {"PMAP_CPU_ISA=sse41", "PMAP_GEMM=cblas", "OPENBLAS_CORETYPE=Haswell",
                         NULL};
    run_child("plain", tmp, env, &r);
    CHECK(r.status == PMAP_ERR_INVALID_ARGUMENT && strstr(r.error, "PMAP_GEMM=\"cblas\"") &&
              strstr(r.error, "avx2") && strstr(r.error, "PMAP_CPU_ISA=\"sse41\""),
          "PMAP_GEMM=cblas on Haswell kernels under sse41: status %d, message %s", r.status,
          r.error);
    const char *within[] = {"PMAP_CPU_ISA=avx2", "PMAP_GEMM=cblas", "OPENBLAS_CORETYPE=Haswell",
                            NULL};
    run_child("plain", tmp, within, &r);
    CHECK(r.status == PMAP_SUCCESS && !strcmp(r.provider, "cblas"),
          "PMAP_GEMM=cblas on Haswell kernels under avx2: status %d, provider %s (%s)", r.status,
          r.provider, r.error);
  }
  if (onednn && machine >= 3) {
    const char *env[] = {"PMAP_CPU_ISA=", "ONEDNN_MAX_CPU_ISA=AVX512_CORE", NULL};
    run_child("plain", tmp, env, &r);
    CHECK(r.status == PMAP_SUCCESS && !strcmp(r.bf16, "portable") &&
              strstr(r.bf16_reason, "ONEDNN_MAX_CPU_ISA"),
          "ONEDNN_MAX_CPU_ISA=AVX512_CORE: bf16 GEMM %s (%s)", r.bf16, r.bf16_reason);
  }
}

static void test_cache(void) {
  report r, r2;
  char dir[128], path[160];
  snprintf(dir, sizeof dir, "%s/a", tmp);
  snprintf(path, sizeof path, "%s/pmap/gemm", dir);
  run_child("plain", dir, NULL, &r);
  expect(&r, PMAP_SUCCESS, NULL, "measured", "first process");
  CHECK(built(r.provider), "first process: provider %s is not built", r.provider);
  char *file = read_file(path);
  CHECK(file != NULL, "no cache file at %s", path);
  if (!file) return;
  char key[512], line[1024];
  entry_key(file, key, sizeof key);
  snprintf(line, sizeof line, "%s\t%s\t", key, r.provider);
  CHECK(strstr(file, line) != NULL, "the cache does not hold the choice %s: %s", r.provider, file);
  free(file);

  run_child("plain", dir, NULL, &r2);
  expect(&r2, PMAP_SUCCESS, r.provider, "cached", "second process");
  const char *autov[] = {"PMAP_GEMM=auto", NULL};
  run_child("plain", dir, autov, &r2);
  expect(&r2, PMAP_SUCCESS, r.provider, "cached", "PMAP_GEMM=auto");

  /* The next process takes the file's word for it, whatever was measured. */
  int n = 0;
  char names[128], *last = NULL;
  snprintf(names, sizeof names, "%s", pmap_gemm_providers());
  for (char *save = NULL, *p = strtok_r(names, ",", &save); p; p = strtok_r(NULL, ",", &save))
    last = p, n++;
  char planted[1024];
  int len = snprintf(planted, sizeof planted, "%s\t%s\n", key, last);
  write_file(path, planted, (size_t)len);
  run_child("plain", dir, NULL, &r2);
  expect(&r2, PMAP_SUCCESS, last, "cached", "a planted choice");
  /* (That process may have added the bf16 GEMM's line: the file as it left it.) */
  char *before = read_file(path);
  CHECK(before && strstr(before, planted), "the planted line went: %s", before);
  const char *nocache[] = {"PMAP_GEMM_CACHE=0", NULL};
  run_child("plain", dir, nocache, &r2);
  expect(&r2, PMAP_SUCCESS, NULL, "measured", "PMAP_GEMM_CACHE=0");
  file = read_file(path);
  CHECK(file && before && strcmp(file, before) == 0, "PMAP_GEMM_CACHE=0 changed the cache: %s",
        file);
  free(file), free(before);

  /* Corrupt: binary bytes, an overlong line, this key with an unknown provider, lines of the
   * wrong shape. Survived, measured again, and the next process reads the repaired file. */
  char junk[8192];
  size_t j = 0;
  for (int i = 0; i < 300; i++) junk[j++] = (char)(i * 37 + 11);
  junk[j++] = '\n';
  memset(junk + j, 'x', 5000);
  j += 5000;
  j += (size_t)snprintf(junk + j, sizeof junk - j, "\n%s\tbogus\t\n\t\t\t\t\t\t\n%s\n", key, key);
  write_file(path, junk, j);
  run_child("plain", dir, NULL, &r2);
  expect(&r2, PMAP_SUCCESS, NULL, "measured", "a corrupt cache");
  run_child("plain", dir, NULL, &r2);
  expect(&r2, PMAP_SUCCESS, NULL, "cached", "the cache rewritten after corruption");
  write_file(path, "", 0);
  run_child("plain", dir, NULL, &r2);
  expect(&r2, PMAP_SUCCESS, NULL, "measured", "an empty cache");

  /* A line of this key naming a built provider outside the key's list (one above the cap,
   * under PMAP_CPU_ISA) is no hit: measured again, within the cap. */
  const char *capped[] = {"PMAP_CPU_ISA=sse41", NULL};
  write_file(path, "", 0);
  run_child("plain", dir, capped, &r2);
  file = read_file(path);
  char ckey[512];
  if (file) entry_key(file, ckey, sizeof ckey);
  if (file && built("cblas") && !strstr(ckey, "cblas")) { /* OpenBLAS's kernels are above sse41 */
    int clen = snprintf(planted, sizeof planted, "%s\tcblas\t\n", ckey);
    write_file(path, planted, (size_t)clen);
    run_child("plain", dir, capped, &r2);
    expect(&r2, PMAP_SUCCESS, NULL, "measured", "a cached provider outside its key's list");
    CHECK(strcmp(r2.provider, "cblas") != 0, "the cap's choice is cblas, above it");
  }
  free(file);

  /* Another machine's (or version's) line is no hit, and is kept. */
  const char *other = "Other CPU 9000\t9.9.9\tonednn,cblas\tcblas\tonednn=1/1 cblas=1/1\n";
  write_file(path, other, strlen(other));
  run_child("plain", dir, NULL, &r2);
  expect(&r2, PMAP_SUCCESS, NULL, "measured", "another machine's line");
  file = read_file(path);
  CHECK(file && strstr(file, other) && strstr(file, key), "the rewritten cache lost a line: %s",
        file);
  free(file);
  (void)n;
}

static void test_cache_unusable(void) {
  report r;
  /* XDG_CACHE_HOME is a file: no folder can be made, nothing can be written. */
  char file[128];
  snprintf(file, sizeof file, "%s/not-a-folder", tmp);
  write_file(file, "x", 1);
  for (int i = 0; i < 2; i++) {
    run_child("plain", file, NULL, &r);
    expect(&r, PMAP_SUCCESS, NULL, "measured", "a cache folder that cannot exist");
  }
  /* A folder without write permission (root may write anyway: then it is only cached). */
  char ro[128];
  snprintf(ro, sizeof ro, "%s/ro", tmp);
  CHECK(mkdir(ro, 0500) == 0, "mkdir %s", ro);
  run_child("plain", ro, NULL, &r);
  CHECK(r.status == PMAP_SUCCESS, "a read-only cache folder: status %d (%s)", r.status, r.error);
  chmod(ro, 0700);
  /* A FIFO without a writer in the cache file's place: no cache, not a wait for a writer. */
  char fifo_home[128], fifo_dir[160], fifo[192];
  snprintf(fifo_home, sizeof fifo_home, "%s/fifo", tmp);
  snprintf(fifo_dir, sizeof fifo_dir, "%s/pmap", fifo_home);
  snprintf(fifo, sizeof fifo, "%s/gemm", fifo_dir);
  CHECK(mkdir(fifo_home, 0700) == 0 && mkdir(fifo_dir, 0700) == 0 && mkfifo(fifo, 0600) == 0,
        "mkfifo %s", fifo);
  run_child("plain", fifo_home, NULL, &r);
  expect(&r, PMAP_SUCCESS, NULL, "measured", "a FIFO as the cache file");
}

static void test_concurrent(void) {
  /* Two processes at once on an empty cache: one measures, the other waits for its result. */
  char dir[128];
  snprintf(dir, sizeof dir, "%s/b", tmp);
  report *r = calloc(2, sizeof *r);
  pid_t pid[2];
  int fd[2][2];
  for (int i = 0; i < 2; i++) {
    if (pipe(fd[i])) exit(2);
    fflush(stdout);
    int failures = test_failures;
    pid[i] = fork();
    if (pid[i] == 0) {
      close(fd[i][0]);
      run_child("threads", dir, NULL, &r[i]);
      if (write(fd[i][1], &r[i], sizeof r[i]) != (ssize_t)sizeof r[i]) _exit(4);
      _exit(test_failures > failures ? 1 : 0);
    }
    close(fd[i][1]);
  }
  int measured = 0;
  for (int i = 0; i < 2; i++) {
    ssize_t got = read(fd[i][0], &r[i], sizeof r[i]);
    close(fd[i][0]);
    int ws = 0;
    waitpid(pid[i], &ws, 0);
    CHECK(got == (ssize_t)sizeof r[i] && WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
          "concurrent child %d failed", i);
    expect(&r[i], PMAP_SUCCESS, NULL, NULL, "concurrent processes");
    CHECK(strstr(r[i].out, "threads_same 1") != NULL, "threads saw different providers: %s",
          r[i].out);
    measured += strcmp(r[i].reason, "measured") == 0;
  }
  CHECK(measured == 1, "%d of 2 concurrent processes measured, want 1 (%s, %s)", measured,
        r[0].reason, r[1].reason);
  CHECK(strcmp(r[0].provider, r[1].provider) == 0, "concurrent processes chose %s and %s",
        r[0].provider, r[1].provider);
  free(r);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

/* The refusal of a cap above the CPU for every CPU level, whatever CPU runs the test (the check
 * above meets it only on a CPU below the top level): each level up to the CPU's passes, each one
 * above is PMAP_ERR_UNAVAILABLE with a message naming the value as PMAP_CPU_ISA gives it, the
 * CPU's level and exactly the caps up to it; "native" (past the last level) always passes. */
static void test_cap_check_every_level(void) {
  static const char *const levels[] = {"sse41", "avx2", "avx512", "avx512_bf16", "amx"};
  for (int cpu = 0; cpu < 5; cpu++)
    for (int pick = 0; pick <= 5; pick++) {
      char msg[512] = "", want[64], has[64];
      pmap_status st = cpu_isa_cap_check((cpu_isa)cpu, pick, msg, sizeof msg);
      if (pick == 5 || pick <= cpu) {
        CHECK(st == PMAP_SUCCESS && !msg[0], "cpu %s, cap %d: status %d, message %s", levels[cpu],
              pick, (int)st, msg);
        continue;
      }
      char caps[128] = "the caps below it: "; /* exactly those up to the CPU's level */
      for (int k = 0; k <= cpu; k++) {
        if (k) strcat(caps, ", ");
        strcat(caps, levels[k]);
      }
      strcat(caps, ")");
      snprintf(want, sizeof want, "PMAP_CPU_ISA=\"%s\"", levels[pick]);
      snprintf(has, sizeof has, "has up to %s;", levels[cpu]);
      int caps_ok = strstr(msg, caps) != NULL;
      CHECK(st == PMAP_ERR_UNAVAILABLE && strstr(msg, want) && strstr(msg, has) &&
                strstr(msg, "lacks") && caps_ok,
            "cpu %s, cap %s: status %d, message %s", levels[cpu], levels[pick], (int)st, msg);
    }
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "child") == 0) return child(argv[2]);
  snprintf(tmp, sizeof tmp, "/tmp/pmap-gemm-choice-XXXXXX");
  if (!mkdtemp(tmp)) return 2;
  printf("built providers: %s\n", pmap_gemm_providers());
  test_env_values();
  test_bf16_env();
  test_isa_env();
  test_cap_check_every_level();
  if (strchr(pmap_gemm_providers(), ',')) {
    test_cache();
    test_cache_unusable();
    test_concurrent();
  } else {
    report r;
    run_child("plain", tmp, NULL, &r);
    expect(&r, PMAP_SUCCESS, pmap_gemm_providers(), "only one built", "one provider");
  }
  nftw(tmp, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  return test_exit("gemm-choice");
}
