/* dist_mpi.c: the exchanges of the MPI transport. Every collective first agrees on what it is:
 * each process sends its descriptor (sequence number, call, count, root, element type) to every
 * other and waits for theirs, so a process that stalled, died, left or called something else is
 * named instead of waited for. The data then moves point to point (each process's part to every
 * other, or the root's to every other), so that in every state of an exchange the processes a
 * wait is still waiting for are known and named. Every wait is MPI_Test against the deadline;
 * errors are returned (MPI_ERRORS_RETURN on pmap's communicator). Sums add the processes' parts
 * in process order, so every process gets bitwise the same result. */
#include <limits.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist_mpi.h"
#include "base/error.h"
#include "runtime/sync.h"

void dist_mpi_text(int rc, char *buf, size_t size) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
  s[len] = '\0';
  snprintf(buf, size, "%s (MPI error %d)", len ? s : "unknown", rc);
}

/* Whether an exchange of this process failed: the exit handler then leaves MPI unfinalised. */
static _Atomic int any_broken;

void dist_broken_mark(void) { atomic_store(&any_broken, 1); }

int dist_broken_any(void) { return atomic_load(&any_broken); }

void dist_send_notes(pmap_dist *d, pmap_status s, int reason, const char *text) {
  if (s) dist_broken_mark();
  if (d->note_sent || !d->note_sends) return;
  d->note_sent = 1;
  leave_note *n = &d->note_out;
  memset(n, 0, sizeof *n);
  n->nonce = d->nonce;
  n->status = s;
  n->reason = reason;
  n->seq = (int64_t)atomic_load(&d->seq);
  snprintf(n->text, sizeof n->text, "%s", text);
  for (int r = 0; r < d->size; r++)
    if (r != d->rank)
      MPI_Isend(n, (int)sizeof *n, MPI_BYTE, r, TAG_LEAVE, d->comm, &d->note_sends[r]);
}

void dist_proc_name(const pmap_dist *d, int r, char *buf, size_t size) {
  int D = d->local_devices, g = r * D;
  if (D == 1)
    snprintf(buf, size, "process %d (host %s, device %d)", r, dist_host(d, r), g);
  else
    snprintf(buf, size, "process %d (host %s, devices %d-%d)", r, dist_host(d, r), g, g + D - 1);
}

void dist_abandon(pmap_dist *d, pmap_status s, const char *msg) {
  if (!d || d->broken) return;
  d->broken = s;
  size_t len = strlen(msg);
  if (len >= sizeof d->broken_msg) len = sizeof d->broken_msg - 1;
  memcpy(d->broken_msg, msg, len);
  d->broken_msg[len] = '\0';
  dist_send_notes(d, s, LEAVE_BROKEN, msg);
}

pmap_status dist_set_broken(pmap_dist *d, pmap_status s, const char *msg) {
  dist_abandon(d, s, msg);
  return PMAP_ERR(s, "%s", msg);
}

static pmap_status check_broken(const pmap_dist *d) {
  if (!d->broken) return PMAP_SUCCESS;
  return PMAP_ERR(d->broken,
                  "process %d: an earlier inter-process exchange failed, so the processes are "
                  "out of step (destroy the context and end the job): %s",
                  d->rank, d->broken_msg);
}

/* Whether process r's leave notice has arrived (a notice of another context is dropped and the
 * receive posted again). */
int dist_has_left(pmap_dist *d, int r) {
  if (d->left[r]) return 1;
  if (d->note_reqs[r] == MPI_REQUEST_NULL) return 0;
  int flag = 0;
  if (MPI_Test(&d->note_reqs[r], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) return 0;
  if (d->notes[r].nonce == d->nonce) return d->left[r] = 1;
  MPI_Irecv(&d->notes[r], (int)sizeof d->notes[r], MPI_BYTE, r, TAG_LEAVE, d->comm,
            &d->note_reqs[r]);
  return 0;
}

/* Tests every request once; the number still pending, or -1 when MPI failed (*rc). */
static int test_all(int n, MPI_Request *reqs, int *rc) {
  int pending = 0;
  for (int i = 0; i < n; i++) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    int flag = 0;
    *rc = MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
    if (*rc != MPI_SUCCESS) return -1;
    pending += !flag;
  }
  return pending;
}

