// sm90 GEMM + column statistics, bf16 inputs, 128x128 ping-pong tile (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {
namespace {
using Config = detail::SmallTileConfig<cutlass::bfloat16_t>;
// Raster along N: the faster order for these underfilled grids in the sweep (tf32: 12 % at
// 1024x2048x4096; 16-bit: level).
constexpr detail::SchedulerOptions kScheduler{2, 1};
}  // namespace

Status run_bf16_128x128(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<cutlass::bfloat16_t, Config>(args, workspace, stream, kScheduler);
}

std::size_t workspace_bf16_128x128(const GemmStatsArgs& args) {
  return detail::workspace_bytes<cutlass::bfloat16_t, Config>(args, kScheduler);
}

}  // namespace fused::sm90::instances
