/* dist_mpi_open.c: the life of the MPI transport. MPI is started (when nobody has) on a thread
 * of its own so that pmap_ctx_create can give up on a process that never arrives; the processes
 * then meet point to point (each names its host and layout), so a missing one is named; leave
 * notices tell the others at once when a process destroys its context, gives up on an exchange
 * or ends; and the exit handler ends the job within the timeout: the processes agree that every
 * one of them has finished, and MPI_Finalize (which waits for every process: one that is stopped
 * or gone would hold the job for ever) is waited for no longer than the timeout; a process that
 * does not finish is named, and the others exit without MPI_Finalize, which makes the launcher
 * end the job. */
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist_env.h"
#include "dist_mpi.h"
#include "base/error.h"
#include "runtime/sync.h"

#define TAG_HELLO 32717 /* on the user's communicator, during pmap_ctx_create only */
#define TAG_FINISH 1    /* on the communicator of the end of the job */
#define HELLO_MAGIC 0x706d61702d686921ull

/* What each process tells the others when they meet. */
typedef struct hello {
  uint64_t magic, nonce;
  int64_t devices, kind, pid;
  char host[DIST_HOST_LEN];
} hello;

/* MPI started by pmap, on its own thread, which later also finalises it (MPI wants both on one
 * thread). */
enum { START_NONE, START_RUNNING, START_DONE, START_FAILED };
static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  _Atomic int state;
  int rc, provided;
  int finalize;          /* 0 not yet asked, 1 finalise, 2 leave MPI as it is */
  _Atomic int finalized; /* MPI_Finalize returned */
  int ours;              /* pmap started MPI (its thread exists) */
  pthread_t thread;
} start = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, START_NONE, 0, 0, 0, 0, 0, 0};

/* The end of the job, where pmap started MPI: a duplicate of MPI_COMM_WORLD made with the first
 * context (the processes' last agreement runs on it), the host and process id of each process,
 * and the timeout that bounds the end: that of the last context created. */
static struct {
  int have, rank, size;
  MPI_Comm comm;
  char (*hosts)[DIST_HOST_LEN]; /* (size) */
  int64_t *pids;                /* (size) */
  int opened;                   /* a context was opened */
  int64_t timeout_ns;           /* the last one's; < 0: never */
} job_end;

/* The open transports, for the exit handler. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pmap_dist *open_list;

/* Whether every other process of d has sent its leave notice, waiting until the deadline. */
static int all_left(pmap_dist *d, int64_t deadline) {
  for (;;) {
    int all = 1;
    for (int r = 0; r < d->size; r++) all &= r == d->rank || dist_has_left(d, r);
    if (all) return 1;
    if (deadline >= 0 && pmap_now_ns() >= deadline) return 0;
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
}

/* "process 1 (host b, pid 4242: stopped)": a process named with what /proc says of it where it
 * runs on this host (stopped, ended or running), "process 1 (host b)" elsewhere. Returns the
 * state it found: 'T' stopped, 'Z' ended, 'R' running, 0 not known. */
static char proc_named(int r, char *buf, size_t size) {
  char host[DIST_HOST_LEN] = "", path[64], text[512];
  snprintf(buf, size, "process %d (host %s)", r, job_end.hosts[r]);
  if (gethostname(host, sizeof host - 1) != 0 || strcmp(host, job_end.hosts[r]) != 0) return 0;
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)job_end.pids[r]);
  FILE *f = fopen(path, "r");
  size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
  if (f) fclose(f);
  text[n] = '\0';
  const char *paren = strrchr(text, ')');
  char state = paren && paren[1] == ' ' ? paren[2] : 'X';
  char found = state == 'T' || state == 't' ? 'T' : state == 'Z' || state == 'X' ? 'Z' : 'R';
  snprintf(buf, size, "process %d (host %s, pid %lld: %s)", r, job_end.hosts[r],
           (long long)job_end.pids[r],
           found == 'T'   ? "stopped"
           : found == 'Z' ? "ended"
                          : "running");
  return found;
}