/* A process whose notice arrived and that a request still waits for after one more test (its
 * last messages precede its notice, so they are complete by then if they were sent), or -1. */
static int gone_peer(pmap_dist *d, int n, MPI_Request *reqs, const int *peer, int *rc,
                     int *failed) {
  if (!d->note_reqs) return -1;
  for (int i = 0; i < n; i++) {
    if (reqs[i] == MPI_REQUEST_NULL || !dist_has_left(d, peer[i])) continue;
    if (test_all(n, reqs, rc) < 0) {
      *failed = 1;
      return -1;
    }
    for (int j = 0; j < n; j++)
      if (reqs[j] != MPI_REQUEST_NULL && peer[j] == peer[i]) return peer[i];
  }
  return -1;
}

/* A non-blocking exchange moves only inside MPI_Test, so the wait tests continuously, yielding
 * the core between tests (another process may be waiting for it), and after 50 ms sleeps in
 * 20 us slices: a peer that slow is likely stalled, and a sleeping waiter costs nobody a core. */
int dist_wait(pmap_dist *d, int n, MPI_Request *reqs, const int *peer, int64_t deadline, int *rc,
              int *who) {
  int64_t start = pmap_now_ns();
  for (int round = 0;; round++) {
    int pending = test_all(n, reqs, rc);
    if (pending < 0) return WAIT_MPI;
    if (!pending) return WAIT_DONE;
    if ((round & 15) == 15) {
      int failed = 0;
      *who = gone_peer(d, n, reqs, peer, rc, &failed);
      if (failed) return WAIT_MPI;
      if (*who >= 0) return WAIT_GONE;
    }
    int64_t now = pmap_now_ns();
    if (deadline >= 0 && now >= deadline) return WAIT_LATE;
    if (now - start > 50000000) {
      struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    } else {
      sched_yield();
    }
  }
}

static int64_t deadline_of(const pmap_dist *d) {
  return d->timeout_ns < 0 ? -1 : pmap_now_ns() + d->timeout_ns;
}

/* "process 1 (host b, devices 2-3), process 2 (...)": the processes whose request is pending. */
static void pending_names(const pmap_dist *d, int n, const MPI_Request *reqs, const int *peer,
                          char *buf, size_t size, int *count) {
  size_t len = 0;
  *count = 0;
  buf[0] = '\0';
  for (int r = 0; r < d->size && len < size; r++) {
    int waits = 0;
    for (int i = 0; i < n; i++) waits |= reqs[i] != MPI_REQUEST_NULL && peer[i] == r;
    if (!waits) continue;
    char name[160];
    dist_proc_name(d, r, name, sizeof name);
    len += (size_t)snprintf(buf + len, size - len, "%s%s", *count ? ", " : "", name);
    ++*count;
  }
}

/* The message of a wait that did not end well, recorded as the transport's failure. */
static pmap_status wait_failed(pmap_dist *d, int w, int rc, int who, int n, const char *who_am_i,
                               const char *stage) {
  char msg[768], names[400];
  unsigned long long seq = (unsigned long long)dist_seq(d);
  if (w == WAIT_MPI) {
    char text[MPI_MAX_ERROR_STRING + 32];
    dist_mpi_text(rc, text, sizeof text);
    snprintf(msg, sizeof msg, "%s: collective #%llu: MPI failed %s: %s", who_am_i, seq, stage,
             text);
    return dist_set_broken(d, PMAP_ERR_DEVICE, msg);
  }
  if (w == WAIT_GONE) {
    const leave_note *note = &d->notes[who];
    dist_proc_name(d, who, names, sizeof names);
    const char *why = note->reason == LEAVE_CLOSED ? "destroyed its context"
                      : note->reason == LEAVE_EXIT ? "ended with its context open"
                                                   : "gave up";
    snprintf(msg, sizeof msg, "%s: collective #%llu: %s %s after %lld collectives%s%.400s",
             who_am_i, seq, names, why, (long long)note->seq,
             note->reason == LEAVE_BROKEN ? ": " : "",
             note->reason == LEAVE_BROKEN ? note->text : "");
    pmap_status s =
        note->reason == LEAVE_BROKEN && note->status ? (pmap_status)note->status : PMAP_ERR_ABORTED;
    return dist_set_broken(d, s, msg);
  }
  int count = 0;
  pending_names(d, n, d->reqs, d->peer, names, sizeof names, &count);
  snprintf(msg, sizeof msg, "%s: collective #%llu: %s %s within %.3f s", who_am_i, seq,
           count ? names : "(no process)", stage, (double)d->timeout_ns * 1e-9);
  return dist_set_broken(d, PMAP_ERR_TIMEOUT, msg);
}

