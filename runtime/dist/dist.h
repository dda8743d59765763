/* dist.h: the inter-process transport under the collectives (P processes x D local devices).
 * Local device 0 of each process calls these for its process (or the calling thread, outside a
 * job, for the host exchanges); every wait is bounded by the context's timeout and names the
 * process it waits for. The runtime's dist.c implements them: one process by itself, or, once a
 * context spans processes, the MPI transport of the MPI plugin (libpmap-mpi.so: dist_mpi*.c,
 * which implement the same functions inside it, given to dist.c as a pmap_dist_i). */
#ifndef PMAP_RUNTIME_DIST_H
#define PMAP_RUNTIME_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "base/plugin.h"
#include "pmap.h"

typedef struct pmap_dist pmap_dist;

/* The element type of an exchange: part of what the processes agree on. */
typedef enum dist_dtype {
  DIST_F32 = 0,
  DIST_I64 = 1,
  DIST_BYTES = 2,
  DIST_DEVICES_DIFFER = 3, /* not an exchange: the process's own devices called different
                              collectives (call: what each called), so every process fails */
  DIST_JOB_END = 4,        /* not an exchange: the devices of the process returned from a mapped
                              function (dist_end_job) */
} dist_dtype;

/* What a collective is, exactly as the devices of one process compare it at their rendezvous
 * (runtime/backend.c): the call's name, its count (elements of dtype), its root (broadcast: the
 * global root device; a reduction: its operation). */
typedef struct dist_call {
  const char *call;
  size_t count;
  int root;
  dist_dtype dtype;
  /* Not compared, for the processes that meet another's end of a mapped function: */
  int failed; /* DIST_JOB_END: the mapped function failed on this process */
  int meets;  /* the call is inside a mapped function whose end this process will meet at */
} dist_call;

/* Decides from cfg->dist (and, for PMAP_DIST_AUTO, the environment variable PMAP_DIST and the
 * launcher's variables) whether the context spans processes. *out is NULL for one process;
 * otherwise MPI is initialised (by pmap when nobody has), every process has met every other
 * and checked that they run the same backend with the same local device count, and *rank /
 * *size are set. The whole creation is bounded by timeout_ns (< 0: never): a process that does
 * not arrive is a PMAP_ERR_TIMEOUT naming it (MPI_Init itself cannot say who is missing). */
pmap_status dist_open(const pmap_config *cfg, pmap_backend kind, int local_devices,
                      int64_t timeout_ns, pmap_dist **out, int *rank, int *size);
/* Tells the other processes that this one leaves (their waits for it end at once, naming it),
 * waits (within the timeout) for theirs, then closes the transport (accepts NULL). After a failed
 * exchange nothing is released that MPI may still write into. Returns PMAP_ERR_TIMEOUT naming
 * the processes that did not leave in time (the transport is closed here all the same, and MPI
 * is not finalised at exit); else PMAP_SUCCESS. */
pmap_status dist_close(pmap_dist *d);

/* Every process sends what it is about to call and receives what the others are: a difference
 * is PMAP_ERR_INVALID_ARGUMENT on every process with the same list of what each process's
 * devices called; a process that does not arrive is PMAP_ERR_TIMEOUT naming it and its host; a
 * process that left or gave up ends the wait at once with its reason. who names the caller in
 * messages ("pmap_psum on device 2 (process 1 of 2, host b)"). A process whose devices returned
 * from their mapped function instead (dist_end_job) is PMAP_ERR_INVALID_ARGUMENT naming it
 * ("returned from its mapped function without calling this"), or PMAP_ERR_ABORTED when its
 * function failed there (its pmap_run reports that failure on every process). Every failure
 * but a difference in the collectives' numbers leaves the processes in step. On success every
 * process has arrived (a barrier), and the data calls below may follow. */
pmap_status dist_agree(pmap_dist *d, const dist_call *c, const char *who);

/* What a mapped function came to on one process, as dist_end_job carries it. */
typedef struct dist_outcome {
  int64_t status; /* pmap_status: PMAP_SUCCESS, or its failure */
  int64_t own;    /* the failure is the process's own, not an abandoned collective */
  char text[1008];
} dist_outcome;

/* The end of a mapped function (pmap_run) on this process: the processes meet, so that none
 * returns while another still waits for it in a collective of the function. While another
 * process is still in the function (its collective meets this end and fails), this process's
 * outcome becomes a failure naming what that process called, and the meeting repeats until
 * every process has ended (a process met in a call that is not a mapped function's returns
 * from it, so the meeting ends there, failed). Once all have ended, a failure anywhere is every
 * process's: *io becomes the same outcome on every process (the first process's own failure,
 * else the first failure). Returns a status other than PMAP_SUCCESS only when the meeting
 * itself failed (a process did not arrive, left, or the processes are out of step: the
 * transport is then broken). */
