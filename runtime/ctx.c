/* ctx.c: the context: backend choice, one persistent worker thread per device (device 0's work
 * runs on the calling thread unless the caller only waits), and the dispatch of one job to every
 * device. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "base/env.h"
#include "base/error.h"
#include "fault.h"
#include "runtime/dist/dist.h"

#define DEFAULT_TIMEOUT_S 300.0
#define MAX_TIMEOUT_S 1e9

static int online_cpus(void) {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* The timeout of a context: cfg's when it is not 0, else the environment variable PMAP_TIMEOUT
 * (seconds, > 0; negative or inf: never), else DEFAULT_TIMEOUT_S. */
static pmap_status timeout_of(double cfg_s, double *out) {
  *out = cfg_s;
  if (cfg_s != 0.0) return PMAP_SUCCESS;
  return pmap_env_seconds("PMAP_TIMEOUT", DEFAULT_TIMEOUT_S, out);
}

/* Device work never takes an asynchronous signal: oneDNN's JIT GEMM kernels point the stack
 * pointer into heap memory, where the kernel would write the signal's frame (a handler that only
 * sets a flag, Python's, corrupts the heap), and other libraries' code is not written for it
 * either. The workers are created with these signals blocked and keep them so; the calling
 * thread blocks them while it runs device 0's part of a job, where a handler could run (below).
 * A signal sent meanwhile goes to another thread of the process or waits for the end of device
 * 0's part. Signals that a thread's own action raises (faults, abort, a write to a closed pipe)
 * stay unblocked. */
static void async_signals(sigset_t *set) {
  static const int own[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT, SIGPIPE};
  sigfillset(set);
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++) sigdelset(set, own[i]);
}

/* What the calling thread blocks during device 0's part: the same, but for the signals that end
 * a program (SIGINT, SIGTERM, SIGHUP, SIGQUIT) while their action is the default (looked at on
 * every such call: a handler installed after the context was created is blocked too; an ignored
 * one is blocked, which changes nothing): their default action runs no handler on the thread,
 * and a Ctrl-C must not wait for the end of a job (one stuck in a collective waits for the
 * timeout). */
