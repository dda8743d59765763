/* ctx.c: the context: backend choice, one persistent worker thread per device (device 0's work
 * runs on the calling thread), and the dispatch of one job to every device. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "error.h"

#define DEFAULT_CPU_DEVICES 4
#define DEFAULT_TIMEOUT_S 300.0

static int online_cpus(void) {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* Reads a positive integer from environment variable `name`; 0 when unset. */
static pmap_status env_int(const char *name, long lo, long hi, long *out) {
  const char *s = getenv(name);
  *out = 0;
  if (!s || !*s) return PMAP_SUCCESS;
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "environment variable %s=\"%s\" is not an integer in [%ld, %ld]",
                    name, s, lo, hi);
  *out = v;
  return PMAP_SUCCESS;
}

static void run_job(pmap_ctx *ctx, pmap_device *dev) {
  dev->status = ctx->fn(dev, ctx->arg);
  if (dev->status != PMAP_SUCCESS) {
    snprintf(dev->msg, sizeof dev->msg, "%s", pmap_error_message());
    if (dev->status != PMAP_ERR_ABORTED) pmap_ctx_abort(ctx);
  }
}

static void *worker_main(void *p) {
  pmap_device *dev = p;
  pmap_ctx *ctx = dev->ctx;
  /* Idle between jobs: spin a little, then sleep as long as it takes. */
  pmap_wait_policy idle = {ctx->wait.spin_ns, ctx->wait.yield_ns, -1, NULL};
  uint32_t seen = 0;
  for (;;) {
    pmap_event_wait(&ctx->job, seen, &idle);
    seen = atomic_load_explicit(&ctx->job.gen, memory_order_acquire);
    if (ctx->stop) break;
    run_job(ctx, dev);
    if (atomic_fetch_add_explicit(&ctx->done_count, 1, memory_order_acq_rel) ==
        (uint32_t)ctx->n - 2)
      pmap_event_signal(&ctx->done);
  }
  return NULL;
}

void pmap_ctx_abort(pmap_ctx *ctx) {
  atomic_store_explicit(&ctx->abort, 1, memory_order_seq_cst);
  pmap_event_poke(&ctx->bar.ev);
}

pmap_status pmap_wait_status(pmap_device *dev, int r, const char *call) {
  if (r == PMAP_WAIT_OK) return PMAP_SUCCESS;
  if (r == PMAP_WAIT_ABORTED)
    return PMAP_ERR(PMAP_ERR_ABORTED, "%s on device %d abandoned: another device failed", call,
                    dev->index);
  pmap_ctx_abort(dev->ctx);
  return PMAP_ERR(PMAP_ERR_TIMEOUT, "%s on device %d: not every device arrived within %.3f s",
                  call, dev->index, (double)dev->ctx->wait.timeout_ns * 1e-9);
}

pmap_status pmap_ctx_dispatch(pmap_ctx *ctx, pmap_fn fn, void *arg) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&ctx->busy, &expected, 1))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "a job is already running on this context (pmap_run is not re-entrant)");
  /* Every worker is idle: reset the per-job state. */
  atomic_store(&ctx->abort, 0);
  atomic_store(&ctx->bar.count, 0);
  atomic_store(&ctx->done_count, 0);
  ctx->fn = fn;
  ctx->arg = arg;
  uint32_t done_seen = atomic_load(&ctx->done.gen);
  if (ctx->n > 1) pmap_event_signal(&ctx->job);

  pmap_device *d0 = &ctx->dev[0];
  int saved[2] = {0, 0};
  pmap_status entered = ctx->be->enter ? ctx->be->enter(d0, saved) : PMAP_SUCCESS;
  if (entered == PMAP_SUCCESS) {
    run_job(ctx, d0);
    if (ctx->be->leave) ctx->be->leave(d0, saved);
  } else {
    d0->status = entered;
    snprintf(d0->msg, sizeof d0->msg, "%s", pmap_error_message());
    pmap_ctx_abort(ctx);
  }

  if (ctx->n > 1) {
    pmap_wait_policy w = {ctx->wait.spin_ns, ctx->wait.yield_ns, -1, NULL};
    while (atomic_load_explicit(&ctx->done_count, memory_order_acquire) != (uint32_t)ctx->n - 1)
      pmap_event_wait(&ctx->done, done_seen, &w);
  }
  /* Report the device whose failure caused the others to abandon the job. */
  pmap_status st = PMAP_SUCCESS;
  int first = -1;
  for (int i = 0; i < ctx->n; i++) {
    pmap_status s = ctx->dev[i].status;
    if (s == PMAP_SUCCESS) continue;
    if (first < 0 || (st == PMAP_ERR_ABORTED && s != PMAP_ERR_ABORTED)) {
      first = i;
      st = s;
    }
  }
  if (first >= 0) pmap_error_set(st, "device %d: %s", first, ctx->dev[first].msg);
  atomic_store(&ctx->busy, 0);
  return st;
}

