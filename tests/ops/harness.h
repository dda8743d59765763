/* harness.h: the op harness (tests/ops), in the spirit of ggml's test-backend-ops: every op of
 * ops/op_list.h, on every op backend of the build, against a float64 reference, gradients also
 * against central finite differences of the float64 forward, and on a backend other than the
 * CPU also against the CPU kernels (the oracle) on the same random data.
 *
 * A new op is covered by declaring it in ops/op_list.h and writing its case, one function
 *   void opcase_<op>(hx *h)
 * in one of the case files (tests/ops/case_*.c): the table of cases is made from op_list.h, so
 * an op without a case does not link. A case draws shapes from h's random state (odd sizes, 0
 * and 1 where the op allows them), makes buffers with fresh random values, runs the op through
 * hx_run and compares what came back. hx_run checks the write contract on its own: outputs
 * start as NaN (an element left unwritten shows), inputs must come back bit for bit, the op runs
 * twice and must give the same bits, and on a non-CPU backend every output must agree with the
 * CPU kernels'. Parameter gradients (+=) are HX_INOUT buffers that start from random values:
 * the case compares what they gained. */
#ifndef PMAP_OPS_HARNESS_H
#define PMAP_OPS_HARNESS_H

#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../bounds.h"
#include "ops/ops.h"

/* Relative tolerances against float64 of the ops without a long float sum (the sums of layer
 * and batch norm, softmax, the losses and norm2 are taken in double on every backend), and of
 * gradients against finite differences. Float sums and GEMMs are held to bounds in their
 * reduction length k instead: hx_tol_sum, hx_tol_gemm, hx_tol_gemm16.
 *
 * HX_TOL_FWD: a few float roundings of u = 2^-24 each, op_math.h's exp, tanh, sigmoid and GELU
 * within 4 ulps (tests/test_vmath.c) and one rounding of each double sum: under 20 u = 1.2e-6 of
 * the result's scale; 1e-5 leaves a factor of 8 for the normalisations' x - mean (the cases keep
 * a channel's or a row's variance at 0.1 or more).
 * HX_TOL_GRAD: a central difference of step h errs by h^2 |f'''| / 6 (truncation: 0 for the
 * bilinear GEMM and convolution losses; for the others, at h = 1e-3 or 1e-4, under 1e-5 |f'|:
 * their third derivatives stay within 60 |f'| on the cases' data, inputs of order 1, variances
 * of 0.1 or more) and by 2^-53 |f| / h from the float64 loss's rounding (~1e-12 |f|); 1e-4 is
 * that and the fp32 gradient's own few roundings, with room. */
#define HX_TOL_FWD 1e-5
#define HX_TOL_GRAD 1e-4

/* What a buffer is to one run of an op. */
typedef enum hx_role {
  HX_IN,      /* read: starts from init and must come back with the same bits */
  HX_OUT,     /* overwritten (=): starts as NaN; every element must be written */
  HX_INOUT,   /* starts from init (accumulated gradients, optimizer state, in place, a partly
                 poisoned array); the case compares got */
  HX_SCRATCH, /* the op's scratch: starts as NaN, never compared */
} hx_role;

typedef struct hx_buf {
  const char *name; /* in messages */
  hx_role role;
  size_t n;         /* elements (floats, or int32 labels: is_int) */
  int is_int;       /* int32 elements: init holds them (only HX_IN) */
  float *init;      /* (n) host: what the run starts from (HX_IN, HX_INOUT: the case fills it) */
  float *got;       /* (n) host: the backend's result (HX_OUT, HX_INOUT) after hx_run */
  float *again;     /* (n) host: the second run's, which must equal got bit for bit */
  float *cpu;       /* (n) host: the CPU kernels' result on the same data (another backend) */
  float *dev;       /* the backend's memory, between two guards that must keep their bits */
  float *base;      /* what was allocated: (HX_GUARD, n, HX_GUARD) */
  uint32_t guard;   /* the guards' bits: a NaN of the buffer's own (none an op would make) */
  void *p;          /* during a call: dev on the backend, cpu for the oracle (HX_F, HX_I) */
  double tol_cpu;   /* relative tolerance of got against cpu; 0: the same bits (default 1e-6) */
  double scale_cpu; /* ... relative to at least this scale (see hx_close_scale; default 0) */
  int keep_nan;     /* HX_OUT: NaN may come back (a NaN input propagates); the case checks */
  size_t n16;       /* a buffer of bfloat16s (hx_new16): their count, held two to a float of
                       the n; unwritten ones start as a bfloat16 NaN. 0: floats */
  struct hx_buf *next;
} hx_buf;

/* The pointer an op gets for b in the current call. */
#define HX_F(b) ((float *)(b)->p)
#define HX_I(b) ((const int32_t *)(b)->p)
#define HX_H(b) ((pmap_bf16 *)(b)->p)
/* The bfloat16 elements of one of b's host arrays (init, got, again, cpu). */
#define HX_H16(x) ((pmap_bf16 *)(void *)(x))

