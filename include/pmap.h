/* pmap.h: the public API of pmap, multi-device data-parallel training in one process or, on MPI,
 * across processes and machines (docs/distributed.md).
 * Parameters are replicated on every device, the leading (batch) axis of the inputs is split into
 * one shard per device, and loss and gradients are averaged across devices before each step.
 *
 * Dimension letters used in shape comments:
 *   N  devices in the context          B  global batch (leading axis of xs and ys), B % N == 0
 *   Bd per-device batch, B / N         F  features per example of a rank-1 input
 *   P  processes of a distributed context (1 otherwise), D devices per process, N = P * D;
 *      there, xs and ys are this process's rows: B / P of them, and "device d" in a pmap_params
 *      call is a global index
 *   C, H, W  channels, height, width   OC output channels     K  outputs of the model
 *
 * Every function that can fail returns a pmap_status; on failure pmap_last_error() returns a
 * message naming the call and the offending values, and nothing the call was given is changed
 * (a create call leaves *out as it was; the one exception, pmap_device_alloc, says so).
 * Library code never exits or aborts on bad input or a device failure. Every size computed from
 * user input is checked for overflow (PMAP_ERR_INVALID_ARGUMENT or PMAP_ERR_OUT_OF_MEMORY).
 *
 * Threads. Every public call on a context, or on params of that context, may be made from any
 * host thread: each takes the context's lock, so concurrent calls run one after the other, each
 * whole (a pmap_update never mixes with another's rows). A call on a context from inside a
 * mapped function of the same context (pmap_run's fn) would wait for itself: it is refused with
 * PMAP_ERR_INVALID_ARGUMENT. Contexts are independent of each other. pmap_last_error() is
 * per thread. Destroying a context or params while another thread still uses them is the
 * caller's error, as for free(). A context belongs to the process that created it: in a forked
 * child (which has none of its worker threads) every call on it or its params fails at once
 * with PMAP_ERR_INVALID_ARGUMENT naming both processes, destroy calls included (they change
 * nothing); create a new context in the child.
 *
 * Signals. Device work never runs a signal handler: a context's worker threads block every
 * signal but those a thread's own action raises (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP,
 * SIGSYS, SIGABRT, SIGPIPE), and a thread calling into a context blocks the same set while it
 * runs device 0's part of the call (pmap_config.caller_waits: it runs none), then restores its
 * own mask; it leaves out SIGINT, SIGTERM, SIGHUP and SIGQUIT where their action at the call is
 * the default one (it ends the process at once, running nothing on the thread); caught or
 * ignored, they are blocked with the rest. A caught signal sent meanwhile (Ctrl-C in Python)
 * goes to another thread, or is delivered when device 0's part ends; none is lost. Where none
 * of those signals has a handler, nothing could run on the thread, and it keeps its own mask: a
 * call then costs no system call for signals. Whether one has a handler is read when a context
 * is created and again at a call 10 ms or more after the last reading, so a process's first
 * handler, installed after its contexts were created, is blocked from that reading on: install
 * handlers before creating a context (or use caller_waits) to have them blocked from the first
 * call. */
#ifndef PMAP_H
#define PMAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library exports exactly the functions marked PMAP_API (it is built with hidden
 * visibility), so `nm -D --defined-only libpmap.so` lists only pmap_ names. */
#if defined(__GNUC__) || defined(__clang__)
#define PMAP_API __attribute__((visibility("default")))
#define PMAP_PRINTF_LIKE(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define PMAP_API
#define PMAP_PRINTF_LIKE(fmt, args)
#endif

/* The version of this header; pmap_version() gives the library's ("0.1.0"). */
#define PMAP_VERSION_MAJOR 0
#define PMAP_VERSION_MINOR 1
#define PMAP_VERSION_PATCH 0

#define PMAP_MAX_DEVICES 64 /* most devices one context may hold */
#define PMAP_MAX_RANK 4     /* most axes of a pmap_array, batch axis included */
/* The model builder's limits (each builder below names its own as well); a size past one is
 * refused with PMAP_ERR_INVALID_ARGUMENT naming it, so no count of the model wraps 64 bits. */
#define PMAP_MAX_EXTENT (1 << 24) /* an input axis: 1..2^24 */
#define PMAP_MAX_FEATURES \
  (1 << 28) /* values per example of the input and of every layer's output */
#define PMAP_MAX_PARAMS ((size_t)1 << 31) /* parameters of a model, state included */
#define PMAP_DEVICES_DEFAULT (-1)         /* pmap_config.num_devices: the backend's default count */

/* ------------------------------------------------------------------------------------------ */
/* Status and errors                                                                          */

typedef enum pmap_status {
  PMAP_SUCCESS = 0,
  PMAP_ERR_INVALID_ARGUMENT = 1, /* bad input at the API boundary: NULL, shape, count, range */
  PMAP_ERR_OUT_OF_MEMORY = 2,    /* host or device allocation failed */
  PMAP_ERR_UNAVAILABLE = 3,      /* backend not built in, its plugin does not load, or no such
                                    device on this machine */
  PMAP_ERR_DEVICE = 4,           /* a device, driver, BLAS or collective library call failed */
  PMAP_ERR_TIMEOUT = 5,          /* a collective did not complete within the context timeout */
  PMAP_ERR_ABORTED = 6,          /* another device failed, so this device's call was abandoned */
  PMAP_ERR_INTERNAL = 7,         /* a bug in pmap: please report it with the message */
  PMAP_ERR_NUMERIC = 8           /* non-finite loss or gradients: the step was skipped on every
                                    replica, nothing changed (see pmap_update) */
} pmap_status;

/* "MAJOR.MINOR.PATCH" of the library that is loaded; compare with PMAP_VERSION_* to catch a
 * header and library of different releases. */
PMAP_API const char *pmap_version(void);

/* A short constant string for a status ("invalid argument", ...); never NULL. */
PMAP_API const char *pmap_status_string(pmap_status s);

/* The detailed message of the last failure of a pmap call on the calling thread, e.g.
 * "pmap_update: global batch 30 is not divisible by 4 devices". It starts with the public call
 * that failed; a failure on a device adds the device: "pmap_update: device 2: <its message>".
 * Valid until the next failing pmap call on this thread (a call that succeeds leaves it as it
 * was); "" when there was none. Never NULL. */
PMAP_API const char *pmap_last_error(void);

/* Sets the calling thread's last-error message to the printf-style text and returns status
 * unchanged (fmt NULL clears the message). For your own gradient or mapped functions: return
 * pmap_set_error(PMAP_ERR_INVALID_ARGUMENT, "my_loss: label %d out of range", y) and the
 * pmap_update or pmap_run it ends reports your status and your text, naming the device. */
PMAP_API pmap_status pmap_set_error(pmap_status status, const char *fmt, ...)
    PMAP_PRINTF_LIKE(2, 3);

/* ------------------------------------------------------------------------------------------ */
/* Context: the device mesh and one worker thread per device                                  */

typedef enum pmap_backend {
  PMAP_BACKEND_AUTO = 0, /* CUDA where a GPU is present, the CUDA backend was built and its
                            plugin (libpmap-cuda.so) loads, else CPU */
  PMAP_BACKEND_CPU = 1,  /* host memory; each device is a worker thread ("virtual device") */
  PMAP_BACKEND_CUDA = 2  /* one GPU per device, cuBLAS and NCCL */
} pmap_backend;

/* Whether a context spans processes (docs/distributed.md). With P processes of D devices each,
 * the context has P*D global devices: pmap_axis_index and pmap_axis_size are global, every
 * collective (and the gradient mean of pmap_update) runs over all of them, and each process
 * passes its own rows to pmap_update. */
typedef enum pmap_dist_mode {
  PMAP_DIST_AUTO = 0, /* distributed when the environment variable PMAP_DIST is "mpi", or when
                         it is unset or "auto" and the program was started by an MPI launcher
                         with more than one process (mpirun sets OMPI_COMM_WORLD_SIZE or
                         PMI_SIZE) or MPI is already initialised with more than one process;
                         otherwise one process. PMAP_DIST=none forces one process. */
  PMAP_DIST_NONE = 1, /* one process, whatever the environment */
  PMAP_DIST_MPI = 2   /* across the processes of an MPI communicator (PMAP_ERR_UNAVAILABLE in a
                         build without MPI) */
} pmap_dist_mode;