static void caller_signals(sigset_t *set) {
  static const int stop[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  async_signals(set);
  for (size_t i = 0; i < sizeof stop / sizeof stop[0]; i++) {
    struct sigaction sa;
    if (sigaction(stop[i], NULL, &sa) == 0 && !(sa.sa_flags & SA_SIGINFO) &&
        sa.sa_handler == SIG_DFL)
      sigdelset(set, stop[i]);
  }
}

/* Whether any asynchronous signal has a handler (is neither at its default action nor ignored):
 * about 60 sigaction queries. glibc's own signals (32, 33) cannot be queried and are skipped. */
static int async_handlers_installed(void) {
  sigset_t set;
  async_signals(&set);
  for (int s = 1; s < NSIG; s++) {
    struct sigaction sa;
    if (s == SIGKILL || s == SIGSTOP || sigismember(&set, s) != 1) continue;
    if (sigaction(s, NULL, &sa) != 0) continue;
    if ((sa.sa_flags & SA_SIGINFO) || (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN))
      return 1;
  }
  return 0;
}

/* While no asynchronous signal has a handler nothing can run on the calling thread during
 * device 0's part (a signal ends the process, stops it or is ignored, as its default action
 * says), so it blocks nothing and a call makes no system call for signals: the masking (four
 * sigaction queries and a pthread_sigmask pair, about a microsecond) is paid only where a
 * handler exists. The handlers belong to the process; pmap reads them when a context is created
 * and again at a call that finds its last reading older than HANDLERS_REREAD_NS (one reading is
 * about 60 system calls: a few microseconds every 10 ms of calls), so a first handler installed
 * after a context was created is blocked from the next reading on. */
#define HANDLERS_REREAD_NS 10000000
static _Atomic int64_t handlers_read_ns; /* when they were last read; 0: never */
static _Atomic int handlers_seen;        /* whether one had a handler then */

static int caller_must_block(int64_t now_ns, int force) {
  int64_t last = atomic_load_explicit(&handlers_read_ns, memory_order_acquire);
  if (force || last == 0 || now_ns - last >= HANDLERS_REREAD_NS) {
    atomic_store_explicit(&handlers_seen, async_handlers_installed(), memory_order_relaxed);
    atomic_store_explicit(&handlers_read_ns, now_ns, memory_order_release);
  }
  return atomic_load_explicit(&handlers_seen, memory_order_relaxed);
}

/* The context whose mapped function this thread is running, if any. With ctx->parent (the job
 * the dispatching thread was running when it started ctx's job) it forms the chain of jobs this
 * thread's work is nested in, across threads: a public call on any context of that chain would
 * wait for itself. */
static _Thread_local pmap_ctx *job_ctx;

static void run_job(pmap_ctx *ctx, pmap_device *dev, int64_t start_ns) {
  /* Each job starts with clean messages: a failure never reports an earlier job's text. */
  pmap_error_clear();
  dev->msg[0] = '\0';
  dev->own_failure = 0;
  dev->abandoned = 0;
  dev->coll_seq = 0;
  dev->names_others = 0;
  dev->mark_ns = start_ns;
  pmap_ctx *outer = job_ctx;
  job_ctx = ctx;
  dev->status = ctx->fn(dev, ctx->arg);
  job_ctx = outer;
  if (dev->status != PMAP_SUCCESS) {
    const char *m = pmap_error_message();
    if (*m)
      snprintf(dev->msg, sizeof dev->msg, "%s", m);
    else
      snprintf(dev->msg, sizeof dev->msg, "the mapped function returned %s (%d) without a message",
               pmap_status_string(dev->status), (int)dev->status);
    /* PMAP_ERR_ABORTED is what a device returns when it abandoned a collective because another
     * device had failed (the abort flag is then up); a function that returns it while no device
     * has failed fails on its own account, like any other status. The flag goes up before this
     * device counts as left, so the others waiting in a collective see the failure, not a
     * device that left without calling it. */
    dev->own_failure =
        dev->status != PMAP_ERR_ABORTED || (!dev->abandoned && !atomic_load(&ctx->abort));
    if (dev->own_failure) pmap_ctx_abort(ctx);
  }
  /* The spans timed on the device's queue: only after a job that succeeded (a failed one may
   * have left its queue stuck), and after its message was kept. */
  if (dev->marks) runtime_trace_flush(dev, dev->status == PMAP_SUCCESS);
  /* A device that returned can no longer meet the others at a collective. */
  int expected = -1;
  atomic_compare_exchange_strong(&ctx->left_device, &expected, dev->index);
  atomic_fetch_add_explicit(&ctx->left, 1, memory_order_acq_rel);
  if (ctx->n > 1) pmap_event_poke(&ctx->bar.ev);
}

static void *worker_main(void *p) {
  pmap_device *dev = p;
  pmap_ctx *ctx = dev->ctx;
  /* Idle between jobs: spin a little, then sleep as long as it takes. */
  pmap_wait_policy idle = {ctx->wait.spin_ns, ctx->wait.yield_ns, -1, NULL, NULL};
  uint32_t seen = 0;
  for (;;) {
    pmap_event_wait(&ctx->job, seen, &idle);
    seen = atomic_load_explicit(&ctx->job.gen, memory_order_acquire);
    if (ctx->stop) break;
    run_job(ctx, dev, pmap_now_ns());
    if (atomic_fetch_add_explicit(&ctx->done_count, 1, memory_order_acq_rel) ==
        (uint32_t)(ctx->n - ctx->first_worker) - 1)
      pmap_event_signal(&ctx->done);
  }
  return NULL;
}

void pmap_ctx_abort(pmap_ctx *ctx) {
  atomic_store_explicit(&ctx->abort, 1, memory_order_seq_cst);
  pmap_event_poke(&ctx->bar.ev);
}

pmap_status pmap_abandonedv(pmap_device *dev, const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  dev->abandoned = 1;
  return pmap_error_set(PMAP_ERR_ABORTED, "%s", msg);
}

pmap_status pmap_abandoned(pmap_device *dev, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  pmap_status st = pmap_abandonedv(dev, fmt, ap);
  va_end(ap);
  return st;
}

int pmap_barrier_arrive(pmap_device *dev, const pmap_wait_policy *w, _Atomic int *touch) {
  atomic_fetch_add_explicit(&dev->arrivals, 1, memory_order_acq_rel);
  return sync_barrier_wait_touch(&dev->ctx->bar, w, touch);
}

/* "device 3" or "devices 2, 3" (global indices; across processes with the process and host):
 * the devices of this process that have not arrived at the barrier dev waits at. Empty when
 * every device has (one arrived just after the timeout). */
static void missing_devices(const pmap_device *dev, char *buf, size_t size) {
  pmap_ctx *ctx = dev->ctx;
  uint32_t mine = atomic_load(&dev->arrivals);
  int count = 0, base = ctx->proc * ctx->n;
  size_t len = 0;
  char list[512] = "";
  for (int i = 0; i < ctx->n && len < sizeof list; i++)
    if (atomic_load(&ctx->dev[i].arrivals) < mine)
      len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", count++ ? ", " : "", base + i);
  buf[0] = '\0';
  if (!count) return;
  if (ctx->dist)
    snprintf(buf, size, "device%s %s (process %d of %d, host %s)", count > 1 ? "s" : "", list,
             ctx->proc, ctx->nproc, pmap_proc_host(ctx, ctx->proc));
  else
    snprintf(buf, size, "device%s %s", count > 1 ? "s" : "", list);
}

pmap_status pmap_wait_status(pmap_device *dev, int r, const char *call) {
  pmap_ctx *ctx = dev->ctx;
  if (r == PMAP_WAIT_OK) return PMAP_SUCCESS;
  /* Across processes: the device by its global index, process and host, and the number of the
   * collective, which is the same on every process (their messages can be matched). */
  char name[160], seq[48] = "";
  pmap_dev_name(dev, name, sizeof name);
  if (ctx->dist) snprintf(seq, sizeof seq, " (collective #%llu)", (unsigned long long)dev->xseq);
  switch (r) {
  case PMAP_WAIT_ABORTED:
    return pmap_abandoned(dev, "%s on %s abandoned%s: another device failed", call, name, seq);
  case PMAP_WAIT_LEFT: {
    pmap_ctx_abort(ctx);
    int left = atomic_load(&ctx->left_device);
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s on %s%s: device %d returned from the mapped function without "
                    "calling it (every device must call the same collectives in the same order)",
                    call, name, seq, ctx->proc * ctx->n + left);
  }
  }
  /* A timeout: the message names the devices that did not arrive, the same whichever waiting
   * device gave up first, and the job reports it as theirs. */
  pmap_ctx_abort(ctx);
  char missing[640];
  missing_devices(dev, missing, sizeof missing);
  double s = (double)ctx->wait.timeout_ns * 1e-9;
  if (!missing[0])
    return PMAP_ERR(PMAP_ERR_TIMEOUT, "%s on %s%s: not every device arrived within %.3f s", call,
                    name, seq, s);
  dev->names_others = 1;
  return PMAP_ERR(PMAP_ERR_TIMEOUT, "%s%s: %s did not arrive within %.3f s", call, seq, missing, s);
}

