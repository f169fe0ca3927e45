// Launch template of the sm90 GEMM + column-statistics kernel:
//   y = x * W^T + bias  (fp32 accumulation, fp32 y)   and per-CTA-tile column partials (mean, M2) of y.
// CUTLASS 3.x: CollectiveBuilder, TMA, warp-specialized cooperative or ping-pong kernel, persistent
// tile scheduler, epilogue visitor tree  y = Sm90ColumnPartials(acc) + RowBroadcast(bias).
// Included by exactly one TU per (element type, tile): gemm_stats_sm90_{bf16,fp16,tf32}_{256x128,128x128}.cu,
// and by the configuration sweep (bench/cpp/sweep).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"

#include "util/cuda_check.h"
#include "util/device_info.h"
#include "kernels/epilogue/sm90_column_partials.hpp"
#include "kernels/sm90/gemm_stats_sm90.h"

// How the split-K tile's peers sum their partial accumulators (FUSED_SPLITK_FIXUP):
//   1 (the library's): every non-final peer stores its partials to a slot of its own at once; the
//     final peer (the last K range) waits until all have arrived, then adds the slots in split order.
//   0: CUTLASS's deterministic reduction, a chain (peer k waits for peer k - 1 to have added its
//     partials into one shared slot, then adds its own), kept for A/B measurements.
// Both orders are fixed, so either gives the same bits run to run (not the same bits as each other).
#ifndef FUSED_SPLITK_FIXUP
#define FUSED_SPLITK_FIXUP 1
#endif

namespace fused::sm90::detail {

// CUTLASS 4.2's stream-K scheduler whose is_last_tile() compiles under CUTLASS_ENABLE_GDC_FOR_SM90 (CUTLASS's
// own binds a member to a non-const reference in a const method). It answers true for every work unit: the
// cooperative kernel asks it after a unit's K loop, to let the next kernel launch early (a hint: the next
// kernel still waits for this grid to complete before it reads anything, griddepcontrol.wait). Where a CTA
// runs more units than one the hint comes early, which changes no result. Everything else is CUTLASS's: the
// decomposition (data-parallel, split-K, stream-K, as Arguments pick), the workspace, and the deterministic
// fixup. The backward's presplit 3xTF32 GEMM runs it in CUTLASS's heuristic (gemm_3xtf32_row_major.cuh),
// where the decomposition, split-K included, is chosen per problem: so the fixup and workspace must stay
// CUTLASS's, which agree in every mode.
template <class TileShape, class ClusterShape>
class StreamKScheduler
    : public cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape, ClusterShape> {
  using Base = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90StreamK<TileShape, ClusterShape>;

 public:
  using Base::Base;
  using typename Base::Arguments;
  using typename Base::Params;
  using typename Base::WorkTileInfo;

  template <class Tile>
  CUTLASS_DEVICE bool is_last_tile(Tile, uint32_t = 1) const { return true; }
};
// The tag that selects it (GemmUniversal's tile-scheduler parameter).
struct StreamKSchedulerTag {};

// The split-K tile's scheduler: StreamKScheduler in CUTLASS's split-K mode with a split count the
// library sets (GemmStatsArgs::k_splits, else split_k_count), and its own fixup():
// - the peers of a tile store their partials concurrently into one slot each and only the final peer
//   waits, instead of CUTLASS's deterministic chain, where each peer waits for the one before it and the
//   final peer is the end of splits - 1 dependent read-add-write rounds through L2. H200, the kernel
//   alone on the GPU at 1024x512x4096 with 4 splits: bf16 19.7 us against 23.7 with the chain (15.2
//   without any reduction, a bound), tf32 24.7 against 27.8; at 8 splits (16 tiles) 22.3 against 30.7;
//   level at 2 splits. The workspace grows by splits - 2 slots per tile (the first peer uses CUTLASS's
//   slot): get_workspace_size adds them for Arguments in split-K mode only, so this scheduler must not
//   run a mode where CUTLASS picks the split count itself (its heuristic).
template <class TileShape, class ClusterShape>
class SplitKScheduler : public StreamKScheduler<TileShape, ClusterShape> {
  using Base = StreamKScheduler<TileShape, ClusterShape>;
  static constexpr uint64_t kTileElements = uint64_t(cute::size<0>(TileShape{})) * cute::size<1>(TileShape{});