typedef struct pmap_config {
  pmap_backend backend;
  int num_devices;       /* 1..PMAP_MAX_DEVICES, or PMAP_DEVICES_DEFAULT for the backend's
                            default: on CPU the environment variable PMAP_CPU_DEVICES, else 4;
                            on CUDA every visible GPU */
  const int *device_ids; /* CUDA: physical GPU of each logical device (num_devices entries,
                            repeats allowed where NCCL allows them: NCCL >= 2.30 documents up
                            to 2 per GPU, docs/cuda.md); NULL means 0..N-1. Ignored on CPU. */
  double timeout_s;      /* a device waiting longer than this in a collective aborts the call on
                            every device with PMAP_ERR_TIMEOUT naming the devices (across
                            processes: the processes) that did not arrive; 0 means the
                            environment variable PMAP_TIMEOUT (seconds > 0; inf or negative:
                            never) when it is set, else 300 s; < 0 or more than 1e9 s (inf
                            included) never; NaN is rejected (a bad PMAP_TIMEOUT too:
                            PMAP_ERR_INVALID_ARGUMENT) */
  int numeric_guard;     /* PMAP_GUARD_ON (0, the default) or PMAP_GUARD_OFF: see pmap_update */
  int uneven_batches;    /* 0 (default): pmap_update and pmap_predict need a global batch that is
                            a multiple of N; 1: any batch of at least N rows, split into shards
                            that differ by at most one row, each device weighted by its rows so
                            that the loss and gradient are the exact mean over the batch.
                            Distributed: numeric_guard and uneven_batches change what every step
                            exchanges, so they must be the same on every process */
  pmap_dist_mode dist;   /* see pmap_dist_mode; 0 is PMAP_DIST_AUTO */
  void *mpi_comm;        /* distributed: a pointer to the MPI_Comm to span (pmap duplicates it
                            and sets MPI_ERRORS_RETURN on its copy), NULL for MPI_COMM_WORLD. The
                            header stays free of mpi.h. If MPI is not initialised, pmap
                            initialises it (MPI_THREAD_MULTIPLE requested, MPI_THREAD_SERIALIZED
                            at least) on a thread of its own, and finalises it at exit only when
                            no process can still be waiting for this one (after a failure across
                            processes it does not, so that mpirun ends the job instead of
                            waiting: docs/distributed.md, "Failures"). Every process of the
                            communicator must create its context with the same backend and the
                            same num_devices. */
  int shard_optimizer;   /* PMAP_SHARD_AUTO (0, the default), PMAP_SHARD_OFF or PMAP_SHARD_ON.
                            On: each device holds the optimizer state of only its own contiguous
                            1/N of the parameters and pmap_update runs reduce-scatter (mean) ->
                            the optimizer on that 1/N -> all-gather of the parameters (ZeRO
                            stage 1); on CPU the results are bitwise those of the replicated
                            step. AUTO: the environment variable PMAP_SHARD_OPTIMIZER (0 or 1)
                            when set, else on for models of at least 65536 parameters (of any
                            size under max_memory, on CPU, where the sharded layout, which pads
                            the parameters to equal parts, holds less) whose optimizer keeps
                            state, unless a CUDA fast path is on (see README, "Sharded
                            optimizer"). PMAP_SHARD_GRADS (3): the gradients too (ZeRO stage
                            2): no device holds the whole gradient; each layer's gradients are
                            reduced into the parts of the devices that own them as the layer's
                            backward ends, so a device holds its part, a window the size of the
                            largest layer's parameters and a tied embedding's table; the same
                            bits as PMAP_SHARD_ON on CPU. Built-in models only (the params of
                            pmap_params_create_custom shard the optimizer alone), where that
                            holds less than PMAP_SHARD_ON's gradient buffer (a model of mostly
                            one layer keeps it whole: pmap_memory_plan.grads_sharded says),
                            one micro-batch where sharded (pmap_params_set_micro_batches
                            refuses more). Never across processes. */
  int cuda_graphs;       /* CUDA: 1 captures the whole step (forward, loss, backward, all-reduce,
                            optimizer) into a CUDA graph after a warm-up step at a batch size and
                            replays it for later steps of that size; -1 never; 0 (default): the
                            environment variable PMAP_CUDA_GRAPHS (0 or 1), else off. Ignored on
                            CPU. See docs/cuda.md */
  int cuda_overlap;      /* CUDA: 1 all-reduces the gradients in buckets on a second stream while
                            backward still runs; -1 never; 0 (default): PMAP_CUDA_OVERLAP (0 or
                            1), else off. Ignored on CPU */
  int cuda_bucket_mb;    /* CUDA, with cuda_overlap: bucket size in MiB (1..4096); 0 (default):
                            PMAP_CUDA_BUCKET_MB, else 25 */
  int caller_waits;      /* 0 (default): device 0's work runs on the thread that calls; 1: device
                            0 has a worker thread of its own too, and a calling thread only waits
                            (it runs no device work and keeps taking signals: for an
                            interpreter's main thread, where a signal handler may raise inside a
                            gradient function written in its language) */
  size_t max_memory;     /* CPU: the bytes each device may hold of what pmap allocates for it
                            (parameters, gradients, optimizer state, activations and the bf16
                            GEMMs' workspace: pmap_params_memory's plan, which equals what a step
                            allocates; and pmap_device_alloc's buffers); 0 (default): no limit.
                            An allocation past it fails with PMAP_ERR_OUT_OF_MEMORY naming the
                            device, the bytes and the limit, and the call that needed it changes
                            nothing (as for any failed allocation). The kernels' own buffers
                            (pmap_params_memory's comment) are not counted. Ignored on CUDA,
                            whose limit is the device's free memory. */
  int recompute;         /* PMAP_RECOMPUTE_NONE (0, the default): a step keeps every layer's
                            activations from forward to backward; PMAP_RECOMPUTE_FULL: of each
                            residual block (the outermost, without batch norm or other layers
                            with state or collectives) it keeps only the input, and computes the
                            block's layers forward again just before their backward: activation
                            memory of about one block instead of all, for about one more forward
                            pass; the results are the same bits (docs/tracing.md, "When a model
                            does not fit"). PMAP_RECOMPUTE_SELECTIVE: of the same blocks it
                            keeps the GEMMs' outputs and computes again only the element-wise
                            results (layer norms' outputs and statistics, the activation
                            functions' outputs, standalone or folded into a dense layer; one
                            folded into a convolution is kept: the cheap part), just before
                            every such block's backward, where two blocks or more hold them
                            (else it keeps all, as NONE); the same bits too. PMAP_RECOMPUTE_AUTO: each step (and
                            pmap_params_memory) takes the first of NONE, SELECTIVE and FULL
                            whose plan at its batch fits the device's limit (max_memory on CPU;
                            on CUDA the memory free on device 0 and what the params'
                            activations hold there), FULL where none does, releasing the
                            activations when the choice changes
                            (the next step sizes them anew at its own rows, and pmap_predict
                            then runs in pieces of those; a pmap_predict before anything sized
                            them chooses as a step of its rows would). For the params created
                            in the context. */
} pmap_config;

enum { PMAP_GUARD_ON = 0, PMAP_GUARD_OFF = 1 };
enum { PMAP_SHARD_AUTO = 0, PMAP_SHARD_OFF = 1, PMAP_SHARD_ON = 2, PMAP_SHARD_GRADS = 3 };
enum {
  PMAP_RECOMPUTE_NONE = 0,
  PMAP_RECOMPUTE_FULL = 1,
  PMAP_RECOMPUTE_AUTO = 2,
  PMAP_RECOMPUTE_SELECTIVE = 3
};

typedef struct pmap_ctx pmap_ctx;

/* Creates a context of cfg->num_devices devices on cfg->backend and starts one worker thread per
 * device (device 0's work runs on the calling thread unless cfg->caller_waits, devices 1..N-1 on
 * persistent workers). The workers are named "pmap-dev<i>" (top -H, gdb, perf, /proc's comm; the
 * calling thread keeps its name), the CUDA backend's NCCL watchdog "pmap-watchdog"; all are
 * joined before pmap_ctx_destroy returns. The GEMM library's own thread pools are not the
 * context's (OpenBLAS stops its pool at a fork and starts it again at its next call).
 * cfg may be NULL for all defaults (auto backend, default device count). On success *out owns the context; destroy it with
 * pmap_ctx_destroy. Returns PMAP_ERR_INVALID_ARGUMENT (out NULL, device count outside
 * 1..PMAP_MAX_DEVICES other than PMAP_DEVICES_DEFAULT, unknown backend), PMAP_ERR_UNAVAILABLE
 * (backend not built, no device, or the plugin it needs, libpmap-cuda.so or libpmap-mpi.so, is
 * missing or does not load: the message names the file and the loader's reason),
 * PMAP_ERR_OUT_OF_MEMORY, PMAP_ERR_DEVICE; a bad environment variable (PMAP_TIMEOUT,
 * PMAP_CPU_DEVICES, PMAP_FAULT, ...) is PMAP_ERR_INVALID_ARGUMENT naming it, and every message
 * starts with "pmap_ctx_create: ".
 * Distributed (cfg->dist): a collective call of every process of the communicator, in the same
 * order; it also returns PMAP_ERR_INVALID_ARGUMENT when the processes differ in backend, device
 * count, numeric_guard or uneven_batches (the message names the setting, the processes and
 * their hosts), PMAP_ERR_UNAVAILABLE without MPI in this build (also
 * when an MPI launcher started the program with several processes and dist is
 * PMAP_DIST_AUTO), and
 * PMAP_ERR_TIMEOUT naming the processes that did not arrive within the timeout (the whole
 * creation is bounded by it, MPI's start included, where MPI cannot say which process is
 * missing). The processes meet with one message each on tag 32717 of the communicator. After an
 * inter-process failure (timeout, dead process, MPI error), or a failure of one process that the
 * others do not share outside pmap_run (a device failed in its pmap_update, say), the context
 * is broken: the other processes are told at once, and every later call fails at once with the
 * failure's message naming the process; destroy the context and end the program
 * (docs/distributed.md). A failing pmap_run leaves it usable (see there), and so does a
 * collective call that one process refuses by its own checks before the exchange (bad input,
 * NULL): every process refuses it (pmap_update). */
PMAP_API pmap_status pmap_ctx_create(const pmap_config *cfg, pmap_ctx **out);

/* Stops the workers and frees the context. Accepts NULL (PMAP_SUCCESS). Every pmap_params created
 * on the context must be destroyed first: with params still alive, or when called from inside a
 * mapped function of this context, or from a process other than the one that created it (a
 * forked child), it returns PMAP_ERR_INVALID_ARGUMENT and changes nothing (the context stays
 * usable where it was created). Distributed: it tells the other processes that this one leaves
 * (one still waiting for it in a collective fails at once, naming it) and waits, up to the
 * timeout, for them to destroy theirs; one that does not (stopped, stalled, dead) is named by
 * PMAP_ERR_TIMEOUT ("pmap_ctx_destroy: process 0 of 2 (host a): process 1 (host b, device 1) did
 * not destroy its context within 3.000 s ..."), the context freed all the same (and, where pmap
 * started MPI, MPI left unfinalised at exit, so that the launcher ends the job). */
