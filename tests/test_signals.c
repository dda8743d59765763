/* test_signals.c: asynchronous signals never reach a thread while it runs a device's work (the
 * workers block them; a calling thread blocks them while it runs device 0's part, where a
 * handler exists: where none does it keeps its own mask), the caller's own mask comes back
 * unchanged, signals sent meanwhile are delivered after, and training under a
 * storm of signals gives the result of training without one (with oneDNN's GEMM where built: its
 * JIT kernels point the stack pointer into the heap, where a signal frame corrupts it). The same
 * with pmap_config.caller_waits, where the caller runs no device work and takes signals. CPU. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

/* Raised by a thread's own action, so never sent while the thread runs device work: the workers
 * leave them unblocked (a fault must still reach its handler). */
static const int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE,  SIGILL,
                                   SIGTRAP, SIGSYS, SIGABRT, SIGPIPE};
static const int async_signals[] = {SIGINT,  SIGTERM, SIGHUP,  SIGQUIT, SIGUSR1,
                                    SIGUSR2, SIGALRM, SIGPROF, SIGCHLD, SIGWINCH};
/* Those that end a program: without a handler the caller leaves them to their default action. */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
enum { NSTOP = 4 };

static _Thread_local volatile sig_atomic_t in_work; /* this thread runs a device's work */
static _Thread_local volatile sig_atomic_t waiting; /* this thread is inside a pmap call */
static atomic_long delivered, in_work_hits, waiting_hits;

static void on_signal(int sig) {
  (void)sig;
  atomic_fetch_add(&delivered, 1);
  if (in_work) atomic_fetch_add(&in_work_hits, 1);
  if (waiting) atomic_fetch_add(&waiting_hits, 1);
}

static void install(int sig) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART, as Python installs its handler */
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

static pmap_ctx *make_ctx(int n, int caller_waits) {
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = n, .caller_waits = caller_waits};
  pmap_ctx *ctx = NULL;
  CHECK_OK(pmap_ctx_create(&cfg, &ctx));
  return ctx;
}

/* Work a signal could land in: a few hundred microseconds of arithmetic. */
static float busy(int rounds) {
  volatile float s = 0.0f;
  for (int i = 0; i < rounds * 1000; i++) s = s * 0.999f + (float)(i & 7);
  return s;
}

/* ------------------------------------------------------------------------------------------ */
/* The masks                                                                                  */

typedef struct mask_job {
  pthread_t caller;
  pthread_t thread[PMAP_MAX_DEVICES];
  int is_caller[PMAP_MAX_DEVICES];
  int blocked_async[PMAP_MAX_DEVICES]; /* how many of async_signals are blocked */
  int blocked_stop[PMAP_MAX_DEVICES];  /* how many of stop_signals are blocked */
  int blocked_sync[PMAP_MAX_DEVICES];  /* how many of sync_signals are blocked */
} mask_job;

static pmap_status mask_fn(pmap_device *dev, void *arg) {
  mask_job *j = arg;
  int d = pmap_axis_index(dev);
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, NULL, &now);
  j->thread[d] = pthread_self();
  j->is_caller[d] = pthread_equal(pthread_self(), j->caller);
  for (size_t i = 0; i < sizeof async_signals / sizeof *async_signals; i++)
    j->blocked_async[d] += sigismember(&now, async_signals[i]) == 1;
  for (size_t i = 0; i < sizeof sync_signals / sizeof *sync_signals; i++)
    j->blocked_sync[d] += sigismember(&now, sync_signals[i]) == 1;
  for (int i = 0; i < NSTOP; i++) j->blocked_stop[d] += sigismember(&now, stop_signals[i]) == 1;
  return PMAP_SUCCESS;
}

static int same_mask(const sigset_t *a, const sigset_t *b) {
  for (int s = 1; s < 32; s++)
    if (sigismember(a, s) != sigismember(b, s)) return 0;
  return 1;
}

/* Inside a job every device blocks the asynchronous signals and none of the synchronous ones,
 * except that a caller running device 0 leaves SIGINT, SIGTERM, SIGHUP and SIGQUIT to their
 * default action (none has a handler here); after it the caller has exactly the mask it had,
 * whatever that was. Device 0 runs on the caller's thread, or with caller_waits on its own. */
