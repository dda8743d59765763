/* cuda_ctx.c: the CUDA backend's context: which GPU each logical device uses, the NCCL
 * communicators over them (created with the context, so that failures show at start) and their
 * abort when a device fails or a collective outlives the context's timeout. */
/* dladdr (which file the loaded NCCL came from) needs _GNU_SOURCE, which the build defines. */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/env.h"
#include "cuda_backend.h"
#if defined(PMAP_HAVE_MPI)
#include "runtime/dist/dist_nccl.h"
#endif

/* NCCL 2.30.0, the first that can put several ranks of one communicator on one GPU. */
#define NCCL_MULTI_RANK_VERSION 23000
/* Each of a device's two pinned staging buffers, unless PMAP_CUDA_PINNED_MB says otherwise. */
#define CUDA_PINNED_MB_DEFAULT 4
/* How long a communicator may take to finalize before it is aborted instead. */
#define FINALIZE_TIMEOUT_NS (10LL * 1000000000LL)
/* The watchdog looks this often, and judges a thread stuck in an NCCL call after this long
 * while another device has failed (a healthy call returns in microseconds). */
#define WATCHDOG_PERIOD_NS 20000000L
#define WATCHDOG_STUCK_NS 100000000LL

/* NCCL's upper bound on a communicator's channels, and the most this backend gives a rank that
 * shares its GPU. */
#define NCCL_MAX_CHANNELS 64
#define SHARED_MAX_CTAS 32

/* What the last pmap_cuda_device_count of this thread was told. */
static _Thread_local cudaError_t count_error = cudaSuccess;
static _Thread_local char count_reason[256];

static int nccl_env_enabled(const char *name);

/* CUDA loads a kernel's module at its first launch by default, and loading may wait for the
 * whole GPU while it holds the context's lock. When logical devices share a GPU (and so its
 * CUDA context) one device's first launch of a kernel can then wait for another device's
 * collective kernel, which waits for the first device's collective, which cannot be launched:
 * a deadlock. Loading every module when CUDA starts prevents it. Likewise the streams of the
 * devices sharing a GPU (two each, and NCCL's own) share CUDA's 8 hardware queues by default:
 * a collective kernel queued behind another rank's on the same queue waits for it, which waits
 * for this one; 32 queues, the most CUDA gives, keep 4 devices' streams and NCCL's apart. Both are
 * read once, at the process's first CUDA call, so they are set before it. */
static void loading_prepare_once(void) {
  if (!nccl_env_enabled("NCCL_MULTI_RANK_GPU_ENABLE")) return;
  const char *mode = getenv("CUDA_MODULE_LOADING");
  if (!mode || !*mode) (void)setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  const char *queues = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (!queues || !*queues)
    (void)setenv("CUDA_DEVICE_MAX_CONNECTIONS", CUDA_SHARED_MAX_CONNECTIONS, 1);
}

void cuda_module_loading_prepare(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  (void)pthread_once(&once, loading_prepare_once);
}

int cuda_module_loading_lazy(void) {
  CUresult (*get_mode)(CUmoduleLoadingMode *) = NULL;
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  void *fn = NULL;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &fn, 11070,
                                                   cudaEnableDefault, &found);
#else
  cudaError_t e = cudaGetDriverEntryPoint("cuModuleGetLoadingMode", &fn, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn) {
    (void)cudaGetLastError();
    return -1;
  }
  memcpy(&get_mode, &fn, sizeof get_mode); /* a data pointer to a function's, as dlsym's */
  CUmoduleLoadingMode mode = CU_MODULE_EAGER_LOADING;
  if (get_mode(&mode) != CUDA_SUCCESS) return -1;
  return mode == CU_MODULE_LAZY_LOADING;
}

void cuda_nccl_cta_limits(int sms, int ranks_per_gpu, int *min_ctas, int *max_ctas) {
  *min_ctas = *max_ctas = 0;
  if (ranks_per_gpu <= 1) return;
  int most = sms / (2 * ranks_per_gpu);
  if (most > SHARED_MAX_CTAS) most = SHARED_MAX_CTAS;
  if (most > NCCL_MAX_CHANNELS) most = NCCL_MAX_CHANNELS;
  *max_ctas = most >= 1 ? most : 1;
  *min_ctas = 1;
}