PMAP_API pmap_status pmap_ctx_destroy(pmap_ctx *ctx);

/* Devices of this process (D). */
PMAP_API int pmap_ctx_num_devices(const pmap_ctx *ctx);
/* Processes the context spans (P, 1 when not distributed) and this process's index in 0..P-1
 * (its MPI rank in the communicator). Global device g lives in process g / D as its local
 * device g % D. */
PMAP_API int pmap_ctx_num_processes(const pmap_ctx *ctx);
PMAP_API int pmap_ctx_process_index(const pmap_ctx *ctx);
PMAP_API pmap_backend pmap_ctx_backend(const pmap_ctx *ctx); /* never PMAP_BACKEND_AUTO */

/* "auto", "cpu", "cuda"; NULL for a value outside the enum. */
PMAP_API const char *pmap_backend_name(pmap_backend b);
/* Parses "auto", "cpu" or "cuda" into *out; PMAP_ERR_INVALID_ARGUMENT naming the string else. */
PMAP_API pmap_status pmap_backend_parse(const char *name, pmap_backend *out);
/* Whether this build contains the backend (CPU always; CUDA when configured with it). CUDA lives
 * in a plugin beside the library, libpmap-cuda.so, opened by the first context that needs it
 * (docs/cuda.md says where it is looked for; PMAP_PLUGIN_DIR names the folder): a build that has
 * it may still refuse a context when the plugin does not load, and pmap_ctx_create says why. */
PMAP_API int pmap_backend_built(pmap_backend b);
/* The CPU GEMM in use: "onednn", "cblas" or "portable". A build holds every provider found at
 * configure time (-Dgemm=auto) or one (-Dgemm=NAME); among several, the library chooses once
 * per process, at the first CPU context, the first GEMM, or this call, whichever comes first
 * (every thread that needs it waits for it): the one the environment variable PMAP_GEMM names
 * (onednn, cblas, portable, or auto), else this machine's choice cached in
 * $XDG_CACHE_HOME/pmap/gemm (~/.cache/pmap/gemm) for its CPU model, library version and built
 * providers, else the fastest in a measurement of a fraction of a second, which is then cached
 * (PMAP_GEMM_CACHE=0: neither read nor write the cache). "none" when PMAP_GEMM names no built
 * provider or PMAP_GEMM_CACHE is neither 0 nor 1: pmap_ctx_create of a CPU context then fails
 * with a message naming the value and the built providers. Never NULL; the string is static. */
PMAP_API const char *pmap_gemm_provider(void);
/* The CPU GEMM providers of this build, comma-separated, most preferred first: e.g.
 * "onednn,cblas,portable". Never NULL; makes no choice. */
PMAP_API const char *pmap_gemm_providers(void);
/* Why pmap_gemm_provider() is the one in use: "measured" (in this process), "cached" (by an
 * earlier process on this machine), "forced by PMAP_GEMM", "only one built", "only one within
 * PMAP_CPU_ISA" (OpenBLAS's kernels above the cap), "preferred (no memory to measure)", or "invalid PMAP_GEMM" / "invalid PMAP_GEMM_CACHE" (provider "none"). Makes the choice like
 * pmap_gemm_provider. Never NULL; the string is static. */
PMAP_API const char *pmap_gemm_reason(void);
/* How many convolution shapes (a layer's shape, bias and ReLU, with its rows per device up to
 * the rows the choice measures) this process ran on the CPU `path` ("onednn": oneDNN's
 * convolution primitives, "im2col": im2col + the GEMM in use) in `pass` ("forward" or
 * "backward"), each counted by the path of its last call. Each shape and pass takes the path
 * the environment variable PMAP_CONV forces (onednn, im2col, or auto), else the one chosen at
 * its first call and kept for the process: this machine's choice cached in
 * $XDG_CACHE_HOME/pmap/conv, else the faster in a measurement of a few milliseconds
 * (docs/cpu-gemm.md, "Convolutions"). -1 for another pass or path name. */
PMAP_API int pmap_conv_choices(const char *pass, const char *path);
/* The instruction set pmap's CPU code uses: "sse41", "avx2", "avx512" (x86-64-v4),
 * "avx512_bf16" or "amx": the CPU's (CPUID, with the registers the OS saves), capped by the
 * environment variable PMAP_CPU_ISA (one of those names, or native), read once per process. The
 * cap holds for oneDNN (its primitives, float GEMM and bf16 matmul), pmap's own SIMD kernels and
 * the choices of pmap_gemm_provider and pmap_bf16_provider, so that one machine runs the paths
 * of older CPUs (docs/cpu-gemm.md). A name above the CPU's level, or not one of them, makes
 * pmap_ctx_create of a CPU context fail naming it (the code then runs on the CPU's own level).
 * Never NULL; the string is static. */
PMAP_API const char *pmap_cpu_isa(void);
/* The bfloat16 instructions pmap may use: "amx_bf16" (AMX tiles), "avx512_bf16" or "none", by
 * pmap_cpu_isa(). Never NULL; the string is static. */
PMAP_API const char *pmap_cpu_bf16(void);
/* The CPU GEMM of PMAP_PRECISION_BF16: "onednn" (oneDNN's bf16 matmul, a primitive per shape
 * made at its first use on each device), or "portable" (the bfloat16 operands widened to float,
 * exactly, and multiplied by pmap_gemm_provider()'s GEMM: the same products and float sums, at
 * about the float speed), chosen once per process: the environment variable PMAP_GEMM_BF16
 * (auto, onednn, portable) when set, else onednn where the build has oneDNN, oneDNN runs bf16
 * instructions (pmap_cpu_bf16(), and oneDNN's own cap) and its matmul measures faster than the
 * portable path (cached like pmap_gemm_provider's choice). "none" when PMAP_GEMM_BF16 is invalid or names onednn in a build without
 * it: pmap_ctx_create of a CPU context then fails naming it. Never NULL; static. */
PMAP_API const char *pmap_bf16_provider(void);
/* Why: "the CPU has AVX512_BF16", "the CPU has AMX", "the CPU has no bf16 instructions",
 * "PMAP_CPU_ISA caps the CPU below its bf16 instructions", "oneDNN's ISA has no bf16
 * instructions (ONEDNN_MAX_CPU_ISA)" (oneDNN would emulate them, slower than the portable path),
 * "oneDNN's bf16 matmul measured slower than the portable path",
 * "no oneDNN in this build", "forced by PMAP_GEMM_BF16", "forced" (in-process, by the tests), or
 * "invalid PMAP_GEMM_BF16". Never NULL; static. */
PMAP_API const char *pmap_bf16_reason(void);

/* ------------------------------------------------------------------------------------------ */
/* Host arrays                                                                                */

typedef enum pmap_dtype {
  PMAP_F32 = 0, /* float */
  PMAP_I32 = 1  /* int32_t: class labels, token ids (a model starting with an embedding) */
} pmap_dtype;

/* A dense row-major host array; it does not own data. shape[0] is the global batch B. */
typedef struct pmap_array {
  void *data;
  pmap_dtype dtype;
  int rank;                     /* 1..PMAP_MAX_RANK */
  int64_t shape[PMAP_MAX_RANK]; /* (B, ...) */
} pmap_array;

/* Convenience constructors; they only fill the struct. */
PMAP_API pmap_array pmap_array_f32(float *data, int rank, const int64_t *shape);
PMAP_API pmap_array pmap_array_i32(int32_t *data, int rank, const int64_t *shape);
/* The product of a's extents: 0 for a NULL array or a rank outside 1..PMAP_MAX_RANK; -1 when an
 * extent is negative (whatever the others, 0 among them) or the product does not fit in int64_t;
 * else 0 for an extent of 0, whatever the others. */
PMAP_API int64_t pmap_array_numel(const pmap_array *a);

/* ------------------------------------------------------------------------------------------ */
/* Models: a sequential stack of layers with a loss                                           */

typedef enum pmap_loss {
  PMAP_LOSS_MSE = 0,          /* mean over all outputs of (pred - y)^2; ys are f32 (B, K) */
  PMAP_LOSS_SOFTMAX_XENT = 1, /* mean over the batch of -log softmax(pred)[label]; ys are i32 (B)
                                 or (B, 1), labels in [0, K) */
  PMAP_LOSS_TOKEN_XENT = 2    /* per-token softmax cross-entropy of a (T, V) output, the mean over
                                 the batch's B x T tokens; ys are i32 (B, T), targets in [0, V)
                                 (set by pmap_model_add_lm_head) */
} pmap_loss;

typedef struct pmap_model pmap_model;

/* Creates an empty model taking examples of shape input_shape[0..rank) (without the batch axis):
 * rank 1 (F) or rank 3 (C, H, W), each extent 1..PMAP_MAX_EXTENT and their product at most
 * PMAP_MAX_FEATURES. Returns PMAP_ERR_INVALID_ARGUMENT for a NULL pointer, a rank other than 1
 * or 3, or an extent or product out of range; PMAP_ERR_OUT_OF_MEMORY. */
PMAP_API pmap_status pmap_model_create(int rank, const int64_t *input_shape, pmap_model **out);
PMAP_API void pmap_model_destroy(pmap_model *model); /* accepts NULL */

