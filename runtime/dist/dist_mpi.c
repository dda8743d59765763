/* dist_mpi.c: the inter-process transport on MPI. Every exchange first agrees on what it is: each
 * process sends its (sequence, operation, count, root) to every other and waits for theirs, so a
 * process that stalls, died or called something else is named instead of waited for; then the
 * data moves in one non-blocking MPI call. Every wait is MPI_Test against the context's deadline,
 * and errors are returned (MPI_ERRORS_RETURN on pmap's copy of the communicator). Sums add the
 * processes' values in process order, never in MPI_Allreduce's own order, so every process gets
 * bitwise the same result. */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist.h"
#include "dist_env.h"
#include "runtime/error.h"
#include "runtime/sync.h"

#define TAG_DESC 7011

struct pmap_dist {
  MPI_Comm comm; /* pmap's duplicate of the user's communicator */
  int rank, size;
  int64_t timeout_ns; /* < 0: never */
  uint64_t seq;       /* exchanges so far */
  pmap_status broken; /* the first failure that left the processes out of step */
  char broken_msg[768];
  int64_t desc_out[4]; /* (seq, op, count, root) sent to every process */
  int64_t *desc_in;    /* (size, 4) received */
  MPI_Request *reqs;   /* (2 size) receives then sends of the descriptors */
  float *sbuf, *rbuf;  /* this process's values (scap), every process's (rcap) */
  size_t scap, rcap;
};

/* MPI is process-wide: pmap initialises it when nobody has, and then finalises it at exit,
 * unless an exchange failed (MPI_Finalize would wait for the processes that are gone; exiting
 * without it makes the launcher end the whole job, which is what a failed job needs). */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int initialised_here;
static atomic_int any_broken;

static void finalize_at_exit(void) {
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && !atomic_load(&any_broken)) MPI_Finalize();
}

static const char *op_name(int64_t op) {
  switch ((dist_op)op) {
  case DIST_SUM: return "all-reduce (sum)";
  case DIST_MAX: return "all-reduce (max)";
  case DIST_BROADCAST: return "broadcast";
  case DIST_ALL_GATHER: return "all-gather";
  case DIST_BARRIER: return "barrier";
  }
  return "unknown collective";
}

static void mpi_text(int rc, char *buf, size_t size) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
  s[len] = '\0';
  snprintf(buf, size, "%s (MPI error %d)", len ? s : "unknown", rc);
}

/* Records a failure that leaves the processes out of step; every later exchange repeats it. */
static pmap_status set_broken(pmap_dist *d, pmap_status s, const char *msg) {
  d->broken = s;
  snprintf(d->broken_msg, sizeof d->broken_msg, "%s", msg);
  atomic_store(&any_broken, 1);
  return PMAP_ERR(s, "%s", msg);
}

static pmap_status check_broken(const pmap_dist *d) {
  if (!d->broken) return PMAP_SUCCESS;
  return PMAP_ERR(d->broken,
                  "process %d: an earlier inter-process exchange failed, so the "
                  "processes are out of step (destroy the context and end the job): %s",
                  d->rank, d->broken_msg);
}

/* Tests reqs[0..n) until all are done (0), the deadline passes (1) or MPI fails (-1, *rc).
 * A non-blocking collective moves only inside MPI_Test, so the wait tests continuously, yielding
 * the core between tests (another process may be waiting for it), and only after 50 ms sleeps in
 * 20 us slices: a peer that slow is likely stalled, and a sleeping waiter costs nobody a core. */