/* One line on stderr, for the processes that finished: the end of the job failed. */
static void say_end(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say_end(const char *fmt, ...) {
  char line[1536];
  int len = job_end.have
                ? snprintf(line, sizeof line, "pmap: process %d of %d (host %s): ", job_end.rank,
                           job_end.size, job_end.hosts[job_end.rank])
                : snprintf(line, sizeof line, "pmap: ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + len, sizeof line - (size_t)len, fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s; leaving MPI unfinalised, so that the launcher ends the job\n", line);
}

/* The last agreement: every process tells every other that it has finished, and waits for
 * theirs until deadline. Returns 1 when all arrived; else names those that did not. */
static int finish_agree(int64_t deadline) {
  int p = job_end.size, n = 0, rc = MPI_SUCCESS;
  static int64_t done = 1, *in;
  static MPI_Request *reqs; /* left pending on a timeout: MPI is not finalised then */
  static int *peer;
  in = calloc((size_t)p, sizeof *in);
  reqs = calloc(2 * (size_t)p, sizeof *reqs);
  peer = calloc(2 * (size_t)p, sizeof *peer);
  if (!in || !reqs || !peer) {
    say_end("out of memory for the last agreement of the processes");
    return 0;
  }
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != job_end.rank) {
      peer[n] = r;
      rc = MPI_Irecv(&in[r], 1, MPI_INT64_T, r, TAG_FINISH, job_end.comm, &reqs[n++]);
    }
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != job_end.rank) {
      peer[n] = r;
      rc = MPI_Isend(&done, 1, MPI_INT64_T, r, TAG_FINISH, job_end.comm, &reqs[n++]);
    }
  int64_t t0 = pmap_now_ns();
  for (int pending = 1; rc == MPI_SUCCESS && pending;) {
    pending = 0;
    for (int i = 0; i < n && rc == MPI_SUCCESS; i++) {
      int flag = 1;
      if (reqs[i] != MPI_REQUEST_NULL) rc = MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
      pending |= !flag;
    }
    if (!pending || rc != MPI_SUCCESS) break;
    int64_t now = pmap_now_ns();
    if (deadline >= 0 && now >= deadline) break;
    struct timespec ts = {0, now - t0 > 50000000 ? 1000000 : 20000};
    nanosleep(&ts, NULL);
  }
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING + 32];
    dist_mpi_text(rc, text, sizeof text);
    say_end("at exit: the last agreement of the processes failed: %s", text);
    return 0;
  }
  char names[1024] = "";
  size_t len = 0;
  int count = 0;
  for (int i = 0; i < p - 1 && len < sizeof names; i++) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    char name[320];
    proc_named(peer[i], name, sizeof name);
    len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", count++ ? ", " : "", name);
  }
  if (!count) return 1;
  say_end(
      "at exit: %s did not finish within %.3f s of this process's end (stopped, stalled or "
      "dead)",
      names, (double)job_end.timeout_ns * 1e-9);
  return 0;
}

/* MPI_Finalize on the start thread, waited for until deadline: 1 once it returned. */
static int finalize_within(int64_t deadline) {
  pthread_mutex_lock(&start.lock);
  start.finalize = 1;
  pthread_cond_signal(&start.cond);
  pthread_mutex_unlock(&start.lock);
  while (!atomic_load(&start.finalized)) {
    if (deadline >= 0 && pmap_now_ns() >= deadline) break;
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  if (atomic_load(&start.finalized)) {
    pthread_join(start.thread, NULL);
    return 1;
  }
  /* Every process arrived at the last agreement: one stopped or died since, inside MPI. */
  char names[1024] = "";
  size_t len = 0;
  for (int r = 0; r < job_end.size && len < sizeof names; r++) {
    char name[320];
    if (r != job_end.rank && proc_named(r, name, sizeof name) == 'T')
      len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", len ? ", " : "", name);
  }
  say_end(
      "at exit: MPI_Finalize did not return within %.3f s, though every process had "
      "finished: %s",
      (double)job_end.timeout_ns * 1e-9,
      len ? names : "one stopped or died inside it (MPI cannot say which)");
  return 0;
}

/* The processes of an open context that have not sent their leave notice, into buf. */
static void not_left(pmap_dist *d, char *buf, size_t size) {
  size_t len = 0;
  buf[0] = '\0';
  for (int r = 0; r < d->size && len < size; r++) {
    if (r == d->rank || dist_has_left(d, r)) continue;
    char name[160];
    dist_proc_name(d, r, name, sizeof name);
    len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? ", " : "", name);
  }
}

