// The one-kernel forward, bf16 inputs (one instantiation per TU).
#include "kernels/sm90/one_kernel_forward_sm90.cuh"

namespace fused::sm90::instances {

Status run_one_kernel_bf16(const OneKernelForwardArgs& args, cudaStream_t stream) {
  return detail::run_one_kernel<cutlass::bfloat16_t>(args, stream);
}

}  // namespace fused::sm90::instances