static int wait_reqs(const pmap_dist *d, int n, MPI_Request *reqs, int *rc) {
  int64_t start = pmap_now_ns();
  for (;;) {
    int pending = 0;
    for (int i = 0; i < n; i++) {
      if (reqs[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      *rc = MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
      if (*rc != MPI_SUCCESS) return -1;
      pending += !flag;
    }
    if (!pending) return 0;
    int64_t waited = pmap_now_ns() - start;
    if (d->timeout_ns >= 0 && waited >= d->timeout_ns) return 1;
    if (waited > 50000000) {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    } else {
      sched_yield();
    }
  }
}

static pmap_status mpi_failed(pmap_dist *d, int rc, const char *what) {
  char text[MPI_MAX_ERROR_STRING + 32], msg[768];
  mpi_text(rc, text, sizeof text);
  snprintf(msg, sizeof msg, "process %d: %s failed: %s", d->rank, what, text);
  return set_broken(d, PMAP_ERR_DEVICE, msg);
}

/* "1, 3" into buf: the processes whose descriptor did not arrive. */
static void missing_ranks(const pmap_dist *d, char *buf, size_t size, int *count) {
  size_t len = 0;
  *count = 0;
  buf[0] = '\0';
  for (int r = 0; r < d->size && len < size; r++)
    if (r != d->rank && d->reqs[r] != MPI_REQUEST_NULL) {
      len += (size_t)snprintf(buf + len, size - len, "%s%d", len ? ", " : "", r);
      ++*count;
    }
}

static void describe_desc(const int64_t *desc, char *buf, size_t size) {
  if (desc[1] == DIST_BARRIER)
    snprintf(buf, size, "%s (#%lld)", op_name(desc[1]), (long long)desc[0]);
  else if (desc[1] == DIST_BROADCAST)
    snprintf(buf, size, "%s of %lld from process %lld (#%lld)", op_name(desc[1]),
             (long long)desc[2], (long long)desc[3], (long long)desc[0]);
  else
    snprintf(buf, size, "%s of %lld floats (#%lld)", op_name(desc[1]), (long long)desc[2],
             (long long)desc[0]);
}

/* Every process learns what every other one is about to do; a difference fails all of them. */
static pmap_status agree(pmap_dist *d, dist_op op, size_t count, int root) {
  PMAP_TRY(check_broken(d));
  int64_t *out = d->desc_out;
  out[0] = (int64_t)++d->seq;
  out[1] = op;
  out[2] = (int64_t)count;
  out[3] = root;
  int p = d->size, rc = MPI_SUCCESS;
  for (int r = 0; r < p; r++) d->reqs[r] = d->reqs[p + r] = MPI_REQUEST_NULL;
  memcpy(d->desc_in + 4 * (size_t)d->rank, out, sizeof d->desc_out);
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != d->rank)
      rc = MPI_Irecv(d->desc_in + 4 * (size_t)r, 4, MPI_INT64_T, r, TAG_DESC, d->comm, &d->reqs[r]);
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != d->rank) rc = MPI_Isend(out, 4, MPI_INT64_T, r, TAG_DESC, d->comm, &d->reqs[p + r]);
  if (rc != MPI_SUCCESS) return mpi_failed(d, rc, "posting the exchange's descriptors");
  char what[160], msg[768];
  describe_desc(out, what, sizeof what);
  /* The receives first: a peer's descriptor is what says it arrived. */
  int w = wait_reqs(d, p, d->reqs, &rc);
  if (w == 0) w = wait_reqs(d, 2 * p, d->reqs, &rc);
  if (w < 0) return mpi_failed(d, rc, what);
  if (w > 0) {
    char who[256];
    int nmiss = 0;
    missing_ranks(d, who, sizeof who, &nmiss);
    snprintf(msg, sizeof msg,
             "process %d of %d: inter-process %s: process%s %s did not arrive within %.3f s "
             "(stalled, dead, or calling other collectives)",
             d->rank, p, what, nmiss == 1 ? "" : "es", nmiss ? who : "(unknown)",
             (double)d->timeout_ns * 1e-9);
    return set_broken(d, PMAP_ERR_TIMEOUT, msg);
  }
  int same = 1;
  for (int r = 0; r < p; r++)
    same &= !memcmp(d->desc_in + 4 * (size_t)r, d->desc_in, sizeof d->desc_out);
  if (same) return PMAP_SUCCESS;
  size_t len = (size_t)snprintf(msg, sizeof msg,
                                "process %d: the processes called different collectives (each "
                                "must call the same ones, in the same order):",
                                d->rank);
  for (int r = 0; r < p && len < sizeof msg; r++) {
    describe_desc(d->desc_in + 4 * (size_t)r, what, sizeof what);
    len +=
        (size_t)snprintf(msg + len, sizeof msg - len, "%s process %d: %s", r ? ";" : "", r, what);
  }
  /* The sequence numbers differ when one process skipped a collective: out of step for good. */
  for (int r = 0; r < p; r++)
    if (d->desc_in[4 * (size_t)r] != d->desc_in[0])
      return set_broken(d, PMAP_ERR_INVALID_ARGUMENT, msg);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s", msg);
}

