/* ops.h: the ops a model runs, declared once in op_list.h, and what a backend of them provides
 * (ops/cpu, ops/cuda): a table of the ops, queues to run them on, and a few hooks. Models call
 * ops only through this table, so they never see BLAS, CUDA or threads; ops know nothing of the
 * runtime or of models (they include only pmap.h, base/ and op_math.h). */
#ifndef PMAP_OPS_H
#define PMAP_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "base/plugin.h"
#include "pmap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Geometry of a 2-D convolution over NCHW examples. */
typedef struct pmap_conv_shape {
  int64_t c, h, w;    /* input channels, height, width */
  int64_t oc, oh, ow; /* output channels, height, width */
  int kh, kw, stride, pad;
} pmap_conv_shape;

/* The settings of one optimizer step (models/params.c fills them from pmap_optimizer and the
 * step's place in the learning-rate schedule). */
typedef struct pmap_step_hyper {
  float lr;           /* this step's learning rate */
  float momentum;     /* SGD: 0 for none */
  int nesterov;       /* SGD with momentum: Nesterov's form */
  float weight_decay; /* SGD: L2, added to the gradient; Adam: decoupled (AdamW), applied to w */
  float beta1, beta2, eps;
  float bc1, bc2; /* Adam's bias corrections 1 - beta1^t, 1 - beta2^t for step t >= 1 */
} pmap_step_hyper;

/* Geometry of a 2-D pooling window over NCHW examples (no padding; windows may overlap). */
typedef struct pmap_pool_shape {
  int64_t c, h, w; /* channels, input height and width */
  int64_t oh, ow;  /* output height and width: (H - KH) / stride + 1 */
  int kh, kw, stride;
} pmap_pool_shape;

/* A bfloat16 value: the top 16 bits of a float (ops/op_math.h pmap_bf16_round). */
typedef uint16_t pmap_bf16;

/* The shape of one bfloat16 GEMM (gemm_bf16: batch and groups 1, strides 0; gemm_strided_bf16):
 * the op's arguments without its pointers. Zero it before filling it (backends compare shapes
 * bytewise). */
typedef struct ops_gemm16 {
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  int64_t sa, sb, sc, batch;
  int64_t ga, gb, gc, groups; /* groups of batches (gemm_strided_bf16) */
  float alpha, beta;
} ops_gemm16;

/* Element-wise activations (formulas in ops/op_math.h): those of the act_* ops, and the ReLU a
 * dense layer folds (bias_act_forward, act_bias_backward; its gradient from the output alone). */
typedef enum pmap_act {
  PMAP_ACT_TANH = 0,
  PMAP_ACT_SIGMOID = 1,
  PMAP_ACT_GELU = 2,
  PMAP_ACT_RELU = 3
} pmap_act;

/* Where ops run: one device's queue of work, defined by each op backend (ops/cpu: nothing but the
 * device's index; ops/cuda: its stream, BLAS handle and scratch). Made by op_backend.queue_create
 * from what the caller (models) gets from the runtime, so ops and the runtime never meet. */
typedef struct op_queue op_queue;

/* What a device's queue is made from. */
typedef struct op_queue_init {
  int device;   /* its index among the devices of the process, for messages */
  void *stream; /* CUDA: the device's cudaStream_t; NULL on CPU */
  void *blas;   /* CUDA: its cublasHandle_t, bound to the stream; NULL on CPU */
  /* Device memory for the queue's own scratch, from the device's allocator (NULL on CPU). */
  pmap_status (*alloc)(void *owner, size_t bytes, void **out);
  void (*free)(void *owner, void *ptr);
  void *owner;
} op_queue_init;

/* The op table: one member per op of op_list.h. */
typedef struct pmap_ops {
#define PMAP_OP(name, args) pmap_status(*name) args;
#include "op_list.h"
#undef PMAP_OP
} pmap_ops;

