// sm90 GEMM + column statistics, fp16 inputs, 256x128 cooperative tile (one instantiation per TU).
#include "kernels/sm90/gemm_stats_sm90.cuh"

namespace fused::sm90::instances {

Status run_fp16_256x128(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run<cutlass::half_t, detail::LargeTileConfig<cutlass::half_t>>(args, workspace, stream,
      detail::large_tile_scheduler(args.M, args.N));
}

std::size_t workspace_fp16_256x128(const GemmStatsArgs& args) {
  return detail::workspace_bytes<cutlass::half_t, detail::LargeTileConfig<cutlass::half_t>>(args,
      detail::large_tile_scheduler(args.M, args.N));
}

}  // namespace fused::sm90::instances
