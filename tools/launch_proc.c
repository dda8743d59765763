/* launch_proc.c: the processes of pmap-launch (launch_proc.h): a command in a session of its
 * own, its output pumped through pipes, and what it leaves behind found in /proc (its session,
 * and the orphans this subreaper inherits) and ended before the next run can start. */
#include "launch_proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"

extern char **environ;

void proc_init(void) {
  /* Ranks whose mpirun died come to this process instead of init: they stay findable (their
   * parent is this process) even when they left mpirun's session. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  signal(SIGPIPE, SIG_IGN);
}

static void child(char *const argv[], char *const envp[], pid_t parent, int out, int err) {
  setsid();
  /* The launcher killed (even by SIGKILL) takes mpirun, and so its ranks, with it. */
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(128 + SIGTERM);
  int null = open("/dev/null", O_RDONLY);
  if (null < 0 || dup2(null, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(127);
  /* An ignored signal stays ignored across exec: give the command the defaults. */
  int sigs[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  environ = (char **)envp;
  execvp(argv[0], argv);
  dprintf(2, "pmap-launch: cannot run %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

int proc_start(proc *p, char *const argv[], char *const envp[], char *why, size_t why_size) {
  int out[2], err[2];
  p->pid = p->sid = 0;
  p->out.fd = p->err.fd = -1;
  p->out.kept = p->err.kept = 0;
  p->out.marked = p->err.marked = 0;
  p->out.ncarry = p->err.ncarry = 0;
  p->out.total = p->err.total = 0;
  p->out.keep = p->err.keep = NULL;
  if (pipe2(out, O_CLOEXEC)) goto fail;
  if (pipe2(err, O_CLOEXEC)) {
    close(out[0]);
    close(out[1]);
    goto fail;
  }
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) child(argv, envp, parent, out[1], err[1]);
  int e = errno;
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    errno = e;
    goto fail;
  }
  p->pid = p->sid = pid;
  p->out.fd = out[0];
  p->err.fd = err[0];
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  if (p->out.keep_cap) p->out.keep = malloc(p->out.keep_cap);
  if (p->err.keep_cap) p->err.keep = malloc(p->err.keep_cap);
  return 0;
fail:
  snprintf(why, why_size, "cannot start %s: %s", argv[0], strerror(errno));
  return -1;
}

static void write_all(proc_stream *s, const char *b, size_t n) {
  while (n && s->copy_to >= 0) {
    ssize_t w = write(s->copy_to, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) s->copy_to = -1; /* closed: what the command writes is read, and dropped */
    if (w > 0) b += w, n -= (size_t)w;
  }
}

static void take(proc_stream *s, const char *b, size_t n) {
  s->total += n;
  write_all(s, b, n);
  if (s->keep) {
    if (n >= s->keep_cap) {
      memcpy(s->keep, b + n - s->keep_cap, s->keep_cap);
      s->kept = s->keep_cap;
    } else {
      if (s->kept + n > s->keep_cap) {
        size_t drop = s->kept + n - s->keep_cap;
        memmove(s->keep, s->keep + drop, s->kept - drop);
        s->kept -= drop;
      }
      memcpy(s->keep + s->kept, b, n);
      s->kept += n;
    }
  }
  if (s->mark && !s->marked) {
    size_t m = strlen(s->mark); /* shorter than carry */
    char joined[2 * sizeof s->carry];
    size_t head = n < m ? n : m;
    memcpy(joined, s->carry, s->ncarry);
    memcpy(joined + s->ncarry, b, head);
    if (memmem(joined, s->ncarry + head, s->mark, m) || memmem(b, n, s->mark, m)) s->marked = 1;
    /* The last m - 1 bytes of everything read so far. */
    size_t want = m - 1;
    if (n >= want) {
      memcpy(s->carry, b + n - want, want);
      s->ncarry = want;
    } else {
      size_t keep_old = s->ncarry + n > want ? want - n : s->ncarry;
      memmove(s->carry, s->carry + s->ncarry - keep_old, keep_old);
      memcpy(s->carry + keep_old, b, n);
      s->ncarry = keep_old + n;
    }
  }
}

/* Reads what p's streams have, waiting up to timeout_ms for something; returns how many streams
 * are still open. */
static int pump(proc *p, int timeout_ms) {
  proc_stream *s[2] = {&p->out, &p->err};
  struct pollfd fds[2];
  int n = 0;
  for (int i = 0; i < 2; i++)
    if (s[i]->fd >= 0) fds[n++] = (struct pollfd){.fd = s[i]->fd, .events = POLLIN};
  if (poll(fds, (nfds_t)n, timeout_ms) <= 0) return n;
  char buf[65536];
  for (int i = 0; i < 2; i++) {
    for (;;) {
      if (s[i]->fd < 0) break;
      ssize_t r = read(s[i]->fd, buf, sizeof buf);
      if (r > 0) {
        take(s[i], buf, (size_t)r);
        continue;
      }
      if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(s[i]->fd);
        s[i]->fd = -1;
      }
      break;
    }
  }
  return (p->out.fd >= 0) + (p->err.fd >= 0);
}

int proc_wait(proc *p, double deadline, volatile sig_atomic_t *stop) {
  while (p->pid) {
    int st;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) {
      p->status = st;
      p->pid = 0;
      pump(p, 0);
      return 0;
    }
    if (stop && *stop) return 2;
    double left = deadline - cli_now();
    if (left <= 0) return 1;
    int open = pump(p, left < 0.1 ? (int)(left * 1000) + 1 : 100);
    if (!open) usleep(20000); /* output closed, the command not yet ended */
  }
  return 0;
}

void proc_stop(proc *p, double grace) {
  if (!p->pid) return;
  kill(p->pid, SIGTERM);
  kill(p->pid, SIGCONT);
  if (proc_wait(p, cli_now() + grace, NULL) == 0) return;
  kill(p->pid, SIGKILL);
  proc_wait(p, cli_now() + 10.0, NULL);
}

/* The state, parent and session of process pid from /proc/pid/stat; -1 when it is gone. */
static int stat_of(pid_t pid, char *state, pid_t *ppid, pid_t *sid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  /* "pid (comm) S ppid pgrp session ...": comm may hold spaces and parentheses. */
  char *c = strrchr(buf, ')');
  int pp, pg, se;
  if (!c || sscanf(c + 1, " %c %d %d %d", state, &pp, &pg, &se) != 4) return -1;
  *ppid = pp;
  *sid = se;
  return 0;
}

typedef struct seen {
  pid_t *pid;
  int n, cap;
} seen;

static int seen_add(seen *s, pid_t pid) {
  for (int i = 0; i < s->n; i++)
    if (s->pid[i] == pid) return 0;
  if (s->n == s->cap) {
    int cap = s->cap ? 2 * s->cap : 64;
    pid_t *np = realloc(s->pid, (size_t)cap * sizeof *np);
    if (!np) return 1; /* signalled anyway, only not counted */
    s->pid = np;
    s->cap = cap;
  }
  s->pid[s->n++] = pid;
  return 1;
}

/* The live processes of session sid and this process's children: signals each (sig_new to one
 * not seen before, sig to every one; 0: none), returns how many there are. */
static int sweep(pid_t sid, int sig_new, int sig, seen *s) {
  DIR *d = opendir("/proc");
  if (!d) return -1;
  pid_t self = getpid();
  int count = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    char *end;
    long v = strtol(de->d_name, &end, 10);
    if (*end || v <= 0 || (pid_t)v == self) continue;
    char state;
    pid_t ppid, psid;
    if (stat_of((pid_t)v, &state, &ppid, &psid) || state == 'Z' || state == 'X') continue;
    if (psid != sid && ppid != self) continue;
    count++;
    int first = seen_add(s, (pid_t)v);
    int use = first && sig_new ? sig_new : sig;
    if (use) kill((pid_t)v, use);
    if (use == SIGTERM) kill((pid_t)v, SIGCONT); /* a stopped process acts on it only then */
  }
  closedir(d);
  return count;
}

