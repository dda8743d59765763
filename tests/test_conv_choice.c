/* test_conv_choice.c: the CPU convolutions' path chosen per shape and pass (ops/cpu/conv_choice.c),
 * once per process, so each case runs this program again as a child with its own environment
 * and cache folder: a net whose layers take different paths trains on 2 devices, its choices
 * are written to the cache and read back by the next process (choices planted there are
 * followed shape by shape), the parameters' bits repeat within a process and across processes;
 * PMAP_CONV forces a path and a bad value fails the context naming it; PMAP_GEMM_CACHE=0
 * neither reads nor writes the cache; a corrupt cache is survived; concurrent processes measure
 * each shape once; threads asking at once (devices) share one measurement. No timing is
 * asserted (bench/conv-choice.c times the paths). */
#include <ftw.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ops/cpu/conv.h"
#include "ops/cpu/cpu_ops.h"
#include "pmap.h"
#include "child_run.h"
#include "testutil.h"

#define OUT_CAP 16384
#define MAX_ENTRIES 32
#define THREADS 8

/* ------------------------------------------------------------------------------------------ */
/* The child                                                                                  */

/* FNV-1a of the parameters of a net of three convolutions after 3 SGD steps on 2 devices (8
 * rows each), 0 on failure; *same: both replicas hold the same bits. Layers: 5 -> 17 channels
 * (few input channels: oneDNN's backward on its reference implementation where its kernels
 * want blocked inputs), 17 -> 12 stride 2, 12 -> 17 stride 2, then dense 3, MSE. */
static uint64_t train_hash(int *same) {
  const int64_t in[3] = {5, 20, 22}, rows = 16;
  pmap_model *m = NULL;
  pmap_ctx *ctx = NULL;
  pmap_params *p = NULL;
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_optimizer opt = pmap_sgd(0.01f, 0.9f);
  size_t nx = (size_t)(rows * in[0] * in[1] * in[2]);
  float *x = malloc(nx * sizeof *x), *y = malloc((size_t)rows * 3 * sizeof *y);
  uint64_t rng = 5, h = 1469598103934665603ull;
  for (size_t i = 0; x && i < nx; i++) x[i] = test_rand_uniform(&rng, -1.0f, 1.0f);
  for (int64_t i = 0; y && i < rows * 3; i++) y[i] = test_rand_uniform(&rng, -1.0f, 1.0f);
  const int64_t xs_shape[4] = {rows, in[0], in[1], in[2]}, ys_shape[2] = {rows, 3};
  pmap_array xs = pmap_array_f32(x, 4, xs_shape), ys = pmap_array_f32(y, 2, ys_shape);
  if (!x || !y || pmap_model_create(3, in, &m) || pmap_model_add_conv2d(m, 17, 3, 3, 1, 1) ||
      pmap_model_add_relu(m) || pmap_model_add_conv2d(m, 12, 3, 3, 2, 1) ||
      pmap_model_add_relu(m) || pmap_model_add_conv2d(m, 17, 3, 3, 2, 1) ||
      pmap_model_add_relu(m) || pmap_model_add_flatten(m) || pmap_model_add_dense(m, 3) ||
      pmap_ctx_create(&cfg, &ctx) || pmap_params_create(ctx, m, &opt, 3, &p))
    h = 0;
  for (int step = 0; h && step < 3; step++)
    if (pmap_update(p, &xs, &ys, NULL)) h = 0;
  size_t n = p ? pmap_params_count(p) : 0;
  float *w[2] = {calloc(n + 1, sizeof(float)), calloc(n + 1, sizeof(float))};
  for (int d = 0; h && d < 2; d++)
    if (!w[d] || pmap_params_read(p, d, w[d], n)) h = 0;
  *same = h && memcmp(w[0], w[1], n * sizeof(float)) == 0;
  const unsigned char *c = (const unsigned char *)w[0];
  for (size_t i = 0; h && i < n * sizeof(float); i++) h = (h ^ c[i]) * 1099511628211ull;
  if (!h) printf("error %s\n", pmap_last_error());
  free(w[0]), free(w[1]), free(x), free(y);
  pmap_params_destroy(p);
  pmap_ctx_destroy(ctx);
  pmap_model_destroy(m);
  return h;
}