int pmap_cuda_device_count(void) {
  int n = 0;
  cuda_module_loading_prepare();
  count_error = cudaGetDeviceCount(&n);
  if (count_error != cudaSuccess) {
    /* No driver or no GPU: an error here, not a count of 0. Leave no error behind. */
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

const char *pmap_cuda_unavailable_reason(void) {
  if (count_error == cudaSuccess) return "cudaGetDeviceCount found no GPU";
  snprintf(count_reason, sizeof count_reason, "cudaGetDeviceCount failed: %s (%s)",
           cudaGetErrorString(count_error), cudaGetErrorName(count_error));
  return count_reason;
}

/* NCCL reads its integer variables with strtoll (any base): a number other than 0 enables. */
static int nccl_env_enabled(const char *name) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  char *end = NULL;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  return end != s && !errno && v != 0;
}

/* "2.28.9" from ncclGetVersion's code (major*10000 + minor*100 + patch since 2.9). */
static void nccl_version_string(int v, char *buf, size_t len) {
  if (v >= 10000)
    snprintf(buf, len, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
  else
    snprintf(buf, len, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
}

/* Parses "0,0,1,1" into gpus: its first n entries (a longer list serves smaller contexts too,
 * e.g. the 1, 2 and 4 devices of a scaling run). */
static pmap_status parse_ids(const char *s, int n, int *gpus) {
  const char *what = "pmap_ctx_create: environment variable PMAP_CUDA_DEVICE_IDS";
  const char *p = s;
  int count = 0;
  for (;;) {
    char *end = NULL;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < 0 || v > 1 << 20)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s=\"%s\" is not a comma-separated list of GPU numbers", what, s);
    if (count < n) gpus[count] = (int)v;
    count++;
    if (*end == '\0') break;
    if (*end != ',')
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "%s=\"%s\" is not a comma-separated list of GPU numbers", what, s);
    p = end + 1;
  }
  if (count < n)
    return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                    "%s=\"%s\" lists %d GPUs but the context has %d devices", what, s, count, n);
  return PMAP_SUCCESS;
}

/* The GPU of each logical device: cfg->device_ids, else $PMAP_CUDA_DEVICE_IDS, else 0..n-1;
 * each must exist on this machine. */
static pmap_status choose_gpus(const pmap_config *cfg, int n, int count, int *gpus) {
  const char *env = pmap_env_get("PMAP_CUDA_DEVICE_IDS");
  const char *source = "device_ids";
  if (cfg->device_ids) {
    memcpy(gpus, cfg->device_ids, (size_t)n * sizeof *gpus);
  } else if (env && *env) {
    PMAP_TRY(parse_ids(env, n, gpus));
    source = "PMAP_CUDA_DEVICE_IDS";
  } else {
    for (int i = 0; i < n; i++) gpus[i] = i;
    if (n > count)
      return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                      "pmap_ctx_create: %d CUDA devices requested but this machine has %d GPU%s "
                      "(to run several logical devices on one GPU list them in device_ids or "
                      "PMAP_CUDA_DEVICE_IDS, e.g. 0,0: NCCL documents up to 2 on a GPU)",
                      n, count, count == 1 ? "" : "s");
  }
  for (int i = 0; i < n; i++)
    if (gpus[i] < 0 || gpus[i] >= count)
      return PMAP_ERR(PMAP_ERR_INVALID_ARGUMENT,
                      "pmap_ctx_create: %s[%d] = %d is outside [0, %d): this machine has %d GPU%s",
                      source, i, gpus[i], count, count, count == 1 ? "" : "s");
  return PMAP_SUCCESS;
}

