/* cuda_ops.cu: the CUDA op table, the counterpart of ops/cpu's pmap_cpu_ops; the backend in
 * runtime/cuda hands it to every device. Entries follow the member order of pmap_ops. */
#include "cuda_ops.h"

extern "C" const pmap_ops pmap_cuda_ops = {
    cuda_gemm,          cuda_fill,           cuda_bias_forward,   cuda_bias_backward,
    cuda_relu_forward,  cuda_relu_backward,  cuda_conv2d_forward, cuda_conv2d_backward,
    cuda_mse,           cuda_softmax_xent,   cuda_sgd_step,       cuda_adam_step,
    cuda_norm2,         cuda_scale,          cuda_axpy,
};
