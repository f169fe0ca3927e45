// Geometry of the sm90 partials format, the tile choice, and the dispatch from (element type,
// tile) to the instantiation TUs (no CUTLASS here).
#include "kernels/sm90/gemm_stats_sm90.h"

#include <algorithm>

#include "kernels/sm90/split_small_parts_3xtf32.h"

namespace fused::sm90 {

int64_t partials_row_tile(Sm90Tile tile) { return tile == Sm90Tile::k256x128 ? 256 : 128; }

int64_t partials_ld(int64_t N) { return (N + kCtaTileN - 1) / kCtaTileN * kCtaTileN; }

namespace {
int64_t tile_count(int64_t M, int64_t N, Sm90Tile tile) {
  const int64_t rows = partials_row_tile(tile);
  return (M + rows - 1) / rows * ((N + kCtaTileN - 1) / kCtaTileN);
}
}  // namespace

int split_k_count(int64_t M, int64_t N, int64_t K, int element_bytes, int num_sms) {
  const int64_t tiles = tile_count(M, N, Sm90Tile::k128x128);
  const int64_t k_tiles = element_bytes > 0 ? (K * element_bytes + 127) / 128 : 0;
  if (tiles <= 0 || 2 * tiles > num_sms || k_tiles < kMinKTilesToSplit) return 1;
  const int64_t splits = std::min({int64_t(num_sms) / tiles, k_tiles / kMinKTilesPerSplit, kMaxSplitK});
  return static_cast<int>(std::max<int64_t>(splits, 1));
}

Sm90Tile choose_tile(int64_t M, int64_t N, int64_t K, int element_bytes, int num_sms) {
  if (split_k_count(M, N, K, element_bytes, num_sms) > 1) return Sm90Tile::k128x128SplitK;
  return tile_count(M, N, Sm90Tile::k256x128) < num_sms ? Sm90Tile::k128x128 : Sm90Tile::k256x128;
}

namespace {
constexpr Status kNoKernel{StatusCode::kNotSupported, "sm90 gemm_stats: no kernel for this element type and precision"};
constexpr Status kWrongTile{StatusCode::kInvalidArgument, "sm90 gemm_stats: 3xTF32 runs the 128x128 tile only"};

// One instantiation TU's entry points.
struct Instance {
  std::size_t (*workspace)(const GemmStatsArgs&);
  Status (*run)(const GemmStatsArgs&, void*, cudaStream_t);
};

// The instantiation for (element type, precision, tile), or null with the reason in `why`.
const Instance* find_instance(ElementType dtype, MatmulPrecision precision, Sm90Tile tile, Status& why) {
  using namespace instances;
  static constexpr Instance k3xTf32InLoop{workspace_3xtf32_128x128, run_3xtf32_128x128};
  static constexpr Instance k3xTf32Presplit{workspace_3xtf32_presplit_128x128, run_3xtf32_presplit_128x128};
  // Indexed by Sm90Tile.
  static constexpr Instance kBf16[3] = {{workspace_bf16_256x128, run_bf16_256x128},
                                        {workspace_bf16_128x128, run_bf16_128x128},
                                        {workspace_bf16_128x128_splitk, run_bf16_128x128_splitk}};
  static constexpr Instance kFp16[3] = {{workspace_fp16_256x128, run_fp16_256x128},
                                        {workspace_fp16_128x128, run_fp16_128x128},
                                        {workspace_fp16_128x128_splitk, run_fp16_128x128_splitk}};
  static constexpr Instance kTf32[3] = {{workspace_tf32_256x128, run_tf32_256x128},
                                        {workspace_tf32_128x128, run_tf32_128x128},
                                        {workspace_tf32_128x128_splitk, run_tf32_128x128_splitk}};
  why = kNoKernel;
  const int index = static_cast<int>(tile);
  if (index < 0 || index > 2) return nullptr;
  if (dtype == ElementType::kFloat32 && precision == MatmulPrecision::kHighest) return nullptr;
  if (dtype == ElementType::kFloat32 && precision == MatmulPrecision::k3xTF32) {
    if (tile == k3xTf32Tile) return presplit_3xtf32() ? &k3xTf32Presplit : &k3xTf32InLoop;
    why = kWrongTile;
    return nullptr;
  }
  switch (dtype) {
    case ElementType::kBFloat16: return &kBf16[index];
    case ElementType::kFloat16: return &kFp16[index];
    case ElementType::kFloat32: return &kTf32[index];
    default: return nullptr;
  }
}
}  // namespace

std::size_t gemm_workspace_bytes(ElementType dtype, MatmulPrecision precision, const GemmStatsArgs& args) {
  Status why;
  const Instance* instance = find_instance(dtype, precision, args.tile, why);
  return instance != nullptr ? instance->workspace(args) : 0;
}

Status run_gemm_stats(ElementType dtype, MatmulPrecision precision, const GemmStatsArgs& args, void* workspace,
                      cudaStream_t stream) {
  Status why;
  const Instance* instance = find_instance(dtype, precision, args.tile, why);
  return instance != nullptr ? instance->run(args, workspace, stream) : why;
}

}  // namespace fused::sm90
