/* cpu_queue.c: the CPU op backend: its table (one cpu_<op> per op of ops/op_list.h), its queues
 * (which pin the GEMM library to one thread on each device's thread, and keep the device's
 * cache of convolution primitives, cpu_cache.h) and the choice of the GEMM provider and of the
 * convolutions before the first device runs. */
#include <stdlib.h>

#include "base/error.h"
#include "conv.h"
#include "cpu_cache.h"
#include "cpu_ops.h"
#include "bf16.h"
#include "gemm.h"
#include "cpu_isa.h"

const pmap_ops pmap_cpu_ops = {
#define PMAP_OP(name, args) .name = cpu_##name,
#include "ops/op_list.h"
#undef PMAP_OP
};

static pmap_status cpu_queue_create(const op_queue_init *init, op_queue **out) {
  op_queue *q = malloc(sizeof *q);
  cpu_cache *c = cpu_cache_create();
  if (!q || !c) {
    free(q);
    cpu_cache_destroy(c);
    return PMAP_ERR(PMAP_ERR_OUT_OF_MEMORY, "device %d: out of memory for its op queue",
                    init->device);
  }
  q->device = init->device;
  q->cache = c;
  q->ws = NULL;
  q->ws_bytes = 0;
  cpu_gemm_threads_set(1);
  *out = q;
  return PMAP_SUCCESS;
}

static void cpu_queue_destroy(op_queue *q) {
  if (!q) return;
  cpu_cache_destroy(q->cache);
  free(q);
}

static int cpu_enter(void) { return cpu_gemm_threads_set(1); }
static void cpu_leave(int saved) { cpu_gemm_threads_set(saved); }

/* The GEMM providers are chosen before the devices run any op: they would disturb the float
 * one's measurement, and a bad PMAP_CPU_ISA, PMAP_GEMM, PMAP_GEMM_BF16 or PMAP_CONV is an error
 * before anything starts. */
static pmap_status cpu_ready(const char *call) {
  PMAP_TRY(cpu_isa_ready(call));
  PMAP_TRY(cpu_gemm_ready(call));
  PMAP_TRY(cpu_bf16_ready(call));
  return cpu_conv_ready(call);
}

static pmap_status cpu_gemm16_workspace(const ops_gemm16 *g, size_t *bytes) {
  return cpu_bf16_workspace(g, bytes);
}

static void cpu_gemm16_set_workspace(op_queue *q, void *ws, size_t bytes) {
  q->ws = ws;
  q->ws_bytes = ws ? bytes : 0;
}

const op_backend pmap_cpu_op_backend = {
    .name = "cpu",
    .ops = &pmap_cpu_ops,
    .queue_create = cpu_queue_create,
    .queue_destroy = cpu_queue_destroy,
    .enter = cpu_enter,
    .leave = cpu_leave,
    .ready = cpu_ready,
    .gemm16_workspace = cpu_gemm16_workspace,
    .gemm16_set_workspace = cpu_gemm16_set_workspace,
};