static pmap_status init_job(pmap_device *dev, void *arg) {
  (void)arg;
  if (dev->ctx->be->device_init) PMAP_TRY(dev->ctx->be->device_init(dev));
  dev->initialised = 1;
  return PMAP_SUCCESS;
}

static pmap_status fini_job(pmap_device *dev, void *arg) {
  (void)arg;
  if (dev->initialised && dev->ctx->be->device_fini) dev->ctx->be->device_fini(dev);
  dev->initialised = 0;
  return PMAP_SUCCESS;
}

static pmap_status choose_backend(const pmap_config *cfg, pmap_backend *kind,
                                  const pmap_backend_i **be) {
  switch (cfg->backend) {
  case PMAP_BACKEND_AUTO:
#if defined(PMAP_HAVE_CUDA)
    if (pmap_cuda_device_count() > 0) {
      *kind = PMAP_BACKEND_CUDA;
      *be = &pmap_cuda_backend;
      return PMAP_SUCCESS;
    }
#endif
    *kind = PMAP_BACKEND_CPU;
    *be = &pmap_cpu_backend;
    return PMAP_SUCCESS;
  case PMAP_BACKEND_CPU:
    *kind = PMAP_BACKEND_CPU;
    *be = &pmap_cpu_backend;
    return PMAP_SUCCESS;
  case PMAP_BACKEND_CUDA:
#if defined(PMAP_HAVE_CUDA)
    if (pmap_cuda_device_count() <= 0)
      return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                      "pmap_ctx_create: backend cuda requested but no CUDA device is usable "
                      "here: %s",
                      pmap_cuda_unavailable_reason());
    *kind = PMAP_BACKEND_CUDA;
    *be = &pmap_cuda_backend;
    return PMAP_SUCCESS;
#else
    return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                    "pmap_ctx_create: backend cuda requested but this build has no CUDA backend "
                    "(configure with -Dcuda=enabled on a machine with the CUDA toolkit)");
#endif
  }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_ctx_create: unknown backend %d",
                  (int)cfg->backend);
}