int pmap_ctx_in_job(const pmap_ctx *ctx) {
  for (const pmap_ctx *c = job_ctx; c; c = c->parent)
    if (c == ctx) return 1;
  return 0;
}

int pmap_ctx_foreign(const pmap_ctx *ctx) { return ctx->pid != (long)getpid(); }

/* A forked child has a copy of the context but none of its worker threads, and its copy of the
 * lock may have been held by a thread that does not exist there: a call would wait forever. */
static pmap_status check_process(const pmap_ctx *ctx, const char *call) {
  if (!pmap_ctx_foreign(ctx)) return PMAP_SUCCESS;
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "%s: the context was created by process %ld and this is process %ld (a forked "
                  "child?); its worker threads exist only in process %ld, so it cannot be used "
                  "here: create a new context in this process (nothing was changed)",
                  call, ctx->pid, (long)getpid(), ctx->pid);
}

pmap_status pmap_ctx_lock(pmap_ctx *ctx, const char *call) {
  PMAP_TRY(check_process(ctx, call));
  if (pmap_ctx_in_job(ctx))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: called from inside a mapped function of the same context, which is not "
                    "re-entrant (the call would wait for itself); call it outside pmap_run",
                    call);
  pthread_mutex_lock(&ctx->lock);
  if (ctx->lock_depth++ == 0) ctx->call = call;
  return PMAP_SUCCESS;
}

void pmap_ctx_unlock(pmap_ctx *ctx) {
  if (--ctx->lock_depth == 0) ctx->call = NULL;
  pthread_mutex_unlock(&ctx->lock);
}

/* The message of a failed job, "<call>: <device>: <its message>": the public call that ran the
 * job, then device `first`, unless its message already starts with the device (a local index
 * becomes the global name) or is about other devices (a timeout naming those that did not
 * arrive), then device `first`'s message. */