 public:
  using Base::Base;
  using typename Base::Arguments;
  using typename Base::Params;
  using typename Base::WorkTileInfo;

  // CUTLASS's workspace (one slot per tile, then the counters), then splits - 2 more slots per tile.
  template <class ProblemShape, class ElementAccumulator>
  static size_t get_workspace_size(Arguments const& args, ProblemShape problem_shape,
                                   cutlass::KernelHardwareInfo const& hw_info, uint32_t mma_warp_groups,
                                   uint32_t epilogue_subtile = 1, uint32_t num_accumulator_mtxs = 1) {
    const size_t base = Base::template get_workspace_size<ProblemShape, ElementAccumulator>(
        args, problem_shape, hw_info, mma_warp_groups, epilogue_subtile, num_accumulator_mtxs);
#if FUSED_SPLITK_FIXUP == 1
    static_assert(cute::is_same_v<ElementAccumulator, float>, "the slots hold fp32 accumulators");
    if (args.decomposition_mode != Params::DecompositionMode::SplitK || args.splits <= 2) return base;
    // Tiles as CUTLASS counts them (the grid rounded up to the swizzle); CUTLASS may lower the split
    // count (never raise it), so args.splits bounds the slots the kernel uses.
    auto shape_mnkl = cute::append<4>(problem_shape, 1);
    const auto blocks = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params::get_tiled_cta_shape_mnl(
        cutlass::gemm::BatchedGemmCoord(cute::get<0>(shape_mnkl), cute::get<1>(shape_mnkl), cute::get<2>(shape_mnkl),
                                        cute::get<3>(shape_mnkl)),
        cutlass::gemm::GemmCoord(cute::size<0>(TileShape{}), cute::size<1>(TileShape{}), cute::size<2>(TileShape{})),
        cutlass::gemm::GemmCoord(cute::size<0>(ClusterShape{}), cute::size<1>(ClusterShape{}), 1));
    const int log_swizzle = cutlass::gemm::kernel::detail::PersistentTileSchedulerSm90Params::get_log_swizzle_size(
        blocks.x, blocks.y, args.max_swizzle_size);
    const uint64_t round_m = (uint64_t(1) << log_swizzle) * cute::size<0>(ClusterShape{});
    const uint64_t round_n = (uint64_t(1) << log_swizzle) * cute::size<1>(ClusterShape{});
    const uint64_t tiles = (blocks.x + round_m - 1) / round_m * round_m * ((blocks.y + round_n - 1) / round_n * round_n) *
                           blocks.z;
    return base + tiles * uint64_t(args.splits - 2) * kTileElements * sizeof(float);
#else
    return base;
#endif
  }

#if FUSED_SPLITK_FIXUP == 1
  // The kernel calls it after a work unit's K loop, per consumer warpgroup (barrier_idx), with that
  // warpgroup's share of the tile's accumulators.
  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const& params, WorkTileInfo const& work, FrgTensorC& accumulators,
                                   uint32_t num_barriers, uint32_t barrier_idx) {
    const uint32_t splits = params.divmod_splits_.divisor;
    if (splits <= 1) {  // not split-K (the library does not run this scheduler so): CUTLASS's own reduction
      Base::fixup(params, work, accumulators, num_barriers, barrier_idx);
      return;
    }
    if (!Base::requires_fixup(params, work)) return;
    static_assert(cute::is_same_v<typename FrgTensorC::value_type, float>, "fp32 accumulators");
    constexpr int kThreads = cutlass::NumThreadsPerWarpGroup;
    constexpr int kVectors = int(cute::size(FrgTensorC{})) / 4;  // float4s per thread
    static_assert(int(cute::size(FrgTensorC{})) % 4 == 0);
    using Barriers = cutlass::NamedBarrierManager<kThreads, uint32_t(cutlass::arch::ReservedNamedBarriers::StreamkBarrier0), 2>;

    // The workspace as get_workspace_size laid it out.
    const uint64_t tiles = params.units_per_problem_;
    const uint64_t tile = Base::output_tile_index(params, work);
    const cutlass::gemm::GemmCoord tile_shape(cute::size<0>(TileShape{}), cute::size<1>(TileShape{}),
                                              cute::size<2>(TileShape{}));
    auto* workspace = reinterpret_cast<uint8_t*>(params.reduction_workspace_);
    const size_t first_slots_bytes = Params::get_reduction_workspace_size(tiles, tile_shape, 32);
    int* counters = reinterpret_cast<int*>(workspace + first_slots_bytes);
    float* more_slots =
        reinterpret_cast<float*>(workspace + first_slots_bytes + Params::get_barrier_workspace_size(tiles, num_barriers, 32));
    const uint64_t warpgroup_offset = uint64_t(barrier_idx) * kVectors * 4 * kThreads;
    auto slot = [&](uint32_t split) {  // split in [0, splits - 1): a non-final peer's slot
      float* p = split == 0 ? reinterpret_cast<float*>(workspace) + tile * kTileElements
                            : more_slots + (tile * (splits - 2) + (split - 1)) * kTileElements;
      return reinterpret_cast<float4*>(p + warpgroup_offset);
    };
    const int counter = int(tile * num_barriers + barrier_idx);
    const int thread = int(threadIdx.x % kThreads);
    float* acc = accumulators.data();

    if (!Base::compute_epilogue(work, params)) {
      // The split's index from its first k-tile: CUTLASS gives the first big_units_ splits one k-tile more.
      const uint32_t per = params.divmod_k_tiles_per_sk_unit_.divisor, big = params.big_units_;
      const uint32_t k0 = uint32_t(work.K_idx);
      const uint32_t split = k0 < big * (per + 1) ? k0 / (per + 1) : big + (k0 - big * (per + 1)) / per;
      float4* out = slot(split);
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < kVectors; ++v)
        __stcg(out + v * kThreads + thread, make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]));
      Barriers::arrive_inc(barrier_idx, counters, thread, counter, 1);  // the warpgroup's stores, then a release
      return;
    }
    Barriers::wait_eq(barrier_idx, counters, thread, counter, int(splits - 1));
    // Add the slots in split order, one whole slot at a time (its loads in flight together: the
    // registers hold one slot beside the accumulators, not two). The slots were written by other SMs:
    // loads and stores bypass L1 (.cg).