/* At exit, when pmap started MPI: a context still open tells its peers this process ends, and
 * waits for theirs. MPI is finalised only when no exchange of this process failed, every peer of
 * every open context ended too, and every process arrived at the last agreement, each within the
 * timeout; MPI_Finalize itself is waited for no longer than the timeout. Otherwise the process
 * exits without it (a line on stderr names the process that did not finish), and the launcher
 * ends the job. */
static void at_exit(void) {
  pthread_mutex_lock(&reg_lock);
  for (pmap_dist *d = open_list; d; d = d->next) dist_send_notes(d, PMAP_SUCCESS, LEAVE_EXIT, "");
  int clean = !dist_broken_any();
  for (pmap_dist *d = open_list; d && clean; d = d->next) {
    clean = !d->broken && all_left(d, d->timeout_ns < 0 ? -1 : pmap_now_ns() + d->timeout_ns);
    if (!clean && !d->broken) {
      char names[640];
      not_left(d, names, sizeof names);
      say_end("at exit: %s did not end within %.3f s (stopped, stalled or dead)", names,
              (double)d->timeout_ns * 1e-9);
    }
  }
  pthread_mutex_unlock(&reg_lock);
  int64_t t = job_end.timeout_ns;
  if (clean && job_end.have) clean = finish_agree(t < 0 ? -1 : pmap_now_ns() + t);
  if (clean) {
    finalize_within(t < 0 || !job_end.opened ? -1 : pmap_now_ns() + t);
    return;
  }
  pthread_mutex_lock(&start.lock);
  start.finalize = 2;
  pthread_cond_signal(&start.cond);
  pthread_mutex_unlock(&start.lock);
}

static void *start_main(void *arg) {
  (void)arg;
  int provided = 0;
  int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  pthread_mutex_lock(&start.lock);
  start.rc = rc;
  start.provided = provided;
  atomic_store(&start.state, rc == MPI_SUCCESS ? START_DONE : START_FAILED);
  while (rc == MPI_SUCCESS && !start.finalize) pthread_cond_wait(&start.cond, &start.lock);
  int fin_now = start.finalize == 1;
  pthread_mutex_unlock(&start.lock);
  if (fin_now) MPI_Finalize();
  atomic_store(&start.finalized, 1);
  return NULL;
}

/* MPI_Init_thread unless the program (or an earlier context) did; SERIALIZED at least, since
 * device 0's thread of each context does the exchanges and that is whichever thread calls. */
static pmap_status ensure_init(int64_t deadline, double timeout_s) {
  pthread_mutex_lock(&start.lock);
  int state = atomic_load(&start.state), inited = 0, fin = 0, provided = 0;
  pmap_status st = PMAP_SUCCESS;
  if (state == START_DONE) {
    MPI_Finalized(&fin);
    if (fin) st = PMAP_ERR(PMAP_ERR_UNAVAILABLE, "pmap_ctx_create: MPI is already finalised");
  } else if (state == START_NONE) {
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (fin) {
      st = PMAP_ERR(PMAP_ERR_UNAVAILABLE, "pmap_ctx_create: MPI is already finalised");
    } else if (inited) {
      MPI_Query_thread(&provided);
      start.provided = provided;
      atomic_store(&start.state, START_DONE); /* the program's MPI: it finalises it */
    } else if (pthread_create(&start.thread, NULL, start_main, NULL) != 0) {
      st = PMAP_ERR(PMAP_ERR_UNAVAILABLE, "pmap_ctx_create: cannot start a thread for MPI_Init");
    } else {
      pthread_setname_np(start.thread, "pmap-mpi-init");
      start.ours = 1;
      atomic_store(&start.state, START_RUNNING);
      atexit(at_exit);
    }
  }
  pthread_mutex_unlock(&start.lock);
  if (st) return st;
  while (atomic_load(&start.state) == START_RUNNING) {
    if (deadline >= 0 && pmap_now_ns() >= deadline) {
      long launched = dist_env_launch_size(NULL);
      dist_broken_mark();
      return PMAP_ERR(PMAP_ERR_TIMEOUT,
                      "pmap_ctx_create: MPI_Init_thread did not return within %.3f s: not every "
                      "one of the %ld processes the launcher started has started MPI (MPI "
                      "cannot say which; look for a process that is stuck or slow before its "
                      "pmap_ctx_create, or raise the timeout)",
                      timeout_s, launched);
    }
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  pthread_mutex_lock(&start.lock);
  int rc = start.rc;
  provided = start.provided;
  state = atomic_load(&start.state);
  pthread_mutex_unlock(&start.lock);
  if (state == START_FAILED) {
    char text[MPI_MAX_ERROR_STRING + 32];
    dist_mpi_text(rc, text, sizeof text);
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "pmap_ctx_create: MPI initialisation failed: %s", text);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "pmap_ctx_create: MPI runs at thread level %d; pmap needs "
                    "MPI_THREAD_SERIALIZED (%d) or higher (use MPI_Init_thread)",
                    provided, MPI_THREAD_SERIALIZED);
  return PMAP_SUCCESS;
}

