/* dist_mpi_open.c: the life of the MPI transport. MPI is started (when nobody has) on a thread
 * of its own so that pmap_ctx_create can give up on a process that never arrives; the processes
 * then meet point to point (each names its host and layout), so a missing one is named; leave
 * notices tell the others at once when a process destroys its context, gives up on an exchange
 * or ends; and the exit handler finalises MPI only when that cannot wait for a process that is
 * gone (MPI_Finalize waits for every process: a failed process that called it would hold the
 * job until the others time out, while one that exits without it makes mpirun end the job). */
#include <limits.h>
#include <pthread.h>
#include <sched.h>
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
#define HELLO_MAGIC 0x706d61702d686921ull

/* What each process tells the others when they meet. */
typedef struct hello {
  uint64_t magic, nonce;
  int64_t devices, kind;
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
  int finalize; /* 0 not yet asked, 1 finalise, 2 leave MPI as it is */
  pthread_t thread;
} start = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, START_NONE, 0, 0, 0, 0};

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

/* At exit, when pmap started MPI: a context still open tells its peers this process ends. MPI
 * is finalised only when no exchange of this process failed and every peer of every open
 * context ended too (within the context's timeout): otherwise MPI_Finalize would wait for
 * processes that may never call it, and exiting without it makes the launcher end the job. */
static void at_exit(void) {
  pthread_mutex_lock(&reg_lock);
  for (pmap_dist *d = open_list; d; d = d->next) dist_send_notes(d, PMAP_SUCCESS, LEAVE_EXIT, "");
  int clean = !dist_broken_any();
  for (pmap_dist *d = open_list; d && clean; d = d->next)
    clean = !d->broken && all_left(d, d->timeout_ns < 0 ? -1 : pmap_now_ns() + d->timeout_ns);
  pthread_mutex_unlock(&reg_lock);
  pthread_mutex_lock(&start.lock);
  start.finalize = clean ? 1 : 2;
  pthread_cond_signal(&start.cond);
  pthread_mutex_unlock(&start.lock);
  if (clean) pthread_join(start.thread, NULL);
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
  int fin = start.finalize == 1;
  pthread_mutex_unlock(&start.lock);
  if (fin) MPI_Finalize();
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

/* pmap's own communicator (non-blocking, so that it is bounded), then the receives of the
 * other processes' leave notices. */
static pmap_status own_comm(pmap_dist *d, MPI_Comm user, int64_t deadline) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Comm_idup(user, &d->comm, &req), who = -1, peer = 0;
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
  MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
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
  if (st) {
    /* After a timeout MPI may still write into d: keep it. */
    if (!dist_broken_any()) free_dist(d);
    return st;
  }
  pthread_mutex_lock(&reg_lock);
  d->next = open_list;
  open_list = d;
  pthread_mutex_unlock(&reg_lock);
  *out = d;
  *rank = d->rank;
  *size = d->size;
  return PMAP_SUCCESS;
}

void dist_close(pmap_dist *d) {
  if (!d) return;
  pthread_mutex_lock(&reg_lock);
  for (pmap_dist **at = &open_list; *at; at = &(*at)->next)
    if (*at == d) {
      *at = d->next;
      break;
    }
  pthread_mutex_unlock(&reg_lock);
  dist_send_notes(d, PMAP_SUCCESS, LEAVE_CLOSED, "");
  if (d->broken) return; /* requests may still be pending on its memory: keep it */
  /* Every notice sent must be received before the communicator goes: MPI may give a later one
   * the same internal id, and a message left over would then take the place of one of its own.
   * So the processes close together; one that does not within the timeout keeps this one's
   * communicator (and memory) alive for good. */
  if (!all_left(d, d->timeout_ns < 0 ? -1 : pmap_now_ns() + d->timeout_ns)) return;
  /* The notices are small (sent at once); one still pending after a second keeps d alive. */
  int64_t deadline = pmap_now_ns() + 1000000000;
  for (int done = 0; !done;) {
    if (MPI_Testall(d->size, d->note_sends, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) return;
    if (!done && pmap_now_ns() >= deadline) return;
    if (!done) sched_yield();
  }
  MPI_Comm_free(&d->comm);
  free_dist(d);
}