/* Logical devices sharing a GPU are NCCL ranks sharing a GPU: only where NCCL allows it. */
static pmap_status check_shared_gpus(const int *gpus, int n, int version) {
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      if (gpus[i] != gpus[j]) continue;
      const char *env = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
      int enabled = nccl_env_enabled("NCCL_MULTI_RANK_GPU_ENABLE");
      if (version >= NCCL_MULTI_RANK_VERSION && enabled) return PMAP_SUCCESS;
      char vs[32], why[96] = "";
      nccl_version_string(version, vs, sizeof vs);
      if (version >= NCCL_MULTI_RANK_VERSION)
        snprintf(why, sizeof why, " and NCCL_MULTI_RANK_GPU_ENABLE is %s%.40s%s",
                 env ? "\"" : "unset", env ? env : "", env ? "\"" : "");
      return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                      "pmap_ctx_create: logical devices %d and %d both use GPU %d; several NCCL "
                      "ranks on one GPU need NCCL >= 2.30 with NCCL_MULTI_RANK_GPU_ENABLE=1 "
                      "(this process loaded NCCL %s%s)",
                      i, j, gpus[i], vs, why);
    }
  return PMAP_SUCCESS;
}

/* Logical devices sharing a GPU need every kernel loaded before any collective runs (see
 * loading_prepare_once): refused where CUDA loads them lazily in this process. */
static pmap_status check_loading(const int *gpus, int n) {
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      if (gpus[i] != gpus[j]) continue;
      if (cuda_module_loading_lazy() != 1) return PMAP_SUCCESS;
      const char *mode = getenv("CUDA_MODULE_LOADING");
      return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                      "pmap_ctx_create: logical devices %d and %d share GPU %d, but CUDA loads "
                      "kernels lazily in this process (CUDA_MODULE_LOADING is %s%.40s%s): a kernel "
                      "loaded while another device's collective runs on that GPU can deadlock "
                      "it. Set CUDA_MODULE_LOADING=EAGER before the process's first CUDA call "
                      "(pmap sets it at its own first CUDA call when NCCL_MULTI_RANK_GPU_ENABLE "
                      "is set and CUDA_MODULE_LOADING is not)",
                      i, j, gpus[i], mode ? "\"" : "unset", mode ? mode : "", mode ? "\"" : "");
    }
  return PMAP_SUCCESS;
}

/* The NCCL loaded at run time must be the major.minor pmap was compiled against: anything else
 * means the loader found another NCCL first (e.g. the toolkit's beside a wheel's), and features
 * that differ by minor version (several ranks on one GPU, communicator options) would not be
 * what the build assumed. An error, not a warning: a library prints nothing, and the message
 * names both and where the loaded one came from. PMAP_NCCL_ALLOW_MISMATCH=1 accepts it. */
static pmap_status check_nccl_version(int loaded) {
  int built = NCCL_VERSION_CODE;
  if (loaded / 100 == built / 100 || nccl_env_enabled("PMAP_NCCL_ALLOW_MISMATCH"))
    return PMAP_SUCCESS;
  char lv[32], bv[32];
  nccl_version_string(loaded, lv, sizeof lv);
  nccl_version_string(built, bv, sizeof bv);
  Dl_info info;
  const char *file = "an unknown file";
  if (dladdr((void *)(uintptr_t)ncclGetVersion, &info) && info.dli_fname) file = info.dli_fname;
  return PMAP_ERR(PMAP_ERR_UNAVAILABLE,
                  "pmap_ctx_create: this process loaded NCCL %s (%s) but pmap was built against "
                  "NCCL %s: put the NCCL it was built with first on the loader's path, or rebuild "
                  "with -Dnccl_root naming the one to use (PMAP_NCCL_ALLOW_MISMATCH=1 accepts it)",
                  lv, file, bv);
}

/* The run-time switches of the backend (docs/cuda.md): TF32 GEMMs (off unless configured with
 * -Dtf32=true), how threads wait for their streams, whether the host waits for every
 * collective, and the pinned staging buffers' size. */
