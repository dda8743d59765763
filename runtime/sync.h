/* sync.h: waits that stay fast when devices outnumber cores: spin for a short time, then sleep
 * on a futex (Linux) or yield (elsewhere). An abort flag wakes every waiter, so a failed device
 * never leaves the others waiting. */
#ifndef PMAP_RUNTIME_SYNC_H
#define PMAP_RUNTIME_SYNC_H

#include <stdatomic.h>
#include <stdint.h>

/* A generation counter that threads wait on for a change. */
typedef struct pmap_event {
  _Atomic uint32_t gen;
  _Atomic uint32_t sleepers;
} pmap_event;

/* How a thread waits: spin spin_ns, then yield the core for yield_ns (worth it when threads
 * outnumber cores: the thread waited for may be next in this core's queue), then sleep; give up
 * after timeout_ns (< 0: never). */
typedef struct pmap_wait_policy {
  int64_t spin_ns;
  int64_t yield_ns;
  int64_t timeout_ns;
  _Atomic int *abort; /* non-zero ends every wait */
  _Atomic int *left;  /* (optional) non-zero: a device left the job, so a barrier cannot complete */
} pmap_wait_policy;

enum { PMAP_WAIT_OK = 0, PMAP_WAIT_ABORTED = 1, PMAP_WAIT_TIMEOUT = 2, PMAP_WAIT_LEFT = 3 };

int64_t pmap_now_ns(void);

/* Bumps the generation and wakes the sleepers. */
void pmap_event_signal(pmap_event *e);
/* Wakes every sleeper so that it re-checks the abort flag (also bumps the generation). */
void pmap_event_poke(pmap_event *e);
/* Waits until e->gen != seen (PMAP_WAIT_OK), *abort (PMAP_WAIT_ABORTED, checked first) or the
 * timeout (PMAP_WAIT_TIMEOUT). */
int pmap_event_wait(pmap_event *e, uint32_t seen, const pmap_wait_policy *p);

/* A reusable barrier of n threads with one verdict per use: either every thread is released
 * (PMAP_WAIT_OK) or every thread fails. The state is one word, generation | failed | arrived, so
 * the last arrival's release and a waiter's giving up (abort, timeout, a device that left) are
 * ordered by one atomic operation: whichever comes first decides for everybody. A thread that
 * arrives at a failed barrier fails at once. */
typedef struct sync_barrier {
  _Atomic uint64_t state;
  uint32_t n;
  pmap_event ev; /* bumped on every change of state, to wake sleepers */
} sync_barrier;

void sync_barrier_init(sync_barrier *b, uint32_t n);
/* Starts a new job: no arrivals, not failed. Only while no thread waits. */
void sync_barrier_reset(sync_barrier *b);
/* Returns PMAP_WAIT_OK once all n threads arrived, else ABORTED, TIMEOUT or LEFT, the same
 * verdict (success or not) on every thread. When touch is non-NULL, the release stores n in
 * *touch before anyone is released (the threads may now use each other's memory; each takes
 * itself off before its next arrival). */
int sync_barrier_wait_touch(sync_barrier *b, const pmap_wait_policy *p, _Atomic int *touch);
int sync_barrier_wait(sync_barrier *b, const pmap_wait_policy *p);

#endif