static pmap_status grow(pmap_dist *d, float **buf, size_t *cap, size_t floats) {
  if (floats <= *cap) return PMAP_SUCCESS;
  float *b = realloc(*buf, floats * sizeof *b);
  if (!b)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "process %d: out of memory for %zu floats of an "
                    "inter-process exchange",
                    d->rank, floats);
  *buf = b;
  *cap = floats;
  return PMAP_SUCCESS;
}

/* Waits for one data request of an agreed exchange. */
static pmap_status finish(pmap_dist *d, int rc, MPI_Request *req, dist_op op, size_t count) {
  const char *what = op_name(op);
  if (rc != MPI_SUCCESS) return mpi_failed(d, rc, what);
  int w = wait_reqs(d, 1, req, &rc);
  if (w < 0) return mpi_failed(d, rc, what);
  if (w == 0) return PMAP_SUCCESS;
  char msg[512];
  snprintf(msg, sizeof msg,
           "process %d of %d: inter-process %s of %zu floats (#%llu) did not complete within "
           "%.3f s (every process arrived; one stalled or died during the transfer)",
           d->rank, d->size, what, count, (unsigned long long)d->seq, (double)d->timeout_ns * 1e-9);
  return set_broken(d, PMAP_ERR_TIMEOUT, msg);
}

static pmap_status check_count(const pmap_dist *d, size_t count, size_t per) {
  if (count <= (size_t)INT_MAX / per) return PMAP_SUCCESS;
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "process %d: %zu floats per process is more than one MPI call moves (%d)",
                  d->rank, count, INT_MAX / (int)per);
}

pmap_status dist_all_reduce(pmap_dist *d, float *buf, size_t count, dist_op op) {
  PMAP_TRY(agree(d, op, count, 0));
  if (!count) return PMAP_SUCCESS;
  PMAP_TRY(check_count(d, count, (size_t)d->size));
  PMAP_TRY(grow(d, &d->sbuf, &d->scap, count));
  PMAP_TRY(grow(d, &d->rbuf, &d->rcap, count * (size_t)d->size));
  memcpy(d->sbuf, buf, count * sizeof *buf);
  MPI_Request req = MPI_REQUEST_NULL;
  int rc =
      MPI_Iallgather(d->sbuf, (int)count, MPI_FLOAT, d->rbuf, (int)count, MPI_FLOAT, d->comm, &req);
  PMAP_TRY(finish(d, rc, &req, op, count));
  /* Process order, element by element: the same additions on every process. */
  memcpy(buf, d->rbuf, count * sizeof *buf);
  for (int r = 1; r < d->size; r++) {
    const float *s = d->rbuf + (size_t)r * count;
    if (op == DIST_MAX)
      for (size_t i = 0; i < count; i++) buf[i] = s[i] > buf[i] || s[i] != s[i] ? s[i] : buf[i];
    else
      for (size_t i = 0; i < count; i++) buf[i] += s[i];
  }
  return PMAP_SUCCESS;
}

pmap_status dist_broadcast(pmap_dist *d, float *buf, size_t count, int root) {
  PMAP_TRY(agree(d, DIST_BROADCAST, count, root));
  if (!count) return PMAP_SUCCESS;
  PMAP_TRY(check_count(d, count, 1));
  PMAP_TRY(grow(d, &d->sbuf, &d->scap, count));
  if (d->rank == root) memcpy(d->sbuf, buf, count * sizeof *buf);
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Ibcast(d->sbuf, (int)count, MPI_FLOAT, root, d->comm, &req);
  PMAP_TRY(finish(d, rc, &req, DIST_BROADCAST, count));
  if (d->rank != root) memcpy(buf, d->sbuf, count * sizeof *buf);
  return PMAP_SUCCESS;
}

