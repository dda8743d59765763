/* cuda_ops.cu: the CUDA op table, the counterpart of ops/cpu's pmap_cpu_ops; the backend in
 * runtime/cuda hands it to every device. Entries follow the member order of pmap_ops. Also the
 * loading of every kernel when a device starts (cuda_ops_preload). */
#include "cuda_ops.h"

extern "C" const pmap_ops pmap_cuda_ops = {
    cuda_gemm,          cuda_fill,           cuda_bias_forward,   cuda_bias_backward,
    cuda_relu_forward,  cuda_relu_backward,  cuda_conv2d_forward, cuda_conv2d_backward,
    cuda_mse,           cuda_softmax_xent,   cuda_sgd_step,       cuda_adam_step,
    cuda_norm2,         cuda_scale,          cuda_axpy,
    /* layers beyond dense and conv */
    cuda_act_forward,   cuda_act_backward,   cuda_add,
    cuda_layernorm_forward,  cuda_layernorm_backward,
    cuda_pool2d_forward,     cuda_pool2d_backward,
    cuda_dropout_forward,    cuda_dropout_backward,
    cuda_bn_stats,      cuda_bn_forward,     cuda_bn_backward_sums,   cuda_bn_backward_dx,
};

extern "C" pmap_status cuda_ops_preload(cuda_device *cd) {
  pmap_status (*const each[])(cuda_device *) = {
      cuda_adam_preload, cuda_bias_preload, cuda_conv2d_preload,      cuda_fill_preload,
      cuda_mse_preload,  cuda_norm2_preload, cuda_loss_reduce_preload, cuda_relu_preload,
      cuda_sgd_preload,  cuda_softmax_xent_preload,
      cuda_act_preload,  cuda_add_preload,   cuda_batchnorm_preload,   cuda_dropout_preload,
      cuda_layernorm_preload, cuda_pool2d_preload,
  };
  for (size_t i = 0; i < sizeof each / sizeof each[0]; i++) PMAP_TRY(each[i](cd));
  return PMAP_SUCCESS;
}