/* Layers, appended in order. Each checks that it fits the current output shape and returns
 * PMAP_ERR_INVALID_ARGUMENT (model unchanged) when it does not. Every layer's output holds at
 * most PMAP_MAX_FEATURES values per example, and the model at most PMAP_MAX_PARAMS parameters.
 * dense:   (F) -> (units), y = x W + b, W (F, units) row-major, b (units); units 1..2^24.
 * relu:    any shape, y = max(x, 0).
 * conv2d:  (C, H, W) -> (OC, OH, OW), NCHW, weights (OC, C, KH, KW), bias (OC),
 *          OH = (H + 2 pad - KH) / stride + 1 (likewise OW); out_channels 1..65536, kernel
 *          1..64 each way, stride >= 1, pad 0..64.
 * flatten: (C, H, W) -> (C*H*W), a view: no copy. */
PMAP_API pmap_status pmap_model_add_dense(pmap_model *model, int64_t units);
PMAP_API pmap_status pmap_model_add_relu(pmap_model *model);
PMAP_API pmap_status pmap_model_add_conv2d(pmap_model *model, int64_t out_channels, int kernel_h,
                                           int kernel_w, int stride, int pad);
PMAP_API pmap_status pmap_model_add_flatten(pmap_model *model);
/* The loss (default MSE). The model's output must be rank 1 (K) when training, rank 2 (T, V) for
 * PMAP_LOSS_TOKEN_XENT. */
PMAP_API pmap_status pmap_model_set_loss(pmap_model *model, pmap_loss loss);

/* More layers (docs/models.md, "Layers"), with the same checks and statuses as those above:
 * PMAP_ERR_INVALID_ARGUMENT (model unchanged) for a NULL model, an argument out of range or an
 * input shape the layer cannot take; PMAP_ERR_OUT_OF_MEMORY.
 * tanh, sigmoid, gelu: any shape, element-wise. gelu is the tanh form,
 *          0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (jax.nn.gelu(approximate=True)). */
PMAP_API pmap_status pmap_model_add_tanh(pmap_model *model);
PMAP_API pmap_status pmap_model_add_sigmoid(pmap_model *model);
PMAP_API pmap_status pmap_model_add_gelu(pmap_model *model);
/* layernorm: any shape (S elements per example); each example is normalised over all its S
 *          elements, y = (x - mean) / sqrt(var + 1e-6) * gamma + beta (biased variance).
 *          Parameters: gamma (S) then beta (S), initialised to 1 and 0. */
PMAP_API pmap_status pmap_model_add_layernorm(pmap_model *model);
/* maxpool2d, avgpool2d: (C, H, W) -> (C, OH, OW), OH = (H - kernel_h) / stride + 1 (likewise
 *          OW), no padding; windows may overlap (stride < kernel). Kernel and stride 1..64.
 *          Max pooling passes the gradient to the first maximum of each window. No parameters.
 * global_avgpool: (C, H, W) -> (C), the mean of each channel's plane; H and W 1..65536. */
PMAP_API pmap_status pmap_model_add_maxpool2d(pmap_model *model, int kernel_h, int kernel_w,
                                              int stride);
PMAP_API pmap_status pmap_model_add_avgpool2d(pmap_model *model, int kernel_h, int kernel_w,
                                              int stride);
PMAP_API pmap_status pmap_model_add_global_avgpool(pmap_model *model);
/* dropout: any shape, rate in [0, 1). In pmap_update, y = x * keep / (1 - rate) with keep drawn
 *          from a counter-based hash of (layer, step, the element's index in the global batch):
 *          the masks are reproducible and the same on any device count. In pmap_predict the
 *          identity. No parameters. */
PMAP_API pmap_status pmap_model_add_dropout(pmap_model *model, float rate);
/* Transformers (docs/models.md, "Transformers"). A language model takes token ids: a model
 * created with input shape (T) whose first layer is the token embedding takes xs as i32 (B, T)
 * token ids (pmap_update and pmap_predict refuse f32 xs for it, and any id outside [0, vocab),
 * naming it and its place, with nothing changed).
 * embedding:        (T) token ids -> (T, dim), y[t] = E[id[t]], table E (vocab, dim) ~ N(0, 0.02^2);
 *                   only as the first layer. Its gradient is summed per token in a fixed order
 *                   (bitwise the same on every run and device count).
 * pos_embedding:    (T, D) -> (T, D), y = x + P, P (T, D) ~ N(0, 0.02^2), learned.
 * token_dense:      (T, F) -> (T, units), y[t] = x[t] W + b per token, W (F, units), b (units).
 * token_layernorm:  (T, F) -> (T, F), each token normalised over its F features, eps 1e-5,
 *                   gamma (F) then beta (F).
 * causal_attention: (T, D) -> (T, D), heads x head_size = E: qkv = x Wqkv + bqkv (Wqkv (D, 3E):
 *                   Q, K, V side by side, head h at columns h*head_size of each), per head
 *                   softmax(Q K^T / sqrt(head_size)) with position t seeing positions <= t,
 *                   times V, heads concatenated (T, E), then y = O Wo + bo (Wo (E, D)).
 *                   Parameters: Wqkv, Wo, then bqkv (3E), bo (D). Its activations hold
 *                   2 B H T^2 + 8 B T E floats per device (B its rows) up to T 64 (under bf16:
 *                   256, P in bfloat16); past it the attention is blocked: blocks
 *                   of R queries (R 64, T / 8 rounded up to 16 past T 512) scored against the
 *                   keys up to the block's end, P taken again in the backward pass (the same
 *                   bits), 8 B T E + 2 B H T floats and 2 H R T of its own (docs/models.md,
 *                   "Memory"): linear in T up to T 512.
 * lm_head:          (T, D) -> (T, vocab) logits; tied 0: x W + b with W (D, vocab), b (vocab) of
 *                   its own; tied 1: x E^T with the token embedding's table (no parameters of
 *                   its own: one block of the flat vector serves both, so the optimizer,
 *                   checkpoints and pmap_params_read see it once, its gradient the sum of both
 *                   uses). Needs the model to start with an embedding; sets the loss to
 *                   PMAP_LOSS_TOKEN_XENT.
 * Limits: embedding vocab 1..2^24 and dim 1..65536 (T x dim at most PMAP_MAX_FEATURES);
 * token_dense units 1..2^20; causal_attention heads 1..1024, head_size 1..4096, T at most 4096
 * and D x E at most 2^26; lm_head T x vocab at most PMAP_MAX_FEATURES. */
PMAP_API pmap_status pmap_model_add_embedding(pmap_model *model, int64_t vocab, int64_t dim);
PMAP_API pmap_status pmap_model_add_pos_embedding(pmap_model *model);
PMAP_API pmap_status pmap_model_add_token_dense(pmap_model *model, int64_t units);
PMAP_API pmap_status pmap_model_add_token_layernorm(pmap_model *model);
PMAP_API pmap_status pmap_model_add_causal_attention(pmap_model *model, int heads, int head_size);
PMAP_API pmap_status pmap_model_add_lm_head(pmap_model *model, int tied);
/* batchnorm: (F) or (C, H, W); normalises each feature (channel: over the batch and H, W) with
 *          the batch's mean and biased variance, y = (x - mean) / sqrt(var + 1e-5) * gamma + beta.
 *          cross_replica != 0: the statistics are those of the global batch (all-reduces of
 *          per-device sums and counts, then of sums of squares around the global mean, in
 *          forward, and of the matching sums in backward), so N devices compute what 1 device
 *          computes on the same global batch (jax pmap with axis_name); 0: each device
 *          normalises over its own shard.
 *          Parameters: gamma (C), beta (C), then the running mean (C) and running variance (C)
 *          (initialised 1, 0, 0, 1). The running statistics sit in the parameter vector so that
 *          pmap_params_read, checkpoints and pmap_params_verify carry them, but they are
 *          state that is not trained: the optimizer (weight decay included), clipping and the
 *          numeric guard never see them. Each forward pass of a training step moves them
 *          towards the moments of the rows it takes on every device together, running =
 *          0.9 running + 0.1 batch (with either setting of cross_replica, so every replica
 *          holds the same values): once a step, or k times with k micro-batches
 *          (pmap_params_set_micro_batches), once for each micro-batch's rows. They change only
 *          once the step is taken: a step that fails or is skipped leaves them as they were. A
 *          batch whose moments are not finite or overflow float (the global batch's, on any
 *          device count) leaves them as they were and makes the step's loss not finite, so the
 *          numeric guard skips it.
 *          pmap_predict normalises with them. */
PMAP_API pmap_status pmap_model_add_batchnorm(pmap_model *model, int cross_replica);
/* Residual blocks: the layers added between begin and end form f, and the block computes
 * y = x + f(x); f must keep the shape (end returns PMAP_ERR_INVALID_ARGUMENT otherwise, and
 * when no block is open). Blocks nest up to 16 deep; pmap_params_create rejects a model with a
 * block left open. No parameters of their own. */
PMAP_API pmap_status pmap_model_begin_residual(pmap_model *model);
PMAP_API pmap_status pmap_model_end_residual(pmap_model *model);

/* Number of parameters. Their layout in the flat parameter vector: layers in order, each
 * layer's weights then its bias, in the shapes given above (norms: gamma then beta; batch norm
 * then its running mean and variance); pmap_model_param_block names each block. */
PMAP_API size_t pmap_model_num_params(const pmap_model *model);