static void reap(void) {
  while (waitpid(-1, NULL, WNOHANG) > 0) continue;
}

int proc_end(proc *p, double grace, proc_ending *e) {
  *e = (proc_ending){0};
  seen s = {0};
  double t0 = cli_now();
  reap();
  int n = sweep(p->sid, SIGTERM, 0, &s);
  if (n < 0) {
    e->left = -1; /* no /proc: nothing can be made sure of */
    return -1;
  }
  while (n && cli_now() - t0 < grace) {
    pump(p, 50);
    reap();
    n = sweep(p->sid, SIGTERM, 0, &s);
  }
  if (n) e->killed = 1;
  while (n && cli_now() - t0 < grace + 10.0) {
    n = sweep(p->sid, SIGKILL, SIGKILL, &s);
    pump(p, 50);
    reap();
    n = sweep(p->sid, SIGKILL, 0, &s);
  }
  e->found = s.n;
  for (int i = 0; i < s.n && i < PROC_MAX_LISTED; i++) e->pid[i] = s.pid[i];
  e->left = n;
  e->took = cli_now() - t0;
  free(s.pid);
  return n ? -1 : 0;
}

void proc_close(proc *p) {
  double quiet = cli_now();
  while (p->out.fd >= 0 || p->err.fd >= 0) {
    size_t before = p->out.total + p->err.total;
    pump(p, 100);
    if (p->out.total + p->err.total != before) quiet = cli_now();
    if (cli_now() - quiet > 1.0) break;
  }
  if (p->out.fd >= 0) close(p->out.fd);
  if (p->err.fd >= 0) close(p->err.fd);
  p->out.fd = p->err.fd = -1;
}

void proc_free(proc *p) {
  free(p->out.keep);
  free(p->err.keep);
  p->out.keep = p->err.keep = NULL;
  p->out.kept = p->err.kept = 0;
}

static int executable(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

int proc_found(const char *name) {
  if (!*name) return 0;
  if (strchr(name, '/')) return executable(name);
  const char *path = getenv("PATH");
  if (!path) path = "/usr/local/bin:/usr/bin:/bin";
  for (const char *d = path;; d++) {
    const char *end = strchr(d, ':');
    size_t len = end ? (size_t)(end - d) : strlen(d);
    char buf[4096];
    if (len + strlen(name) + 2 < sizeof buf) {
      snprintf(buf, sizeof buf, "%.*s/%s", (int)len, len ? d : ".", name);
      if (!len) snprintf(buf, sizeof buf, "./%s", name);
      if (executable(buf)) return 1;
    }
    if (!end) return 0;
    d = end;
  }
}
