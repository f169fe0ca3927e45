// sm90 GEMM + column statistics, bf16 inputs, 128x128 cooperative tile with split K (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {

Status run_bf16_128x128_splitk(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<cutlass::bfloat16_t, detail::SplitKConfig>(args, workspace, stream);
}

std::size_t workspace_bf16_128x128_splitk(const GemmStatsArgs& args) {
  return detail::workspace_bytes<cutlass::bfloat16_t, detail::SplitKConfig>(args);
}

}  // namespace fused::sm90::instances