/* One named block of the flat parameter vector (docs/models.md, "Parameter blocks"). */
#define PMAP_BLOCK_NAME_MAX 64
typedef struct pmap_param_block {
  char name[PMAP_BLOCK_NAME_MAX]; /* "<layer>.<kind>.<block>": "3.dense.w", "1.batchnorm.beta" */
  const char *kind;               /* the layer's kind, "dense" (static storage) */
  const char *block;              /* the block's name in its layer, "w" (static storage) */
  int layer;                      /* the layer's index: one per builder call, residual begin and
                                     end included */
  int trained;                    /* 1: trained; 0: state that is not trained (batch norm's
                                     running statistics) */
  int rank;
  int64_t shape[PMAP_MAX_RANK]; /* row-major; unused axes 0 */
  size_t offset;                /* its first element in the flat vector (pmap_params_read) */
  size_t count;                 /* its elements, the product of its shape */
} pmap_param_block;
/* The model's blocks, in the flat vector's order, each once (a tied lm_head has none of its own:
 * it reads 0.embedding.table); they cover the vector exactly. 0 for a NULL model. */
PMAP_API size_t pmap_model_num_param_blocks(const pmap_model *model);
/* Block `index` into *out. PMAP_ERR_INVALID_ARGUMENT for a NULL model or out, or an index outside
 * [0, pmap_model_num_param_blocks); *out is unchanged then. */
PMAP_API pmap_status pmap_model_param_block(const pmap_model *model, size_t index,
                                            pmap_param_block *out);
/* The block named `name` into *out. PMAP_ERR_INVALID_ARGUMENT for a NULL argument or a name that
 * is not one of the model's blocks (the message says what that layer holds); *out unchanged. */
PMAP_API pmap_status pmap_model_find_param_block(const pmap_model *model, const char *name,
                                                 pmap_param_block *out);
/* Output shape of one example: writes the rank into *rank and the extents into shape. */
PMAP_API void pmap_model_output_shape(const pmap_model *model, int *rank,
                                      int64_t shape[PMAP_MAX_RANK]);
/* Multiply-adds of one example's forward pass (for FLOP counts: a training step costs about
 * 3x forward, 2 FLOPs each). */
PMAP_API double pmap_model_forward_macs(const pmap_model *model);

/* ------------------------------------------------------------------------------------------ */
/* Optimizers                                                                                 */

/* The update of step t (t = 1, 2, ...) with gradient g and this step's learning rate lr_t:
 *   SGD    g' = g + weight_decay w;  momentum 0: w -= lr_t g';  else v = momentum v + g' and
 *          w -= lr_t v, or with nesterov w -= lr_t (g' + momentum v)
 *   ADAM   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;
 *          w -= lr_t (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
 *   ADAMW  ADAM, and the decoupled weight decay w -= lr_t weight_decay w (w before the step) */
typedef enum pmap_optimizer_kind {
  PMAP_OPT_SGD = 0,
  PMAP_OPT_ADAM = 1,
  PMAP_OPT_ADAMW = 2
} pmap_optimizer_kind;

/* The learning rate of step t (t = 1, 2, ...; W warmup_steps, D decay_steps, f final_lr):
 *   CONSTANT       lr
 *   WARMUP_COSINE  lr t / W for t <= W, then f + (lr - f) (1 + cos(pi min(t - W, D) / D)) / 2
 *   WARMUP_LINEAR  lr t / W for t <= W, then lr - (lr - f) min(t - W, D) / D
 * (W = 0: no warm-up), computed in double and rounded once, identically on every replica. */
typedef enum pmap_schedule {
  PMAP_SCHEDULE_CONSTANT = 0,
  PMAP_SCHEDULE_WARMUP_COSINE = 1,
  PMAP_SCHEDULE_WARMUP_LINEAR = 2
} pmap_schedule;

typedef struct pmap_optimizer {
  pmap_optimizer_kind kind;
  float lr;           /* > 0 and finite: the base (peak) learning rate */
  float momentum;     /* SGD: in [0, 1) */
  float beta1;        /* Adam, AdamW: in [0, 1) */
  float beta2;        /* Adam, AdamW: in [0, 1) */
  float eps;          /* Adam, AdamW: > 0 */
  float clip_norm;    /* > 0: before the step, the averaged gradient is scaled so that its global L2
                      norm is at most clip_norm (the norm is identical on every replica);
                      0 (the default): no clipping */
  float weight_decay; /* >= 0: SGD's L2 term, AdamW's decoupled decay; Adam: must be 0 */
  int nesterov;       /* SGD with momentum > 0: 1 for Nesterov's momentum */
  pmap_schedule schedule; /* the learning-rate schedule (default constant) */
  int64_t warmup_steps;   /* >= 0, whatever the schedule */
  int64_t decay_steps;    /* > 0 for the decaying schedules */
  float final_lr;         /* the floor the decay ends at: in [0, lr] */
} pmap_optimizer;

/* Settings with everything else at its default: no clipping, no weight decay, constant lr. */
PMAP_API pmap_optimizer pmap_sgd(float lr, float momentum);
PMAP_API pmap_optimizer pmap_adam(float lr); /* beta1 0.9, beta2 0.999, eps 1e-8 */
PMAP_API pmap_optimizer pmap_adamw(float lr,
                                   float weight_decay); /* as pmap_adam, decoupled decay */
/* The learning rate of step t >= 1 under opt's schedule (opt->lr for t < 1 or NULL: 0). */
PMAP_API double pmap_optimizer_lr(const pmap_optimizer *opt, int64_t t);

/* ------------------------------------------------------------------------------------------ */
/* Replicated training state                                                                  */

typedef struct pmap_params pmap_params;

/* Creates the training state of model on every device of ctx: parameters initialised once on
 * the host from seed (He or LeCun normal weights, zero biases) and copied to every replica,
 * gradients and optimizer state zeroed. The model and the optimizer are copied: the caller
 * keeps ownership of both. Returns PMAP_ERR_INVALID_ARGUMENT (NULL, empty model, optimizer
 * settings out of range: lr <= 0 or not finite, ...; PMAP_FAULT=gather for params whose
 * optimizer is replicated, where it would never fire), PMAP_ERR_OUT_OF_MEMORY, PMAP_ERR_DEVICE.
 * Distributed: a collective call (device 0's parameters are broadcast); a create that one
 * process refuses, or of another parameter count, fails on every process (named). */
PMAP_API pmap_status pmap_params_create(pmap_ctx *ctx, const pmap_model *model,
                                        const pmap_optimizer *opt, uint64_t seed,
                                        pmap_params **out);
/* Frees params. Accepts NULL. Does nothing when called from inside a mapped function of its
 * context or from a process other than the one that created the context. */
PMAP_API void pmap_params_destroy(pmap_params *params);

PMAP_API size_t pmap_params_count(const pmap_params *params);
/* Bytes of optimizer state a device holds (the most any device holds): slots x P x 4 replicated
 * (1 slot for SGD with momentum, 2 for Adam, 0 for plain SGD), about 1/N of that with
 * pmap_config.shard_optimizer. 0 for NULL. */
PMAP_API size_t pmap_params_optimizer_bytes(const pmap_params *params);
/* 1 when the optimizer of params is sharded over the devices (pmap_config.shard_optimizer on and
 * more than one device in one process), else 0 (NULL included). */
PMAP_API int pmap_params_sharded(const pmap_params *params);
/* Optimizer steps taken. Steps count from 1: after step t it is t, and every message, trace and
 * checkpoint names steps so (README, "Step numbers"). */
PMAP_API int64_t pmap_params_step(const pmap_params *params);

/* One data-parallel training step. xs: (B, input shape...) f32, or i32 token ids (B, T) in
 * [0, vocab) for a model that starts with an embedding; ys: (B, K) f32 for MSE, (B) or (B, 1) i32
 * for softmax cross-entropy, (B, T) i32 targets in [0, vocab) for the per-token cross-entropy.
 * Ids and targets out of range are refused naming the value, its example and its position,
 * before anything changes. In a distributed context each process passes its own
 * rows of the global batch, the same number (a multiple of D) in every process, at the same
 * step, with the same optimizer settings (checked before every step in one exchange:
 * PMAP_ERR_INVALID_ARGUMENT on every process otherwise, naming each process's value, nothing
 * changed), and the D local devices split them; the mean is then over every process's rows (each global device weighs its
 * rows equally, which is the exact global mean) and *loss is the same on every process.
 * Device d takes rows [d B/N, (d+1) B/N) of both as a view
 * (no copy on CPU), computes forward, loss and backward on them, then one all-reduce averages
 * gradients and loss together and every device applies the same optimizer step (with
 * pmap_config.shard_optimizer: a reduce-scatter, each device steps its 1/N of the parameters,
 * and an all-gather of the parameters, with bitwise the same result on CPU). *loss (may be
 * NULL) receives the mean loss over the global batch. Synchronous: returns when every replica is
 * updated; xs and ys may be reused at once. The first call with a larger batch than before sizes
 * the activation memory; later calls allocate nothing. Exception, the CUDA fast steps
 * (pmap_config.cuda_graphs, cuda_overlap): with the numeric guard off and loss NULL the call
 * returns once the step is queued on the GPUs (xs and ys may still be reused at once); a failure
 * of that step is returned by the next call that waits for the GPUs.
 *
 * Numeric guard (on unless pmap_config.numeric_guard is PMAP_GUARD_OFF): after the all-reduce,
 * every replica checks the averaged loss and gradients for non-finite values (a non-finite
 * value on any device makes them so; each device's own values are looked at only to name it,
 * after a skip). If any is non-finite, every
 * replica skips the optimizer step alike (parameters, the layers' state such as batch norm's
 * running statistics, optimizer state and step count unchanged, *loss not written) and the call
 * returns PMAP_ERR_NUMERIC naming the step and the devices whose own loss or gradients were
 * non-finite (by global index; across processes with their process and host) (a gradient whose
 * L2 norm exceeds FLT_MAX counts as non-finite; under Adam and AdamW so does one whose norm, after
 * clipping, exceeds 1e19, whose squares could overflow the second moment: the message names the
 * norm; docs/reliability.md). With layers that exchange values between
 * devices (batch norm, also per device), a device's own values are what it sent into the first
 * exchange that returned a non-finite value: the step is computed once more to find them, and
 * the devices that only received non-finite values are said to (docs/reliability.md). NaN propagates through every op. With the guard off, non-finite values go
 * into the parameters. With opt.clip_norm > 0 the averaged gradient is scaled to that global L2
 * norm when it exceeds it (the norm is computed in the guard's pass; the scale is applied
 * however small).
 *
 * Returns PMAP_ERR_INVALID_ARGUMENT (NULL, B not divisible by N or zero, wrong rank, dtype or
 * extent, label out of range, a shape whose size overflows; called from inside a mapped
 * function; the step count already at 2^63 - 2, the most pmap_params_load takes, so every
 * checkpoint a run saves loads) with the parameters untouched; PMAP_ERR_OUT_OF_MEMORY (also
 * when the activations of the batch would not fit the address space); PMAP_ERR_NUMERIC (above:
 * nothing changed); PMAP_ERR_DEVICE, PMAP_ERR_TIMEOUT, PMAP_ERR_ABORTED (a device or a
 * collective failed: on the CPU backend the step is then not applied on any replica, as every
 * failure happens before the optimizer; on CUDA the replicas' state is undefined after a
 * timeout). One exception, with a
 * sharded optimizer: when the all-gather of the parameters after the optimizer fails twice, the
 * step was taken (pmap_params_step() counts it, *loss is written, the message says "step S was
 * taken") and the next call on params completes the all-gather before anything else; compare
 * pmap_params_step() before and after to know whether to retry a batch.
 * Distributed: a call one process refuses by itself (its rows fail a check above, a NULL xs
 * or ys included; not a NULL params, which names no context) still takes part in the step
 * check, so every process refuses that step, the others with PMAP_ERR_INVALID_ARGUMENT naming
 * the process, its host and why; nothing changes on any, and the next calls pair with each
 * other (skipping a bad batch with a caught error is safe). */