/* An op backend: the table and what its queues need. */
typedef struct op_backend {
  const char *name; /* the runtime backend it runs on: "cpu", "cuda" */
  const pmap_ops *ops;
  /* Makes device init->device's queue, on that device's own thread (the CPU pins its GEMM
   * library to one thread there). */
  pmap_status (*queue_create)(const op_queue_init *init, op_queue **out);
  void (*queue_destroy)(op_queue *q); /* accepts NULL; after the device's queued work ended */
  /* Around ops run on a thread that is not a device's own (device 0's work on the caller's
   * thread): enter returns what leave restores (optional, both NULL). */
  int (*enter)(void);
  void (*leave)(int saved);
  /* Whether the backend can run here, once, before the first queue (the CPU chooses its GEMM):
   * an error naming `call` when it cannot (optional). */
  pmap_status (*ready)(const char *call);
  /* The CUDA fast steps (models/step_fast.c) (optional, both NULL where there are none).
   * step_values: this step's optimizer settings and number into device memory in queue order;
   * until a call with h NULL the optimizer, copy and dropout ops read them from there (so a
   * captured step does not bake them in) and change nothing once decide skipped the step.
   * decide: from the averaged [loss | flags (n) | norm] at tail, skip the step when check and a
   * value is not finite or the norm the optimizer would take exceeds norm_max (> 0; ops/op_math.h
   * pmap_guard_norm_over), else scale g (P) by clip / norm when clip > 0 and the norm exceeds
   * it. */
  pmap_status (*step_values)(op_queue *q, const pmap_step_hyper *h, int64_t step);
  pmap_status (*decide)(op_queue *q, float *g, size_t P, const float *tail, int n, int check,
                        float clip, float norm_max);
  /* The bf16 GEMMs' workspace, memory of the caller's that they use for their scratch (optional,
   * both NULL where the backend's GEMMs need none from the caller). gemm16_workspace: the bytes
   * of it a GEMM of shape g takes (CPU: oneDNN's scratchpad, or the portable path's widened
   * operands), asked from any thread, with or without queues. gemm16_set_workspace: q's bf16
   * GEMMs use ws (bytes, 64-byte aligned; NULL and 0: none) from now on, until the next call,
   * while the caller keeps it. A GEMM that needs more takes memory of its own. */
  pmap_status (*gemm16_workspace)(const ops_gemm16 *g, size_t *bytes);
  void (*gemm16_set_workspace)(op_queue *q, void *ws, size_t bytes);
} op_backend;

/* The op backend of the runtime backend `name` ("cpu"; "cuda" where it was built, from the CUDA
 * plugin), ready to run (its ready hook passed once); PMAP_ERR_UNAVAILABLE naming it when there
 * is none or its plugin does not load. */
pmap_status ops_backend(const char *name, const char *call, const op_backend **out);

/* An op backend plugin's entry point (base/plugin.h): returns op_plugin_abi() as the plugin was
 * built, and only when that equals abi (the same build) binds base and sets *out. */
typedef uint64_t (*op_plugin_entry)(uint64_t abi, const pmap_base_i *base, const op_backend **out);
/* The ops' names and argument lists as op_list.h writes them, hashed (FNV-1a): a plugin built
 * against other signatures has another ABI even where the table's size is the same. */
static inline uint64_t op_signatures_hash(void) {
  static const char *const text[] = {
#define PMAP_OP(name, args) #name #args,
#include "op_list.h"
#undef PMAP_OP
  };
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof text / sizeof text[0]; i++)
    for (const char *c = text[i]; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
  return h;
}
static inline uint64_t op_plugin_abi(void) {
  const size_t sizes[] = {sizeof(pmap_base_i),     sizeof(op_backend),
                          sizeof(pmap_ops),        sizeof(op_queue_init),
                          sizeof(pmap_step_hyper), (size_t)op_signatures_hash()};
  return pmap_plugin_abi(sizes, (int)(sizeof sizes / sizeof sizes[0]));
}

/* The CPU op backend (always built); its table is the oracle every other backend is tested
 * against. */
extern const op_backend pmap_cpu_op_backend;
extern const pmap_ops pmap_cpu_ops;

#ifdef __cplusplus
}
#endif
#endif