/* "pmap_broadcast(count 5, root 3)" into buf. */
static void describe(const dist_desc *x, char *buf, size_t size) {
  static const char *const types[] = {"", ", bytes", ", int64"};
  const char *t = x->dtype == DIST_BYTES ? types[1] : x->dtype == DIST_I64 ? types[2] : types[0];
  if (x->dtype == DIST_DEVICES_DIFFER)
    snprintf(buf, size, "its own devices called different collectives (%s)", x->call);
  else if (x->dtype == DIST_JOB_END)
    snprintf(buf, size, "returned from its mapped function%s", x->failed ? " (failed)" : "");
  else if (!strcmp(x->call, "pmap_barrier"))
    snprintf(buf, size, "%s", x->call);
  else if (!strcmp(x->call, "pmap_broadcast"))
    snprintf(buf, size, "%s(count %lld, root %lld%s)", x->call, (long long)x->count,
             (long long)x->root, t);
  else
    snprintf(buf, size, "%s(count %lld%s)", x->call, (long long)x->count, t);
}

/* The list of what every process called, alike on every process. */
static pmap_status mismatch(pmap_dist *d, const char *who_am_i) {
  char msg[1024], what[200], name[160];
  unsigned long long seq = (unsigned long long)dist_seq(d);
  size_t len = (size_t)snprintf(msg, sizeof msg,
                                "%s: the devices called different collectives (each must call the "
                                "same ones, in the same order, with the same count and root): ",
                                who_am_i);
  for (int r = 0; r < d->size && len < sizeof msg; r++) {
    describe(&d->in[r], what, sizeof what);
    if (d->in[r].seq != (int64_t)seq)
      snprintf(what + strlen(what), sizeof what - strlen(what), " as collective #%lld",
               (long long)d->in[r].seq);
    dist_proc_name(d, r, name, sizeof name);
    len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s: %s", r ? "; " : "", name, what);
  }
  /* Different sequence numbers: a process skipped a collective, out of step for good. */
  for (int r = 0; r < d->size; r++)
    if (d->in[r].seq != (int64_t)seq) return dist_set_broken(d, PMAP_ERR_INVALID_ARGUMENT, msg);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%s", msg);
}

/* Two descriptors of one exchange: failed and meets are what the process is in, not what it
 * calls. */
static int same_desc(const dist_desc *a, const dist_desc *b) {
  return a->seq == b->seq && a->count == b->count && a->root == b->root && a->dtype == b->dtype &&
         !memcmp(a->call, b->call, sizeof a->call);
}

/* This process's descriptor to every other and theirs into d->in: the exchange is agreed once
 * they are all the same. */
static pmap_status exchange_desc(pmap_dist *d, const dist_call *c, const char *who) {
  PMAP_TRY(check_broken(d));
  uint64_t seq = atomic_fetch_add(&d->seq, 1) + 1;
  dist_desc *m = &d->mine;
  memset(m, 0, sizeof *m);
  m->seq = (int64_t)seq;
  m->count = (int64_t)c->count;
  m->root = c->root;
  m->dtype = c->dtype;
  m->failed = c->failed;
  m->meets = c->meets;
  snprintf(m->call, sizeof m->call, "%s", c->call);
  int p = d->size, rc = MPI_SUCCESS, n = 0;
  d->in[d->rank] = *m;
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != d->rank) {
      d->peer[n] = r;
      rc = MPI_Irecv(&d->in[r], (int)sizeof *m, MPI_BYTE, r, TAG_DESC, d->comm, &d->reqs[n++]);
    }
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != d->rank) {
      d->peer[n] = r;
      rc = MPI_Isend(m, (int)sizeof *m, MPI_BYTE, r, TAG_DESC, d->comm, &d->reqs[n++]);
    }
  if (rc != MPI_SUCCESS) return wait_failed(d, WAIT_MPI, rc, -1, n, who, "posting descriptors");
  /* The receives first: a peer's descriptor is what says it arrived. */
  int who_r = -1, recvs = p - 1;
  int w = dist_wait(d, recvs, d->reqs, d->peer, deadline_of(d), &rc, &who_r);
  if (w == WAIT_DONE) w = dist_wait(d, n, d->reqs, d->peer, deadline_of(d), &rc, &who_r);
  if (w != WAIT_DONE)
    return wait_failed(d, w, rc, who_r, n, who,
                       "did not arrive (stalled, dead, or calling other collectives)");
  return PMAP_SUCCESS;
}