static void report_failure(pmap_ctx *ctx, int first, pmap_status st) {
  char who[160], local[32], call[64] = "";
  const char *msg = ctx->dev[first].msg;
  if (ctx->call) {
    size_t lc = strlen(ctx->call);
    if (strncmp(msg, ctx->call, lc) == 0 && msg[lc] == ':' && msg[lc + 1] == ' ') msg += lc + 2;
    snprintf(call, sizeof call, "%s: ", ctx->call);
  }
  pmap_dev_name(&ctx->dev[first], who, sizeof who);
  snprintf(local, sizeof local, "device %d", first);
  size_t lw = strlen(who), ll = strlen(local);
  if (ctx->dev[first].names_others ||
      (strncmp(msg, who, lw) == 0 && (msg[lw] == ':' || msg[lw] == ' ')))
    pmap_error_set(st, "%s%s", call, msg);
  else if (strncmp(msg, local, ll) == 0 && (msg[ll] == ':' || msg[ll] == ' '))
    pmap_error_set(st, "%s%s%s", call, who, msg + ll);
  else
    pmap_error_set(st, "%s%s: %s", call, who, msg);
}

/* Runs one job; on failure the thread's message is the job's report and *own says whether the
 * reported failure is this process's own. A job that succeeds leaves the thread's last error as
 * it was (it is a failing call's until the next failing call). */
static pmap_status dispatch(pmap_ctx *ctx, pmap_fn fn, void *arg, int *own) {
  *own = 0;
  PMAP_TRY(check_process(ctx, ctx->call ? ctx->call : "pmap_run"));
  int expected = 0;
  if (!atomic_compare_exchange_strong(&ctx->busy, &expected, 1))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s: a job is already running on this context (pmap_run is not re-entrant)",
                    ctx->call ? ctx->call : "pmap_run");
  char last[1024];
  pmap_error_save(last, sizeof last);
  /* Every worker is idle: reset the per-job state. */
  atomic_store(&ctx->abort, 0);
  atomic_store(&ctx->left, 0);
  atomic_store(&ctx->left_device, -1);
  atomic_store(&ctx->dist_agreed, 0);
  for (int i = 0; i < ctx->n; i++) atomic_store(&ctx->dev[i].arrivals, 0);
  ctx->job_gen++;
  ctx->parent = job_ctx; /* read by this job's threads: written before the job starts */
  sync_barrier_reset(&ctx->bar);
  atomic_store(&ctx->done_count, 0);
  ctx->fn = fn;
  ctx->arg = arg;
  uint32_t done_seen = atomic_load(&ctx->done.gen);
  uint32_t workers = (uint32_t)(ctx->n - ctx->first_worker);
  if (workers) pmap_event_signal(&ctx->job);

  if (ctx->first_worker) {
    pmap_device *d0 = &ctx->dev[0];
    int saved[2] = {0, 0};
    int64_t now = pmap_now_ns();
    int block = caller_must_block(now, 0);
    sigset_t caller_block, caller_mask;
    if (block) {
      caller_signals(&caller_block);
      pthread_sigmask(SIG_BLOCK, &caller_block, &caller_mask);
    }
    pmap_status entered = backend_enter(d0, saved);
    if (entered == PMAP_SUCCESS) {
      run_job(ctx, d0, now);
      backend_leave(d0, saved);
    } else {
      d0->status = entered;
      snprintf(d0->msg, sizeof d0->msg, "%s", pmap_error_message());
      pmap_ctx_abort(ctx);
    }
    if (block) pthread_sigmask(SIG_SETMASK, &caller_mask, NULL);
  }

  if (workers) {
    pmap_wait_policy w = {ctx->wait.spin_ns, ctx->wait.yield_ns, -1, NULL, NULL};
    while (atomic_load_explicit(&ctx->done_count, memory_order_acquire) != workers)
      pmap_event_wait(&ctx->done, done_seen, &w);
  }
  /* Report the device whose failure caused the others to abandon the job: the first device that
   * failed on its own account, else the first that failed. */
  pmap_status st = PMAP_SUCCESS;
  int first = -1;
  for (int i = 0; i < ctx->n; i++) {
    pmap_status s = ctx->dev[i].status;
    if (s == PMAP_SUCCESS) continue;
    if (first < 0 || (!ctx->dev[first].own_failure && ctx->dev[i].own_failure)) {
      first = i;
      st = s;
    }
  }
  if (first >= 0) {
    report_failure(ctx, first, st);
    *own = ctx->dev[first].own_failure;
  } else {
    pmap_error_copy(last);
  }
  atomic_store(&ctx->busy, 0);
  return st;
}

