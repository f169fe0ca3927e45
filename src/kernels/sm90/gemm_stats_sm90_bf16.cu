// sm90 GEMM + column statistics, bf16 inputs (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90 {

Status run_gemm_stats_bf16(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<cutlass::bfloat16_t>(args, workspace, stream);
}

std::size_t gemm_workspace_bytes_bf16(const GemmStatsArgs& args) {
  return detail::workspace_bytes<cutlass::bfloat16_t>(args);
}

}  // namespace fused::sm90