#pragma unroll 1
    for (uint32_t split = 0; split + 1 < splits; ++split) {
      const float4* in = slot(split);
      float4 part[kVectors];
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < kVectors; ++v) part[v] = __ldcg(in + v * kThreads + thread);
      CUTLASS_PRAGMA_UNROLL
      for (int v = 0; v < kVectors; ++v) {
        acc[4 * v] += part[v].x;
        acc[4 * v + 1] += part[v].y;
        acc[4 * v + 2] += part[v].z;
        acc[4 * v + 3] += part[v].w;
      }
    }
  }
#elif FUSED_SPLITK_FIXUP == 2
  // Diagnostic only, wrong results: no reduction at all (a bound on what any fixup costs).
  template <class FrgTensorC>
  CUTLASS_DEVICE static void fixup(Params const&, WorkTileInfo const&, FrgTensorC&, uint32_t, uint32_t) {}
#endif
};
// The tag that selects it (GemmUniversal's tile-scheduler parameter).
struct SplitKSchedulerTag {};

}  // namespace fused::sm90::detail

namespace cutlass::gemm::kernel::detail {
template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<fused::sm90::detail::StreamKSchedulerTag, arch::Sm90, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = fused::sm90::detail::StreamKScheduler<TileShape, ClusterShape>;
};
template <class TileShape, class ClusterShape, uint32_t SchedulerPipelineStageCount>
struct TileSchedulerSelector<fused::sm90::detail::SplitKSchedulerTag, arch::Sm90, TileShape, ClusterShape,
                             SchedulerPipelineStageCount> {
  using Scheduler = fused::sm90::detail::SplitKScheduler<TileShape, ClusterShape>;
};
}  // namespace cutlass::gemm::kernel::detail