/* "process 1 (host b, device 1), process 2 (...)": the processes whose descriptor is the end of
 * a mapped function (failed ones only, when failed); returns how many. */
static int ended_names(const pmap_dist *d, int failed, char *buf, size_t size) {
  size_t len = 0;
  int count = 0;
  buf[0] = '\0';
  for (int r = 0; r < d->size && len < size; r++) {
    if (d->in[r].dtype != DIST_JOB_END || (failed && !d->in[r].failed)) continue;
    char name[160];
    dist_proc_name(d, r, name, sizeof name);
    len += (size_t)snprintf(buf + len, size - len, "%s%s", count++ ? ", " : "", name);
  }
  return count;
}

/* This process's exchange met the end of another process's mapped function: that process will
 * not call it. The numbers agree, so the processes stay in step. */
static pmap_status met_an_end(pmap_dist *d, const char *who) {
  char names[400];
  unsigned long long seq = (unsigned long long)dist_seq(d);
  int count = ended_names(d, 1, names, sizeof names);
  if (count)
    return PMAP_ERR(PMAP_ERR_ABORTED,
                    "%s: collective #%llu abandoned: %s returned from %s mapped function after "
                    "a failure instead of calling it",
                    who, seq, names, count > 1 ? "their" : "its");
  count = ended_names(d, 0, names, sizeof names);
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: collective #%llu: %s returned from %s mapped function without calling it "
                  "(every device must call the same collectives, and every process make the same "
                  "pmap calls, in the same order)",
                  who, seq, names, count > 1 ? "their" : "its");
}

pmap_status dist_agree(pmap_dist *d, const dist_call *c, const char *who) {
  PMAP_TRY(exchange_desc(d, c, who));
  int same = 1, in_step = 1, ended = 0;
  for (int r = 0; r < d->size; r++) {
    same &= same_desc(&d->in[r], &d->mine);
    in_step &= d->in[r].seq == d->mine.seq;
    ended |= d->in[r].dtype == DIST_JOB_END;
  }
  if (same) return PMAP_SUCCESS;
  if (in_step && ended) return met_an_end(d, who);
  int others = 0;
  for (int r = 0; r < d->size; r++) others |= r != d->rank && d->in[r].meets;
  if (in_step && !others) d->alone_seq = (uint64_t)d->mine.seq;
  return mismatch(d, who);
}

/* The outcome every process reports: the first own failure, else the first failure. */
static void choose_outcome(const pmap_dist *d, const dist_outcome *all, dist_outcome *io) {
  int pick = -1;
  for (int r = 0; r < d->size; r++)
    if (all[r].status && (pick < 0 || (all[r].own && !all[pick].own))) pick = r;
  if (pick >= 0) *io = all[pick];
}

pmap_status dist_end_job(pmap_dist *d, dist_outcome *io, const char *who) {
  for (;;) {
    dist_call c = {"the end of a mapped function", 0, 0, DIST_JOB_END, io->status != 0, 0};
    PMAP_TRY(exchange_desc(d, &c, who));
    int in_step = 1, all_end = 1, meets = 0, other = -1;
    for (int r = 0; r < d->size; r++) {
      in_step &= d->in[r].seq == d->mine.seq;
      if (d->in[r].dtype == DIST_JOB_END) continue;
      all_end = 0;
      meets |= d->in[r].meets != 0;
      if (other < 0) other = r;
    }
    if (!in_step) return mismatch(d, who);
    if (all_end) break;
    /* A process still calls something: its call fails on meeting this end. Unless this
     * process's function failed already, that is a failure of its own. */
    if (!io->status) {
      char what[200], name[160];
      describe(&d->in[other], what, sizeof what);
      dist_proc_name(d, other, name, sizeof name);
      io->status = PMAP_ERR_INVALID_ARGUMENT;
      io->own = 1;
      snprintf(io->text, sizeof io->text,
               "%s: collective #%llu: %s called %s, but the devices of this process returned "
               "from the mapped function without calling it (every device must call the same "
               "collectives, and every process make the same pmap calls, in the same order)",
               who, (unsigned long long)d->mine.seq, name, what);
    }
    /* A process in a mapped function comes to its end next: meet it there. */
    if (!meets) return PMAP_SUCCESS;
  }
  int failed = 0;
  for (int r = 0; r < d->size; r++) failed |= d->in[r].failed != 0;
  if (!failed) return PMAP_SUCCESS;
  /* Every process knows from the descriptors that one failed: they all gather the outcomes. */
  const void *all = NULL;
  PMAP_TRY(dist_all_gather(d, io, sizeof *io, &all));
  choose_outcome(d, all, io);
  return PMAP_SUCCESS;
}

