// The one-kernel forward, tf32 inputs (one instantiation per TU).
#include "kernels/sm90/one_kernel_forward_sm90.cuh"

namespace fused::sm90::instances {

Status run_one_kernel_tf32(const OneKernelForwardArgs& args, cudaStream_t stream) {
  return detail::run_one_kernel<float>(args, stream);
}

}  // namespace fused::sm90::instances