namespace fused::sm90::detail {

using namespace cute;

// A kernel configuration: CTA tile (M, N), cluster (M, N), and schedule. Cooperative: two consumer
// warpgroups share one TileM x TileN tile. Ping-pong: each consumer warpgroup owns a whole tile and
// the two alternate, so one's epilogue (the y stores and the statistics) overlaps the other's
// mainloop. The CTA tile fixes the partials format: one slot per (TileM row tile, column).
// SplitK (cooperative only): CUTLASS's stream-K tile scheduler in its split-K mode: each tile's K loop
// is split over `splits` CTAs (GemmStatsArgs::k_splits, else split_k_count), so a grid of few tiles
// keeps more SMs busy. The partial accumulators are summed in a fixed order (deterministic reduction)
// before the one CTA that owns the tile runs the epilogue, so the statistics see whole tiles as before.
template <int TileM_, int TileN_, int ClusterM_, int ClusterN_, bool PingPong_, bool SplitK_ = false>
struct GemmStatsConfig {
  static constexpr int kTileM = TileM_, kTileN = TileN_, kClusterM = ClusterM_, kClusterN = ClusterN_;
  static constexpr bool kPingPong = PingPong_;
  static constexpr bool kSplitK = SplitK_;
  static_assert(!(kPingPong && kSplitK), "CUTLASS's stream-K scheduler runs the cooperative kernel only");
};

// What the library runs (Sm90Tile in gemm_stats_sm90.h): 256x128 cooperative in clusters of 1x2, and
// 128x128 ping-pong, cluster 2x1 for 16-bit inputs and 1x2 for tf32 (the faster of the two in the
// sweep for each). In the 256x128 tile x's tile is twice W's, so multicasting it to the two CTAs along
// N (1x2) takes a CTA pair's L2 reads per k-tile from 5 to 4 tiles of W's size, against W's along M
// (2x1). The op timed per build in alternating processes on the H200 (graph replays), 1x2 against
// 2x1: 1-2 % faster at 4096x8192x8192 (bf16, tf32) and 1024x32768x4096, 4.5 % at 1024x131072x4096
// tf32, 0.5 % at the 1024x8192x8192 headline in tf32, level there in bf16 and at M = 16384; the same
// bits. fp16, with bf16's tile bytes, follows bf16 untimed. Each switch set to 0 builds 2x1 again
// (A/B runs: bench/cpp/variants.sh).
#ifndef FUSED_LARGE_TILE_CLUSTER_1X2_TF32
#define FUSED_LARGE_TILE_CLUSTER_1X2_TF32 1
#endif
#ifndef FUSED_LARGE_TILE_CLUSTER_1X2_16BIT
#define FUSED_LARGE_TILE_CLUSTER_1X2_16BIT 1
#endif
template <class ElementIn, bool kAlongN = (sizeof(ElementIn) == 2 ? FUSED_LARGE_TILE_CLUSTER_1X2_16BIT
                                                                  : FUSED_LARGE_TILE_CLUSTER_1X2_TF32) != 0>
using LargeTileConfig = GemmStatsConfig<256, int(kCtaTileN), kAlongN ? 1 : 2, kAlongN ? 2 : 1, false>;
template <class ElementIn>
using SmallTileConfig = GemmStatsConfig<128, int(kCtaTileN), sizeof(ElementIn) == 2 ? 2 : 1,
                                        sizeof(ElementIn) == 2 ? 1 : 2, true>;
// Grids of at most half a wave of 128x128 tiles (Sm90Tile::k128x128SplitK): 128x128 cooperative,
// no cluster (a tile's split-K peers are not neighbours), K split over CTAs.
using SplitKConfig = GemmStatsConfig<128, int(kCtaTileN), 1, 1, false, true>;

// Tile-scheduler choices that need no recompilation (0: CUTLASS's heuristic, 1: along M, 2: along N).
struct SchedulerOptions {
  int raster_order = 0;
  int max_swizzle = 1;
};
// The 128x128 tile's: raster along N, the faster order for these underfilled grids in the sweep
// (tf32: 12 % at 1024x2048x4096; 16-bit: level).
constexpr SchedulerOptions kSmallTileScheduler{2, 1};

// The 256x128 tile's: CUTLASS's heuristic order without swizzle, except on grids of at least
// FUSED_SWIZZLE_MIN_TILES tiles in both directions, where raster along N with swizzle 4 keeps
// the operand tiles that neighbouring CTAs share in L2 (H200, N = K = 8192, interleaved A/B runs of
// this kernel: M = 8192 bf16 1.40 against 1.45 ms, tf32 2.69-2.88 against 2.89-3.16; M = 16384 tf32
// 6.04-6.08 against 6.33-6.45; at M = 4096, 16 row tiles, no raster order or swizzle was faster).
#ifndef FUSED_SWIZZLE_MIN_TILES
#define FUSED_SWIZZLE_MIN_TILES 32
#endif
// Whether an (M, N) output holds at least FUSED_SWIZZLE_MIN_TILES whole (tile_m, tile_n) tiles in both
// directions: the grids whose kernels take swizzle 4 (this one and the 3xTF32 row-major GEMM).
inline bool swizzles_large_grid(int64_t M, int64_t N, int64_t tile_m, int64_t tile_n) {
  constexpr int64_t kMinTiles = FUSED_SWIZZLE_MIN_TILES;
  return M >= kMinTiles * tile_m && N >= kMinTiles * tile_n;
}
inline SchedulerOptions large_tile_scheduler(int64_t M, int64_t N) {
  using Tile = LargeTileConfig<float>;  // the same tile shape for every input width
  return swizzles_large_grid(M, N, Tile::kTileM, Tile::kTileN) ? SchedulerOptions{2, 4} : SchedulerOptions{};
}

// ElementIn: cutlass::bfloat16_t, cutlass::half_t, or float (tf32 tensor-core MMA).
template <class ElementIn, class Config>
struct GemmStatsKernel {
  static constexpr int kTileM = Config::kTileM, kTileN = Config::kTileN;
  static constexpr bool kSplitK = Config::kSplitK;
  using ElementA = ElementIn;                     // x (M,K) row-major: K-major
  using LayoutA = cutlass::layout::RowMajor;
  using ElementB = ElementIn;                     // W (N,K) row-major == B (K,N) column-major: K-major
  using LayoutB = cutlass::layout::ColumnMajor;
  using ElementBias = ElementIn;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementD = float;                         // y (M,N) row-major
  using LayoutD = cutlass::layout::RowMajor;
  using ElementC = void;                          // no source tensor