PMAP_API pmap_status pmap_update(pmap_params *params, const pmap_array *xs, const pmap_array *ys,
                                 float *loss);
/* In place of pmap_update, for a step whose batch this process's own checks refused (a data
 * loader's, a binding's): takes part in the step check without a batch, so that the other
 * processes' pmap_update of that step fails as above, naming this process and why. Returns
 * status (PMAP_ERR_INVALID_ARGUMENT for PMAP_SUCCESS or a value that is no pmap_status) with why
 * as its message, or the failure of the exchange; in one process it returns at once.
 * PMAP_ERR_INVALID_ARGUMENT for NULL params. */
PMAP_API pmap_status pmap_update_refuse(pmap_params *params, pmap_status status, const char *why);

/* Splits each device's rows into k micro-batches (1..65536; 1, the default, is one piece):
 * forward and backward run once per piece, the gradients accumulate, and the step still does
 * one all-reduce and one optimizer update, equal to the unsplit step up to rounding, while the
 * activation memory drops by k. A device with fewer than k rows takes one row per piece; for a
 * model with collectives inside (batch norm across replicas) or a gradient function (which may
 * call collectives), k is capped at the fewest rows of any device, so that every device runs
 * as many pieces; across processes they must set the same k then (pmap_update's step check). */
PMAP_API pmap_status pmap_params_set_micro_batches(pmap_params *params, int k);

/* The numeric policy of a step and a prediction (docs/precision.md says what each part computes
 * in which format). */
typedef enum pmap_precision {
  PMAP_PRECISION_FP32 = 0, /* everything in float (the default) */
  PMAP_PRECISION_BF16 = 1  /* mixed: GEMM operands in bfloat16, the rest in float */
} pmap_precision;
/* Sets params' policy; it applies from the next pmap_update or pmap_predict on. Under
 * PMAP_PRECISION_BF16 the operands of every GEMM (dense, token_dense, lm_head, the attention's
 * projections and per-head products) are rounded to bfloat16 (to nearest, ties to even) and
 * multiplied with float sums, from a bfloat16 copy of the weights made before each step; the
 * parameters (float masters), gradients, their all-reduce, the optimizer and its state, the
 * losses, softmax, norms, biases and residual sums stay float. Activations read only as GEMM
 * operands are kept in bfloat16 (pmap_params_memory counts what that saves, and the weights'
 * copy). Replicas stay bitwise identical, and runs repeat bitwise on the same machine, device
 * count and GEMM providers. Checkpoints hold the float parameters and record the policy; a
 * file saved under one loads under the other. A change releases the activation memory first, as
 * pmap_params_shrink does (its layout differs; the next call sizes it anew), so the switch never
 * holds it and the weights' copy at once. Returns PMAP_ERR_INVALID_ARGUMENT (NULL, a value
 * outside the enum, bf16 for params of pmap_params_create_custom), PMAP_ERR_OUT_OF_MEMORY
 * (nothing else changed). */
PMAP_API pmap_status pmap_params_set_precision(pmap_params *params, pmap_precision precision);
/* params' policy; PMAP_PRECISION_FP32 for NULL. */
PMAP_API pmap_precision pmap_params_precision(const pmap_params *params);
/* "fp32", "bf16"; NULL for a value outside the enum. */
PMAP_API const char *pmap_precision_name(pmap_precision precision);
/* Parses "fp32" or "bf16" into *out; PMAP_ERR_INVALID_ARGUMENT naming the string else. */
PMAP_API pmap_status pmap_precision_parse(const char *name, pmap_precision *out);

/* Sharded forward pass: out (B, output shape...) f32, written in batch order. xs as for
 * pmap_update. Returns the same statuses as pmap_update; out->shape must match exactly. Each
 * device runs its rows in pieces of at most its share of a micro-batch and, once a pmap_update
 * (or pmap_predict) has sized its activations, of at most the rows they were last sized for
 * (also after pmap_params_shrink or a change of precision released them): a prediction of any
 * number of rows after a step allocates nothing beyond that step's pmap_params_memory plan (at
 * the precision in force; before any step, the first call sizes them for its own pieces). The
 * pieces' rows are the GEMMs' rows, whose last bits can depend on them: the same rows predicted
 * after activations sized for another count (a smaller step after pmap_params_shrink, a change
 * of precision, PMAP_RECOMPUTE_AUTO changing its choice, or a step refused for memory, each of
 * which releases them) may differ in the last bits. */
PMAP_API pmap_status pmap_predict(pmap_params *params, const pmap_array *xs, pmap_array *out);

/* Copies the parameters of device `device`'s replica into dst (count == pmap_params_count()).
 * device is a global index; in a distributed context it must be one of this process's devices
 * (process p holds p * D .. p * D + D - 1; replicas are identical, so read one of those).
 * Returns PMAP_ERR_INVALID_ARGUMENT for a NULL dst, a device outside [0, N), a device of another
 * process (the message names its process) or another count. */
PMAP_API pmap_status pmap_params_read(const pmap_params *params, int device, float *dst,
                                      size_t count);
/* Copies the block named `name` (pmap_model_find_param_block on the params' model) of device
 * `device`'s replica into dst (count == the block's count). The same statuses as
 * pmap_params_read, and PMAP_ERR_INVALID_ARGUMENT for a NULL name, a name that is not a block
 * (params of pmap_params_create_custom have none) or another count; dst unchanged on error. */
PMAP_API pmap_status pmap_params_read_named(const pmap_params *params, int device, const char *name,
                                            float *dst, size_t count);
/* Copies src (count == pmap_params_count()) into every replica of this process; optimizer state
 * is kept. In a distributed context write the same values in every process. */
PMAP_API pmap_status pmap_params_write(pmap_params *params, const float *src, size_t count);

/* Checkpoints. pmap_params_save writes the whole training state (model description, optimizer
 * kind and settings, step count, parameters and optimizer state, and an optional opaque user
 * section, e.g. a data loader's position) to `path`: a versioned file with a magic number and a
 * CRC-32C per section, written to a temporary file in the same folder, fsync'ed, then renamed over
 * `path` (and the folder fsync'ed), so a crash during a save leaves the previous file intact. Two
 * saves of the same state are byte-identical. The file does not depend on the device count.
 * A device, FIFO, folder or socket at `path` is never replaced (PMAP_ERR_UNAVAILABLE), nor a
 * file the process may not write; through a symbolic link the file it names is replaced (the
 * link stays), and a link to a file that does not exist yet has that file created, so that
 * `ln -s /big/disk/run.ckpt run.ckpt` works before the first save (the folder of the file it
 * names must exist: a link into a missing folder, or a loop, is PMAP_ERR_UNAVAILABLE); a file
 * replaced keeps its permissions (a new one gets 0644).
 * pmap_params_load reads only a regular file (a FIFO, a device or a folder is refused at once
 * with PMAP_ERR_INVALID_ARGUMENT, as no checkpoint, never waited on; a save to such a path fails
 * with PMAP_ERR_UNAVAILABLE, as a file that cannot be written) and validates the whole file first (magic, version, every checksum and size, the
 * model description against params' model, the optimizer kind and state layout) and only then
 * sets every replica, the optimizer state and the step count; on any error nothing is changed.
 * The optimizer's settings (lr, betas, clip_norm) are those of params, not the file's.
 * user/user_bytes: the user section to save (NULL/0: none). On load, user_cap bytes at user
 * receive it (PMAP_ERR_INVALID_ARGUMENT, nothing changed, when it does not fit) and *user_bytes
 * (may be NULL) its size; pmap_params_load ignores the user section. A save killed midway may
 * leave a stray temporary file `path.tmp.XXXXXX` beside path. The format:
 * docs/reliability.md. Return PMAP_ERR_INVALID_ARGUMENT (NULL, a file that is not a pmap
 * checkpoint, damaged, truncated, of another version, another model or another optimizer: the
 * message says which), PMAP_ERR_UNAVAILABLE (the file cannot be opened, read or written: the
 * message carries the system's reason), PMAP_ERR_OUT_OF_MEMORY, PMAP_ERR_DEVICE (a device
 * failed while its replica was being set: the replicas are then undefined). */