static pmap_status read_switches(cuda_ctx *cc) {
#if defined(PMAP_CUDA_TF32_DEFAULT)
  PMAP_TRY(pmap_env_flag("PMAP_CUDA_TF32", 1, &cc->tf32));
#else
  PMAP_TRY(pmap_env_flag("PMAP_CUDA_TF32", 0, &cc->tf32));
#endif
  PMAP_TRY(pmap_env_flag("PMAP_CUDA_COLL_WAIT", 0, &cc->coll_wait));
  static const char *const waits[] = {"block", "poll", NULL};
  int wait = CUDA_WAIT_BLOCK;
  PMAP_TRY(pmap_env_choice("PMAP_CUDA_WAIT", waits, CUDA_WAIT_BLOCK, &wait));
  cc->wait_mode = wait == 1 ? CUDA_WAIT_POLL : CUDA_WAIT_BLOCK;
  long v = CUDA_PINNED_MB_DEFAULT;
  PMAP_TRY(pmap_env_long("PMAP_CUDA_PINNED_MB", 0, 4096, CUDA_PINNED_MB_DEFAULT, &v));
  cc->pinned_bytes = (size_t)v << 20;
  long fail = -1;
  PMAP_TRY(pmap_env_long("PMAP_CUDA_WAIT_FAIL", -1, PMAP_MAX_DEVICES - 1, -1, &fail));
  cc->wait_fail = (int)fail;
  PMAP_TRY(pmap_env_flag("PMAP_CUDA_NO_MEMPOOL", 0, &cc->no_pool));
  return PMAP_SUCCESS;
}

/* Aborts the communicators when a thread has sat inside an NCCL call, or in a wait that covers a
 * collective, for long while another device failed; or inside either for longer than the
 * context's timeout. Aborting ends the collective kernels, which ends the waits. */
static void *watchdog_main(void *p) {
  cuda_ctx *cc = p;
  pmap_ctx *ctx = cc->ctx;
  while (!atomic_load(&cc->watchdog_stop)) {
    struct timespec ts = {0, WATCHDOG_PERIOD_NS};
    nanosleep(&ts, NULL);
    if (atomic_load(&cc->dead)) continue;
    int64_t now = pmap_now_ns(), timeout = cuda_timeout_of(cc);
    int failed = atomic_load(&ctx->abort) != 0;
    for (int i = 0; i < cc->n; i++) {
      int64_t since = atomic_load(&cc->nccl_since[i]);
      int coll = 1;
      if (!since) {
        since = atomic_load(&cc->wait_since[i]);
        coll = atomic_load(&cc->wait_coll[i]);
      }
      if (!since) continue;
      int late = timeout >= 0 && now - since > timeout;
      if (late || (failed && coll && now - since > WATCHDOG_STUCK_NS)) {
        atomic_store(&cc->watchdog_fired, late ? CUDA_WATCHDOG_TIMEOUT : CUDA_WATCHDOG_PEER_FAILED);
        cuda_comms_abort(cc);
        pmap_ctx_abort(ctx);
        break;
      }
    }
  }
  return NULL;
}

static void watchdog_stop(cuda_ctx *cc) {
  if (!cc->watchdog_started) return;
  atomic_store(&cc->watchdog_stop, 1);
  pthread_join(cc->watchdog, NULL);
  cc->watchdog_started = 0;
}

/* Whether a device on GPU g failed to drain its work when it was destroyed: freeing anything on
 * that GPU (an abort frees NCCL's buffers) could wait for that work for ever. */
static int gpu_busy(const cuda_ctx *cc, int g) {
  for (int j = 0; j < cc->n; j++)
    if (cc->gpus[j] == g && atomic_load(&cc->drained[j]) < 0) return 1;
  return 0;
}

/* Aborts the ranks not yet gone, except on a GPU with work left (gpu_busy): those are left to the
 * process, and one line on stderr says so. No thread is inside an NCCL call by now. */
static void ranks_abort_left(cuda_ctx *cc) {
  int left = 0;
  for (int i = 0; i < cc->n; i++) {
    if (atomic_load(&cc->comm_gone[i])) continue;
    if (gpu_busy(cc, cc->gpus[i]))
      left++;
    else
      cuda_rank_abort(cc, i);
  }
  if (left)
    fprintf(stderr,
            "pmap: %d NCCL communicator rank%s left to the process: work on %s GPU did not "
            "finish when the context was destroyed, and freeing %s would wait for it\n",
            left, left == 1 ? "" : "s", left == 1 ? "its" : "their", left == 1 ? "it" : "them");
}

