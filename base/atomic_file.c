/* atomic_file.c: writing a whole file so that a crash leaves either the old file or the new one:
 * a temporary file in the same folder, fsync'ed, renamed over the path, then the folder fsync'ed
 * (atomic_file.h); and the same checks made beforehand, writing nothing. Used by the
 * checkpoints, the traces and the GEMM cache. */
#include "atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"

static pmap_status write_all(int fd, const unsigned char *buf, size_t n) {
  while (n) {
    ssize_t w = write(fd, buf, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return PMAP_ERR_UNAVAILABLE;
    buf += w;
    n -= (size_t)w;
  }
  return PMAP_SUCCESS;
}

/* fsync of the folder holding path, so that the rename itself is durable. */
static int sync_folder(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = NULL;
  if (!slash)
    dir = strdup(".");
  else if (slash == path)
    dir = strdup("/");
  else
    dir = strndup(path, (size_t)(slash - path));
  if (!dir) return -1;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  close(fd);
  return rc;
}

#define LINKS_MAX 40 /* symbolic links followed at most, as the kernel's limit on one path */

/* The end of the chain of symbolic links at path, where that chain names nothing yet (*end,
 * malloc'ed): a link whose folder exists but whose file does not is a common setup (`ln -s
 * /big/disk/run.ckpt run.ckpt` before the first run), and the writer creates the file there.
 * A link names its target relative to the link's own folder. */
static pmap_status link_end(const char *path, const char *call, char **end) {
  char *cur = strdup(path);
  for (int i = 0; cur && i <= LINKS_MAX; i++) {
    struct stat st;
    if (lstat(cur, &st) != 0) {
      if (errno == ENOENT) {
        *end = cur;
        return PMAP_SUCCESS;
      }
      break;
    }
    if (!S_ISLNK(st.st_mode)) {
      errno = ENOENT; /* it came into being meanwhile: a race, reported as what was seen */
      break;
    }
    char text[4096];
    ssize_t len = readlink(cur, text, sizeof text);
    if (len < 0 || (size_t)len >= sizeof text) {
      if (len >= 0) errno = ENAMETOOLONG;
      break;
    }
    const char *slash = strrchr(cur, '/');
    size_t dir = text[0] == '/' || !slash ? 0 : (size_t)(slash - cur) + 1; /* with its '/' */
    char *next = malloc(dir + (size_t)len + 1);
    if (next) {
      memcpy(next, cur, dir);
      memcpy(next + dir, text, (size_t)len);
      next[dir + (size_t)len] = '\0';
    }
    free(cur);
    cur = next;
    if (i == LINKS_MAX) errno = ELOOP;
  }
  int e = cur ? errno : ENOMEM;
  free(cur);
  return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: \"%s\" is a symbolic link to nothing usable: %s", call,
                  path, strerror(e));
}

/* What is at path now: nothing (*target = NULL), a regular file we may write (*target its own
 * path, through symbolic links: the file is replaced, not the link; *mode its permissions), a
 * symbolic link to a file not there yet (*target the path its chain ends at, created there), or
 * a refusal: a device, a FIFO, a folder or a socket is never replaced by a regular file (a root
 * process would otherwise turn /dev/null into one), nor a file we may not write. */
static pmap_status existing_target(const char *path, const char *call, char **target,
                                   mode_t *mode) {
  struct stat st;
  *target = NULL;
  *mode = 0644;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return PMAP_SUCCESS;
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: cannot examine \"%s\": %s", call, path,
                    strerror(errno));
  }
  if (S_ISLNK(st.st_mode) && stat(path, &st) != 0) {
    if (errno == ENOENT) return link_end(path, call, target);
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: \"%s\" is a symbolic link to nothing usable: %s",
                    call, path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode))
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "%s: cannot write \"%s\": not a regular file (a device, FIFO, folder or "
                    "socket is never replaced)",
                    call, path);
  if (access(path, W_OK) != 0)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: \"%s\" is not writable: %s", call, path,
                    strerror(errno));
  *target = realpath(path, NULL);
  if (!*target)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: cannot resolve \"%s\": %s", call, path,
                    strerror(errno));
  *mode = st.st_mode & 07777;
  return PMAP_SUCCESS;
}

/* Creates the temporary file beside path (the file written, given as `asked`: its name in
 * messages): *tmp (malloc'ed) and *fd. */
static pmap_status make_temp(const char *path, const char *asked, const char *call, char **tmp,
                             int *fd) {
  size_t len = strlen(path);
  *tmp = malloc(len + sizeof ".tmp.XXXXXX");
  if (!*tmp) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "%s: out of memory", call);
  memcpy(*tmp, path, len);
  memcpy(*tmp + len, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
  *fd = mkostemp(*tmp, O_CLOEXEC);
  if (*fd >= 0) return PMAP_SUCCESS;
  int e = errno;
  free(*tmp);
  *tmp = NULL;
  if (strcmp(path, asked))
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "%s: cannot create a temporary file beside \"%s\" (the file the symbolic "
                    "link \"%s\" names): %s",
                    call, path, asked, strerror(e));
  return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: cannot create a temporary file beside \"%s\": %s",
                  call, path, strerror(e));
}

static pmap_status atomic_replace(const char *path, const char *asked, const unsigned char *buf,
                                  size_t n, mode_t mode, const char *call) {
  char *tmp;
  int fd;
  PMAP_TRY(make_temp(path, asked, call, &tmp, &fd));
  const char *what = "write";
  int ok = fchmod(fd, mode) == 0 || (what = "chmod", 0);
  ok = ok && (write_all(fd, buf, n) == PMAP_SUCCESS || (what = "write", 0));
  ok = ok && (fsync(fd) == 0 || (what = "fsync", 0));
  int e = errno;
  if (close(fd) != 0 && ok) ok = 0, what = "close", e = errno;
  if (ok && rename(tmp, path) != 0) ok = 0, what = "rename", e = errno;
  if (!ok) {
    unlink(tmp);
    pmap_status st = PMAP_ERR(PMAP_ERR_UNAVAILABLE, "%s: cannot %s \"%s\" (for \"%s\"): %s", call,
                              what, tmp, path, strerror(e));
    free(tmp);
    return st;
  }
  free(tmp);
  if (sync_folder(path) != 0)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "%s: \"%s\" was written but its folder could not be "
                    "synced: %s",
                    call, path, strerror(errno));
  return PMAP_SUCCESS;
}

pmap_status atomic_file_write(const char *path, const unsigned char *buf, size_t n,
                              const char *call) {
  char *resolved;
  mode_t mode;
  PMAP_TRY(existing_target(path, call, &resolved, &mode));
  pmap_status st = atomic_replace(resolved ? resolved : path, path, buf, n, mode, call);
  free(resolved);
  return st;
}

pmap_status atomic_file_check(const char *path, const char *call) {
  char *resolved, *tmp;
  mode_t mode;
  int fd;
  PMAP_TRY(existing_target(path, call, &resolved, &mode));
  pmap_status st = make_temp(resolved ? resolved : path, path, call, &tmp, &fd);
  if (!st) {
    close(fd);
    unlink(tmp);
    free(tmp);
  }
  free(resolved);
  return st;
}
