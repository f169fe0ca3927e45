// Geometry of the sm90 partials format, the tile choice, and the dispatch from (element type,
// tile) to the instantiation TUs (no CUTLASS here).
#include "kernels/sm90/gemm_stats_sm90.h"

namespace fused::sm90 {

int64_t partials_row_tile(Sm90Tile tile) { return tile == Sm90Tile::k128x128 ? 128 : 256; }

int64_t partials_ld(int64_t N) { return (N + kCtaTileN - 1) / kCtaTileN * kCtaTileN; }

Sm90Tile choose_tile(int64_t M, int64_t N, int num_sms) {
  const int64_t rows = partials_row_tile(Sm90Tile::k256x128);
  const int64_t tiles_256x128 = (M + rows - 1) / rows * ((N + kCtaTileN - 1) / kCtaTileN);
  return tiles_256x128 < num_sms ? Sm90Tile::k128x128 : Sm90Tile::k256x128;
}

std::size_t gemm_workspace_bytes(ElementType dtype, const GemmStatsArgs& args) {
  const bool small = args.tile == Sm90Tile::k128x128;
  switch (dtype) {
    case ElementType::kBFloat16: return small ? instances::workspace_bf16_128x128(args) : instances::workspace_bf16_256x128(args);
    case ElementType::kFloat16: return small ? instances::workspace_fp16_128x128(args) : instances::workspace_fp16_256x128(args);
    case ElementType::kFloat32: return small ? instances::workspace_tf32_128x128(args) : instances::workspace_tf32_256x128(args);
    default: return 0;
  }
}

Status run_gemm_stats_bf16(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return args.tile == Sm90Tile::k128x128 ? instances::run_bf16_128x128(args, workspace, stream)
                                         : instances::run_bf16_256x128(args, workspace, stream);
}
Status run_gemm_stats_fp16(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return args.tile == Sm90Tile::k128x128 ? instances::run_fp16_128x128(args, workspace, stream)
                                         : instances::run_fp16_256x128(args, workspace, stream);
}
Status run_gemm_stats_tf32(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return args.tile == Sm90Tile::k128x128 ? instances::run_tf32_128x128(args, workspace, stream)
                                         : instances::run_tf32_256x128(args, workspace, stream);
}

}  // namespace fused::sm90