PMAP_API pmap_status pmap_params_save(const pmap_params *params, const char *path);
PMAP_API pmap_status pmap_params_load(pmap_params *params, const char *path);
PMAP_API pmap_status pmap_params_save_user(const pmap_params *params, const char *path,
                                           const void *user, size_t user_bytes);
PMAP_API pmap_status pmap_params_load_user(pmap_params *params, const char *path, void *user,
                                           size_t user_cap, size_t *user_bytes);
/* Whether pmap_params_save could write `path` now, checked before training so that a path it
 * cannot write fails at the start, not at the first save: the rules above (the folder exists and
 * takes a new file, no device, FIFO, folder or socket at path, a file there writable, symbolic
 * links followed as the save follows them), with the temporary file created beside the file and
 * removed at once: nothing is written and nothing is left behind. It does not reserve the space
 * a save needs. Returns PMAP_SUCCESS, PMAP_ERR_INVALID_ARGUMENT (path NULL or empty),
 * PMAP_ERR_UNAVAILABLE (what the save would fail with: the system's reason),
 * PMAP_ERR_OUT_OF_MEMORY. */
PMAP_API pmap_status pmap_params_save_check(const char *path);

/* Compares every replica (parameters and optimizer state; the parameters only when the optimizer
 * is sharded, each device's part of the state being its own): each device computes a checksum of
 * its own replica, and the checksums are gathered and compared. PMAP_SUCCESS when they are all
 * equal; PMAP_ERR_DEVICE with a message naming the devices that differ from device 0 when not
 * (replicas must never drift: this is a check for hardware or memory faults). Distributed: a
 * collective call of every process that compares every replica of every process (the processes
 * exchange their checksums) and names devices by global index, process and host, alike on every
 * process; one that fails before its checksums takes part all the same, failing every process. */
PMAP_API pmap_status pmap_params_verify(const pmap_params *params);

/* Releases the activation memory, which is sized for the largest batch seen so far; the next
 * pmap_update allocates what its batch needs, the next pmap_predict what its pieces need (at
 * most the rows last sized for: see pmap_predict). Parameters and optimizer state are kept.
 * Returns PMAP_ERR_INVALID_ARGUMENT for NULL. */
PMAP_API pmap_status pmap_params_shrink(pmap_params *params);

/* ------------------------------------------------------------------------------------------ */
/* Your own model: a per-device loss-and-gradient function                                    */

typedef struct pmap_device pmap_device;

/* What a gradient function receives for one piece of one device's rows. Pointers are device
 * memory of `dev` (host memory on CPU; on CUDA use pmap_device_stream and pmap_device_blas so
 * that your kernels run in order with the runtime's). */
typedef struct pmap_grad_args {
  pmap_device *dev;    /* this device: pmap_axis_index, pmap_device_alloc, collectives */
  const float *params; /* (P) this device's replica of the parameters; read only */
  float *grads;        /* (P) ADD (+=) scale times the gradient of the mean loss over these
                          rows; zeroed by the runtime before the first piece of a step */
  float *loss;         /* one float: WRITE (=) the mean loss over these rows, not scaled */
  float scale;         /* the weight of these rows in the device's share: 1 unless the rows are
                          a micro-batch or the global batch is uneven */
  pmap_array xs, ys;   /* these rows of xs and ys (data: device memory; shape[0]: the rows) */
  int64_t row0;        /* the index of the first row in the global batch (for per-example
                          randomness); across processes process p's rows follow those of
                          processes 0..p-1, so it does not depend on the layout */
  int64_t step;        /* pmap_params_step() before this step: 0 in step 1 */
  size_t num_params;   /* P */
} pmap_grad_args;

/* Computes the loss and the gradient of args->xs, args->ys as described above; called on every
 * device at once, on the device's thread, once per micro-batch; returns PMAP_SUCCESS or an error
 * (with your own message through pmap_set_error, any status, PMAP_ERR_ABORTED included; the
 * step then fails on every device with that status and message, nothing changed). */
typedef pmap_status (*pmap_grad_fn)(const pmap_grad_args *args, void *user);

/* Training state for a model the runtime does not know: num_params parameters, initialised on
 * every replica from init (num_params host floats, copied), trained by pmap_update exactly as a
 * built-in model (validation, sharding and staging, the one all-reduce of [gradients | loss],
 * the optimizer, the numeric guard, clipping, micro-batches, uneven batches, checkpoints),
 * with fn in place of forward, loss and backward. xs must be f32 and ys f32 or i32, any rank
 * 1..PMAP_MAX_RANK, with the same leading extent; the rest of their shape is fn's to check.
 * pmap_predict is not available for them (PMAP_ERR_INVALID_ARGUMENT). user is passed to fn
 * and stays the caller's. Returns as pmap_params_create. */
PMAP_API pmap_status pmap_params_create_custom(pmap_ctx *ctx, size_t num_params, const float *init,
                                               pmap_grad_fn fn, void *user,
                                               const pmap_optimizer *opt, pmap_params **out);

/* On CUDA, the device's cudaStream_t and cublasHandle_t (as void *); NULL on the CPU backend. */
PMAP_API void *pmap_device_stream(pmap_device *dev);
PMAP_API void *pmap_device_blas(pmap_device *dev);

/* ------------------------------------------------------------------------------------------ */
/* Mapped functions and collectives                                                           */

/* A user's mapped function: called once per device, on that device's thread, all at once. */
typedef pmap_status (*pmap_fn)(pmap_device *dev, void *arg);

/* Runs fn(dev, arg) on every device and waits for all of them. Returns PMAP_SUCCESS when every
 * call did; otherwise the first failing device's status (a failure that made other devices
 * abandon a collective is reported, not their PMAP_ERR_ABORTED; a function that returns
 * PMAP_ERR_ABORTED itself, while no other device has failed, is such a failure), with its
 * message, "pmap_run: device 2: <its message>" (pmap_set_error; a device that fails without
 * setting one is reported as such; messages never carry over from an earlier job). A device
 * failing before a collective never leaves the others waiting, and neither does a device that
 * returns without calling a collective the others wait in.
 * Distributed: the processes meet when their devices have returned (a small exchange; its wait
 * is bounded by the timeout like a collective's), so the verdict is every process's: a process
 * whose devices return while another's wait in a collective (its call then fails, naming the
 * process that returned), a failure on one process, or the same invalid call on every process,
 * fails pmap_run on every process with the same status and message (the first process's own
 * failure, else the first failure), and the context stays usable; collectives of one pmap_run
 * never pair with another's; fn NULL on one process is such a failure. A process that called
 * something else than pmap_run (pmap_update, say) fails that call. Messages name devices by
 * global index, process and host. Not re-entrant: fn
 * calling any public function on the same context (pmap_run, pmap_update, pmap_params_read,
 * pmap_ctx_destroy, ...) gets PMAP_ERR_INVALID_ARGUMENT. */
PMAP_API pmap_status pmap_run(pmap_ctx *ctx, pmap_fn fn, void *arg);

/* The global view: N = P * D devices over every process; device (process p, local d) has
 * index p * D + d. One process: the local view. */
PMAP_API int pmap_axis_index(const pmap_device *dev); /* this device's global index, 0..N-1 */
PMAP_API int pmap_axis_size(const pmap_device *dev);  /* N, over every process */
/* The local view: this device's index among the devices of its process (0..D-1), and the
 * process it belongs to (0..P-1). */
PMAP_API int pmap_local_index(const pmap_device *dev);
PMAP_API int pmap_process_index(const pmap_device *dev);

/* Device memory for buffers passed to collectives (host memory on CPU, GPU memory on CUDA).
 * pmap_device_alloc sets *out to NULL on failure; a count whose bytes exceed the address space
 * is PMAP_ERR_OUT_OF_MEMORY. */
PMAP_API pmap_status pmap_device_alloc(pmap_device *dev, size_t count,
                                       float **out);          /* count floats */
PMAP_API void pmap_device_free(pmap_device *dev, float *ptr); /* accepts NULL */
PMAP_API pmap_status pmap_device_upload(pmap_device *dev, float *dst, const float *src,
                                        size_t count);
PMAP_API pmap_status pmap_device_download(pmap_device *dev, float *dst, const float *src,
                                          size_t count);