/* Across processes a failure of a job that the other processes do not share leaves them out of
 * step: the transport is broken and the others are told at once (runtime/dist). */
pmap_status pmap_ctx_dispatch(pmap_ctx *ctx, pmap_fn fn, void *arg) {
  int own = 0;
  pmap_status st = dispatch(ctx, fn, arg, &own);
  if (st && ctx->dist && !atomic_load(&ctx->dist_agreed))
    dist_abandon(ctx->dist, st, pmap_error_message());
  return st;
}

static pmap_status init_job(pmap_device *dev, void *arg) {
  (void)arg;
  PMAP_TRY(backend_device_init(dev));
  dev->initialised = 1;
  return PMAP_SUCCESS;
}

static pmap_status fini_job(pmap_device *dev, void *arg) {
  (void)arg;
  if (dev->initialised) backend_device_fini(dev);
  dev->initialised = 0;
  return PMAP_SUCCESS;
}

/* The backend of cfg->backend from the list, its plugin opened: AUTO takes the first with a
 * usable device, passing over a plugin that does not load (its message is not left behind). */
static pmap_status choose_backend(const pmap_config *cfg, const backend_entry **out,
                                  const backend_impl **impl) {
  int count = 0;
  const backend_entry *list = backend_list(&count);
  if (cfg->backend == PMAP_BACKEND_AUTO) {
    char last[1024];
    snprintf(last, sizeof last, "%s", pmap_error_message());
    for (int i = 0; i < count; i++) {
      if (list[i].may_have_devices && !list[i].may_have_devices()) continue;
      if (backend_load(&list[i], "pmap_ctx_create", impl)) {
        pmap_error_copy(last);
        continue;
      }
      if ((*impl)->device_count() > 0) {
        *out = &list[i];
        return PMAP_SUCCESS;
      }
    }
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE, "pmap_ctx_create: no backend has a usable device");
  }
  const char *name = pmap_backend_name(cfg->backend);
  if (!name)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_ctx_create: unknown backend %d",
                    (int)cfg->backend);
  const backend_entry *e = backend_find(cfg->backend);
  if (!e)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "pmap_ctx_create: backend %s requested but this build has no %s backend "
                    "(configure with -D%s=enabled on a machine with what it needs)",
                    name, name, name);
  char what[64];
  snprintf(what, sizeof what, "pmap_ctx_create: backend %s", name);
  PMAP_TRY(backend_load(e, what, impl));
  if ((*impl)->device_count() <= 0)
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "pmap_ctx_create: backend %s requested but no %s device is usable here%s%s",
                    name, e->label, (*impl)->unavailable_reason ? ": " : "",
                    (*impl)->unavailable_reason ? (*impl)->unavailable_reason() : "");
  *out = e;
  return PMAP_SUCCESS;
}

