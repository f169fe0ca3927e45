// sm90 GEMM + column statistics, fp32 inputs, tf32 tensor-core MMA (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90 {

Status run_gemm_stats_tf32(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<float>(args, workspace, stream);
}

std::size_t gemm_workspace_bytes_tf32(const GemmStatsArgs& args) {
  return detail::workspace_bytes<float>(args);
}

}  // namespace fused::sm90