/* Collectives, called by every device of the mapped function in the same order with the same
 * count (in elements, not bytes; count x 4 bytes, and N x count x 4 for all_gather's recv, must
 * fit an object: at most PTRDIFF_MAX, else PMAP_ERR_INVALID_ARGUMENT naming the count, before
 * any device waits for another). In place is recv == send (all_gather: send == recv +
 * axis_index * count, as in NCCL); otherwise the buffers must not overlap. Every device receives
 * bitwise the same result: the summation order is fixed; max propagates NaN. Each collective
 * first checks, at a rendezvous, that every device called the same collective with the same
 * count (and root); if not, it fails on every device with PMAP_ERR_INVALID_ARGUMENT and a
 * message naming what each device called (across processes the same check: call, count,
 * operation, root as a global device, element type, with the same message on every process). A collective has one verdict: it succeeds on every
 * device or fails on every device, and when it returns (whatever it returns) no device reads or
 * writes this device's buffers any more, so they may be freed at once. In a distributed context
 * they run over every process's devices (N = P * D, indices and roots global): the devices of a
 * process combine over shared memory in device order, then the processes' partials are added
 * in process order, and a process that called another collective, returned from its mapped
 * function without calling this one, stalled, died or left fails every process
 * (PMAP_ERR_INVALID_ARGUMENT, PMAP_ERR_TIMEOUT or PMAP_ERR_ABORTED naming it, its host and the
 * collective's number) instead of hanging. A device that does not arrive within the timeout is
 * named: "pmap_psum: device 3 did not arrive within 1.000 s".
 *   psum/pmean/pmax: recv[i] = sum / mean / max over devices of send[i]   (count each)
 *   all_gather:      recv (N, count) = every device's send (count), in device order
 *   broadcast:       recv (count) = send (count) of device root
 *   barrier:         returns once every device has entered it
 * Return PMAP_ERR_INVALID_ARGUMENT (NULL with count > 0, root outside [0, N), a count whose
 * bytes do not fit, buffers that overlap other than in place, collectives that differ across
 * devices, a device that left the function), PMAP_ERR_TIMEOUT,
 * PMAP_ERR_ABORTED (another device failed), PMAP_ERR_DEVICE. */
PMAP_API pmap_status pmap_psum(pmap_device *dev, const float *send, float *recv, size_t count);
PMAP_API pmap_status pmap_pmean(pmap_device *dev, const float *send, float *recv, size_t count);
PMAP_API pmap_status pmap_pmax(pmap_device *dev, const float *send, float *recv, size_t count);
PMAP_API pmap_status pmap_all_gather(pmap_device *dev, const float *send, float *recv,
                                     size_t count);
PMAP_API pmap_status pmap_broadcast(pmap_device *dev, const float *send, float *recv, size_t count,
                                    int root);
PMAP_API pmap_status pmap_barrier(pmap_device *dev);

/* ------------------------------------------------------------------------------------------ */
/* Seeing a run: a timeline of every step, the waits at the collectives, the memory plan      */

/* Starts recording a timeline of ctx into path, a Chrome trace-event JSON file (open it in
 * https://ui.perfetto.dev or chrome://tracing): one track per device (named by global index
 * and, across processes, process and host) and one for the calling thread. Each device's track
 * holds its steps ("step", nested: "forward <layer> <i>", "loss", "backward <layer> <i>", the
 * collectives with their bytes and, inside each, "wait <collective>": the time the device waited
 * for the others at its rendezvous), "optimizer", host staging ("stage inputs"); the caller's
 * holds "pmap_update" and "checkpoint save". steps says which steps are kept (a step is the
 * optimizer step it takes, 1 the first): NULL or "" the last 10, "K" the last K (1..10000),
 * "A..B" steps A to B (1 <= A <= B, at most 10000 steps; K, A and B in decimal digits alone);
 * the recording never holds more than that window (and at most 65536 spans per track and step:
 * past 65472 the layers' are dropped, the last 64 kept for the step's reduction, optimizer and
 * step spans). The file is written at once (empty, so that a path that cannot be written fails
 * here), and again by pmap_trace_stop or pmap_ctx_destroy.
 * Across processes each process writes its own file, "<path without .json>.p<process>.json".
 * pmap_ctx_destroy cannot report a write that fails: the file then stays as last written.
 * The environment variable PMAP_TRACE=FILE (with PMAP_TRACE_STEPS=K or A..B) starts a recording
 * in every pmap_ctx_create, each to that file: with several contexts in a process, the one
 * written last is what the file holds (give each its own path with pmap_trace_start instead). Off, nothing is recorded and a step pays one test of a NULL pointer
 * per span it would record. On CUDA the layers, the loss and the optimizer are timed on the
 * device (CUDA events on its stream, read when its job ends and placed on the host's clock); the
 * waits, collectives and staging are host times (docs/tracing.md).
 * Returns PMAP_ERR_INVALID_ARGUMENT (ctx or path NULL, path empty, a bad steps, a recording
 * already on), PMAP_ERR_UNAVAILABLE (the file cannot be written: the system's reason; a
 * device, FIFO or folder at path is never replaced, and a symbolic link is written through, as
 * by pmap_params_save). */
PMAP_API pmap_status pmap_trace_start(pmap_ctx *ctx, const char *path, const char *steps);
/* Writes the recording to its file and ends it. PMAP_ERR_INVALID_ARGUMENT when none is on;
 * PMAP_ERR_UNAVAILABLE when the file cannot be written (the recording ends all the same). */
PMAP_API pmap_status pmap_trace_stop(pmap_ctx *ctx);

/* What the collectives cost each device, summed over every collective it met since the context
 * was created (pmap_update's all-reduce is one per step): */
typedef struct pmap_device_waits {
  int device;          /* global index */
  int64_t collectives; /* collectives met */
  double busy_s;       /* computing: from the start of its job, or the end of its previous
                          collective, to arriving at the next (its forward and backward) */
  double wait_s;       /* waiting at the collectives for the other devices (across processes:
                          for the other processes too) to arrive */
  double held_s;       /* the waiting of the other devices of its process at the collectives
                          it arrived at last: the time it held them back */
} pmap_device_waits;
/* Fills out[0..count) for every device, by global index (count: pmap_ctx_num_devices times
 * pmap_ctx_num_processes). Among the devices of a process, the one with the largest held_s is
 * the straggler; across processes, the process whose devices wait least (wait_s) is the one the
 * others wait for. Distributed: a collective call of every process (the records are exchanged).
 * PMAP_ERR_INVALID_ARGUMENT for ctx or out NULL or another count (on one process: every
 * process fails, naming it); across processes the failures of an exchange (PMAP_ERR_TIMEOUT
 * naming the process that did not call it, ...). */
PMAP_API pmap_status pmap_ctx_waits(pmap_ctx *ctx, pmap_device_waits *out, int count);

/* The device memory a training step of pmap_update at a global batch needs on each device of
 * this process (the most any one device needs), in bytes: */
typedef struct pmap_memory_plan {
  size_t params;      /* the trained parameters (padded to equal parts when sharded), and their
                         bfloat16 copy under PMAP_PRECISION_BF16 */
  size_t grads;       /* gradients, with the loss and guard values reduced alongside */
  size_t optimizer;   /* optimizer state: the device's part when sharded */
  size_t state;       /* non-trained state (batch norm's statistics), and the pending copy a
                         step computes before committing it */
  size_t activations; /* activations and their gradients at the rows of one micro-batch (under
                         PMAP_PRECISION_BF16 those kept in bfloat16 count 2 bytes each, and on
                         CPU the bf16 GEMMs' workspace: oneDNN's scratchpads, or the portable
                         path's widened operands, the most any one GEMM of the step takes) */
  size_t staging;     /* device buffers the backend stages the batch's rows into (0 on CPU) */
  size_t total;       /* the sum */
  int optimizer_sharded;
  size_t device_free; /* memory free on device 0 now (CUDA: cudaMemGetInfo); SIZE_MAX where the
                         backend does not know (CPU) */
  int recompute;      /* the recomputation the activations are planned for: PMAP_RECOMPUTE_FULL
                         or PMAP_RECOMPUTE_SELECTIVE when a step at this batch recomputes
                         (pmap_config.recompute; under PMAP_RECOMPUTE_AUTO as the step
                         chooses), else PMAP_RECOMPUTE_NONE, also where it saves nothing: a
                         model with fewer than two blocks that can be recomputed (FULL: the
                         last one is never run again, its values are still in place) or, for
                         SELECTIVE, with fewer than two holding element-wise layers */
  size_t activations_stored;     /* activations (as above) with no block recomputed */
  size_t activations_recomputed; /* activations with every block that can be recomputed (equal
                                    to activations_stored for a model with none) */
  size_t activations_selective;  /* activations with the element-wise results of those blocks
                                    recomputed (PMAP_RECOMPUTE_SELECTIVE) */
  int grads_sharded; /* the gradients are sharded (PMAP_SHARD_GRADS): grads is the device's part,
                        the tail, the window and a tied table (optimizer_sharded is 1 too) */
} pmap_memory_plan;
/* Fills *out for pmap_update at global batch `batch` (this process's rows under several
 * processes, as pmap_update takes them), with the params' micro-batches. On CPU the total is
 * exactly what the backend allocates for the params once a step at that batch ran. The kernels'
 * own buffers come on top, bounded whatever the batch: on CPU, per device, oneDNN's convolution
 * workspace (pieces of the rows whose input and output take 4 MiB at most, the weights in its
 * layout and its scratchpad), the GEMM libraries' own buffers and their kernels (oneDNN: a few
 * tens of KB per GEMM shape, once per process, and, under bf16, a GEMM's scratch beyond the
 * plan's workspace where a smaller last micro-batch needs more); on CUDA the op queues' scratch,
 * cuBLAS's workspace and the captured graphs of the fast paths. Params of
 * pmap_params_create_custom have no activations pmap knows (0). Returns
 * PMAP_ERR_INVALID_ARGUMENT (params or out NULL, batch < 1 or too large to plan, or not a
 * multiple of the devices where pmap_update would refuse it: uneven_batches off). */
PMAP_API pmap_status pmap_params_memory(const pmap_params *params, int64_t batch,
                                        pmap_memory_plan *out);

#ifdef __cplusplus
}
#endif
#endif /* PMAP_H */