/* Frees every rank of the communicators. Ranks of one process reach a common barrier while they
 * finalize, so one thread finalizes them all inside a group (NCCL's own single-process example
 * does this) and then destroys each; if that fails they are aborted, which needs no peer. The
 * blocking ranks of the captured steps are aborted: their finalize could not be bounded, and
 * every device's work is drained by now. After an abort (comms_live 0) only the ranks it left
 * out remain. */
static void comms_destroy(cuda_ctx *cc) {
  int saved = -1;
  if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
  int busy = 0;
  for (int i = 0; i < cc->n; i++) busy |= gpu_busy(cc, cc->gpus[i]);
  if (cc->comms_live && !busy) {
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < cc->n && r == ncclSuccess; i++) r = ncclCommFinalize(cc->comms[i]);
    ncclResult_t end = ncclGroupEnd();
    if (r == ncclSuccess || r == ncclInProgress) r = end;
    /* Non-blocking communicators finalize in the background: wait for each, within a limit. */
    int64_t deadline = pmap_now_ns() + FINALIZE_TIMEOUT_NS;
    for (int i = 0; i < cc->n && (r == ncclSuccess || r == ncclInProgress); i++)
      r = cuda_nccl_settle(cc, cc->comms[i], deadline);
    for (int i = 0; i < cc->n && r == ncclSuccess; i++) {
      (void)ncclCommDestroy(cc->comms[i]);
      if (cc->graph_comms && cc->graph_comms[i]) (void)ncclCommAbort(cc->graph_comms[i]);
      atomic_store(&cc->comm_gone[i], 1);
    }
  }
  ranks_abort_left(cc);
  if (saved >= 0) (void)cudaSetDevice(saved);
  (void)cudaGetLastError();
  cc->comms_live = 0;
}

static void ctx_free(cuda_ctx *cc) {
  if (!cc) return;
  free(cc->gpus);
  free(cc->devs);
  free(cc->comms);
  free(cc->graph_comms);
  free((void *)cc->comm_gone);
  free((void *)cc->drained);
  free((void *)cc->nccl_since);
  free((void *)cc->wait_since);
  free((void *)cc->wait_coll);
  free((void *)cc->pending);
  free((void *)cc->issued);
  pthread_mutex_destroy(&cc->abort_lock);
  free(cc);
}

/* Aborts what exists of a failed creation of the communicators. */
static void comms_abandon(cuda_ctx *cc) {
  for (int i = 0; i < cc->n; i++) {
    if (cc->comms[i]) (void)ncclCommAbort(cc->comms[i]);
    if (cc->graph_comms && cc->graph_comms[i]) (void)ncclCommAbort(cc->graph_comms[i]);
    atomic_store(&cc->comm_gone[i], 1);
  }
}

/* Where ranks share a GPU, the channels each rank may use (cuda_nccl_cta_limits), the same for
 * every rank (NCCL's ranks must agree on their channels): from the most ranks on one GPU and the
 * fewest multiprocessors among the GPUs. */
static pmap_status shared_cta_limits(cuda_ctx *cc) {
  int most = 1, sms = 0;
  for (int i = 0; i < cc->n; i++) {
    int same = 0, v = 0;
    for (int j = 0; j < cc->n; j++) same += cc->gpus[j] == cc->gpus[i];
    if (same > most) most = same;
    CUDA_CHECK(NULL, cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, cc->gpus[i]));
    if (!sms || v < sms) sms = v;
  }
  cuda_nccl_cta_limits(sms, most, &cc->cta_min, &cc->cta_max);
  return PMAP_SUCCESS;
}

/* The creation of the captured steps' blocking ranks (graph_comms_create), on a thread of its
 * own: a blocking creation returns only once every rank is made and cannot be aborted, and the
 * context's creation must end within its limit all the same. An abandoned creation that ends
 * later aborts what it made and frees this itself. */
typedef struct graph_init {
  int n;
  int *gpus;         /* (n) */
  ncclComm_t *comms; /* (n) */
  ncclUniqueId id;
  ncclConfig_t config;
  ncclResult_t result;
  int done, abandoned;
  pthread_mutex_t lock;
  pthread_cond_t cond;
} graph_init;