  static constexpr int AlignmentAB = 128 / cutlass::sizeof_bits<ElementIn>::value;   // 16-byte TMA rows
  static constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;

  // 128-byte K slices (bf16/fp16: 64, tf32: 32).
  using TileShape = Shape<Int<Config::kTileM>, Int<Config::kTileN>, Int<128 / int(sizeof(ElementIn))>>;
  using ClusterShape = Shape<Int<Config::kClusterM>, Int<Config::kClusterN>, _1>;

  using KernelSchedule = cute::conditional_t<Config::kPingPong, cutlass::gemm::KernelTmaWarpSpecializedPingpong,
                                             cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using EpilogueSchedule = cute::conditional_t<Config::kPingPong, cutlass::epilogue::TmaWarpSpecialized,
                                               cutlass::epilogue::TmaWarpSpecializedCooperative>;
  static constexpr auto RoundStyle = cutlass::FloatRoundStyle::round_to_nearest;

  // Epilogue visitor tree: y = partials(acc) + bias.  The statistics see acc (before the bias).
  using AccFetch = cutlass::epilogue::fusion::Sm90AccFetch;
  using Partials = fused::epilogue::Sm90ColumnPartials<TileShape, ElementBias>;
  using BiasBroadcast = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementBias, ElementCompute>;
  using Plus = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementD, ElementCompute, RoundStyle>;
  using FusionCallbacks = cutlass::epilogue::fusion::Sm90EVT<
      Plus, cutlass::epilogue::fusion::Sm90EVT<Partials, AccFetch>, BiasBroadcast>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto,
      ElementAccumulator, ElementCompute,
      ElementC, LayoutD, AlignmentD,
      ElementD, LayoutD, AlignmentD,
      EpilogueSchedule,
      FusionCallbacks>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementA, LayoutA, AlignmentAB,
      ElementB, LayoutB, AlignmentAB,
      ElementAccumulator,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using TileScheduler = cute::conditional_t<Config::kSplitK, SplitKSchedulerTag, cutlass::gemm::PersistentScheduler>;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
      Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, TileScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
};

// The tf32 128x128 cooperative kernel (cluster 1x1) that both 3xTF32 kernels build on: it supplies
// their TF32 TiledMma, layouts and TMA copies (and the forward's statistics epilogue), so the two
// run the same mainloop (gemm_stats_sm90_3xtf32_128x128.cu, gemm_3xtf32_row_major.cu).
using Tf32ReferenceFor3xTf32 = GemmStatsKernel<float, GemmStatsConfig<128, int(kCtaTileN), 1, 1, false>>;

// The launch code below takes a kernel description KC: GemmStatsKernel<ElementIn, Config>, or
// another kernel with the same members (Gemm, the strides, FusionCallbacks, ElementA/B/Bias,
// AlignmentAB/D, kTileM/N, kSplitK), e.g. the 3xTF32 one (gemm_stats_sm90_3xtf32_128x128.cu).
template <class KC>
Status validate(const GemmStatsArgs& a) {
  if (partials_row_tile(a.tile) != KC::kTileM)
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: args.tile does not match the instantiation"};
  constexpr int64_t kIntMax = 0x7fffffff;
  if (a.M <= 0 || a.N <= 0 || a.K <= 0)
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: M, N, K must be positive"};
  if (a.k_splits < 0 || (a.k_splits > 0 && !KC::kSplitK))
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: k_splits must be 0, or positive for the split-K tile"};
  if (a.M > kIntMax || a.N > kIntMax || a.K > kIntMax)
    return {StatusCode::kNotSupported, "sm90 gemm_stats: M, N, K must fit in int32"};
  if (a.x == nullptr || a.w == nullptr || a.y == nullptr)
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: x, w, y must be non-null"};
  if (a.ldx < a.K || a.ldw < a.K || a.ldy < a.N)
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: leading dimension smaller than the row"};
  if (a.K % KC::AlignmentAB != 0 || a.ldx % KC::AlignmentAB != 0 || a.ldw % KC::AlignmentAB != 0)
    return {StatusCode::kNotSupported, "sm90 gemm_stats: K, ldx, ldw must be multiples of 16 bytes (TMA)"};
  if (a.N % KC::AlignmentD != 0 || a.ldy % KC::AlignmentD != 0)
    return {StatusCode::kNotSupported, "sm90 gemm_stats: N and ldy must be multiples of 4 (TMA store of y)"};
  if (!cuda::util::aligned16(a.x) || !cuda::util::aligned16(a.w) || !cuda::util::aligned16(a.y))
    return {StatusCode::kNotSupported, "sm90 gemm_stats: x, w, y must be 16-byte aligned"};
  const ColumnStatsPartials& p = a.partials;
  if ((p.mean == nullptr) != (p.m2 == nullptr))
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: partials.mean and partials.m2 must both be set or both null"};
  if (p.mean != nullptr) {
    if (p.row_tile != KC::kTileM || p.ld != (a.N + KC::kTileN - 1) / KC::kTileN * KC::kTileN ||
        p.num_row_tiles < (a.M + KC::kTileM - 1) / KC::kTileM)
      return {StatusCode::kInvalidArgument,
              "sm90 gemm_stats: partials geometry must be [ceil(M/partials_row_tile()), partials_ld(N)]"};
  }
  return Status::Ok();
}

template <class KC>
Status make_arguments(const GemmStatsArgs& a, const SchedulerOptions& sched, typename KC::Gemm::Arguments& out) {
  using Gemm = typename KC::Gemm;
  Status st = validate<KC>(a);
  if (!st.ok()) return st;

  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return {StatusCode::kCudaError, "sm90 gemm_stats: cudaGetDevice failed"};
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = device;
  st = cuda::util::sm_count(device, hw_info.sm_count);
  if (!st.ok()) return st;

  const int M = int(a.M), N = int(a.N), K = int(a.K);
  typename KC::StrideA stride_a = make_stride(a.ldx, _1{}, a.ldx * a.M);
  typename KC::StrideB stride_b = make_stride(a.ldw, _1{}, a.ldw * a.N);
  typename KC::StrideC stride_c = make_stride(a.ldy, _1{}, a.ldy * a.M);
  typename KC::StrideD stride_d = make_stride(a.ldy, _1{}, a.ldy * a.M);

  using ElementBias = typename KC::ElementBias;
  const auto* bias = static_cast<const ElementBias*>(a.bias);
  const auto* x = static_cast<const typename KC::ElementA*>(a.x);
  const auto* w = static_cast<const typename KC::ElementB*>(a.w);

  typename KC::FusionCallbacks::Arguments fusion_args{
      {                                                  // Sm90EVT<Partials, AccFetch>
          {},                                            //   acc
          {a.partials.mean, a.partials.m2, bias}},       //   column partials of acc (+ bias in the mean)
      {bias, ElementBias(0), {}},                        // bias row broadcast (null: adds 0)
      {}};                                               // plus

  out = typename Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {x, stride_a, w, stride_b},
      {fusion_args, nullptr, stride_c, a.y, stride_d},
      hw_info};
  using Raster = typename Gemm::GemmKernel::TileScheduler::RasterOrderOptions;
  out.scheduler.raster_order = sched.raster_order == 1   ? Raster::AlongM
                               : sched.raster_order == 2 ? Raster::AlongN
                                                         : Raster::Heuristic;
  out.scheduler.max_swizzle_size = sched.max_swizzle;
  if constexpr (KC::kSplitK) {
    using Scheduler = typename Gemm::GemmKernel::TileScheduler;
    out.scheduler.reduction_mode = Scheduler::ReductionMode::Deterministic;  // same bits run to run
    out.scheduler.decomposition_mode = Scheduler::DecompositionMode::SplitK;
    out.scheduler.splits = a.k_splits > 0 ? a.k_splits : split_k_count(a.M, a.N, a.K, int(sizeof(typename KC::ElementA)), hw_info.sm_count);
  }
  return Status::Ok();
}