/* The choices of this process, one "entry" line each, and the public counts. */
static void print_choices(void) {
  static char report[OUT_CAP / 2];
  conv_choice_report(report, sizeof report);
  for (char *save = NULL, *l = strtok_r(report, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
    printf("entry %s\n", l);
  printf("counts %d %d %d %d\n", pmap_conv_choices("forward", "onednn"),
         pmap_conv_choices("forward", "im2col"), pmap_conv_choices("backward", "onednn"),
         pmap_conv_choices("backward", "im2col"));
}

static pmap_conv_shape thread_shape = {16, 12, 12, 16, 12, 12, 3, 3, 1, 1};
static pthread_barrier_t start;

/* A device's first call of a shape: the forward of thread_shape on this thread's cache. */
static void *first_call(void *arg) {
  const pmap_conv_shape *s = &thread_shape;
  size_t nx = (size_t)(4 * s->c * s->h * s->w), ny = (size_t)(4 * s->oc * s->oh * s->ow);
  size_t ncol = (size_t)(s->c * s->kh * s->kw * s->oh * s->ow);
  float *x = calloc(nx, sizeof *x), *y = calloc(ny, sizeof *y), *col = calloc(ncol, sizeof *col);
  float *w = calloc((size_t)(s->oc * s->c * 9), sizeof *w);
  pthread_barrier_wait(&start);
  *(pmap_status *)arg = pmap_cpu_ops.conv2d_forward(NULL, s, 4, x, w, NULL, 1, y, col);
  free(x), free(y), free(col), free(w);
  return NULL;
}

static int child(const char *mode) {
  alarm(300); /* a child that hangs fails instead of holding the test */
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(mode, "plain")) {
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 1};
    pmap_ctx *ctx = NULL;
    pmap_status st = pmap_ctx_create(&cfg, &ctx);
    printf("status %d\nerror %s\n", (int)st, st ? pmap_last_error() : "");
    pmap_ctx_destroy(ctx);
    return 0;
  }
  if (!strcmp(mode, "threads")) {
    pthread_t t[THREADS];
    pmap_status st[THREADS];
    pthread_barrier_init(&start, NULL, THREADS);
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, first_call, &st[i]);
    int ok = 1;
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL), ok &= st[i] == PMAP_SUCCESS;
    printf("status %d\nmeasurements %d\n", ok ? 0 : 1, conv_choice_measurements());
    print_choices();
    return 0;
  }
  int same = 0;
  uint64_t h = train_hash(&same);
  printf("status %d\nhash %016llx\nreplicas %d\n", h ? 0 : 1, (unsigned long long)h, same);
  if (!strcmp(mode, "train2")) {
    uint64_t h2 = train_hash(&same);
    printf("hash2 %016llx\n", (unsigned long long)h2);
  }
  print_choices();
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* The parent                                                                                 */

typedef struct entry {
  char shape[160], path[16], reason[64], ran[16];
} entry;

typedef struct report {
  char out[OUT_CAP];
  int status, replicas, counts[4], n;
  unsigned long long hash, hash2;
  int measurements;
  entry e[MAX_ENTRIES];
  const char *error; /* into out */
} report;

static char tmp[64];

static void parse_entries(report *r) {
  for (const char *l = strstr(r->out, "entry "); l && r->n < MAX_ENTRIES;
       l = strstr(l + 1, "\nentry ")) {
    entry *e = &r->e[r->n++];
    l += *l == '\n' ? 7 : 6;
    if (sscanf(l, "%159[^\t]\t%15[^\t]\t%63[^\t]\t%15[^\n]", e->shape, e->path, e->reason,
               e->ran) != 4)
      r->n--;
    l--;
  }
}

/* Runs this program as a child in `mode` with XDG_CACHE_HOME `cache` and the settings of env
 * ("NAME=VALUE", NULL-terminated), PMAP_CONV and PMAP_GEMM_CACHE unset otherwise. */
static void run_child(const char *mode, const char *cache, const char *const *env, report *r) {
  memset(r, 0, sizeof *r);
  r->status = -1;
  static const char *const unset[] = {"PMAP_CONV", "PMAP_GEMM_CACHE", NULL};
  child_run("test_conv_choice", mode, cache, unset, env, r->out, sizeof r->out);
  const char *s;
  if ((s = strstr(r->out, "status "))) sscanf(s, "status %d", &r->status);
  if ((s = strstr(r->out, "hash "))) sscanf(s, "hash %llx", &r->hash);
  if ((s = strstr(r->out, "hash2 "))) sscanf(s, "hash2 %llx", &r->hash2);
  if ((s = strstr(r->out, "replicas "))) sscanf(s, "replicas %d", &r->replicas);
  if ((s = strstr(r->out, "measurements "))) sscanf(s, "measurements %d", &r->measurements);
  if ((s = strstr(r->out, "counts ")))
    sscanf(s, "counts %d %d %d %d", &r->counts[0], &r->counts[1], &r->counts[2], &r->counts[3]);
  r->error = strstr(r->out, "error ");
  if (!r->error) r->error = "";
  parse_entries(r);
}

