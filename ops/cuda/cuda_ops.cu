/* cuda_ops.cu: the CUDA op table, the counterpart of ops/cpu's pmap_cpu_ops; the backend in
 * runtime/cuda hands it to every device. Designated initializers (C++20: in member order), and
 * runtime/backend.c checks at context creation that no member is left NULL. Also the loading of
 * every kernel when a device starts (cuda_ops_preload). */
#include "cuda_ops.h"

extern "C" const pmap_ops pmap_cuda_ops = {
    .gemm = cuda_gemm,
    .fill = cuda_fill,
    .copy = cuda_copy,
    .bias_forward = cuda_bias_forward,
    .bias_backward = cuda_bias_backward,
    .relu_forward = cuda_relu_forward,
    .relu_backward = cuda_relu_backward,
    .conv2d_forward = cuda_conv2d_forward,
    .conv2d_backward = cuda_conv2d_backward,
    .mse = cuda_mse,
    .softmax_xent = cuda_softmax_xent,
    .sgd_step = cuda_sgd_step,
    .adam_step = cuda_adam_step,
    .norm2 = cuda_norm2,
    .scale = cuda_scale,
    .axpy = cuda_axpy,
    .act_forward = cuda_act_forward,
    .act_backward = cuda_act_backward,
    .add = cuda_add,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .pool2d_forward = cuda_pool2d_forward,
    .pool2d_backward = cuda_pool2d_backward,
    .dropout_forward = cuda_dropout_forward,
    .dropout_backward = cuda_dropout_backward,
    .bn_stats = cuda_bn_stats,
    .bn_forward = cuda_bn_forward,
    .bn_backward_sums = cuda_bn_backward_sums,
    .bn_backward_dx = cuda_bn_backward_dx,
};

extern "C" pmap_status cuda_ops_preload(cuda_device *cd) {
  pmap_status (*const each[])(cuda_device *) = {
      cuda_adam_preload,         cuda_bias_preload,    cuda_conv2d_preload,
      cuda_fill_preload,         cuda_mse_preload,     cuda_norm2_preload,
      cuda_loss_reduce_preload,  cuda_relu_preload,    cuda_sgd_preload,
      cuda_softmax_xent_preload, cuda_act_preload,     cuda_add_preload,
      cuda_batchnorm_preload,    cuda_dropout_preload, cuda_layernorm_preload,
      cuda_pool2d_preload,       cuda_step_vals_preload, cuda_copy_preload,
  };
  for (size_t i = 0; i < sizeof each / sizeof each[0]; i++) PMAP_TRY(each[i](cd));
  return PMAP_SUCCESS;
}
