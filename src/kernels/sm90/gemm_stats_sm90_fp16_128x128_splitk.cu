// sm90 GEMM + column statistics, fp16 inputs, 128x128 cooperative tile with split K (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {

Status run_fp16_128x128_splitk(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<cutlass::half_t, detail::SplitKConfig>(args, workspace, stream);
}

std::size_t workspace_fp16_128x128_splitk(const GemmStatsArgs& args) {
  return detail::workspace_bytes<cutlass::half_t, detail::SplitKConfig>(args);
}

}  // namespace fused::sm90::instances