/* One backend's run of the cases. */
typedef struct hx {
  const char *backend; /* "cpu", "cuda" */
  char label[32];      /* in messages: the backend, and the device where several run at once */
  int devices;         /* logical devices running the cases at once (rerun lines name them) */
  int oracle;          /* the backend's kernels are the CPU oracle's: no comparison with itself */
  int large;           /* also the large sizes (a GPU's multi-block and per-channel paths) */
  int quick;           /* fewer random shapes and finite-difference samples */
  int tf32;            /* the float GEMMs round their operands to TF32 (CUDA, PMAP_CUDA_TF32) */
  int tensor16;        /* the bfloat16 GEMMs sum on tensor cores (CUDA) */
  size_t fd_samples;   /* finite differences at most at this many entries of an array */
  const pmap_ops *ops; /* the backend's table, run on q of dev */
  op_queue *q;
  pmap_device *dev;
  uint64_t rng;   /* this case's random state: the same shapes on every backend */
  const char *op; /* the case running */
  char trial[200];
  hx_buf *bufs;  /* the case's buffers, freed by hx_release */
  void *scratch; /* host arrays of the case, freed by hx_release */
  int checks, failures;
  /* The largest error measured against its tolerance, per kind of comparison (what it
   * compares), in the case running: printed with --verbose. */
  struct hx_worst {
    char what[96];
    double ratio;
  } worst[24];
  int nworst;
  double worst_ratio; /* and over every case of the run, with where */
  char worst_at[160];
} hx;

/* Every op's case. */
#define PMAP_OP(name, args) void opcase_##name(hx *h);
#include "ops/op_list.h"
#undef PMAP_OP

/* ---- tolerances in the reduction length (harness.c says where each comes from) ---- */

/* A float sum of k terms against float64: bound_sum(k) on every backend (k counts roundings: a
 * gain added to its base, a bias, alpha and beta count one each). The cases' data are uniform
 * of mean 0, bound_sum's model (tests/bounds.h), and the checks are normwise against at least
 * the root mean square of such sums (their scale floors). */
double hx_tol_sum(double k);
/* An fp32 GEMM or convolution of reduction length k against float64: bound_sum(k), and the
 * operands' rounding where the backend's GEMMs take TF32. */
double hx_tol_gemm(const hx *h, double k);
/* A bfloat16 GEMM against the float64 sums of its bfloat16 operands (whose products are
 * exact). */
double hx_tol_gemm16(const hx *h, double k);
/* A backend's result against the CPU kernels' on the same data: the backend within tol of
 * float64 and the CPU within bound_sum(k), so within their sum of each other. */
double hx_tol_vs_cpu(double tol, double k);

/* ---- shapes and random values (h->rng) ---- */