pmap_status dist_all_gather(pmap_dist *d, const float *send, size_t count, const float **out) {
  *out = NULL;
  PMAP_TRY(agree(d, DIST_ALL_GATHER, count, 0));
  if (!count) return PMAP_SUCCESS;
  PMAP_TRY(check_count(d, count, (size_t)d->size));
  PMAP_TRY(grow(d, &d->sbuf, &d->scap, count));
  PMAP_TRY(grow(d, &d->rbuf, &d->rcap, count * (size_t)d->size));
  memcpy(d->sbuf, send, count * sizeof *send);
  MPI_Request req = MPI_REQUEST_NULL;
  int rc =
      MPI_Iallgather(d->sbuf, (int)count, MPI_FLOAT, d->rbuf, (int)count, MPI_FLOAT, d->comm, &req);
  PMAP_TRY(finish(d, rc, &req, DIST_ALL_GATHER, count));
  *out = d->rbuf;
  return PMAP_SUCCESS;
}

/* Every process has received every other's descriptor: all of them arrived. */
pmap_status dist_barrier(pmap_dist *d) { return agree(d, DIST_BARRIER, 0, 0); }

pmap_status dist_broadcast_bytes(pmap_dist *d, void *buf, size_t bytes, int root) {
  PMAP_TRY(agree(d, DIST_BROADCAST, bytes, root));
  if (!bytes) return PMAP_SUCCESS;
  PMAP_TRY(check_count(d, bytes, 1));
  PMAP_TRY(grow(d, &d->sbuf, &d->scap, (bytes + sizeof(float) - 1) / sizeof(float)));
  if (d->rank == root) memcpy(d->sbuf, buf, bytes);
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Ibcast(d->sbuf, (int)bytes, MPI_BYTE, root, d->comm, &req);
  PMAP_TRY(finish(d, rc, &req, DIST_BROADCAST, bytes));
  if (d->rank != root) memcpy(buf, d->sbuf, bytes);
  return PMAP_SUCCESS;
}

int dist_broken(const pmap_dist *d) { return d && d->broken; }
int dist_rank(const pmap_dist *d) { return d ? d->rank : 0; }

/* MPI_Init_thread unless the program (or an earlier context) did; SERIALIZED at least, since
 * device 0's thread of each context does the exchanges and that is whichever thread calls. */
static pmap_status ensure_init(void) {
  pthread_mutex_lock(&init_lock);
  int inited = 0, fin = 0, provided = 0, rc = MPI_SUCCESS;
  pmap_status st = PMAP_SUCCESS;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (fin) {
    st = PMAP_ERR(PMAP_ERR_UNAVAILABLE, "pmap_ctx_create: MPI is already finalised");
  } else if (!inited) {
    rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc == MPI_SUCCESS) {
      initialised_here = 1;
      atexit(finalize_at_exit);
    }
  } else {
    rc = MPI_Query_thread(&provided);
  }
  if (!st && rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING + 32];
    mpi_text(rc, text, sizeof text);
    st = PMAP_ERR(PMAP_ERR_UNAVAILABLE, "pmap_ctx_create: MPI initialisation failed: %s", text);
  } else if (!st && provided < MPI_THREAD_SERIALIZED) {
    st = PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                  "pmap_ctx_create: MPI runs at thread level %d; pmap needs "
                  "MPI_THREAD_SERIALIZED (%d) or higher (use MPI_Init_thread)",
                  provided, MPI_THREAD_SERIALIZED);
  }
  pthread_mutex_unlock(&init_lock);
  return st;
}

/* Whether PMAP_DIST_AUTO means more than one process here. */
static int auto_spans(void) {
  if (dist_env_launch_size(NULL) > 1) return 1;
  int inited = 0, fin = 0, size = 1;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  if (inited && !fin) MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size > 1;
}

static void free_dist(pmap_dist *d) {
  free(d->desc_in);
  free(d->reqs);
  free(d->sbuf);
  free(d->rbuf);
  free(d);
}