pmap_status dist_end_job(pmap_dist *d, dist_outcome *io, const char *who);

/* The data of an agreed collective. buf (count): this process's partial values; on return the
 * sum (in process order 0..P-1, so every process gets bitwise the same) or, with max, the max
 * (NaN propagates) over processes. */
pmap_status dist_all_reduce(pmap_dist *d, float *buf, size_t count, int max);
/* bytes of process root to every process. */
pmap_status dist_broadcast(pmap_dist *d, void *buf, size_t bytes, int root);
/* send (bytes) of every process; *out points to (P, bytes) in process order, owned by the
 * transport and valid until its next call. */
pmap_status dist_all_gather(pmap_dist *d, const void *send, size_t bytes, const void **out);

/* Agreed and moved in one call, outside any job: */
/* bytes of every process gathered as above (call names it). */
pmap_status dist_exchange(pmap_dist *d, const char *call, const void *mine, size_t bytes,
                          const void **all);
/* bytes of process root to every process (the NCCL unique id, runtime/dist/dist_nccl.c). */
pmap_status dist_broadcast_bytes(pmap_dist *d, void *buf, size_t bytes, int root);

/* This process's index among the transport's processes, and their count. */
int dist_rank(const pmap_dist *d);
int dist_size(const pmap_dist *d);
/* The host name process r reported when the context was created ("?" when unknown). */
const char *dist_host(const pmap_dist *d, int r);
/* Exchanges agreed so far: the next one is number dist_seq() + 1 on every process. */
uint64_t dist_seq(const pmap_dist *d);

/* The number of the last exchange this process failed, in step, against processes none of which
 * was in a mapped function or at its end (0: none): those processes returned from their calls,
 * so nobody meets the end of this process's mapped function if that exchange was its last. */
uint64_t dist_alone_seq(const pmap_dist *d);

/* A failure of this process that the others do not share (a device failed, a local wait timed
 * out): the processes are out of step, so the transport is broken as by a failed exchange and
 * the other processes are told at once (their waits for this one end naming it, with msg). */
void dist_abandon(pmap_dist *d, pmap_status s, const char *msg);

/* Whether an exchange failed (timeout, a process gone, an MPI error): the processes are no
 * longer in step, so every later exchange fails at once with the first failure's message. */
int dist_broken(const pmap_dist *d);

/* The MPI transport as its plugin gives it: the functions above, for a d it opened. */
typedef struct pmap_dist_i {
  pmap_status (*open)(const pmap_config *cfg, pmap_backend kind, int local_devices,
                      int64_t timeout_ns, pmap_dist **out, int *rank, int *size);
  pmap_status (*close)(pmap_dist *d);
  pmap_status (*agree)(pmap_dist *d, const dist_call *c, const char *who);
  pmap_status (*end_job)(pmap_dist *d, dist_outcome *io, const char *who);
  pmap_status (*all_reduce)(pmap_dist *d, float *buf, size_t count, int max);
  pmap_status (*broadcast)(pmap_dist *d, void *buf, size_t bytes, int root);
  pmap_status (*all_gather)(pmap_dist *d, const void *send, size_t bytes, const void **out);
  pmap_status (*exchange)(pmap_dist *d, const char *call, const void *mine, size_t bytes,
                          const void **all);
  pmap_status (*broadcast_bytes)(pmap_dist *d, void *buf, size_t bytes, int root);
  int (*rank)(const pmap_dist *d);
  int (*size)(const pmap_dist *d);
  const char *(*host)(const pmap_dist *d, int r);
  uint64_t (*seq)(const pmap_dist *d);
  uint64_t (*alone_seq)(const pmap_dist *d);
  void (*abandon)(pmap_dist *d, pmap_status s, const char *msg);
  int (*broken)(const pmap_dist *d);
} pmap_dist_i;

/* What the runtime hands the MPI plugin: the core functions its code calls, which it forwards
 * to under their own names (runtime/dist/dist_plugin.c). */
typedef struct dist_core_i {
  const pmap_base_i *base;
  int64_t (*now_ns)(void);
  const char *(*backend_name)(pmap_backend b);
} dist_core_i;

/* The MPI plugin's entry point: returns dist_plugin_abi() as the plugin was built, and only when
 * that equals abi (the same build) binds core and sets *out. */
typedef uint64_t (*dist_plugin_entry)(uint64_t abi, const dist_core_i *core,
                                      const pmap_dist_i **out);
static inline uint64_t dist_plugin_abi(void) {
  const size_t sizes[] = {sizeof(pmap_base_i), sizeof(dist_core_i),  sizeof(pmap_dist_i),
                          sizeof(dist_call),   sizeof(dist_outcome), sizeof(pmap_config)};
  return pmap_plugin_abi(sizes, (int)(sizeof sizes / sizeof sizes[0]));
}

#endif
