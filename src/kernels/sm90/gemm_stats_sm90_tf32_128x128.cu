// sm90 GEMM + column statistics, fp32 inputs, tf32 tensor-core MMA, 128x128 ping-pong tile (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {
namespace {
using Config = detail::SmallTileConfig<float>;
}  // namespace

Status run_tf32_128x128(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<float, Config>(args, workspace, stream, detail::kSmallTileScheduler);
}

std::size_t workspace_tf32_128x128(const GemmStatsArgs& args) {
  return detail::workspace_bytes<float, Config>(args, detail::kSmallTileScheduler);
}

}  // namespace fused::sm90::instances