/* Every process checks that the others have its backend and local device count. */
static pmap_status check_layout(pmap_dist *d, pmap_backend kind, int local_devices) {
  int p = d->size, rc;
  int64_t *all = calloc(2 * (size_t)p, sizeof *all);
  if (!all) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory");
  int64_t *mine = d->desc_out;
  mine[0] = local_devices;
  mine[1] = kind;
  MPI_Request req = MPI_REQUEST_NULL;
  rc = MPI_Iallgather(mine, 2, MPI_INT64_T, all, 2, MPI_INT64_T, d->comm, &req);
  pmap_status st = PMAP_SUCCESS;
  if (rc == MPI_SUCCESS && wait_reqs(d, 1, &req, &rc) > 0) {
    char msg[256];
    snprintf(msg, sizeof msg,
             "pmap_ctx_create: process %d of %d: not every process created its "
             "context within %.3f s",
             d->rank, p, (double)d->timeout_ns * 1e-9);
    st = set_broken(d, PMAP_ERR_TIMEOUT, msg);
    return st; /* `all` stays: MPI may still write into it */
  }
  if (rc != MPI_SUCCESS) st = mpi_failed(d, rc, "pmap_ctx_create: exchanging the device counts");
  for (int r = 1; r < p && !st; r++)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: process %d has %lld devices on backend %s, process 0 has "
                    "%lld on %s: every process must create its context with the same backend "
                    "and device count",
                    r, (long long)all[2 * r], pmap_backend_name((pmap_backend)all[2 * r + 1]),
                    (long long)all[0], pmap_backend_name((pmap_backend)all[1]));
  if (!d->broken) free(all);
  return st;
}

pmap_status dist_open(const pmap_config *cfg, pmap_backend kind, int local_devices,
                      int64_t timeout_ns, pmap_dist **out, int *rank, int *size) {
  *out = NULL;
  *rank = 0;
  *size = 1;
  pmap_dist_mode mode;
  PMAP_TRY(dist_env_mode(cfg, &mode));
  if (mode == PMAP_DIST_NONE || (mode == PMAP_DIST_AUTO && !auto_spans())) return PMAP_SUCCESS;
  PMAP_TRY(ensure_init());
  MPI_Comm user = cfg->mpi_comm ? *(const MPI_Comm *)cfg->mpi_comm : MPI_COMM_WORLD;
  pmap_dist *d = calloc(1, sizeof *d);
  if (!d) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory");
  d->timeout_ns = timeout_ns;
  d->comm = MPI_COMM_NULL;
  MPI_Comm_rank(user, &d->rank);
  /* Duplicating is collective; non-blocking so that a missing process is a timeout. */
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Comm_idup(user, &d->comm, &req);
  if (rc == MPI_SUCCESS) {
    int w = wait_reqs(d, 1, &req, &rc);
    if (w > 0) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "pmap_ctx_create: process %d: not every process of the "
               "communicator created its context within %.3f s",
               d->rank, (double)timeout_ns * 1e-9);
      return set_broken(d, PMAP_ERR_TIMEOUT, msg); /* d stays: MPI may still write into it */
    }
  }
  if (rc != MPI_SUCCESS) {
    pmap_status st = mpi_failed(d, rc, "pmap_ctx_create: MPI_Comm_idup");
    return st;
  }
  MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(d->comm, &d->rank);
  MPI_Comm_size(d->comm, &d->size);
  d->desc_in = calloc(4 * (size_t)d->size, sizeof *d->desc_in);
  d->reqs = calloc(2 * (size_t)d->size, sizeof *d->reqs);
  pmap_status st = PMAP_SUCCESS;
  if (!d->desc_in || !d->reqs)
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory for %d processes",
                  d->size);
  if (!st) st = check_layout(d, kind, local_devices);
  if (st) {
    dist_close(d);
    return st;
  }
  *out = d;
  *rank = d->rank;
  *size = d->size;
  return PMAP_SUCCESS;
}

void dist_close(pmap_dist *d) {
  if (!d || d->broken) return; /* requests may still be pending on its memory: keep it */
  if (d->comm != MPI_COMM_NULL) MPI_Comm_free(&d->comm);
  free_dist(d);
}