/* Whether PMAP_DIST_AUTO means more than one process here. */
static int auto_spans(void) {
  if (dist_env_launch_size(NULL) > 1) return 1;
  if (atomic_load(&start.state) == START_RUNNING) return 0;
  int inited = 0, fin = 0, size = 1;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (inited && !fin) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size > 1;
}

static void free_dist(pmap_dist *d) {
  free(d->hosts);
  free(d->in);
  free(d->reqs);
  free(d->peer);
  free(d->notes);
  free(d->note_reqs);
  free(d->left);
  free(d->note_sends);
  free(d->sbuf);
  free(d->rbuf);
  free(d);
}

static pmap_status alloc_dist(pmap_dist *d) {
  size_t p = (size_t)d->size;
  d->hosts = calloc(p, sizeof *d->hosts);
  d->in = calloc(p, sizeof *d->in);
  d->reqs = calloc(2 * p, sizeof *d->reqs);
  d->peer = calloc(2 * p, sizeof *d->peer);
  d->notes = calloc(p, sizeof *d->notes);
  d->left = calloc(p, sizeof *d->left);
  d->sbuf = malloc(p * sizeof(hello)); /* the hellos of every process while they meet */
  d->scap = p * sizeof(hello);
  if (d->hosts && d->in && d->reqs && d->peer && d->notes && d->left && d->sbuf)
    return PMAP_SUCCESS;
  return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory for %d processes",
                  d->size);
}

/* Every process sends its hello to every other on the user's communicator and waits for
 * theirs: one that does not arrive by the deadline is named. */
static pmap_status meet(pmap_dist *d, MPI_Comm user, pmap_backend kind, int64_t deadline) {
  static _Atomic uint64_t opened;
  hello *all = (hello *)d->sbuf, *mine = &all[d->rank];
  memset(all, 0, (size_t)d->size * sizeof *all);
  mine->magic = HELLO_MAGIC;
  mine->nonce = (uint64_t)pmap_now_ns() ^ ((uint64_t)getpid() << 32) ^ atomic_fetch_add(&opened, 1);
  mine->devices = d->local_devices;
  mine->kind = kind;
  mine->pid = (int64_t)getpid();
  if (gethostname(mine->host, sizeof mine->host - 1) != 0) snprintf(mine->host, 8, "?");
  int p = d->size, rc = MPI_SUCCESS, n = 0, who = -1;
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != d->rank) {
      d->peer[n] = r;
      rc = MPI_Irecv(&all[r], (int)sizeof *all, MPI_BYTE, r, TAG_HELLO, user, &d->reqs[n++]);
    }
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != d->rank) {
      d->peer[n] = r;
      rc = MPI_Isend(mine, (int)sizeof *mine, MPI_BYTE, r, TAG_HELLO, user, &d->reqs[n++]);
    }
  int w = rc == MPI_SUCCESS ? dist_wait(d, n, d->reqs, d->peer, deadline, &rc, &who) : WAIT_MPI;
  for (int r = 0; r < p; r++) snprintf(d->hosts[r], sizeof d->hosts[r], "%s", all[r].host);
  if (w == WAIT_MPI) {
    char text[MPI_MAX_ERROR_STRING + 32];
    dist_mpi_text(rc, text, sizeof text);
    dist_broken_mark();
    return PMAP_ERR(PMAP_ERR_DEVICE, "pmap_ctx_create: process %d: MPI failed: %s", d->rank, text);
  }
  if (w == WAIT_LATE) {
    char names[400];
    size_t len = 0;
    int count = 0;
    for (int i = 0; i < p - 1 && len < sizeof names; i++)
      if (d->reqs[i] != MPI_REQUEST_NULL)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%d", count++ ? ", " : "",
                                d->peer[i]);
    dist_broken_mark();
    return PMAP_ERR(PMAP_ERR_TIMEOUT,
                    "pmap_ctx_create: process %d of %d (host %s): process%s %s did not create "
                    "%s context within %.3f s (not started, stalled or failed before it, or "
                    "creating a different context first)",
                    d->rank, p, mine->host, count == 1 ? "" : "es", count ? names : "?",
                    count == 1 ? "its" : "their", (double)d->timeout_ns * 1e-9);
  }
  for (int r = 0; r < p; r++) {
    if (all[r].magic != HELLO_MAGIC)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "pmap_ctx_create: process %d sent something else than pmap's greeting on "
                      "tag %d of the communicator (is the program receiving on it?)",
                      r, TAG_HELLO);
    if (all[r].devices != all[0].devices || all[r].kind != all[0].kind)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "pmap_ctx_create: process %d (host %s) has %lld devices on backend %s, "
                      "process 0 (host %s) has %lld on %s: every process must create its context "
                      "with the same backend and device count",
                      r, all[r].host, (long long)all[r].devices,
                      pmap_backend_name((pmap_backend)all[r].kind), all[0].host,
                      (long long)all[0].devices, pmap_backend_name((pmap_backend)all[0].kind));
  }
  d->nonce = all[0].nonce;
  return PMAP_SUCCESS;
}