static void graph_init_free(graph_init *g) {
  pthread_mutex_destroy(&g->lock);
  pthread_cond_destroy(&g->cond);
  free(g->gpus);
  free(g->comms);
  free(g);
}

static void *graph_init_main(void *p) {
  graph_init *g = p;
  ncclResult_t r = ncclGroupStart();
  for (int i = 0; i < g->n && r == ncclSuccess; i++) {
    /* Each GPU was selected once already by the non-blocking ranks' creation. */
    (void)cudaSetDevice(g->gpus[i]);
    r = ncclCommInitRankConfig(&g->comms[i], g->n, g->id, i, &g->config);
  }
  ncclResult_t end = ncclGroupEnd();
  if (r == ncclSuccess) r = end;
  (void)cudaGetLastError();
  pthread_mutex_lock(&g->lock);
  g->result = r;
  g->done = 1;
  int abandoned = g->abandoned;
  pthread_cond_signal(&g->cond);
  pthread_mutex_unlock(&g->lock);
  if (abandoned) {
    for (int i = 0; i < g->n; i++)
      if (g->comms[i]) (void)ncclCommAbort(g->comms[i]);
    graph_init_free(g);
  }
  return NULL;
}

/* Every device's blocking rank for its captured steps (cuda_ctx.graph_comms), one communicator
 * apart from the non-blocking one, within CUDA_STARTUP_TIMEOUT_NS. In one process only: the fast
 * steps that capture do not run across processes. */
/* The communicators' settings: blocking or not, and the CTA limits measured for the GPU. */
static ncclConfig_t nccl_config(const cuda_ctx *cc, int blocking) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = blocking;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 17, 0)
  if (cc->cta_max > 0) {
    config.minCTAs = cc->cta_min;
    config.maxCTAs = cc->cta_max;
  }
#else
  (void)cc;
#endif
  return config;
}

static pmap_status graph_comms_create(cuda_ctx *cc) {
  graph_init *g = calloc(1, sizeof *g);
  if (!g) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "CUDA backend: out of memory");
  g->n = cc->n;
  g->gpus = calloc((size_t)cc->n, sizeof *g->gpus);
  g->comms = calloc((size_t)cc->n, sizeof *g->comms);
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cond, NULL);
  if (!g->gpus || !g->comms) {
    graph_init_free(g);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "CUDA backend: out of memory for %d devices", cc->n);
  }
  memcpy(g->gpus, cc->gpus, (size_t)cc->n * sizeof *g->gpus);
  g->config = nccl_config(cc, 1);
  ncclResult_t idr = ncclGetUniqueId(&g->id);
  pthread_t t;
  int e = idr == ncclSuccess ? pthread_create(&t, NULL, graph_init_main, g) : 0;
  if (idr != ncclSuccess || e) {
    graph_init_free(g);
    if (idr != ncclSuccess)
      return cuda_fail(NULL, CUDA_LIB_NCCL, (int)idr, "ncclGetUniqueId(&id)", __FILE__, __LINE__,
                       __func__);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY,
                    "pmap_ctx_create: cannot start a thread to create the CUDA graphs' NCCL "
                    "communicator: %s",
                    strerror(e));
  }
  (void)pthread_detach(t);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)(CUDA_STARTUP_TIMEOUT_NS / 1000000000LL);
  pthread_mutex_lock(&g->lock);
  while (!g->done && pthread_cond_timedwait(&g->cond, &g->lock, &until) != ETIMEDOUT) {
  }
  int done = g->done;
  g->abandoned = !done;
  pthread_mutex_unlock(&g->lock);
  if (!done)
    return PMAP_ERR(PMAP_ERR_TIMEOUT,
                    "pmap_ctx_create: NCCL did not finish creating the blocking communicator of "
                    "the captured steps (ncclCommInitRankConfig with blocking = 1) within %.0f s; "
                    "its creation is left to the process",
                    (double)CUDA_STARTUP_TIMEOUT_NS * 1e-9);
  pmap_status st = PMAP_SUCCESS;
  if (g->result != ncclSuccess) {
    st = cuda_fail(NULL, CUDA_LIB_NCCL, (int)g->result,
                   "ncclCommInitRankConfig(&comm, n, id, rank, {.blocking = 1}) for every device",
                   __FILE__, __LINE__, __func__);
    for (int i = 0; i < cc->n; i++)
      if (g->comms[i]) (void)ncclCommAbort(g->comms[i]);
  } else {
    memcpy(cc->graph_comms, g->comms, (size_t)cc->n * sizeof *g->comms);
  }
  graph_init_free(g);
  return st;
}

