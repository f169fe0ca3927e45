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

namespace {
bool three_x_tf32(ElementType dtype, MatmulPrecision precision) {
  return dtype == ElementType::kFloat32 && precision == MatmulPrecision::k3xTF32;
}
constexpr Status kNoKernel{StatusCode::kNotSupported, "sm90 gemm_stats: no kernel for this element type and precision"};
constexpr Status kWrongTile{StatusCode::kInvalidArgument, "sm90 gemm_stats: 3xTF32 runs the 128x128 tile only"};
}  // namespace

std::size_t gemm_workspace_bytes(ElementType dtype, MatmulPrecision precision, const GemmStatsArgs& args) {
  const bool small = args.tile == Sm90Tile::k128x128;
  if (dtype == ElementType::kFloat32 && precision == MatmulPrecision::kHighest) return 0;
  if (three_x_tf32(dtype, precision)) return args.tile == k3xTf32Tile ? instances::workspace_3xtf32_128x128(args) : 0;
  switch (dtype) {
    case ElementType::kBFloat16: return small ? instances::workspace_bf16_128x128(args) : instances::workspace_bf16_256x128(args);
    case ElementType::kFloat16: return small ? instances::workspace_fp16_128x128(args) : instances::workspace_fp16_256x128(args);
    case ElementType::kFloat32: return small ? instances::workspace_tf32_128x128(args) : instances::workspace_tf32_256x128(args);
    default: return 0;
  }
}

Status run_gemm_stats(ElementType dtype, MatmulPrecision precision, const GemmStatsArgs& args, void* workspace,
                      cudaStream_t stream) {
  const bool small = args.tile == Sm90Tile::k128x128;
  if (dtype == ElementType::kFloat32 && precision == MatmulPrecision::kHighest) return kNoKernel;
  if (three_x_tf32(dtype, precision))
    return args.tile == k3xTf32Tile ? instances::run_3xtf32_128x128(args, workspace, stream) : kWrongTile;
  switch (dtype) {
    case ElementType::kBFloat16:
      return small ? instances::run_bf16_128x128(args, workspace, stream)
                   : instances::run_bf16_256x128(args, workspace, stream);
    case ElementType::kFloat16:
      return small ? instances::run_fp16_128x128(args, workspace, stream)
                   : instances::run_fp16_256x128(args, workspace, stream);
    case ElementType::kFloat32:
      return small ? instances::run_tf32_128x128(args, workspace, stream)
                   : instances::run_tf32_256x128(args, workspace, stream);
    default: return kNoKernel;
  }
}

}  // namespace fused::sm90