/* A duplicate of comm into *out (non-blocking, so that it is bounded), with MPI's errors
 * returned. */
static pmap_status dup_comm(pmap_dist *d, MPI_Comm comm, MPI_Comm *out, int64_t deadline) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Comm_idup(comm, out, &req), who = -1, peer = 0;
  int w = rc == MPI_SUCCESS ? dist_wait(d, 1, &req, &peer, deadline, &rc, &who) : WAIT_MPI;
  if (w != WAIT_DONE) {
    char text[MPI_MAX_ERROR_STRING + 32] = "";
    if (w == WAIT_MPI) dist_mpi_text(rc, text, sizeof text);
    dist_broken_mark();
    return PMAP_ERR(w == WAIT_MPI ? PMAP_ERR_DEVICE : PMAP_ERR_TIMEOUT,
                    "pmap_ctx_create: process %d: every process arrived but duplicating the "
                    "communicator %s%s (another process gave up?)",
                    d->rank, w == WAIT_MPI ? "failed: " : "did not complete in time", text);
  }
  MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
  return PMAP_SUCCESS;
}

/* The first context of a process whose MPI pmap started: the communicator of the end of the
 * job, and each process's host and id (from the hellos all, of MPI_COMM_WORLD's processes). */
static pmap_status finish_comm(pmap_dist *d, const hello *all, int64_t deadline) {
  size_t p = (size_t)d->size;
  job_end.hosts = calloc(p, sizeof *job_end.hosts);
  job_end.pids = calloc(p, sizeof *job_end.pids);
  if (!job_end.hosts || !job_end.pids)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory");
  for (size_t r = 0; r < p; r++) {
    snprintf(job_end.hosts[r], sizeof job_end.hosts[r], "%s", all[r].host);
    job_end.pids[r] = all[r].pid;
  }
  PMAP_TRY(dup_comm(d, MPI_COMM_WORLD, &job_end.comm, deadline));
  job_end.rank = d->rank;
  job_end.size = d->size;
  job_end.have = 1;
  return PMAP_SUCCESS;
}

/* pmap's own communicator, then the receives of the other processes' leave notices. */
static pmap_status own_comm(pmap_dist *d, MPI_Comm user, int64_t deadline) {
  PMAP_TRY(dup_comm(d, user, &d->comm, deadline));
  d->note_reqs = calloc((size_t)d->size, sizeof *d->note_reqs);
  d->note_sends = calloc((size_t)d->size, sizeof *d->note_sends);
  if (!d->note_reqs || !d->note_sends)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory");
  for (int r = 0; r < d->size; r++) {
    d->note_reqs[r] = d->note_sends[r] = MPI_REQUEST_NULL;
    if (r != d->rank)
      MPI_Irecv(&d->notes[r], (int)sizeof d->notes[r], MPI_BYTE, r, TAG_LEAVE, d->comm,
                &d->note_reqs[r]);
  }
  return PMAP_SUCCESS;
}