static const entry *entry_of(const report *r, const char *shape) {
  for (int i = 0; i < r->n; i++)
    if (!strcmp(r->e[i].shape, shape)) return &r->e[i];
  return NULL;
}

static int measured(const report *r) {
  int n = 0;
  for (int i = 0; i < r->n; i++) n += !strcmp(r->e[i].reason, "measured");
  return n;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 20);
  if (buf) buf[fread(buf, 1, (1 << 20) - 1, f)] = '\0';
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

static int onednn_built(void) { return strstr(cpu_conv_paths(), "onednn") != NULL; }

/* A training child's report: it trained, its replicas agree, every pass of every layer has a
 * choice, and the counts add up to the entries. */
static void expect_trained(const report *r, const char *what) {
  CHECK(r->status == 0 && r->hash && r->replicas == 1,
        "%s: status %d, hash %016llx, replicas %d: %s", what, r->status, r->hash, r->replicas,
        r->error);
  int fwd = 0;
  for (int i = 0; i < r->n; i++) fwd += !strncmp(r->e[i].shape, "forward ", 8);
  CHECK(r->n >= 6 && fwd >= 3 && r->n - fwd >= 3, "%s: %d entries (%d forward)", what, r->n, fwd);
  CHECK(r->counts[0] + r->counts[1] == fwd && r->counts[2] + r->counts[3] == r->n - fwd,
        "%s: counts %d %d %d %d for %d forward and %d backward shapes", what, r->counts[0],
        r->counts[1], r->counts[2], r->counts[3], fwd, r->n - fwd);
}

/* Fresh cache: measured, written; the next process reads it back (same paths, same bits); two
 * runs in one process repeat the bits. Returns the first report's measured count. */
static int test_cache(report *first) {
  char dir[128], path[160];
  snprintf(dir, sizeof dir, "%s/a", tmp);
  snprintf(path, sizeof path, "%s/pmap/conv", dir);
  run_child("train", dir, NULL, first);
  expect_trained(first, "first process");
  for (int i = 0; i < first->n; i++) {
    const entry *e = &first->e[i];
    printf("  %-55s %s (%s)\n", e->shape, e->path, e->reason);
    CHECK(!strcmp(e->path, e->ran), "%s: chose %s, ran %s", e->shape, e->path, e->ran);
    CHECK(onednn_built() || !strcmp(e->reason, "only im2col built"), "%s: %s", e->shape, e->reason);
  }
  int m = measured(first);
  char *file = read_file(path);
  CHECK(!m || file, "%d shapes measured, no cache file at %s", m, path);
  for (int i = 0; file && i < first->n; i++) {
    char line[256];
    snprintf(line, sizeof line, "\t%s\t%s\t", first->e[i].shape, first->e[i].path);
    if (!strcmp(first->e[i].reason, "measured"))
      CHECK(strstr(file, line), "the cache lacks %s: %s", line + 1, file);
  }
  report r;
  run_child("train", dir, NULL, &r);
  expect_trained(&r, "second process");
  CHECK(r.hash == first->hash, "the second process's bits: %016llx, the first's %016llx", r.hash,
        first->hash);
  for (int i = 0; i < first->n; i++) {
    const entry *a = &first->e[i], *b = entry_of(&r, a->shape);
    CHECK(b && !strcmp(b->path, a->path), "%s: %s, then %s", a->shape, a->path, b ? b->path : "-");
    if (b && !strcmp(a->reason, "measured"))
      CHECK(!strcmp(b->reason, "cached"), "%s again: %s", a->shape, b->reason);
  }
  run_child("train2", dir, NULL, &r);
  CHECK(r.hash == first->hash && r.hash2 == first->hash,
        "two runs in one process: %016llx, %016llx, first process %016llx", r.hash, r.hash2,
        first->hash);
  char *after = read_file(path);
  CHECK((!file && !after) || (file && after && !strcmp(file, after)),
        "processes that found every choice cached changed the file");
  free(file), free(after);
  return m;
}

/* The measured lines of the cache with their choices swapped: the next process follows them,
 * shape by shape. */
