/* cuda_ops.cu: the CUDA op backend: its table (one cuda_<op> per op of ops/op_list.h; designated
 * initializers in member order), its queues (cuda_queue.cu) and the fast steps' hooks, and the
 * plugin's entry point that gives it to ops/ops.c (the runtime's is runtime/cuda/cuda_plugin.c). */
#include "cuda_ops.h"

extern "C" const pmap_ops pmap_cuda_ops = {
#define PMAP_OP(name, args) .name = cuda_##name,
#include "ops/op_list.h"
#undef PMAP_OP
};

extern "C" pmap_status cuda_queue_create(const op_queue_init *init, op_queue **out);
extern "C" void cuda_queue_destroy(op_queue *q);

/* The bf16 GEMMs are cuBLAS's, which keep their own workspace (no gemm16 hooks). */
extern "C" const op_backend pmap_cuda_op_backend = {
    "cuda", &pmap_cuda_ops, cuda_queue_create, cuda_queue_destroy, NULL,
    NULL,   NULL,           cuda_step_values,  cuda_decide,        NULL,
    NULL,
};

extern "C" PMAP_PLUGIN_EXPORT uint64_t pmap_cuda_ops_entry(uint64_t abi, const pmap_base_i *base,
                                                           const op_backend **out) {
  uint64_t mine = op_plugin_abi();
  if (abi != mine) return mine; /* another build: touch nothing of it */
  pmap_plugin_bind_base(base);
  *out = &pmap_cuda_op_backend;
  return mine;
}