pmap_status dist_open(const pmap_config *cfg, pmap_backend kind, int local_devices,
                      int64_t timeout_ns, pmap_dist **out, int *rank, int *size) {
  *out = NULL;
  *rank = 0;
  *size = 1;
  pmap_dist_mode mode;
  PMAP_TRY(dist_env_mode(cfg, &mode));
  if (mode == PMAP_DIST_NONE || (mode == PMAP_DIST_AUTO && !auto_spans())) return PMAP_SUCCESS;
  int64_t deadline = timeout_ns < 0 ? -1 : pmap_now_ns() + timeout_ns;
  PMAP_TRY(ensure_init(deadline, (double)timeout_ns * 1e-9));
  MPI_Comm user = cfg->mpi_comm ? *(const MPI_Comm *)cfg->mpi_comm : MPI_COMM_WORLD;
  pmap_dist *d = calloc(1, sizeof *d);
  if (!d) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory");
  d->timeout_ns = timeout_ns;
  d->comm = MPI_COMM_NULL;
  d->local_devices = local_devices;
  MPI_Comm_rank(user, &d->rank);
  MPI_Comm_size(user, &d->size);
  pmap_status st = alloc_dist(d);
  if (!st) st = meet(d, user, kind, deadline);
  if (!st) st = own_comm(d, user, deadline);
  if (!st && start.ours && !job_end.have && user == MPI_COMM_WORLD)
    st = finish_comm(d, (const hello *)d->sbuf, deadline);
  if (st) {
    /* After a timeout MPI may still write into d: keep it. */
    if (!dist_broken_any()) free_dist(d);
    return st;
  }
  pthread_mutex_lock(&reg_lock);
  d->next = open_list;
  open_list = d;
  job_end.timeout_ns = timeout_ns;
  job_end.opened = 1;
  pthread_mutex_unlock(&reg_lock);
  *out = d;
  *rank = d->rank;
  *size = d->size;
  return PMAP_SUCCESS;
}

pmap_status dist_close(pmap_dist *d) {
  if (!d) return PMAP_SUCCESS;
  pthread_mutex_lock(&reg_lock);
  for (pmap_dist **at = &open_list; *at; at = &(*at)->next)
    if (*at == d) {
      *at = d->next;
      break;
    }
  pthread_mutex_unlock(&reg_lock);
  dist_send_notes(d, PMAP_SUCCESS, LEAVE_CLOSED, "");
  if (d->broken) return PMAP_SUCCESS; /* requests may still be pending on its memory: keep it */
  /* Every notice sent must be received before the communicator goes: MPI may give a later one
   * the same internal id, and a message left over would then take the place of one of its own.
   * So the processes close together; one that does not within the timeout keeps this one's
   * communicator (and memory) alive for good, and is named: the job cannot end together (at
   * exit MPI is left unfinalised, so that the launcher ends it). */
  if (!all_left(d, d->timeout_ns < 0 ? -1 : pmap_now_ns() + d->timeout_ns)) {
    char names[640];
    not_left(d, names, sizeof names);
    dist_broken_mark();
    return PMAP_ERR(PMAP_ERR_TIMEOUT,
                    "process %d of %d (host %s): %s did not destroy its context within %.3f s "
                    "(stopped, stalled or dead, or still using it); this process's context is "
                    "destroyed all the same",
                    d->rank, d->size, dist_host(d, d->rank), names, (double)d->timeout_ns * 1e-9);
  }
  /* The notices are small (sent at once); one still pending after a second keeps d alive. */
  int64_t deadline = pmap_now_ns() + 1000000000;
  for (int done = 0; !done;) {
    if (MPI_Testall(d->size, d->note_sends, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
      return PMAP_SUCCESS;
    if (!done && pmap_now_ns() >= deadline) return PMAP_SUCCESS;
    if (!done) sched_yield();
  }
  MPI_Comm_free(&d->comm);
  free_dist(d);
  return PMAP_SUCCESS;
}