static void test_planted(const report *first) {
  char path[160];
  snprintf(path, sizeof path, "%s/a/pmap/conv", tmp);
  char *file = read_file(path);
  if (!file) return;
  for (char *p = file; *p; p++) {
    if (!strncmp(p, "\tonednn\t", 8))
      memcpy(p + 1, "im2col", 6), p += 7;
    else if (!strncmp(p, "\tim2col\t", 8))
      memcpy(p + 1, "onednn", 6), p += 7;
  }
  write_file(path, file, strlen(file));
  free(file);
  report r;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/a", tmp);
  run_child("train", dir, NULL, &r);
  expect_trained(&r, "a planted cache");
  int followed = 0;
  for (int i = 0; i < first->n; i++) {
    const entry *a = &first->e[i], *b = entry_of(&r, a->shape);
    if (strcmp(a->reason, "measured")) continue;
    const char *want = !strcmp(a->path, "onednn") ? "im2col" : "onednn";
    CHECK(b && !strcmp(b->path, want) && !strcmp(b->reason, "cached"),
          "%s planted %s: took %s (%s)", a->shape, want, b ? b->path : "-", b ? b->reason : "-");
    followed++;
  }
  printf("planted choices followed: %d\n", followed);
}

/* PMAP_CONV forces every shape's path; a bad value fails the context naming it. Forced runs
 * neither measure nor write the cache. */
static void test_forced(const report *first) {
  char dir[128], path[160];
  snprintf(dir, sizeof dir, "%s/a", tmp);
  snprintf(path, sizeof path, "%s/pmap/conv", dir);
  char *before = read_file(path);
  report r;
  const char *im2col[] = {"PMAP_CONV=im2col", NULL};
  run_child("train", dir, im2col, &r);
  expect_trained(&r, "PMAP_CONV=im2col");
  CHECK(r.counts[0] == 0 && r.counts[2] == 0 && r.n == first->n,
        "PMAP_CONV=im2col: %d forward and %d backward shapes on oneDNN, %d entries", r.counts[0],
        r.counts[2], r.n);
  for (int i = 0; i < r.n; i++)
    CHECK(!strcmp(r.e[i].path, "-") && !strcmp(r.e[i].ran, "im2col"), "forced im2col: %s %s ran %s",
          r.e[i].shape, r.e[i].path, r.e[i].ran);
  if (onednn_built()) {
    const char *onednn[] = {"PMAP_CONV=onednn", NULL};
    run_child("train", dir, onednn, &r);
    expect_trained(&r, "PMAP_CONV=onednn");
    int served = 0; /* the shapes oneDNN serves ran there */
    for (int i = 0; i < first->n; i++) {
      const entry *a = &first->e[i], *b = entry_of(&r, a->shape);
      int serves = strcmp(a->reason, "oneDNN does not serve the shape") != 0;
      CHECK(b && !strcmp(b->ran, serves ? "onednn" : "im2col"), "forced onednn: %s ran %s",
            a->shape, b ? b->ran : "-");
      served += serves;
    }
    CHECK(r.counts[0] + r.counts[2] == served, "PMAP_CONV=onednn: %d + %d on oneDNN, want %d",
          r.counts[0], r.counts[2], served);
  }
  char *after = read_file(path);
  CHECK((!before && !after) || (before && after && !strcmp(before, after)),
        "a forced path changed the cache");
  free(before), free(after);
  const char *bogus[] = {"PMAP_CONV=bogus", NULL};
  run_child("plain", dir, bogus, &r);
  CHECK(r.status == PMAP_ERR_INVALID_ARGUMENT && !strncmp(r.error, "error pmap_ctx_create: ", 23) &&
            strstr(r.error, "PMAP_CONV=\"bogus\"") && strstr(r.error, cpu_conv_paths()),
        "PMAP_CONV=bogus: status %d, %s", r.status, r.error);
  if (!onednn_built()) {
    const char *missing[] = {"PMAP_CONV=onednn", NULL};
    run_child("plain", dir, missing, &r);
    CHECK(r.status == PMAP_ERR_UNAVAILABLE && !strncmp(r.error, "error pmap_ctx_create: ", 23),
          "PMAP_CONV=onednn without oneDNN: status %d, %s", r.status, r.error);
  }
}