static void test_masks(int caller_waits) {
  enum { N = 3 };
  pmap_ctx *ctx = make_ctx(N, caller_waits);
  if (!ctx) return;
  const int nasync = (int)(sizeof async_signals / sizeof *async_signals);
  for (int pass = 0; pass < 2; pass++) {
    sigset_t mine, before, after;
    sigemptyset(&mine);
    if (pass) sigaddset(&mine, SIGUSR2); /* a caller that blocks one itself keeps it blocked */
    pthread_sigmask(SIG_SETMASK, &mine, NULL);
    pthread_sigmask(SIG_BLOCK, NULL, &before);
    mask_job j = {.caller = pthread_self()};
    CHECK_OK(pmap_run(ctx, mask_fn, &j));
    pthread_sigmask(SIG_BLOCK, NULL, &after);
    CHECK(same_mask(&before, &after), "pass %d: pmap_run changed the caller's signal mask", pass);
    CHECK(j.is_caller[0] == !caller_waits && !j.is_caller[1] && !j.is_caller[2],
          "caller_waits %d: device 0 %s on the calling thread", caller_waits,
          j.is_caller[0] ? "is" : "is not");
    for (int d = 0; d < N; d++)
      for (int e = 0; e < d; e++)
        CHECK(!pthread_equal(j.thread[d], j.thread[e]), "devices %d and %d share a thread", e, d);
    for (int d = 0; d < N; d++) {
      int on_caller = j.is_caller[d];
      CHECK(j.blocked_async[d] == nasync - (on_caller ? NSTOP : 0),
            "pass %d: device %d blocks %d of the %d asynchronous signals", pass, d,
            j.blocked_async[d], nasync);
      CHECK(j.blocked_stop[d] == (on_caller ? 0 : NSTOP),
            "pass %d: device %d blocks %d of SIGINT, SIGTERM, SIGHUP, SIGQUIT", pass, d,
            j.blocked_stop[d]);
      CHECK(j.blocked_sync[d] == 0, "pass %d: device %d blocks %d synchronous signals", pass, d,
            j.blocked_sync[d]);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, NULL);
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* A signal the caller's own thread gets while it runs device 0's work waits for the end of that
 * work, and is delivered before pmap_run returns (it is not lost). */
static pmap_status self_signal_fn(pmap_device *dev, void *arg) {
  (void)arg;
  in_work = 1;
  if (pmap_axis_index(dev) == 0) pthread_kill(pthread_self(), SIGUSR1);
  busy(50);
  in_work = 0;
  return PMAP_SUCCESS;
}

static void test_self_signal(void) {
  pmap_ctx *ctx = make_ctx(2, 0);
  if (!ctx) return;
  long d0 = atomic_load(&delivered), h0 = atomic_load(&in_work_hits);
  CHECK_OK(pmap_run(ctx, self_signal_fn, NULL));
  CHECK(atomic_load(&delivered) == d0 + 1,
        "the signal to the caller was delivered %ld times "
        "by the end of pmap_run",
        atomic_load(&delivered) - d0);
  CHECK(atomic_load(&in_work_hits) == h0, "the signal ran its handler during device 0's work");
  CHECK_OK(pmap_ctx_destroy(ctx));
}

/* ------------------------------------------------------------------------------------------ */
/* Storms                                                                                     */

typedef struct storm {
  atomic_int stop;
  long sent;
} storm;

/* Sends SIGUSR1 to the process (any thread that does not block it may take it) every 0-500 us. */
static void *storm_main(void *p) {
  storm *s = p;
  uint64_t r = 7;
  while (!atomic_load(&s->stop)) {
    kill(getpid(), SIGUSR1);
    s->sent++;
    struct timespec ts = {0, (long)(test_rand_u64(&r) % 500000)};
    nanosleep(&ts, NULL);
  }
  return NULL;
}

static pmap_status work_fn(pmap_device *dev, void *arg) {
  (void)arg;
  in_work = 1;
  float v = busy(20);
  in_work = 0;
  float sum = 0.0f;
  return pmap_psum(dev, &v, &sum, 1);
}

/* Custom params whose gradient is a busy loop and a linear model's exact gradient: mean loss
 * 0.5 (w x - y)^2 over the rows, one feature. */
static pmap_status slow_grad(const pmap_grad_args *a, void *user) {
  (void)user;
  in_work = 1;
  busy(5);
  const float *x = a->xs.data, *y = a->ys.data;
  int64_t rows = a->xs.shape[0];
  double loss = 0.0, g = 0.0;
  for (int64_t r = 0; r < rows; r++) {
    double e = (double)a->params[0] * x[r] - y[r];
    loss += 0.5 * e * e;
    g += e * x[r];
  }
  *a->loss = (float)(loss / (double)rows);
  a->grads[0] += a->scale * (float)(g / (double)rows);
  in_work = 0;
  return PMAP_SUCCESS;
}

static void train_custom(pmap_ctx *ctx, int steps, float *w_out) {
  enum { ROWS = 48 };
  float x[ROWS], y[ROWS], w0 = 0.0f;
  uint64_t s = 3;
  test_fill(x, ROWS, &s, -1.0f, 1.0f);
  for (int i = 0; i < ROWS; i++) y[i] = 1.5f * x[i];
  pmap_optimizer opt = pmap_sgd(0.1f, 0.0f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create_custom(ctx, 1, &w0, slow_grad, NULL, &opt, &p));
  if (!p) return;
  int64_t shape[1] = {ROWS};
  pmap_array xs = pmap_array_f32(x, 1, shape), ys = pmap_array_f32(y, 1, shape);
  for (int i = 0; i < steps; i++) CHECK_OK(pmap_update(p, &xs, &ys, NULL));
  CHECK_OK(pmap_params_read(p, 0, w_out, 1));
  pmap_params_destroy(p);
}

/* A dense model of the shapes that oneDNN's JIT GEMM runs (64 rows a device, 256 -> 256 -> 10),
 * trained on fixed data: the parameters after `steps` steps. */
static void train_dense(pmap_ctx *ctx, int steps, float *out, size_t count) {
  enum { B = 128, F = 256 };
  static float x[B * F];
  static int32_t y[B];
  uint64_t s = 11;
  test_fill(x, B * F, &s, -1.0f, 1.0f);
  for (int i = 0; i < B; i++) y[i] = (int32_t)(test_rand_u64(&s) % 10);
  int64_t in[1] = {F};
  pmap_model *m = NULL;
  CHECK_OK(pmap_model_create(1, in, &m));
  CHECK_OK(pmap_model_add_dense(m, 256));
  CHECK_OK(pmap_model_add_relu(m));
  CHECK_OK(pmap_model_add_dense(m, 10));
  CHECK_OK(pmap_model_set_loss(m, PMAP_LOSS_SOFTMAX_XENT));
  pmap_optimizer opt = pmap_sgd(0.05f, 0.9f);
  pmap_params *p = NULL;
  CHECK_OK(pmap_params_create(ctx, m, &opt, 5, &p));
  pmap_model_destroy(m);
  if (!p) return;
  CHECK(pmap_params_count(p) == count, "dense model: %zu parameters", pmap_params_count(p));
  int64_t xs_shape[2] = {B, F}, ys_shape[1] = {B};
  pmap_array xs = pmap_array_f32(x, 2, xs_shape), ys = pmap_array_i32(y, 1, ys_shape);
  for (int i = 0; i < steps; i++) CHECK_OK(pmap_update(p, &xs, &ys, NULL));
  CHECK_OK(pmap_params_read(p, 0, out, count));
  pmap_params_destroy(p);
}

/* With caller_waits the caller takes signals while it waits for the devices. */
static void test_storm(int caller_waits) {
  enum { DENSE_P = 256 * 256 + 256 + 256 * 10 + 10, STEPS = 20 };
  pmap_ctx *ctx = make_ctx(3, caller_waits), *ctx2 = make_ctx(2, caller_waits);
  if (!ctx || !ctx2) return;
  static float calm[DENSE_P], stormy[DENSE_P];
  float w_calm = 0.0f, w_stormy = 0.0f;
  train_custom(ctx, STEPS, &w_calm);
  train_dense(ctx2, STEPS, calm, DENSE_P);

  storm s = {0};
  pthread_t t;
  if (pthread_create(&t, NULL, storm_main, &s) != 0) {
    CHECK(0, "pthread_create for the storm");
    return;
  }
  long d0 = atomic_load(&delivered), w0 = atomic_load(&waiting_hits);
  for (int i = 0; i < 100; i++) {
    waiting = 1;
    CHECK_OK(pmap_run(ctx, work_fn, NULL));
    waiting = 0;
  }
  train_custom(ctx, STEPS, &w_stormy);
  train_dense(ctx2, STEPS, stormy, DENSE_P);
  atomic_store(&s.stop, 1);
  pthread_join(t, NULL);

  long to_caller = atomic_load(&waiting_hits) - w0;
  printf(
      "storm, caller_waits %d: %ld signals sent, %ld delivered, %ld of them to the caller "
      "inside pmap_run\n",
      caller_waits, s.sent, atomic_load(&delivered) - d0, to_caller);
  if (caller_waits) CHECK(to_caller > 0, "the waiting caller took none of the signals");
  CHECK(atomic_load(&delivered) > d0, "no signal of the storm was delivered");
  CHECK(atomic_load(&in_work_hits) == 0, "%ld signals ran their handler during device work",
        atomic_load(&in_work_hits));
  CHECK(memcmp(&w_calm, &w_stormy, sizeof w_calm) == 0,
        "custom model: %.9g after the storm, "
        "%.9g without",
        (double)w_stormy, (double)w_calm);
  test_same_bits("dense model after the storm against without", stormy, calm, DENSE_P);
  CHECK_OK(pmap_ctx_destroy(ctx));
  CHECK_OK(pmap_ctx_destroy(ctx2));
}

/* A handler for one of the stop signals makes the caller block it during device 0's part, also
 * on a context created before the handler was installed (the dispositions are read at each
 * call: a program that creates its context, then installs a handler to save on SIGTERM, must be
 * covered); with the handler gone it is left to its default action again. */
static void test_handled_stop_signal(void) {
  pmap_ctx *before = make_ctx(2, 0);
  install(SIGTERM);
  pmap_ctx *after = make_ctx(2, 0);
  if (!before || !after) return;
  mask_job a = {.caller = pthread_self()}, b = {.caller = pthread_self()};
  mask_job c = {.caller = pthread_self()};
  CHECK_OK(pmap_run(after, mask_fn, &a));
  CHECK_OK(pmap_run(before, mask_fn, &b));
  CHECK(a.blocked_stop[0] == 1, "SIGTERM has a handler: the caller blocks %d stop signals",
        a.blocked_stop[0]);
  CHECK(b.blocked_stop[0] == 1,
        "created before the handler: the caller blocks %d stop signals (want SIGTERM)",
        b.blocked_stop[0]);
  signal(SIGTERM, SIG_DFL);
  CHECK_OK(pmap_run(before, mask_fn, &c));
  CHECK(c.blocked_stop[0] == 0, "the handler removed: the caller blocks %d stop signals",
        c.blocked_stop[0]);
  CHECK_OK(pmap_ctx_destroy(before));
  CHECK_OK(pmap_ctx_destroy(after));
}

/* A process whose SIGTERM has its default action ends at once on SIGTERM, also while its caller
 * runs device 0's part of a long job: the job (10 s) must not end first. */
static pmap_status long_fn(pmap_device *dev, void *arg) {
  int *fd = arg;
  if (pmap_axis_index(dev) == 0 && write(*fd, "s", 1) != 1) return PMAP_ERR_INTERNAL;
  const struct timespec ms = {0, 1000000};
  for (int i = 0; i < 10000; i++) nanosleep(&ms, NULL);
  return PMAP_SUCCESS;
}

static void test_terminate_during_a_job(void) {
  int fds[2];
  if (pipe(fds) != 0) {
    CHECK(0, "pipe");
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
    pmap_ctx *ctx = NULL;
    if (pmap_ctx_create(&cfg, &ctx) != PMAP_SUCCESS) _exit(3);
    pmap_run(ctx, long_fn, &fds[1]);
    _exit(4); /* the job ended before the signal took effect */
  }
  close(fds[1]);
  char c = 0;
  CHECK(read(fds[0], &c, 1) == 1, "the child did not start its job");
  kill(pid, SIGTERM);
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 500 && done == 0; i++) { /* up to 5 s */
    const struct timespec ms10 = {0, 10000000};
    nanosleep(&ms10, NULL);
    done = waitpid(pid, &status, WNOHANG);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  CHECK(done == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM,
        "SIGTERM during a job: the child %s (status %d)",
        done == 0 ? "was still running after 5 s" : "did not end by it", status);
  close(fds[0]);
}

/* Where no asynchronous signal has a handler nothing could run on the caller's thread, so it
 * runs device 0's part with its own mask (the workers still block them all); a handler
 * installed later is blocked from pmap's next reading of the handlers on (at a call 10 ms or
 * more after the last one), and once it is removed the mask is left alone again. In a child
 * whose every handler is the default, before this process installs one; its exit status is the
 * number of the first check that failed. */
static int no_handler_checks(void) {
  for (int s = 1; s < NSIG; s++)
    if (s != SIGKILL && s != SIGSTOP) signal(s, SIG_DFL); /* glibc's own refuse: no matter */
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, NULL);
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2};
  pmap_ctx *ctx = NULL;
  if (pmap_ctx_create(&cfg, &ctx) != PMAP_SUCCESS) return 1;
  const int nasync = (int)(sizeof async_signals / sizeof *async_signals);
  const struct timespec past_reading = {0, 30000000}; /* 30 ms: the next call reads again */
  mask_job a = {.caller = pthread_self()}, b = a, c = a;
  if (pmap_run(ctx, mask_fn, &a) != PMAP_SUCCESS) return 2;
  if (!a.is_caller[0] || a.blocked_async[0] != 0) return 3;
  if (a.blocked_async[1] != nasync || a.blocked_sync[1] != 0) return 4;
  install(SIGTERM);
  nanosleep(&past_reading, NULL);
  if (pmap_run(ctx, mask_fn, &b) != PMAP_SUCCESS) return 5;
  /* As wherever a handler exists: every asynchronous signal but the stop signals at their
   * default action, here SIGINT, SIGHUP and SIGQUIT. */
  if (b.blocked_async[0] != nasync - NSTOP + 1 || b.blocked_stop[0] != 1) return 6;
  signal(SIGTERM, SIG_DFL);
  nanosleep(&past_reading, NULL);
  if (pmap_run(ctx, mask_fn, &c) != PMAP_SUCCESS) return 7;
  if (c.blocked_async[0] != 0 || c.blocked_sync[0] != 0) return 8;
  if (pmap_ctx_destroy(ctx) != PMAP_SUCCESS) return 9;
  return 0;
}