static pmap_status ctx_create(const pmap_config *cfg_in, pmap_ctx **out) {
  pmap_config cfg = {.backend = PMAP_BACKEND_AUTO, .num_devices = PMAP_DEVICES_DEFAULT};
  if (cfg_in) cfg = *cfg_in;
  if ((cfg.num_devices < 1 || cfg.num_devices > PMAP_MAX_DEVICES) &&
      cfg.num_devices != PMAP_DEVICES_DEFAULT)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: device count %d is outside 1..%d (PMAP_DEVICES_DEFAULT "
                    "picks the backend's default)",
                    cfg.num_devices, PMAP_MAX_DEVICES);
  if (isnan(cfg.timeout_s))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_ctx_create: timeout_s is NaN");
  if (cfg.uneven_batches != 0 && cfg.uneven_batches != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: uneven_batches %d is neither 0 nor 1", cfg.uneven_batches);
  if (cfg.caller_waits != 0 && cfg.caller_waits != 1)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: caller_waits %d is neither 0 nor 1", cfg.caller_waits);
  if (cfg.numeric_guard != PMAP_GUARD_ON && cfg.numeric_guard != PMAP_GUARD_OFF)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: numeric_guard %d is neither PMAP_GUARD_ON (0) nor "
                    "PMAP_GUARD_OFF (1)",
                    cfg.numeric_guard);
  if (cfg.recompute < PMAP_RECOMPUTE_NONE || cfg.recompute > PMAP_RECOMPUTE_SELECTIVE)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: recompute %d is none of PMAP_RECOMPUTE_NONE (0), "
                    "PMAP_RECOMPUTE_FULL (1), PMAP_RECOMPUTE_AUTO (2), "
                    "PMAP_RECOMPUTE_SELECTIVE (3)",
                    cfg.recompute);
  if (cfg.shard_optimizer < PMAP_SHARD_AUTO || cfg.shard_optimizer > PMAP_SHARD_GRADS)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: shard_optimizer %d is none of PMAP_SHARD_AUTO (0), "
                    "PMAP_SHARD_OFF (1), PMAP_SHARD_ON (2), PMAP_SHARD_GRADS (3)",
                    cfg.shard_optimizer);
  /* AUTO: the variable when set, else the size rule of params_layout (models/params.c). */
  int shard = cfg.shard_optimizer;
  if (shard == PMAP_SHARD_AUTO) {
    int v = -1;
    PMAP_TRY(pmap_env_flag("PMAP_SHARD_OPTIMIZER", -1, &v));
    if (v >= 0) shard = v ? PMAP_SHARD_ON : PMAP_SHARD_OFF;
  }
  const backend_entry *entry = NULL;
  const backend_impl *impl = NULL;
  pmap_status st = choose_backend(&cfg, &entry, &impl);
  if (st) return st;
  pmap_backend kind = entry->kind;
  const pmap_backend_i *be = impl->table;
  PMAP_TRY(backend_check(be));
  if (cfg.num_devices == PMAP_DEVICES_DEFAULT) {
    if (entry->default_devices)
      PMAP_TRY(entry->default_devices(&cfg.num_devices));
    else
      cfg.num_devices = impl->device_count();
    if (cfg.num_devices > PMAP_MAX_DEVICES) cfg.num_devices = PMAP_MAX_DEVICES;
  }
  long spin_us = 0;
  st = pmap_env_long("PMAP_SPIN_US", 0, 10000000, 0, &spin_us);
  if (st) return st;
  double timeout_s = 0.0;
  st = timeout_of(cfg.timeout_s, &timeout_s);
  if (st) return st;

  pmap_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory");
  int n = cfg.num_devices;
  ctx->be = be;
  ctx->kind = kind;
  ctx->n = n;
  ctx->pid = (long)getpid();
  ctx->dev = calloc((size_t)n, sizeof *ctx->dev);
  ctx->threads = calloc((size_t)n, sizeof *ctx->threads);
  ctx->desc = calloc(2 * (size_t)n, sizeof *ctx->desc);
  if (!ctx->dev || !ctx->threads || !ctx->desc) {
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory for %d devices", n);
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    ctx->dev[i].ctx = ctx;
    ctx->dev[i].index = i;
  }
  /* Spin while every device has a core. Oversubscribed, a spinning waiter only takes the core
   * from the device it waits for: spin barely, then yield for a while (the device waited for is
   * likely next in this core's queue), then sleep. */
  int oversubscribed = n + cfg.caller_waits > online_cpus(); /* a caller that waits spins too */
  ctx->wait.spin_ns = oversubscribed ? 2000 : 200000;
  ctx->wait.yield_ns = oversubscribed ? 200000 : 0;
  if (pmap_env_get("PMAP_SPIN_US")) ctx->wait.spin_ns = spin_us * 1000;
  /* Beyond MAX_TIMEOUT_S (inf included) the nanoseconds would not fit: no timeout. */
  ctx->wait.timeout_ns =
      timeout_s < 0 || timeout_s > MAX_TIMEOUT_S ? -1 : (int64_t)(timeout_s * 1e9);
  ctx->wait.abort = &ctx->abort;
  ctx->wait.left = &ctx->left;
  ctx->numeric_guard = cfg.numeric_guard;
  ctx->uneven = cfg.uneven_batches;
  ctx->max_memory = cfg.max_memory;
  ctx->recompute = cfg.recompute;
  ctx->first_worker = cfg.caller_waits ? 0 : 1;
  ctx->shard = shard;
  atomic_store(&ctx->left_device, -1);
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  int me = pthread_mutex_init(&ctx->lock, &attr);
  pthread_mutexattr_destroy(&attr);
  if (me) {
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: pthread_mutex_init: %s", strerror(me));
    goto fail;
  }
  ctx->lock_ready = 1;
  PMAP_TRY_GOTO(st, pmap_fault_parse(pmap_env_get("PMAP_FAULT"), &ctx->fault), fail);
  sync_barrier_init(&ctx->bar, (uint32_t)n);
  ctx->nproc = 1;
  PMAP_TRY_GOTO(st,
                dist_open(&cfg, kind, n, ctx->wait.timeout_ns, &ctx->dist, &ctx->proc, &ctx->nproc),
                fail);
  if (ctx->nproc > 1 && (int64_t)n * ctx->nproc > INT_MAX / 2) {
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "pmap_ctx_create: %d processes x %d devices is too many", ctx->nproc, n);
    goto fail;
  }
  PMAP_TRY_GOTO(st, pmap_fault_bind(ctx->fault, n, ctx->proc, ctx->nproc, shard == PMAP_SHARD_OFF),
                fail);
  PMAP_TRY_GOTO(st, procs_check_settings(ctx), fail);

  PMAP_TRY_GOTO(st, backend_ctx_init(ctx, &cfg), fail);
  if (!cfg.caller_waits) caller_must_block(pmap_now_ns(), 1);
  sigset_t worker_block, caller_mask;
  async_signals(&worker_block);
  pthread_sigmask(SIG_BLOCK, &worker_block, &caller_mask); /* inherited by each worker */
  for (int i = ctx->first_worker; i < n; i++) {
    int e = pthread_create(&ctx->threads[i], NULL, worker_main, &ctx->dev[i]);
    if (e) {
      pthread_sigmask(SIG_SETMASK, &caller_mask, NULL);
      st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: pthread_create for device %d: %s", i,
                    strerror(e));
      goto fail;
    }
    ctx->started++;
    /* Named for top -H, gdb and perf (the caller's thread, device 0's or not, keeps its name). */
    char name[16];
    snprintf(name, sizeof name, "pmap-dev%d", i);
    pthread_setname_np(ctx->threads[i], name);
  }
  pthread_sigmask(SIG_SETMASK, &caller_mask, NULL);
  PMAP_TRY_GOTO(st, pmap_ctx_dispatch(ctx, init_job, NULL), fail);
  PMAP_TRY_GOTO(st, runtime_trace_env(ctx), fail);
  *out = ctx;
  return PMAP_SUCCESS;