/* PMAP_GEMM_CACHE=0: measured, nothing written; a corrupt cache is survived and rewritten. */
static void test_no_cache_and_corrupt(int want_measured) {
  char dir[128], path[160];
  snprintf(dir, sizeof dir, "%s/n", tmp);
  snprintf(path, sizeof path, "%s/pmap/conv", dir);
  const char *off[] = {"PMAP_GEMM_CACHE=0", NULL};
  report r;
  run_child("train", dir, off, &r);
  expect_trained(&r, "PMAP_GEMM_CACHE=0");
  CHECK(measured(&r) == want_measured, "PMAP_GEMM_CACHE=0: %d measured, want %d", measured(&r),
        want_measured);
  struct stat sb;
  CHECK(stat(path, &sb) != 0, "PMAP_GEMM_CACHE=0 wrote %s", path);

  snprintf(dir, sizeof dir, "%s/a", tmp);
  snprintf(path, sizeof path, "%s/pmap", dir);
  mkdir(dir, 0700); /* a build without oneDNN measures nothing: no file, maybe no folder yet */
  mkdir(path, 0700);
  snprintf(path, sizeof path, "%s/pmap/conv", dir);
  char *file = read_file(path), junk[8192];
  size_t j = 0;
  for (int i = 0; i < 300; i++) junk[j++] = (char)(i * 37 + 11);
  junk[j++] = '\n';
  memset(junk + j, 'x', 5000);
  j += 5000;
  junk[j++] = '\n';
  /* this machine's lines with a choice that is no path, cut short, and the wrong shape */
  for (const char *l = file; l && *l && j < sizeof junk - 600; l = strchr(l, '\n'), l += !!l) {
    const char *c = strstr(l, "\tonednn\t") ? strstr(l, "\tonednn\t") : strstr(l, "\tim2col\t");
    const char *nl = strchr(l, '\n');
    if (!c || (nl && c > nl)) continue;
    j += (size_t)snprintf(junk + j, sizeof junk - j, "%.*s\tbogus\t\n%.*s\n\t\t\t\t\t\t\n",
                          (int)(c - l), l, (int)(c - l), l);
  }
  free(file);
  write_file(path, junk, j);
  run_child("train", dir, NULL, &r);
  expect_trained(&r, "a corrupt cache");
  CHECK(measured(&r) == want_measured, "a corrupt cache: %d measured, want %d", measured(&r),
        want_measured);
  run_child("train", dir, NULL, &r);
  CHECK(measured(&r) == 0, "after a corrupt cache: %d measured again", measured(&r));
}

/* Two processes at once on an empty cache: each shape measured once between them, the same
 * paths and bits. */
static void test_concurrent(const report *first, int want_measured) {
  char dir[128];
  snprintf(dir, sizeof dir, "%s/c", tmp);
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
      run_child("train", dir, NULL, &r[i]);
      if (write(fd[i][1], &r[i], sizeof r[i]) != (ssize_t)sizeof r[i]) _exit(4);
      _exit(test_failures > failures ? 1 : 0);
    }
    close(fd[i][1]);
  }
  for (int i = 0; i < 2; i++) {
    ssize_t got = read(fd[i][0], &r[i], sizeof r[i]);
    close(fd[i][0]);
    int ws = 0;
    waitpid(pid[i], &ws, 0);
    CHECK(got == (ssize_t)sizeof r[i] && WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
          "concurrent child %d failed", i);
    r[i].error = "";
    expect_trained(&r[i], "concurrent processes");
  }
  CHECK(measured(&r[0]) + measured(&r[1]) == want_measured,
        "concurrent processes measured %d and %d shapes, want %d in all", measured(&r[0]),
        measured(&r[1]), want_measured);
  for (int i = 0; i < r[0].n; i++) {
    const entry *b = entry_of(&r[1], r[0].e[i].shape);
    CHECK(b && !strcmp(b->path, r[0].e[i].path), "concurrent processes: %s took %s and %s",
          r[0].e[i].shape, r[0].e[i].path, b ? b->path : "-");
  }
  CHECK(r[0].hash == r[1].hash, "concurrent processes' bits: %016llx, %016llx", r[0].hash,
        r[1].hash);
  (void)first;
  free(r);
}

/* Devices asking for a new shape's path at once: one measurement, one choice. */
static void test_threads(void) {
  const char *off[] = {"PMAP_GEMM_CACHE=0", NULL};
  report r;
  run_child("threads", tmp, off, &r);
  CHECK(r.status == 0 && r.n == 1, "threads: status %d, %d entries: %s", r.status, r.n, r.out);
  int want = r.n == 1 && !strcmp(r.e[0].reason, "measured");
  CHECK(r.measurements == want, "%d threads' first calls made %d measurements, want %d", THREADS,
        r.measurements, want);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "child") == 0) return child(argv[2]);
  setvbuf(stdout, NULL, _IOLBF, 0);
  snprintf(tmp, sizeof tmp, "/tmp/pmap-conv-choice-XXXXXX");
  if (!mkdtemp(tmp)) return 2;
  printf("CPU convolutions built: %s\n", cpu_conv_paths());
  report *first = calloc(1, sizeof *first);
  int m = test_cache(first);
  if (m) test_planted(first);
  test_forced(first);
  test_no_cache_and_corrupt(m);
  test_concurrent(first, m);
  test_threads();
  free(first);
  nftw(tmp, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  return test_exit("conv-choice");
}
