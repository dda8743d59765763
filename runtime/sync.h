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
} pmap_wait_policy;

enum { PMAP_WAIT_OK = 0, PMAP_WAIT_ABORTED = 1, PMAP_WAIT_TIMEOUT = 2 };

int64_t pmap_now_ns(void);

/* Bumps the generation and wakes the sleepers. */
void pmap_event_signal(pmap_event *e);
/* Wakes every sleeper so that it re-checks the abort flag (also bumps the generation). */
void pmap_event_poke(pmap_event *e);
/* Waits until e->gen != seen (PMAP_WAIT_OK), *abort (PMAP_WAIT_ABORTED, checked first) or the
 * timeout (PMAP_WAIT_TIMEOUT). */
int pmap_event_wait(pmap_event *e, uint32_t seen, const pmap_wait_policy *p);

/* A reusable barrier of n threads. */
typedef struct sync_barrier {
  _Atomic uint32_t count;
  uint32_t n;
  pmap_event ev;
} sync_barrier;

void sync_barrier_init(sync_barrier *b, uint32_t n);
/* Returns PMAP_WAIT_OK once all n threads arrived, else ABORTED or TIMEOUT. */
int sync_barrier_wait(sync_barrier *b, const pmap_wait_policy *p);

#endif
