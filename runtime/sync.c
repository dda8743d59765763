/* sync.c: spin-then-sleep events and the barrier built on them. */
#include "sync.h"

#include <limits.h>
#include <sched.h>
#include <time.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

int64_t pmap_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void futex_wake_all(_Atomic uint32_t *addr) {
#if defined(__linux__)
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
#else
  (void)addr;
#endif
}

/* Sleeps while *addr == val, at most max_ns. Spurious returns are fine: callers re-check. */
static void futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t max_ns) {
#if defined(__linux__)
  struct timespec ts = {(time_t)(max_ns / 1000000000), (long)(max_ns % 1000000000)};
  syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
#else
  (void)addr;
  (void)val;
  (void)max_ns;
  sched_yield();
#endif
}

void pmap_event_signal(pmap_event *e) {
  atomic_fetch_add_explicit(&e->gen, 1, memory_order_seq_cst);
  if (atomic_load_explicit(&e->sleepers, memory_order_seq_cst) != 0) futex_wake_all(&e->gen);
}

void pmap_event_poke(pmap_event *e) { pmap_event_signal(e); }

/* PMAP_WAIT_OK or _ABORTED when the wait is over, -1 to keep waiting. An abort bumps gen too
 * (pmap_event_poke, after setting *abort), so gen is read first: when the change it shows is a
 * poke, the abort load after it sees the flag and the poke is not taken for a real signal. */
static int wait_over(pmap_event *e, uint32_t seen, const pmap_wait_policy *p) {
  int changed = atomic_load_explicit(&e->gen, memory_order_acquire) != seen;
  if (p->abort && atomic_load_explicit(p->abort, memory_order_acquire)) return PMAP_WAIT_ABORTED;
  return changed ? PMAP_WAIT_OK : -1;
}

int pmap_event_wait(pmap_event *e, uint32_t seen, const pmap_wait_policy *p) {
  int64_t start = 0, now = 0;
  for (uint32_t i = 0;; i++) {
    int r = wait_over(e, seen, p);
    if (r >= 0) return r;
    cpu_relax();
    if ((i & 63) != 63) continue;
    now = pmap_now_ns();
    if (start == 0) start = now;
    if (now - start >= p->spin_ns) break;
  }
  while (now - start < p->spin_ns + p->yield_ns) {
    sched_yield();
    int r = wait_over(e, seen, p);
    if (r >= 0) return r;
    now = pmap_now_ns();
  }
  /* Sleep. Sleep in slices of at most 100 ms so that a lost wake-up costs latency, not a hang. */
  for (;;) {
    if (p->timeout_ns >= 0 && now - start >= p->timeout_ns) return PMAP_WAIT_TIMEOUT;
    int64_t slice = 100000000;
    if (p->timeout_ns >= 0 && p->timeout_ns - (now - start) < slice)
      slice = p->timeout_ns - (now - start);
    atomic_fetch_add_explicit(&e->sleepers, 1, memory_order_seq_cst);
    if (!(p->abort && atomic_load_explicit(p->abort, memory_order_seq_cst)))
      futex_wait(&e->gen, seen, slice);
    atomic_fetch_sub_explicit(&e->sleepers, 1, memory_order_seq_cst);
    int r = wait_over(e, seen, p);
    if (r >= 0) return r;
    now = pmap_now_ns();
  }
}

/* The barrier's state word. */
#define BAR_GEN_SHIFT 32
#define BAR_FAILED ((uint64_t)1 << 31)
#define BAR_COUNT ((uint64_t)BAR_FAILED - 1)

void sync_barrier_init(sync_barrier *b, uint32_t n) {
  atomic_store(&b->state, 0);
  atomic_store(&b->ev.gen, 0);
  atomic_store(&b->ev.sleepers, 0);
  b->n = n;
}

void sync_barrier_reset(sync_barrier *b) {
  uint64_t s = atomic_load(&b->state);
  atomic_store(&b->state, ((s >> BAR_GEN_SHIFT) + 1) << BAR_GEN_SHIFT);
}

/* The verdict for a waiter of generation gen: OK once released, ABORTED once failed, -1 while
 * undecided. When the waiter has a reason to give up (abort, a device left, its timeout) it
 * tries to fail the barrier for everybody; if the state changed under it, it looks again. */