/* One non-blocking communicator rank per logical device (ncclCommInitAll has no options): the
 * watchdog may abort a communicator while a thread is inside a call on it, which NCCL supports
 * only for non-blocking ones. Every rank is created in one group, then polled until ready.
 * Across processes one communicator spans every global device: process 0's unique id reaches
 * the others over MPI, and local device i of process p is rank p * n + i of P * n. Where steps
 * may be captured (cc->graph_comms allocated), a second, blocking communicator follows. */
static pmap_status comms_create(pmap_ctx *ctx, cuda_ctx *cc) {
  pmap_status st = PMAP_SUCCESS;
  ncclUniqueId id;
  int nranks = cc->n, first = 0;
#if defined(PMAP_HAVE_MPI)
  if (ctx->dist) {
    PMAP_TRY(dist_nccl_unique_id(ctx->dist, &id));
    nranks = cc->n * ctx->nproc;
    first = cc->n * ctx->proc;
  } else {
    NCCL_CHECK(NULL, ncclGetUniqueId(&id));
  }
#else
  (void)ctx;
  NCCL_CHECK(NULL, ncclGetUniqueId(&id));
#endif
  ncclConfig_t config = nccl_config(cc, 0);
  /* NCCL switches devices while it sets up each rank: keep the caller's current device. */
  int saved = -1;
  if (cudaGetDevice(&saved) != cudaSuccess) saved = -1;
  ncclResult_t r = ncclGroupStart();
  cudaError_t e = cudaSuccess;
  int i = 0;
  for (; i < cc->n && (r == ncclSuccess || r == ncclInProgress); i++) {
    e = cudaSetDevice(cc->gpus[i]);
    if (e != cudaSuccess) break;
    r = ncclCommInitRankConfig(&cc->comms[i], nranks, id, first + i, &config);
  }
  ncclResult_t end = ncclGroupEnd();
  if (saved >= 0) (void)cudaSetDevice(saved);
  if (e != cudaSuccess) {
    st = cuda_fail(NULL, CUDA_LIB_RUNTIME, (int)e, "cudaSetDevice(gpu) for an NCCL rank", __FILE__,
                   __LINE__, __func__);
    comms_abandon(cc);
    return st;
  }
  (void)cudaGetLastError();
  if (r == ncclSuccess || r == ncclInProgress) r = end;
  int64_t deadline = pmap_now_ns() + CUDA_STARTUP_TIMEOUT_NS;
  for (i = 0; i < cc->n && (r == ncclSuccess || r == ncclInProgress); i++)
    r = cuda_nccl_settle(cc, cc->comms[i], deadline);
  if (r == ncclInProgress) {
    comms_abandon(cc);
    return PMAP_ERR(PMAP_ERR_TIMEOUT,
                    "pmap_ctx_create: NCCL did not finish creating rank %d of %d within %.0f s",
                    i - 1, cc->n, (double)CUDA_STARTUP_TIMEOUT_NS * 1e-9);
  }
  if (r != ncclSuccess) {
    st = cuda_fail(NULL, CUDA_LIB_NCCL, (int)r,
                   "ncclCommInitRankConfig(&comm, n, id, rank, {.blocking = 0}) for every device",
                   __FILE__, __LINE__, __func__);
    comms_abandon(cc);
    return st;
  }
  if (cc->graph_comms && (st = graph_comms_create(cc)) != PMAP_SUCCESS) comms_abandon(cc);
  return st;
}

