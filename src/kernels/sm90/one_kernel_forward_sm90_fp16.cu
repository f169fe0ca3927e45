// The one-kernel forward, fp16 inputs (one instantiation per TU).
#include "kernels/sm90/one_kernel_forward_sm90.cuh"

namespace fused::sm90::instances {

Status run_one_kernel_fp16(const OneKernelForwardArgs& args, cudaStream_t stream) {
  return detail::run_one_kernel<cutlass::half_t>(args, stream);
}

}  // namespace fused::sm90::instances
