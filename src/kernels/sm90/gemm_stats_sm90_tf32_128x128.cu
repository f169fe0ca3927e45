// sm90 GEMM + column statistics, fp32 inputs, tf32 tensor-core MMA, 128x128 ping-pong tile (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {
namespace {
using Config = detail::SmallTileConfig<float>;
// Raster along N: the faster order for these underfilled grids in the sweep (tf32: 12 % at
// 1024x2048x4096; 16-bit: level).
constexpr detail::SchedulerOptions kScheduler{2, 1};
}  // namespace

Status run_tf32_128x128(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<float, Config>(args, workspace, stream, kScheduler);
}

std::size_t workspace_tf32_128x128(const GemmStatsArgs& args) {
  return detail::workspace_bytes<float, Config>(args, kScheduler);
}

}  // namespace fused::sm90::instances