static pmap_status grow(pmap_dist *d, unsigned char **buf, size_t *cap, size_t bytes) {
  if (bytes <= *cap) return PMAP_SUCCESS;
  unsigned char *b = realloc(*buf, bytes);
  if (!b)
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "process %d: out of memory for %zu bytes of an inter-process exchange", d->rank,
                    bytes);
  *buf = b;
  *cap = bytes;
  return PMAP_SUCCESS;
}

static pmap_status check_bytes(const pmap_dist *d, size_t bytes, size_t per) {
  if (bytes <= (size_t)INT_MAX && bytes <= SIZE_MAX / per) return PMAP_SUCCESS;
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "process %d: %zu bytes per process is more than one MPI message moves (%d)",
                  d->rank, bytes, INT_MAX);
}

/* Every process's bytes to every other: rbuf (P, bytes) in process order, this process's part
 * from sbuf. */
static pmap_status gather_parts(pmap_dist *d, size_t bytes, const char *who) {
  int p = d->size, rc = MPI_SUCCESS, n = 0;
  memcpy(d->rbuf + (size_t)d->rank * bytes, d->sbuf, bytes);
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != d->rank) {
      d->peer[n] = r;
      rc = MPI_Irecv(d->rbuf + (size_t)r * bytes, (int)bytes, MPI_BYTE, r, TAG_DATA, d->comm,
                     &d->reqs[n++]);
    }
  for (int r = 0; r < p && rc == MPI_SUCCESS; r++)
    if (r != d->rank) {
      d->peer[n] = r;
      rc = MPI_Isend(d->sbuf, (int)bytes, MPI_BYTE, r, TAG_DATA, d->comm, &d->reqs[n++]);
    }
  int who_r = -1, w = rc == MPI_SUCCESS ? WAIT_DONE : WAIT_MPI;
  if (w == WAIT_DONE) w = dist_wait(d, n, d->reqs, d->peer, deadline_of(d), &rc, &who_r);
  if (w == WAIT_DONE) return PMAP_SUCCESS;
  return wait_failed(d, w, rc, who_r, n, who,
                     "stalled or died during the transfer (its part, or its receipt of this "
                     "process's part, did not complete)");
}

static const char *data_who(const pmap_dist *d, char *buf, size_t size) {
  snprintf(buf, size, "process %d of %d (host %s): inter-process %s", d->rank, d->size,
           dist_host(d, d->rank), d->mine.call);
  return buf;
}

pmap_status dist_all_reduce(pmap_dist *d, float *buf, size_t count, int max) {
  PMAP_TRY(check_broken(d));
  if (!count) return PMAP_SUCCESS;
  size_t bytes = count * sizeof *buf;
  PMAP_TRY(check_bytes(d, bytes, (size_t)d->size));
  PMAP_TRY(grow(d, &d->sbuf, &d->scap, bytes));
  PMAP_TRY(grow(d, &d->rbuf, &d->rcap, bytes * (size_t)d->size));
  memcpy(d->sbuf, buf, bytes);
  char who[256];
  PMAP_TRY(gather_parts(d, bytes, data_who(d, who, sizeof who)));
  /* Process order, element by element: the same additions on every process. */
  const float *all = (const float *)d->rbuf;
  memcpy(buf, all, bytes);
  for (int r = 1; r < d->size; r++) {
    const float *s = all + (size_t)r * count;
    if (max)
      for (size_t i = 0; i < count; i++) buf[i] = s[i] > buf[i] || s[i] != s[i] ? s[i] : buf[i];
    else
      for (size_t i = 0; i < count; i++) buf[i] += s[i];
  }
  return PMAP_SUCCESS;
}