static void test_no_handler(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(no_handler_checks());
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork or waitpid for the no-handler child");
  static const char *const what[] = {
      "",
      "pmap_ctx_create failed",
      "pmap_run failed",
      "no handler: the caller blocked signals during device 0's part (or device 0 was not on it)",
      "no handler: device 1's worker does not block every asynchronous signal alone",
      "pmap_run failed after a SIGTERM handler was installed",
      "a SIGTERM handler installed after the context: not blocked at a call after the next reading",
      "pmap_run failed after the handler was removed",
      "the handler removed: the caller still blocks signals during device 0's part",
      "pmap_ctx_destroy failed"};
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  CHECK(code == 0, "no-handler child: %s (status %d)",
        code > 0 && code < (int)(sizeof what / sizeof *what) ? what[code] : "ended abnormally",
        status);
}

/* caller_waits with one device, a nested call refused from device 0's own thread, a bad value. */
static pmap_status nested_fn(pmap_device *dev, void *arg) {
  pmap_ctx *ctx = arg;
  if (pmap_axis_index(dev) != 0) return PMAP_SUCCESS;
  return pmap_run(ctx, work_fn, NULL) == PMAP_ERR_INVALID_ARGUMENT
             ? PMAP_SUCCESS
             : pmap_set_error(PMAP_ERR_INTERNAL, "a nested pmap_run was not refused");
}