// The workspace depends on the problem shape only: the caller may ask before it has buffers, so
// a workspace query stands in aligned non-null pointers and dense strides where none are given yet.
inline GemmStatsArgs with_stand_ins(GemmStatsArgs a) {
  void* const stand_in = reinterpret_cast<void*>(std::uintptr_t{256});
  if (a.x == nullptr) a.x = stand_in;
  if (a.w == nullptr) a.w = stand_in;
  if (a.y == nullptr) a.y = static_cast<float*>(stand_in);
  if (a.ldx == 0) a.ldx = a.K;
  if (a.ldw == 0) a.ldw = a.K;
  if (a.ldy == 0) a.ldy = a.N;
  return a;
}

template <class KC>
std::size_t kernel_workspace_bytes(const GemmStatsArgs& given, const SchedulerOptions& sched = {}) {
  using Gemm = typename KC::Gemm;
  typename Gemm::Arguments args;
  if (!make_arguments<KC>(with_stand_ins(given), sched, args).ok()) return 0;
  return Gemm::get_workspace_size(args);
}

// Launches a CUTLASS sm90 GEMM (GemmUniversalAdapter `Gemm`) from its arguments: can_implement, the
// workspace, then what Gemm::initialize() and run() do, minus two driver calls they make on every
// call (a few microseconds each on the op's host path): the kernel's shared-memory size is set once
// per device, and the cluster launch does not set the non-portable-cluster-size attribute (our
// clusters are two CTAs, a portable size).
template <class Gemm>
Status launch_gemm(const typename Gemm::Arguments& args, void* workspace, cudaStream_t stream) {
  if (Gemm::can_implement(args) != cutlass::Status::kSuccess)
    return {StatusCode::kNotSupported, "sm90 GEMM: CUTLASS can_implement rejected the problem"};
  if (Gemm::get_workspace_size(args) > 0 && workspace == nullptr)
    return {StatusCode::kInvalidArgument, "sm90 GEMM: workspace required (its workspace_bytes function)"};
  using GemmKernel = typename Gemm::GemmKernel;
  if (GemmKernel::initialize_workspace(args, workspace, stream, nullptr) != cutlass::Status::kSuccess)
    return {StatusCode::kCudaError, "sm90 GEMM: CUTLASS workspace initialisation failed"};
  constexpr int kSmemBytes = GemmKernel::SharedStorageSize;
  const int smem_set = cuda::util::detail::cached_per_device(args.hw_info.device_id, [](int) {
    if (kSmemBytes >= (48 << 10) && cudaFuncSetAttribute(cutlass::device_kernel<GemmKernel>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                         kSmemBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return 1;
  });
  if (smem_set <= 0) return {StatusCode::kCudaError, "sm90 GEMM: cudaFuncSetAttribute(shared memory) failed"};
  typename Gemm::Params params = GemmKernel::to_underlying_arguments(args, workspace);

  using ClusterShape = typename GemmKernel::DispatchPolicy::ClusterShape;
  static_assert(cute::is_static_v<ClusterShape> && cute::size(ClusterShape{}) <= 8,
                "a portable (<= 8 CTAs) static cluster: launched without the non-portable attribute");
  cudaLaunchAttribute attributes[2];
  unsigned num_attributes = 0;
  if constexpr (cute::size(ClusterShape{}) > 1) {
    attributes[num_attributes].id = cudaLaunchAttributeClusterDimension;
    attributes[num_attributes].val.clusterDim = {unsigned(cute::size<0>(ClusterShape{})),
                                                 unsigned(cute::size<1>(ClusterShape{})),
                                                 unsigned(cute::size<2>(ClusterShape{}))};
    ++num_attributes;
  }
  // A programmatic dependent launch (the kernels are built with CUTLASS_ENABLE_GDC_FOR_SM90: their
  // loads wait for the previous kernel, and their last tiles let the next kernel launch early).
  if (cuda::util::current_device_has_pdl()) {
    attributes[num_attributes].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[num_attributes].val.programmaticStreamSerializationAllowed = 1;
    ++num_attributes;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = Gemm::get_grid_shape(params);
  config.blockDim = GemmKernel::get_block_shape();
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = num_attributes;
  void* kernel_params[] = {&params};
  return cuda::util::cuda_status(
      cudaLaunchKernelExC(&config, reinterpret_cast<const void*>(cutlass::device_kernel<GemmKernel>), kernel_params),
      "sm90 GEMM: kernel launch failed");
}

template <class KC>
Status run_kernel(const GemmStatsArgs& a, void* workspace, cudaStream_t stream, const SchedulerOptions& sched = {}) {
  typename KC::Gemm::Arguments args;
  Status st = make_arguments<KC>(a, sched, args);
  if (!st.ok()) return st;
  return launch_gemm<typename KC::Gemm>(args, workspace, stream);
}

template <class ElementIn, class Config>
std::size_t workspace_bytes(const GemmStatsArgs& a, const SchedulerOptions& sched = {}) {
  return kernel_workspace_bytes<GemmStatsKernel<ElementIn, Config>>(a, sched);
}

template <class ElementIn, class Config>
Status run(const GemmStatsArgs& a, void* workspace, cudaStream_t stream, const SchedulerOptions& sched = {}) {
  return run_kernel<GemmStatsKernel<ElementIn, Config>>(a, workspace, stream, sched);
}

}  // namespace fused::sm90::detail
