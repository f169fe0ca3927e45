// sm90 GEMM + column statistics, fp32 inputs, tf32 tensor-core MMA, 256x128 cooperative tile (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {

Status run_tf32_256x128(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<float, detail::LargeTileConfig<float>>(args, workspace, stream,
      detail::large_tile_scheduler(args.M, args.N));
}

std::size_t workspace_tf32_256x128(const GemmStatsArgs& args) {
  return detail::workspace_bytes<float, detail::LargeTileConfig<float>>(args,
      detail::large_tile_scheduler(args.M, args.N));
}

}  // namespace fused::sm90::instances