/* Names the shapes of what follows in messages (printf format). */
void hx_trial(hx *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t hx_u64(hx *h);
int64_t hx_int(hx *h, int64_t lo, int64_t hi); /* uniform in [lo, hi] */
float hx_uniform(hx *h, float lo, float hi);   /* uniform in [lo, hi) */
/* How many random shapes a case draws where it would draw `full`: fewer with --quick. */
int hx_rounds(const hx *h, int full);
/* x (n) uniform in [lo, hi); fill_away: magnitudes in [lo, hi) with random signs (off zero and
 * off the kinks of relu-like functions). */
void hx_fill(hx *h, float *x, size_t n, float lo, float hi);
/* The element counts of an element-wise case, trial i < hx_vec_trials: 0, 1, 7, 1000, on a
 * large backend 100003 (many blocks), then random odd ones. */
int hx_vec_trials(hx *h);
size_t hx_vec_size(hx *h, int i);
void hx_fill_away(hx *h, float *x, size_t n, float lo, float hi);

/* ---- buffers (freed by hx_release) ---- */

hx_buf *hx_new(hx *h, hx_role role, size_t n, const char *name);      /* init zeroed: fill it */
hx_buf *hx_in(hx *h, size_t n, float lo, float hi, const char *name); /* uniform */
hx_buf *hx_in_away(hx *h, size_t n, float lo, float hi, const char *name); /* off zero */
hx_buf *hx_out(hx *h, size_t n, const char *name);
hx_buf *hx_inout(hx *h, size_t n, float lo, float hi, const char *name); /* uniform start */
hx_buf *hx_scratch(hx *h, size_t n, const char *name);
hx_buf *hx_labels(hx *h, size_t rows, int64_t k, const char *name); /* in [0, k) */
/* n bfloat16s (init zeroed), and n of them uniform in [lo, hi) rounded to bfloat16. */
hx_buf *hx_new16(hx *h, hx_role role, size_t n, const char *name);
hx_buf *hx_in16(hx *h, size_t n, float lo, float hi, const char *name);
/* Host arrays of the case, zeroed. */
double *hx_doubles(hx *h, size_t n);
float *hx_floats(hx *h, size_t n);
double *hx_to_double(hx *h, const float *x, size_t n);
/* Frees every buffer and host array of the case. */
void hx_release(hx *h);

/* ---- running an op ---- */

/* One call of the ops under test: o and q are the backend's, or the CPU table and NULL for the
 * oracle; buffers are reached through HX_F / HX_I. */
typedef pmap_status (*hx_call)(const pmap_ops *o, op_queue *q, void *arg);
/* Runs fn on the backend with the buffers (NULL-terminated list) as their roles say, twice
 * (same bits), checks inputs unchanged and outputs written, then on another backend runs it on
 * the CPU kernels and compares every output with the buffer's tol_cpu. */
void hx_run(hx *h, hx_call fn, void *arg, hx_buf *const *bufs);
#define HX_RUN(h, fn, arg, ...) hx_run((h), (fn), (arg), (hx_buf *const[]){__VA_ARGS__, NULL})
/* Inside an hx_call: returns a failing op's status. */
#define HX_TRY(call)                                 \
  do {                                               \
    pmap_status hx_try_s_ = (call);                  \
    if (hx_try_s_ != PMAP_SUCCESS) return hx_try_s_; \
  } while (0)

/* ---- checks (each counts one check; a failure names the backend, the case and the trial) ---- */

/* Relative error ||got - want|| / ||want|| <= tol, after a separate check that got is finite
 * exactly where want is (NaN for NaN, the same infinity); a failure prints the first element
 * off by more than tol (relative to max(|want[i]|, rms(want))) and the worst, both values. */
int hx_close(hx *h, const char *what, const float *got, const double *want, size_t n, double tol);
int hx_close_f(hx *h, const char *what, const float *got, const float *want, size_t n, double tol);
/* got[i] - base[i] (the gain of an accumulated buffer) against want, relative to at least a
 * few ulps of base (what rounding base + gain can keep of a gain far smaller than base). */
int hx_gain(hx *h, const char *what, const float *got, const float *base, const double *want,
            size_t n, double tol);
/* The same relative to max(||want||, scale sqrt(n)): values that cancel to far below their
 * terms' scale (an optimizer's weights and steps) are held to the accuracy of that scale. */
int hx_close_scale(hx *h, const char *what, const float *got, const double *want, size_t n,
                   double tol, double scale);
int hx_gain_scale(hx *h, const char *what, const float *got, const float *base, const double *want,
                  size_t n, double tol, double scale);
/* The scale of a few ulps of base (n) at tolerance tol: what hx_gain holds a gain to at least
 * (a gain taken from another accumulated buffer carries that one's rounding too). */
double hx_base_scale(const float *base, size_t n, double tol);
/* The same bits (NaN payloads aside). */
int hx_same(hx *h, const char *what, const float *got, const float *want, size_t n);
/* The same bits of n bfloat16s, NaN payloads included. */
int hx_same16(hx *h, const char *what, const pmap_bf16 *got, const pmap_bf16 *want, size_t n);
void hx_check(hx *h, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define HX_CHECK(h, cond, ...) hx_check((h), (cond) ? 1 : 0, __VA_ARGS__)

/* A scalar loss of the double arrays in ctx, evaluated after element i of the array being
 * differentiated moved: it may leave out every term that does not depend on that element. */
typedef double (*hx_loss)(const void *ctx, size_t i);
/* Central differences (f(x + step e_i) - f(x - step e_i)) / 2 step at every entry of x (at
 * h->fd_samples random entries of a larger x) against the op's gradient: got, or got - base
 * where base is not NULL (an accumulated gradient and what it started from; as hx_gain). */
void hx_fd(hx *h, const char *what, hx_loss f, const void *ctx, double *x, size_t n,
           const float *got, const float *base, double step, double tol);
/* The same relative to max(||fd||, scale sqrt(n)) (see hx_close_scale). */
void hx_fd_scale(hx *h, const char *what, hx_loss f, const void *ctx, double *x, size_t n,
                 const float *got, const float *base, double step, double tol, double scale);

/* ---- running the cases (harness.c) ---- */

typedef struct hx_opts {
  const char *only; /* comma-separated ops to run; NULL: all */
  uint64_t seed;
  int quick, verbose;
  int as_device; /* the CPU run as another backend is: large sizes, compared with the oracle */
  int devices;   /* logical devices of the context (0: 1), each running every case at the same
                    time as the others, on the GPUs there are (several sharing one where NCCL
                    allows it): the kernels of devices sharing a GPU side by side */
} hx_opts;

/* Runs the cases on backend `name` ("cpu", "cuda"): 1 every check passed, 0 some failed, -1 not
 * run (the backend is not built or has no usable device here; says why on stdout). *checks and
 * *failures (may be NULL) add this backend's counts, every device's. */
int hx_backend_run(const char *name, const hx_opts *o, int *checks, int *failures);
/* Whether `only` names ops of op_list.h alone (says which it does not). */
int hx_only_valid(const char *only);

#endif