pmap_status pmap_ctx_create(const pmap_config *cfg_in, pmap_ctx **out) {
  if (!out) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_ctx_create: out is NULL");
  *out = NULL;
  pmap_config cfg = {PMAP_BACKEND_AUTO, PMAP_DEVICES_DEFAULT, NULL, 0.0, PMAP_GUARD_ON};
  if (cfg_in) cfg = *cfg_in;
  if ((cfg.num_devices < 1 || cfg.num_devices > PMAP_MAX_DEVICES) &&
      cfg.num_devices != PMAP_DEVICES_DEFAULT)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "pmap_ctx_create: device count %d is outside 1..%d (PMAP_DEVICES_DEFAULT "
                    "picks the backend's default)",
                    cfg.num_devices, PMAP_MAX_DEVICES);
  if (isnan(cfg.timeout_s))
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_ctx_create: timeout_s is NaN");
  pmap_backend kind;
  const pmap_backend_i *be;
  pmap_status st = choose_backend(&cfg, &kind, &be);
  if (st) return st;
  if (cfg.num_devices == PMAP_DEVICES_DEFAULT) {
    long env = 0;
    if (kind == PMAP_BACKEND_CPU) {
      st = env_int("PMAP_CPU_DEVICES", 1, PMAP_MAX_DEVICES, &env);
      if (st) return st;
    }
    cfg.num_devices = env ? (int)env : DEFAULT_CPU_DEVICES;
#if defined(PMAP_HAVE_CUDA)
    if (kind == PMAP_BACKEND_CUDA) cfg.num_devices = pmap_cuda_device_count();
#endif
  }
  long spin_us = 0;
  st = env_int("PMAP_SPIN_US", 0, 10000000, &spin_us);
  if (st) return st;

  pmap_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory");
  int n = cfg.num_devices;
  ctx->be = be;
  ctx->kind = kind;
  ctx->n = n;
  ctx->dev = calloc((size_t)n, sizeof *ctx->dev);
  ctx->threads = calloc((size_t)n, sizeof *ctx->threads);
  ctx->slots = calloc(2 * (size_t)n, sizeof *ctx->slots);
  if (!ctx->dev || !ctx->threads || !ctx->slots) {
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: out of memory for %d devices", n);
    goto fail;
  }
  for (int i = 0; i < n; i++) {
    ctx->dev[i].ctx = ctx;
    ctx->dev[i].index = i;
    ctx->dev[i].ops = be->ops;
  }
  /* Spin while every device has a core. Oversubscribed, a spinning waiter only takes the core
   * from the device it waits for: spin barely, then yield for a while (the device waited for is
   * likely next in this core's queue), then sleep. */
  int oversubscribed = n > online_cpus();
  ctx->wait.spin_ns = oversubscribed ? 2000 : 200000;
  ctx->wait.yield_ns = oversubscribed ? 200000 : 0;
  if (getenv("PMAP_SPIN_US")) ctx->wait.spin_ns = spin_us * 1000;
  double timeout_s = cfg.timeout_s == 0.0 ? DEFAULT_TIMEOUT_S : cfg.timeout_s;
  ctx->wait.timeout_ns = timeout_s < 0 ? -1 : (int64_t)(timeout_s * 1e9);
  ctx->wait.abort = &ctx->abort;
  sync_barrier_init(&ctx->bar, (uint32_t)n);

  if (be->ctx_init) PMAP_TRY_GOTO(st, be->ctx_init(ctx, &cfg), fail);
  for (int i = 1; i < n; i++) {
    int e = pthread_create(&ctx->threads[i], NULL, worker_main, &ctx->dev[i]);
    if (e) {
      st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "pmap_ctx_create: pthread_create for device %d: %s", i,
                    strerror(e));
      goto fail;
    }
    ctx->started = i;
  }
  PMAP_TRY_GOTO(st, pmap_ctx_dispatch(ctx, init_job, NULL), fail);
  *out = ctx;
  return PMAP_SUCCESS;
fail: {
  /* Keep the message of the failure through the cleanup. */
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", pmap_error_message());
  pmap_ctx_destroy(ctx);
  pmap_error_set(st, "%s", msg);
  return st;
}
}

pmap_status pmap_ctx_destroy(pmap_ctx *ctx) {
  if (!ctx) return PMAP_SUCCESS;
  if (ctx->dev && ctx->started == ctx->n - 1) pmap_ctx_dispatch(ctx, fini_job, NULL);
  ctx->stop = 1;
  pmap_event_signal(&ctx->job);
  for (int i = 1; i <= ctx->started; i++) pthread_join(ctx->threads[i], NULL);
  if (ctx->be && ctx->be->ctx_fini) ctx->be->ctx_fini(ctx);
  free(ctx->slots);
  free(ctx->threads);
  free(ctx->dev);
  free(ctx);
  return PMAP_SUCCESS;
}

int pmap_ctx_num_devices(const pmap_ctx *ctx) { return ctx ? ctx->n : 0; }
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
  if (!name || !out) return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_backend_parse: NULL argument");
  for (int b = PMAP_BACKEND_AUTO; b <= PMAP_BACKEND_CUDA; b++)
    if (strcmp(name, pmap_backend_name((pmap_backend)b)) == 0) {
      *out = (pmap_backend)b;
      return PMAP_SUCCESS;
    }
  return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "unknown backend \"%s\" (expected auto, cpu or cuda)",
                  name);
}

int pmap_backend_built(pmap_backend b) {
  if (b == PMAP_BACKEND_CPU || b == PMAP_BACKEND_AUTO) return 1;
#if defined(PMAP_HAVE_CUDA)
  if (b == PMAP_BACKEND_CUDA) return 1;
#endif
  return 0;
}

pmap_status pmap_run(pmap_ctx *ctx, pmap_fn fn, void *arg) {
  if (!ctx || !fn)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT, "pmap_run: %s is NULL", ctx ? "fn" : "ctx");
  return pmap_ctx_dispatch(ctx, fn, arg);
}
