// Internal interface of the sm90 GEMM + column-statistics kernels (one TU per instantiation).
// Torch-free; included by the dispatcher (src/api/forward_cuda.cu) and by tests.
#pragma once

#include "fused/batchnorm.h"
#include "fused/types.h"

namespace fused::sm90 {

// Three kernel shapes (chosen per problem by choose_tile; measured on the H200 with bench/cpp/sweep and
// bench_sm90_gemm_stats):
//   k256x128: cooperative (two consumer warpgroups on one 256x128 tile), cluster 1x2 (the x tile is
//             multicast to both CTAs). Fastest once the grid fills the GPU (the headline shape).
//   k128x128: ping-pong (each consumer warpgroup owns a 128x128 tile; one's epilogue overlaps the
//             other's mainloop). Twice the CTAs: 2x faster where 256x128 tiles leave SMs idle
//             (M = 256 or N = 2048 at K = 8192 / 4096).
//   k128x128SplitK: cooperative 128x128 tiles with the K loop split over split_k_count CTAs, summed
//             in a fixed order before the epilogue: for grids of at most half a wave of 128x128 tiles
//             (N = 512 at M = 1024), which the other two leave mostly idle.
// The CTA tile fixes the partials format: one partial per (CTA row tile, column), i.e. a buffer of
// [ceil(M / partials_row_tile(tile)), partials_ld(N)] (all tiles are 128 wide).
enum class Sm90Tile : int { k256x128 = 0, k128x128 = 1, k128x128SplitK = 2 };
// The 3xTF32 kernel's one shape: 128x128 cooperative (two accumulators per thread leave no room for
// a 256x128 tile or a ping-pong one), with the 128-row partials format of k128x128.
constexpr Sm90Tile k3xTf32Tile = Sm90Tile::k128x128;
constexpr int64_t kCtaTileN = 128;                      // CTA tile N of every instantiation
int64_t partials_row_tile(Sm90Tile tile = Sm90Tile::k256x128);   // == CTA tile M
int64_t partials_ld(int64_t N);                         // == round_up(N, kCtaTileN)
// How many CTAs k128x128SplitK splits each tile's K loop over, K counted in k-tiles of 128 bytes (64
// bf16/fp16 elements, 32 fp32; element_bytes 2 or 4): as many as fill the SMs with the 128x128 grid, at
// most kMaxSplitK, each with at least kMinKTilesPerSplit k-tiles; 1 (no split) where the grid already
// fills more than half the SMs or K has fewer than kMinKTilesToSplit k-tiles. Measured on the H200
// (bench_sm90_gemm_stats, the kernel alone on the GPU, splits 2/4/8 at nine shapes in bf16 and tf32,
// the library's fixup): the rule's count was the fastest at each shape where every split's CTA runs at
// once; shorter K loops (bf16 1024x512x2048, 32 k-tiles: 14.8 us unsplit against 17.8 with 2 splits)
// lose to not splitting, since the reduction costs 3-5 us whatever the K.
constexpr int64_t kMinKTilesPerSplit = 16;
constexpr int64_t kMinKTilesToSplit = 64;
constexpr int64_t kMaxSplitK = 8;
int split_k_count(int64_t M, int64_t N, int64_t K, int element_bytes, int num_sms);
// k128x128SplitK when split_k_count > 1; else k128x128 when the 256x128 grid would not fill one wave
// of `num_sms` SMs; else k256x128.
Sm90Tile choose_tile(int64_t M, int64_t N, int64_t K, int element_bytes, int num_sms);

struct GemmStatsArgs {
  int64_t M = 0, N = 0, K = 0;
  const void* x = nullptr;  // (M, K) row-major, row stride ldx (elements), 16-byte aligned rows
  int64_t ldx = 0;
  const void* w = nullptr;  // (N, K) row-major (nn.Linear weight), row stride ldw
  int64_t ldw = 0;
  const void* bias = nullptr;  // (N) same element type as x, or null (no bias)
  float* y = nullptr;          // (M, N) fp32 row-major, row stride ldy (multiple of 4)
  int64_t ldy = 0;
  // Per-CTA-tile column partials of y (mean, M2; count from geometry). mean == nullptr: the
  // epilogue computes no statistics (eval mode).
  ColumnStatsPartials partials;
  Sm90Tile tile = Sm90Tile::k256x128;  // the kernel shape; the partials geometry follows it
  int k_splits = 0;                    // k128x128SplitK only: CTAs per tile's K loop; 0 = split_k_count
};

// Device workspace the GEMM itself needs (tile scheduler etc.), bytes, of the kernel run_gemm_stats
// picks. 0 if the arguments are invalid.
std::size_t gemm_workspace_bytes(ElementType dtype, MatmulPrecision precision, const GemmStatsArgs& args);

// The kernel of an (element type, precision), through one TU per (kernel, tile):
//   bf16 / fp16: A, B in that type; fp32 at kTF32: A, B fp32, TF32 tensor-core MMA;
//   fp32 at k3xTF32: 3xTF32, fp32-grade accuracy; its one tile is k3xTf32Tile, so args.tile must be
//   that. By default the presplit kernel (gemm_stats_sm90_3xtf32_presplit.cu: x's small parts written
//   by a pass into the workspace, M x K floats of it); with FUSED_3XTF32_IN_LOOP_SPLIT=1 the kernel that
//   splits W's tiles in the loop (kernels/sm90/mainloop_3xtf32.hpp), for A/B runs.
// fp32 at kHighest has no sm90 kernel (kNotSupported).
// Requirements (else kNotSupported / kInvalidArgument, nothing launched): K, ldx, ldw multiples of
// 16 bytes; N, ldy multiples of 4; x, w, y 16-byte aligned; M, N, K < 2^31; partials either both
// null or of geometry [>= ceil(M / partials_row_tile(args.tile)), partials_ld(N)]. The bias needs no
// alignment. With null partials and a null bias the kernel is a plain GEMM y = x W^T.
// Launches on `stream` (the current device); asynchronous.
Status run_gemm_stats(ElementType dtype, MatmulPrecision precision, const GemmStatsArgs& args, void* workspace,
                      cudaStream_t stream);

// The instantiations behind the functions above (one TU each).
namespace instances {
#define FUSED_SM90_INSTANCE(name)                                                   \
  Status run_##name(const GemmStatsArgs& args, void* workspace, cudaStream_t stream); \
  std::size_t workspace_##name(const GemmStatsArgs& args);
FUSED_SM90_INSTANCE(bf16_256x128)
FUSED_SM90_INSTANCE(fp16_256x128)
FUSED_SM90_INSTANCE(tf32_256x128)
FUSED_SM90_INSTANCE(bf16_128x128)
FUSED_SM90_INSTANCE(fp16_128x128)
FUSED_SM90_INSTANCE(tf32_128x128)
FUSED_SM90_INSTANCE(bf16_128x128_splitk)
FUSED_SM90_INSTANCE(fp16_128x128_splitk)
FUSED_SM90_INSTANCE(tf32_128x128_splitk)
FUSED_SM90_INSTANCE(3xtf32_128x128)
FUSED_SM90_INSTANCE(3xtf32_presplit_128x128)
#undef FUSED_SM90_INSTANCE
}  // namespace instances

}  // namespace fused::sm90
