// sm90 GEMM + column statistics, bf16 inputs, 128x128 ping-pong tile (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {
namespace {
using Config = detail::SmallTileConfig<cutlass::bfloat16_t>;
}  // namespace

Status run_bf16_128x128(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<cutlass::bfloat16_t, Config>(args, workspace, stream, detail::kSmallTileScheduler);
}

std::size_t workspace_bf16_128x128(const GemmStatsArgs& args) {
  return detail::workspace_bytes<cutlass::bfloat16_t, Config>(args, detail::kSmallTileScheduler);
}

}  // namespace fused::sm90::instances