static void test_caller_waits_misc(void) {
  for (int n = 1; n <= 2; n++) {
    pmap_ctx *ctx = make_ctx(n, 1);
    if (!ctx) return;
    mask_job j = {.caller = pthread_self()};
    CHECK_OK(pmap_run(ctx, mask_fn, &j));
    CHECK(!j.is_caller[0], "%d devices: device 0 on the waiting caller's thread", n);
    CHECK_OK(pmap_run(ctx, nested_fn, ctx));
    float w = 0.0f;
    train_custom(ctx, 3, &w);
    CHECK(w != 0.0f, "%d devices, caller_waits: no step was taken", n);
    CHECK_OK(pmap_ctx_destroy(ctx));
  }
  pmap_config cfg = {.backend = PMAP_BACKEND_CPU, .num_devices = 2, .caller_waits = 2};
  pmap_ctx *bad = NULL;
  CHECK_FAILS(pmap_ctx_create(&cfg, &bad), PMAP_ERR_INVALID_ARGUMENT, "caller_waits 2");
  CHECK(bad == NULL, "a refused context was returned");
}

int main(void) {
  /* The cases count on the stop signals' default action, which a launcher may have changed
   * (nohup ignores SIGHUP, a shell's `&` SIGINT and SIGQUIT): an ignored one is blocked like a
   * caught one, so each starts from SIG_DFL. */
  for (int i = 0; i < NSTOP; i++) signal(stop_signals[i], SIG_DFL);
  test_terminate_during_a_job(); /* forks: before this process has threads of its own */
  test_no_handler();             /* forks too */
#if defined(TEST_HAVE_ONEDNN)
  /* The GEMM whose kernels a signal frame corrupts, chosen before the first GEMM of the process. */
  setenv("PMAP_GEMM", "onednn", 1);
#endif
  install(SIGUSR1);
  for (int caller_waits = 0; caller_waits < 2; caller_waits++) test_masks(caller_waits);
  test_self_signal();
  for (int caller_waits = 0; caller_waits < 2; caller_waits++) test_storm(caller_waits);
  test_caller_waits_misc();
  test_handled_stop_signal();
  return test_exit("test_signals");
}
