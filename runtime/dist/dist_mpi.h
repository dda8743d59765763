/* dist_mpi.h: the inside of the MPI transport (in the MPI plugin, libpmap-mpi.so, whose door is
 * dist_plugin.c), shared by its two files: dist_mpi_open.c (MPI's
 * start, the meeting of the processes at creation, leave notices, closing and the exit handler)
 * and dist_mpi.c (the exchanges). */
#ifndef PMAP_RUNTIME_DIST_MPI_H
#define PMAP_RUNTIME_DIST_MPI_H

#include <mpi.h>
#include <stdatomic.h>

#include "dist.h"

#define DIST_HOST_LEN 64
#define DIST_CALL_LEN 96

/* Tags on pmap's duplicate of the communicator. */
enum { TAG_DESC = 1, TAG_DATA = 2, TAG_LEAVE = 3 };

/* What a process is about to call (dist_call), as it travels: 144 bytes, compared field by
 * field but for failed and meets. */
typedef struct dist_desc {
  int64_t seq, count, root, dtype;
  int64_t failed, meets;
  char call[DIST_CALL_LEN]; /* zero-padded */
} dist_desc;

/* Why a process stops taking part. */
enum { LEAVE_CLOSED = 1, LEAVE_EXIT = 2, LEAVE_BROKEN = 3 };

/* A leave notice: sent to every other process when this one destroys its context, ends with it
 * still open, or gives up on an exchange, so that a process waiting for it stops at once and
 * says why. nonce tells this context's notices from those of an earlier communicator that MPI
 * may have given the same internal id. */
typedef struct leave_note {
  uint64_t nonce;
  int64_t status; /* the pmap_status the waiting processes return */
  int64_t reason; /* LEAVE_* */
  int64_t seq;    /* exchanges the leaving process had agreed */
  char text[480]; /* its failure's message (LEAVE_BROKEN) */
} leave_note;

struct pmap_dist {
  MPI_Comm comm; /* pmap's duplicate of the user's communicator */
  int rank, size, local_devices;
  int64_t timeout_ns;   /* < 0: never */
  _Atomic uint64_t seq; /* exchanges agreed so far */
  uint64_t alone_seq;   /* dist_alone_seq */
  uint64_t nonce;       /* process 0's, the same on every process */
  pmap_status broken;   /* the first failure that left the processes out of step */
  char broken_msg[768];
  char (*hosts)[DIST_HOST_LEN]; /* (size) */
  dist_desc mine;
  dist_desc *in;          /* (size) every process's descriptor */
  MPI_Request *reqs;      /* (2 size) the requests of one wait */
  int *peer;              /* (2 size) the process each of them concerns */
  leave_note *notes;      /* (size) received notices */
  MPI_Request *note_reqs; /* (size) their receives (MPI_REQUEST_NULL once one arrived) */
  int *left;              /* (size) 1 once process r's notice arrived */
  leave_note note_out;
  MPI_Request *note_sends; /* (size) */
  int note_sent;
  unsigned char *sbuf, *rbuf; /* this process's bytes (scap), every process's (rcap) */
  size_t scap, rcap;
  struct pmap_dist *next; /* the open transports (for the exit handler) */
};

/* Outcomes of dist_wait. */
enum { WAIT_DONE = 0, WAIT_LATE = 1, WAIT_MPI = 2, WAIT_GONE = 3 };

/* Tests reqs[0..n) (request i concerns process peer[i]) until every one is done (WAIT_DONE),
 * pmap_now_ns() passes deadline (WAIT_LATE; deadline < 0: never), MPI fails (WAIT_MPI, *rc),
 * or a process that a pending request concerns has sent its leave notice (WAIT_GONE, *who).
 * Without notices (d->note_reqs NULL) only the first three. */
int dist_wait(pmap_dist *d, int n, MPI_Request *reqs, const int *peer, int64_t deadline, int *rc,
              int *who);
/* Whether process r's leave notice has arrived. */
int dist_has_left(pmap_dist *d, int r);
/* "process 1 (host b, devices 2-3)" into buf. */
void dist_proc_name(const pmap_dist *d, int r, char *buf, size_t size);
/* MPI's text for rc. */
void dist_mpi_text(int rc, char *buf, size_t size);
/* Records a failure that leaves the processes out of step (every later exchange repeats it),
 * tells the other processes (a LEAVE_BROKEN notice carrying msg), and returns s with msg. */
pmap_status dist_set_broken(pmap_dist *d, pmap_status s, const char *msg);
/* An exchange of this process failed (marked) / whether one did: MPI is then left unfinalised at
 * exit (dist_mpi_open.c). */
void dist_broken_mark(void);
int dist_broken_any(void);
/* Sends this process's leave notice to every other process, once. */
void dist_send_notes(pmap_dist *d, pmap_status s, int reason, const char *text);

#endif