fail : {
  /* Keep the message of the failure through the cleanup. */
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", pmap_error_message());
  pmap_ctx_destroy(ctx);
  pmap_error_set(st, "%s", msg);
  return st;
}
}

/* Every message of a failed creation starts with the call, those of the environment's values
 * and of the devices' start included. */
pmap_status runtime_ctx_create(const pmap_config *cfg, pmap_ctx **out) {
  static const char call[] = "pmap_ctx_create: ";
  if (!out) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "%sout is NULL", call);
  pmap_status st = ctx_create(cfg, out);
  const char *msg = pmap_error_message();
  if (st && strncmp(msg, call, sizeof call - 1) != 0) {
    char text[1024];
    snprintf(text, sizeof text, "%s", msg);
    pmap_error_set(st, "%s%s", call, text);
  }
  return st;
}

pmap_status pmap_ctx_destroy(pmap_ctx *ctx) {
  if (!ctx) return PMAP_SUCCESS;
  if (ctx->lock_ready) {
    PMAP_TRY(pmap_ctx_lock(ctx, "pmap_ctx_destroy"));
    int live = atomic_load(&ctx->live_params);
    if (live > 0) {
      pmap_ctx_unlock(ctx);
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "pmap_ctx_destroy: %d pmap_params still use this context; destroy them "
                      "first (nothing was changed)",
                      live);
    }
  }
  runtime_trace_close(ctx);
  if (ctx->dev && ctx->started == ctx->n - ctx->first_worker)
    pmap_ctx_dispatch(ctx, fini_job, NULL);
  ctx->stop = 1;
  pmap_event_signal(&ctx->job);
  for (int i = 0; i < ctx->started; i++) pthread_join(ctx->threads[ctx->first_worker + i], NULL);
  backend_ctx_fini(ctx);
  /* Across processes: a process that does not destroy its context in time is named, and the
   * context is destroyed here all the same. */
  pmap_status closed = dist_close(ctx->dist);
  char msg[1024] = "";
  if (closed) snprintf(msg, sizeof msg, "%s", pmap_error_message());
  if (ctx->lock_ready) {
    pthread_mutex_unlock(&ctx->lock);
    pthread_mutex_destroy(&ctx->lock);
  }
  pmap_fault_free(ctx->fault);
  free(ctx->desc);
  free(ctx->xsend);
  free(ctx->xall);
  free(ctx->threads);
  for (int i = 0; ctx->dev && i < ctx->n; i++) free(ctx->dev[i].queued);
  free(ctx->dev);
  free(ctx);
  if (closed) return pmap_error_set(closed, "pmap_ctx_destroy: %s", msg);
  return PMAP_SUCCESS;
}

