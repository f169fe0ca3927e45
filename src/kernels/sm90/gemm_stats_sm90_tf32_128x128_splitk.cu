// sm90 GEMM + column statistics, fp32 inputs (TF32 tensor cores), 128x128 cooperative tile with split K (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {

Status run_tf32_128x128_splitk(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<float, detail::SplitKConfig>(args, workspace, stream);
}

std::size_t workspace_tf32_128x128_splitk(const GemmStatsArgs& args) {
  return detail::workspace_bytes<float, detail::SplitKConfig>(args);
}

}  // namespace fused::sm90::instances
