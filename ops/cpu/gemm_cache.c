/* gemm_cache.c: the file that remembers the measured CPU GEMM choice per machine
 * ($XDG_CACHE_HOME/pmap/gemm, else ~/.cache/pmap/gemm), so that only the first process on a
 * machine measures. One line per key, tab-separated: CPU model, library version, built
 * providers, choice, the measured times (for a person). Written atomically under a lock
 * (gemm.lock beside it) that a measuring process holds, so concurrent first processes wait for
 * one measurement instead of each making their own. Nothing here can fail a caller (gemm.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gemm.h"
#include "base/atomic_file.h"
#include "base/error.h"

#define LINE_CAP 512  /* longer lines are not ours: skipped */
#define KEEP_LINES 32 /* entries of other machines and builds kept on rewrite */
#define LOCK_WAIT_MS 10000
#define CHOICE_CAP 32

struct gemm_cache {
  char path[PATH_MAX];
  int lock_fd;                     /* -1: no lock (the folder allows none) */
  char key[LINE_CAP];              /* CPU model \t version \t providers */
  char keep[KEEP_LINES][LINE_CAP]; /* other keys' lines, without the newline */
  int nkeep;
  char choice[CHOICE_CAP]; /* this key's cached choice; "" when none */
};

/* mkdir that accepts an existing folder. */
static int make_dir(const char *path) { return mkdir(path, 0700) == 0 || errno == EEXIST ? 0 : -1; }

int gemm_cache_dir(char *out, size_t cap) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  const char *home = getenv("HOME");
  int n;
  if (xdg && xdg[0] == '/') {
    if (make_dir(xdg)) return -1;
    n = snprintf(out, cap, "%s/pmap", xdg);
  } else if (home && home[0] == '/') {
    n = snprintf(out, cap, "%s/.cache", home);
    if (n < 0 || (size_t)n >= cap || make_dir(out)) return -1;
    n = snprintf(out, cap, "%s/.cache/pmap", home);
  } else {
    return -1;
  }
  if (n < 0 || (size_t)n >= cap) return -1;
  return make_dir(out);
}

void gemm_cache_cpu_model(char *out, size_t cap) {
  snprintf(out, cap, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "re");
  if (!f) return;
  char line[LINE_CAP];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) != 0) continue;
    const char *v = strchr(line, ':');
    if (!v) continue;
    v++;
    while (*v == ' ' || *v == '\t') v++;
    size_t len = strcspn(v, "\n");
    while (len && v[len - 1] == ' ') len--;
    if (!len) continue;
    if (len >= cap) len = cap - 1;
    for (size_t i = 0; i < len; i++) out[i] = v[i] >= 0x20 && v[i] < 0x7f ? v[i] : ' ';
    out[len] = '\0';
    break;
  }
  fclose(f);
}

int gemm_cache_lock(const char *dir, const char *name) {
  char lock[PATH_MAX];
  if (snprintf(lock, sizeof lock, "%s/%s", dir, name) >= (int)sizeof lock) return -1;
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  /* Another process holds it while it measures (well under a second): wait for its result. A
   * lock that stays taken longer is not waited for; the cache is then read and written without. */
  const struct timespec pause = {0, 5 * 1000 * 1000};
  for (int waited = 0; waited < LOCK_WAIT_MS; waited += 5) {
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    if (errno != EWOULDBLOCK && errno != EINTR) break;
    nanosleep(&pause, NULL);
  }
  close(fd);
  return -1;
}

/* Reads the file: this key's choice into c->choice, other well-formed lines into c->keep. */
static void read_entries(gemm_cache *c) {
  /* Only a regular file, opened without blocking: a FIFO in its place is no cache. */
  int fd = open(c->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  if (fd < 0) return;
  FILE *f = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? fdopen(fd, "r") : NULL;
  if (!f) {
    close(fd);
    return;
  }
  char line[LINE_CAP];
  size_t klen = strlen(c->key);
  while (fgets(line, sizeof line, f)) {
    size_t len = strlen(line);
    if (len && line[len - 1] != '\n' && !feof(f)) {
      /* Too long to be ours: skip the rest of it. */
      int ch;
      while ((ch = fgetc(f)) != EOF && ch != '\n') {
      }
      continue;
    }
    line[strcspn(line, "\n")] = '\0';
    /* Ours have four or five tab-separated fields: key (three), choice, times. */
    int tabs = 0;
    for (const char *p = line; *p; p++) tabs += *p == '\t';
    if (line[0] == '#' || tabs < 3 || tabs > 4) continue;
    if (strncmp(line, c->key, klen) == 0 && line[klen] == '\t') {
      const char *choice = line + klen + 1;
      size_t n = strcspn(choice, "\t");
      if (n > 0 && n < CHOICE_CAP) {
        memcpy(c->choice, choice, n);
        c->choice[n] = '\0';
      }
    } else if (c->nkeep < KEEP_LINES) {
      memcpy(c->keep[c->nkeep++], line, strlen(line) + 1);
    }
  }
  fclose(f);
}

gemm_cache *gemm_cache_open(const char *providers) {
  gemm_cache *c = calloc(1, sizeof *c);
  char dir[PATH_MAX];
  if (!c || gemm_cache_dir(dir, sizeof dir) ||
      snprintf(c->path, sizeof c->path, "%s/gemm", dir) >= (int)sizeof c->path) {
    free(c);
    return NULL;
  }
  char cpu[256];
  gemm_cache_cpu_model(cpu, sizeof cpu);
  snprintf(c->key, sizeof c->key, "%s\t%s\t%s", cpu, pmap_version(), providers);
  c->lock_fd = gemm_cache_lock(dir, "gemm.lock");
  read_entries(c);
  return c;
}

const char *gemm_cache_lookup(gemm_cache *c) { return c && c->choice[0] ? c->choice : NULL; }

void gemm_cache_store(gemm_cache *c, const char *choice, const char *times) {
  if (!c) return;
  size_t cap = (size_t)(c->nkeep + 2) * LINE_CAP + 256;
  char *buf = malloc(cap);
  if (!buf) return;
  size_t len = (size_t)snprintf(buf, cap,
                                "# pmap: the CPU GEMM measured fastest per CPU model, library "
                                "version and built providers (delete the file to measure again)\n");
  for (int i = 0; i < c->nkeep; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s\n", c->keep[i]);
  len += (size_t)snprintf(buf + len, cap - len, "%s\t%s\t%s\n", c->key, choice, times);
  /* A cache that cannot be written is no failure of the caller: keep its message as it was. */
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", pmap_error_message());
  if (len < cap) atomic_file_write(c->path, (const unsigned char *)buf, len, "gemm cache");
  pmap_error_copy(saved);
  free(buf);
}

void gemm_cache_close(gemm_cache *c) {
  if (!c) return;
  if (c->lock_fd >= 0) close(c->lock_fd); /* closing releases the lock */
  free(c);
}