pmap_status dist_all_gather(pmap_dist *d, const void *send, size_t bytes, const void **out) {
  *out = NULL;
  PMAP_TRY(check_broken(d));
  if (!bytes) return PMAP_SUCCESS;
  PMAP_TRY(check_bytes(d, bytes, (size_t)d->size));
  PMAP_TRY(grow(d, &d->sbuf, &d->scap, bytes));
  PMAP_TRY(grow(d, &d->rbuf, &d->rcap, bytes * (size_t)d->size));
  memcpy(d->sbuf, send, bytes);
  char who[256];
  PMAP_TRY(gather_parts(d, bytes, data_who(d, who, sizeof who)));
  *out = d->rbuf;
  return PMAP_SUCCESS;
}

pmap_status dist_broadcast(pmap_dist *d, void *buf, size_t bytes, int root) {
  PMAP_TRY(check_broken(d));
  if (!bytes) return PMAP_SUCCESS;
  PMAP_TRY(check_bytes(d, bytes, 1));
  PMAP_TRY(grow(d, &d->sbuf, &d->scap, bytes));
  int rc = MPI_SUCCESS, n = 0;
  if (d->rank == root) {
    memcpy(d->sbuf, buf, bytes);
    for (int r = 0; r < d->size && rc == MPI_SUCCESS; r++)
      if (r != root) {
        d->peer[n] = r;
        rc = MPI_Isend(d->sbuf, (int)bytes, MPI_BYTE, r, TAG_DATA, d->comm, &d->reqs[n++]);
      }
  } else {
    d->peer[n] = root;
    rc = MPI_Irecv(d->sbuf, (int)bytes, MPI_BYTE, root, TAG_DATA, d->comm, &d->reqs[n++]);
  }
  char who[256];
  data_who(d, who, sizeof who);
  int who_r = -1, w = rc == MPI_SUCCESS ? WAIT_DONE : WAIT_MPI;
  if (w == WAIT_DONE) w = dist_wait(d, n, d->reqs, d->peer, deadline_of(d), &rc, &who_r);
  if (w != WAIT_DONE)
    return wait_failed(d, w, rc, who_r, n, who,
                       "stalled or died during the broadcast (its part, or its receipt of this "
                       "process's part, did not complete)");
  if (d->rank != root) memcpy(buf, d->sbuf, bytes);
  return PMAP_SUCCESS;
}

static const char *host_who(const pmap_dist *d, const char *call, char *buf, size_t size) {
  snprintf(buf, size, "%s on process %d of %d (host %s)", call, d->rank, d->size,
           dist_host(d, d->rank));
  return buf;
}

pmap_status dist_exchange(pmap_dist *d, const char *call, const void *mine, size_t bytes,
                          const void **all) {
  char who[256];
  dist_call c = {call, bytes, 0, DIST_BYTES, 0, 0};
  PMAP_TRY(dist_agree(d, &c, host_who(d, call, who, sizeof who)));
  return dist_all_gather(d, mine, bytes, all);
}

pmap_status dist_broadcast_bytes(pmap_dist *d, void *buf, size_t bytes, int root) {
  char who[256];
  dist_call c = {"broadcast of bytes", bytes, root, DIST_BYTES, 0, 0};
  PMAP_TRY(dist_agree(d, &c, host_who(d, c.call, who, sizeof who)));
  return dist_broadcast(d, buf, bytes, root);
}

int dist_broken(const pmap_dist *d) { return d && d->broken; }
uint64_t dist_alone_seq(const pmap_dist *d) { return d ? d->alone_seq : 0; }
int dist_rank(const pmap_dist *d) { return d ? d->rank : 0; }
int dist_size(const pmap_dist *d) { return d ? d->size : 1; }
uint64_t dist_seq(const pmap_dist *d) { return d ? atomic_load(&d->seq) : 0; }
const char *dist_host(const pmap_dist *d, int r) {
  return d && d->hosts && r >= 0 && r < d->size && d->hosts[r][0] ? d->hosts[r] : "?";
}
