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

void sync_barrier_init(sync_barrier *b, uint32_t n) {
  atomic_store(&b->count, 0);
  atomic_store(&b->ev.gen, 0);
  atomic_store(&b->ev.sleepers, 0);
  b->n = n;
}

int sync_barrier_wait(sync_barrier *b, const pmap_wait_policy *p) {
  uint32_t gen = atomic_load_explicit(&b->ev.gen, memory_order_acquire);
  if (atomic_fetch_add_explicit(&b->count, 1, memory_order_acq_rel) == b->n - 1) {
    /* A device that gave up waiting (timeout) stays counted as arrived: a late last arrival
     * after the abort must not release anyone into buffers that device may have freed. */
    if (p->abort && atomic_load_explicit(p->abort, memory_order_acquire)) return PMAP_WAIT_ABORTED;
    atomic_store_explicit(&b->count, 0, memory_order_relaxed);
    pmap_event_signal(&b->ev);
    return PMAP_WAIT_OK;
  }
  return pmap_event_wait(&b->ev, gen, p);
}