pmap_status cuda_ctx_init(pmap_ctx *ctx, const pmap_config *cfg) {
  int n = ctx->n, count = 0;
  pmap_status st = PMAP_SUCCESS;
  cuda_module_loading_prepare();
  CUDA_CHECK(NULL, cudaGetDeviceCount(&count));
  cuda_ctx *cc = calloc(1, sizeof *cc);
  if (!cc) return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "CUDA backend: out of memory");
  pthread_mutex_init(&cc->abort_lock, NULL);
  cc->n = n;
  cc->gpus = calloc((size_t)n, sizeof *cc->gpus);
  cc->devs = calloc((size_t)n, sizeof *cc->devs);
  cc->comms = calloc((size_t)n, sizeof *cc->comms);
  cc->nccl_since = calloc((size_t)n, sizeof *cc->nccl_since);
  cc->wait_since = calloc((size_t)n, sizeof *cc->wait_since);
  cc->wait_coll = calloc((size_t)n, sizeof *cc->wait_coll);
  cc->pending = calloc((size_t)n, sizeof *cc->pending);
  cc->issued = calloc((size_t)n, sizeof *cc->issued);
  cc->comm_gone = calloc((size_t)n, sizeof *cc->comm_gone);
  cc->drained = calloc((size_t)n, sizeof *cc->drained);
  if (!cc->gpus || !cc->devs || !cc->comms || !cc->nccl_since || !cc->wait_since ||
      !cc->wait_coll || !cc->pending || !cc->issued || !cc->comm_gone || !cc->drained) {
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "CUDA backend: out of memory for %d devices", n);
    goto fail;
  }
  PMAP_TRY_GOTO(st, choose_gpus(cfg, n, count, cc->gpus), fail);
  NCCL_CHECK_GOTO(NULL, st, ncclGetVersion(&cc->nccl_version), fail);
  PMAP_TRY_GOTO(st, check_nccl_version(cc->nccl_version), fail);
  PMAP_TRY_GOTO(st, check_shared_gpus(cc->gpus, n, cc->nccl_version), fail);
  PMAP_TRY_GOTO(st, check_loading(cc->gpus, n), fail);
  PMAP_TRY_GOTO(st, read_switches(cc), fail);
  PMAP_TRY_GOTO(st, cuda_fast_switches(cc, cfg), fail);
  PMAP_TRY_GOTO(st, shared_cta_limits(cc), fail);
  /* The captured steps' blocking ranks, where steps may be captured (one process only). */
  if (cc->graphs && ctx->nproc <= 1 &&
      !(cc->graph_comms = calloc((size_t)n, sizeof *cc->graph_comms))) {
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "CUDA backend: out of memory for %d devices", n);
    goto fail;
  }
  PMAP_TRY_GOTO(st, comms_create(ctx, cc), fail);
  cc->comms_live = 1;
  cc->ctx = ctx;
  atomic_store(&cc->starting, n);
  int e = pthread_create(&cc->watchdog, NULL, watchdog_main, cc);
  if (e) {
    st = PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "CUDA backend: cannot start the NCCL watchdog: %s",
                  strerror(e));
    goto fail;
  }
  cc->watchdog_started = 1;
  pthread_setname_np(cc->watchdog, "pmap-watchdog");
  for (int i = 0; i < n; i++) {
    cuda_device *cd = &cc->devs[i];
    cd->where.index = i;
    cd->where.gpu = cc->gpus[i];
    cd->comm = cc->comms[i];
    cd->graph_comm = cc->graph_comms ? cc->graph_comms[i] : NULL;
    cd->alloc_gen = &cc->alloc_gen;
    for (int j = 0; j < n; j++) cd->shared |= j != i && cc->gpus[j] == cc->gpus[i];
    ctx->dev[i].be = cd;
  }
  ctx->be_ctx = cc;
  return PMAP_SUCCESS;
fail:
  if (cc->comms_live) comms_destroy(cc);
  ctx_free(cc);
  return st;
}

void cuda_ctx_fini(pmap_ctx *ctx) {
  cuda_ctx *cc = ctx->be_ctx;
  if (!cc) return;
  watchdog_stop(cc);
  pthread_mutex_lock(&cc->abort_lock);
  comms_destroy(cc); /* after an abort: the ranks it left out */
  pthread_mutex_unlock(&cc->abort_lock);
  for (int i = 0; i < ctx->n; i++) ctx->dev[i].be = NULL;
  ctx->be_ctx = NULL;
  ctx_free(cc);
}