int pmap_ctx_num_devices(const pmap_ctx *ctx) { return ctx ? ctx->n : 0; }

pmap_ctx *runtime_ctx_of(const pmap_device *dev) { return dev->ctx; }
int runtime_global_devices(const pmap_ctx *ctx) { return ctx->n * ctx->nproc; }
int runtime_uneven(const pmap_ctx *ctx) { return ctx->uneven; }
int runtime_guard(const pmap_ctx *ctx) { return ctx->numeric_guard == PMAP_GUARD_ON; }
int runtime_shard(const pmap_ctx *ctx) { return ctx->shard; }
int runtime_recompute(const pmap_ctx *ctx) { return ctx->recompute; }
size_t runtime_max_memory(const pmap_ctx *ctx) { return ctx->max_memory; }
int runtime_distributed(const pmap_ctx *ctx) { return ctx->dist != NULL; }
int64_t runtime_timeout_ns(const pmap_ctx *ctx) { return ctx->wait.timeout_ns; }
int runtime_aborting(const pmap_ctx *ctx) { return atomic_load(&ctx->abort) != 0; }
void runtime_params_live(pmap_ctx *ctx, int delta) { atomic_fetch_add(&ctx->live_params, delta); }
uint64_t runtime_coll_seq(const pmap_ctx *ctx) { return ctx->dev[0].xseq; }
int runtime_faults(const pmap_ctx *ctx) { return ctx->fault != NULL; }

int runtime_fault_is(const pmap_ctx *ctx, fault_kind kind) {
  return pmap_fault_is(ctx->fault, kind);
}

int runtime_fault(pmap_device *dev, fault_kind kind, int64_t step) {
  return pmap_fault_fires(dev->ctx->fault, kind, dev->index, step);
}
int pmap_ctx_num_processes(const pmap_ctx *ctx) { return ctx ? ctx->nproc : 0; }
int pmap_ctx_process_index(const pmap_ctx *ctx) { return ctx ? ctx->proc : -1; }
pmap_backend pmap_ctx_backend(const pmap_ctx *ctx) { return ctx ? ctx->kind : PMAP_BACKEND_CPU; }

const char *pmap_backend_name(pmap_backend b) {
  switch (b) {
  case PMAP_BACKEND_AUTO: return "auto";
  case PMAP_BACKEND_CPU: return "cpu";
  case PMAP_BACKEND_CUDA: return "cuda";
  }
  return NULL;
}

pmap_status pmap_backend_parse(const char *name, pmap_backend *out) {
  if (!name || !out)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_backend_parse: NULL argument");
  for (int b = PMAP_BACKEND_AUTO; b <= PMAP_BACKEND_CUDA; b++)
    if (strcmp(name, pmap_backend_name((pmap_backend)b)) == 0) {
      *out = (pmap_backend)b;
      return PMAP_SUCCESS;
    }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                  "pmap_backend_parse: unknown backend \"%s\" (expected auto, cpu or cuda)", name);
}

int pmap_backend_built(pmap_backend b) { return b == PMAP_BACKEND_AUTO || backend_find(b) != NULL; }

pmap_status pmap_run(pmap_ctx *ctx, pmap_fn fn, void *arg) {
  if (!ctx) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_run: ctx is NULL");
  PMAP_TRY(pmap_ctx_lock(ctx, "pmap_run"));
  int own = 1;
  uint64_t seq0 = dist_seq(ctx->dist);
  pmap_status st = PMAP_SUCCESS;
  /* Refused, the run still ends at the processes' meeting: the others' collectives fail there
   * instead of pairing with this process's next call. */
  if (!fn && ctx->dist)
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_run: process %d of %d (host %s): fn is NULL",
                  ctx->proc, ctx->nproc, dist_host(ctx->dist, ctx->proc));
  else if (!fn)
    st = PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_run: fn is NULL");
  ctx->meets = ctx->dist != NULL;
  if (fn) st = dispatch(ctx, fn, arg, &own);
  ctx->meets = 0;
  if (ctx->dist) st = procs_end_job(ctx, st, own, seq0);
  pmap_ctx_unlock(ctx);
  return st;
}
