/* cuda_ops.cu: the CUDA op backend: its table (one cuda_<op> per op of ops/op_list.h; designated
 * initializers in member order), its queues (cuda_queue.cu), the fast steps' hooks, and the
 * loading of every kernel when a queue is made (cuda_ops_preload). */
#include "cuda_ops.h"

extern "C" const pmap_ops pmap_cuda_ops = {
#define PMAP_OP(name, args) .name = cuda_##name,
#include "ops/op_list.h"
#undef PMAP_OP
};

extern "C" pmap_status cuda_ops_preload(op_queue *q) {
  pmap_status (*const each[])(op_queue *) = {
      cuda_adam_preload,         cuda_bias_preload,      cuda_conv2d_preload,
      cuda_fill_preload,         cuda_mse_preload,       cuda_norm2_preload,
      cuda_loss_reduce_preload,  cuda_relu_preload,      cuda_sgd_preload,
      cuda_softmax_xent_preload, cuda_act_preload,       cuda_add_preload,
      cuda_batchnorm_preload,    cuda_dropout_preload,   cuda_layernorm_preload,
      cuda_pool2d_preload,       cuda_step_vals_preload, cuda_copy_preload,
  };
  for (size_t i = 0; i < sizeof each / sizeof each[0]; i++) PMAP_TRY(each[i](q));
  return PMAP_SUCCESS;
}

extern "C" pmap_status cuda_queue_create(const op_queue_init *init, op_queue **out);
extern "C" void cuda_queue_destroy(op_queue *q);

extern "C" const op_backend pmap_cuda_op_backend = {
    "cuda", &pmap_cuda_ops, cuda_queue_create, cuda_queue_destroy, NULL,
    NULL,   NULL,           cuda_step_values,  cuda_decide,
};