static int barrier_verdict(sync_barrier *b, uint32_t gen, const pmap_wait_policy *p,
                           int timed_out) {
  for (;;) {
    uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
    if ((uint32_t)(s >> BAR_GEN_SHIFT) != gen) return PMAP_WAIT_OK;
    if (s & BAR_FAILED) return PMAP_WAIT_ABORTED;
    int why = -1;
    if (p->abort && atomic_load_explicit(p->abort, memory_order_acquire))
      why = PMAP_WAIT_ABORTED;
    else if (p->left && atomic_load_explicit(p->left, memory_order_acquire))
      /* A device that failed raised abort before it left: read abort again, so that a failure
       * racing this check is not taken for a device that left without calling. */
      why = p->abort && atomic_load_explicit(p->abort, memory_order_acquire) ? PMAP_WAIT_ABORTED
                                                                             : PMAP_WAIT_LEFT;
    else if (timed_out)
      why = PMAP_WAIT_TIMEOUT;
    if (why < 0) return -1;
    if (atomic_compare_exchange_strong_explicit(&b->state, &s, s | BAR_FAILED, memory_order_acq_rel,
                                                memory_order_acquire)) {
      pmap_event_signal(&b->ev);
      return why;
    }
  }
}

/* Waits for the verdict of generation gen: spin, yield, then sleep on the event in slices. */
static int barrier_wait_verdict(sync_barrier *b, uint32_t gen, const pmap_wait_policy *p) {
  int64_t start = pmap_now_ns(), now = start;
  for (uint32_t i = 0;; i++) {
    uint32_t seen = atomic_load_explicit(&b->ev.gen, memory_order_acquire);
    int timed_out = p->timeout_ns >= 0 && now - start >= p->timeout_ns;
    int r = barrier_verdict(b, gen, p, timed_out);
    if (r >= 0) return r;
    if ((i & 63) == 63) now = pmap_now_ns();
    int64_t waited = now - start;
    if (waited < p->spin_ns) {
      cpu_relax();
    } else if (waited < p->spin_ns + p->yield_ns) {
      sched_yield();
      now = pmap_now_ns();
    } else {
      int64_t slice = 100000000;
      if (p->timeout_ns >= 0 && p->timeout_ns - waited < slice) slice = p->timeout_ns - waited;
      if (slice < 1000) slice = 1000;
      atomic_fetch_add_explicit(&b->ev.sleepers, 1, memory_order_seq_cst);
      if (barrier_verdict(b, gen, p, 0) < 0) futex_wait(&b->ev.gen, seen, slice);
      atomic_fetch_sub_explicit(&b->ev.sleepers, 1, memory_order_seq_cst);
      now = pmap_now_ns();
    }
  }
}

int sync_barrier_wait_touch(sync_barrier *b, const pmap_wait_policy *p, _Atomic int *touch) {
  uint64_t s = atomic_fetch_add_explicit(&b->state, 1, memory_order_acq_rel) + 1;
  uint32_t gen = (uint32_t)(s >> BAR_GEN_SHIFT);
  if (s & BAR_FAILED) return PMAP_WAIT_ABORTED;
  if ((s & BAR_COUNT) != b->n) return barrier_wait_verdict(b, gen, p);
  /* The last arrival releases everybody, unless a waiter gave up first. */
  for (;;) {
    int aborted = p->abort && atomic_load_explicit(p->abort, memory_order_acquire);
    uint64_t next = aborted ? s | BAR_FAILED : (uint64_t)(gen + 1u) << BAR_GEN_SHIFT;
    if (touch && !aborted) atomic_store_explicit(touch, (int)b->n, memory_order_release);
    if (atomic_compare_exchange_strong_explicit(&b->state, &s, next, memory_order_acq_rel,
                                                memory_order_acquire)) {
      pmap_event_signal(&b->ev);
      return aborted ? PMAP_WAIT_ABORTED : PMAP_WAIT_OK;
    }
    if (touch) atomic_store_explicit(touch, 0, memory_order_release);
    if (s & BAR_FAILED) return PMAP_WAIT_ABORTED;
  }
}

int sync_barrier_wait(sync_barrier *b, const pmap_wait_policy *p) {
  return sync_barrier_wait_touch(b, p, NULL);
}
