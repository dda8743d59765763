/* conv_cache.c: the file that remembers the measured path of each convolution shape per machine
 * ($XDG_CACHE_HOME/pmap/conv, else ~/.cache/pmap/conv), so that every process on a machine runs
 * a shape on the same path (the same bits) and only the first measures it. One line per shape,
 * tab-separated: CPU model, library version, context (cap, GEMM, oneDNN's version), shape,
 * choice, the measured times (for a person). Lines are appended under a lock (conv.lock beside
 * it) that a measuring process holds, so concurrent first processes measure a shape once. Nothing
 * here can fail a caller (conv.h). */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/atomic_file.h"
#include "base/error.h"
#include "conv.h"
#include "gemm.h"

#define LINE_CAP 512 /* longer lines are not ours: skipped */
/* Past this size the file keeps this machine's and version's lines alone when it is next
 * written, or starts afresh when those alone take more (about 5000 shapes). */
#define FILE_CAP ((size_t)1 << 20)

struct conv_cache {
  char path[PATH_MAX];
  int lock_fd;                  /* -1: no lock (the folder allows none) */
  char prefix[LINE_CAP];        /* CPU model \t version \t context \t: this machine's lines */
  char choice[CONV_CHOICE_CAP]; /* the shape's cached choice; "" when none */
};

/* The file's text (a regular file only, opened without blocking: a FIFO in its place is no
 * cache), NUL-terminated; NULL when there is none or it is past twice FILE_CAP. */
static char *read_all(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  if (fd < 0) return NULL;
  char *buf = NULL;
  if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size <= 2 * FILE_CAP)
    buf = malloc((size_t)sb.st_size + 1);
  size_t n = 0;
  ssize_t got = 0;
  while (buf && n < (size_t)sb.st_size && (got = read(fd, buf + n, (size_t)sb.st_size - n)) > 0)
    n += (size_t)got;
  close(fd);
  if (buf) buf[n] = '\0';
  *len = n;
  return buf;
}

/* Whether line (without its newline) is one of ours: five tabs, not a comment, no NUL. */
static int well_formed(const char *line, size_t len) {
  if (len == 0 || len >= LINE_CAP || line[0] == '#') return 0;
  int tabs = 0;
  for (size_t i = 0; i < len; i++) {
    if (line[i] == '\0') return 0;
    tabs += line[i] == '\t';
  }
  return tabs == 5;
}

/* The last well-formed line of prefix + shape into c->choice (a later line wins: a choice
 * appended after a corrupt one). */
static void find_choice(conv_cache *c, const char *text, size_t len, const char *shape) {
  size_t plen = strlen(c->prefix), slen = strlen(shape);
  for (size_t at = 0; at < len;) {
    const char *line = text + at, *nl = memchr(line, '\n', len - at);
    size_t n = nl ? (size_t)(nl - line) : len - at;
    at += n + 1;
    if (!well_formed(line, n) || n < plen + slen + 1 || memcmp(line, c->prefix, plen) ||
        memcmp(line + plen, shape, slen) || line[plen + slen] != '\t')
      continue;
    const char *choice = line + plen + slen + 1;
    size_t k = strcspn(choice, "\t");
    if (k == 6 && (!memcmp(choice, "onednn", 6) || !memcmp(choice, "im2col", 6))) {
      memcpy(c->choice, choice, k);
      c->choice[k] = '\0';
    }
  }
}

conv_cache *conv_cache_open(const char *context, const char *shape) {
  conv_cache *c = calloc(1, sizeof *c);
  char dir[PATH_MAX], cpu[256];
  if (!c || gemm_cache_dir(dir, sizeof dir) ||
      snprintf(c->path, sizeof c->path, "%s/conv", dir) >= (int)sizeof c->path) {
    free(c);
    return NULL;
  }
  gemm_cache_cpu_model(cpu, sizeof cpu);
  snprintf(c->prefix, sizeof c->prefix, "%s\t%s\t%s\t", cpu, pmap_version(), context);
  c->lock_fd = gemm_cache_lock(dir, "conv.lock");
  size_t len = 0;
  char *text = read_all(c->path, &len);
  if (text) find_choice(c, text, len, shape);
  free(text);
  return c;
}

const char *conv_cache_lookup(const conv_cache *c) { return c && c->choice[0] ? c->choice : NULL; }

/* The file rewritten with this machine's and version's lines alone (none when they alone pass
 * FILE_CAP), then `line`. */
static void rewrite(const conv_cache *c, const char *text, size_t len, const char *line) {
  char *buf = malloc(FILE_CAP + LINE_CAP);
  if (!buf) return;
  size_t n = 0, plen = strlen(c->prefix);
  const char *head =
      "# pmap: the CPU convolutions' path measured fastest per shape (delete the "
      "file to measure again)\n";
  n += (size_t)snprintf(buf, FILE_CAP, "%s", head);
  for (size_t at = 0; text && at < len;) {
    const char *l = text + at, *nl = memchr(l, '\n', len - at);
    size_t k = nl ? (size_t)(nl - l) : len - at;
    at += k + 1;
    if (!well_formed(l, k) || k < plen || memcmp(l, c->prefix, plen)) continue;
    if (n + k + 1 > FILE_CAP) {
      n = strlen(head); /* this machine's lines alone are too many: start afresh */
      break;
    }
    memcpy(buf + n, l, k);
    buf[n + k] = '\n';
    n += k + 1;
  }
  n += (size_t)snprintf(buf + n, LINE_CAP, "%s", line);
  atomic_file_write(c->path, (const unsigned char *)buf, n, "conv cache");
  free(buf);
}

/* Appends line to the file (a regular file, created if need be), after a newline where a torn
 * write left the last line without one. */
static void append(const conv_cache *c, const char *line) {
  int fd = open(c->path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);
  struct stat sb;
  if (fd < 0) return;
  if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode)) {
    char last = '\n';
    if (sb.st_size > 0 && pread(fd, &last, 1, sb.st_size - 1) != 1) last = '\n';
    if (last != '\n' && write(fd, "\n", 1) != 1) last = '\n';
    size_t len = strlen(line);
    if (write(fd, line, len) != (ssize_t)len) {
      /* a lost or torn line reads as a miss: the shape is measured again */
    }
  }
  close(fd);
}

void conv_cache_store(conv_cache *c, const char *shape, const char *choice, const char *times) {
  if (!c) return;
  char line[LINE_CAP];
  int n = snprintf(line, sizeof line, "%s%s\t%s\t%s\n", c->prefix, shape, choice, times);
  if (n < 0 || n >= (int)sizeof line) return;
  /* A cache that cannot be written is no failure of the caller: keep its message as it was. */
  char saved[1024];
  pmap_error_save(saved, sizeof saved);
  struct stat sb;
  if (stat(c->path, &sb) == 0 && S_ISREG(sb.st_mode) && (size_t)sb.st_size > FILE_CAP) {
    size_t len = 0;
    char *text = read_all(c->path, &len);
    rewrite(c, text, len, line);
    free(text);
  } else {
    append(c, line);
  }
  pmap_error_copy(saved);
}

void conv_cache_close(conv_cache *c) {
  if (!c) return;
  if (c->lock_fd >= 0) close(c->lock_fd); /* closing releases the lock */
  free(c);
}
