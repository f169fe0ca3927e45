// What the two statistics nodes share (Sm90ColumnPartials: per-tile column partials, reduced over the
// tile's rows; Sm90RowPartials: per-tile row partials, reduced over its columns): their arguments and
// host side, the lane and warp layouts over the epilogue tile, the per-thread registers of a reduced
// line, and the shifted sums with their median-of-three shift.
#pragma once

#include "cutlass/cutlass.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cute/tensor.hpp"

namespace fused::epilogue {

using namespace cute;
using cutlass::epilogue::fusion::ConsumerStoreArgs;
using cutlass::epilogue::fusion::EmptyConsumerStoreCallbacks;
using cutlass::epilogue::fusion::EmptyProducerLoadCallbacks;
using cutlass::epilogue::fusion::ProducerLoadArgs;
using cutlass::Array;
using cutlass::NumThreadsPerWarp;
using cutlass::canonical_lane_idx;

namespace detail {

// The host side and the arguments of a partials node: where the partials go (both null: the node is
// a pure pass-through, eval mode) and the bias folded into the reported mean (may be null).
template <class ElementBias_>
struct PartialsNodeBase {
  using ElementBias = ElementBias_;
  struct SharedStorage { };
  struct Arguments {
    float* ptr_mean = nullptr;
    float* ptr_m2 = nullptr;
    ElementBias const* ptr_bias = nullptr;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) { return args; }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return (args.ptr_mean == nullptr) == (args.ptr_m2 == nullptr);
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) { return 0; }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE PartialsNodeBase() { }
  CUTLASS_HOST_DEVICE PartialsNodeBase(Params const& params, SharedStorage const&) : params(params) { }
  Params params;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }
  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(ProducerLoadArgs<Args...> const&) {
    return EmptyProducerLoadCallbacks{};
  }
};

// Lane and warp layouts over the epilogue tile, exactly as CUTLASS's Sm90RowReduction derives them:
// (lane_layout_MN: lane_mn -> lane_idx, this lane's (m, n), warp_layout_MN: warp_mn -> warp_idx,
// this warp's (m, n)).
template <bool ReferenceSrc, class TiledCopy>
CUTLASS_DEVICE auto lane_and_warp_layouts(TiledCopy const& tiled_copy, int thread_idx) {
  Layout ref_layout_MN = [&] () {
    auto mn_shape = shape(typename TiledCopy::Tiler_MN{});
    if constexpr (ReferenceSrc) { return right_inverse(tiled_copy.get_layoutS_TV()).with_shape(mn_shape); }
    else                        { return right_inverse(tiled_copy.get_layoutD_TV()).with_shape(mn_shape); }
  }();                                                                                        // tile_mn -> tv_idx
  using _W = Int<TiledCopy::TiledNumThr::value / NumThreadsPerWarp>;
  Layout tv2lane = Layout<Shape<Int<NumThreadsPerWarp>,_W,_1>,Stride<_1,_0,_0>>{};           //   tv_idx -> lane_idx
  Layout ref2lane = composition(tv2lane, ref_layout_MN);                                     //  tile_mn -> lane_idx
  Layout lane_layout_MN = make_layout(filter(get<0>(ref2lane)), filter(get<1>(ref2lane)));   //  lane_mn -> lane_idx
  Layout inv_lane_layout_MN = right_inverse(lane_layout_MN);                                 // lane_idx -> lane_mn
  auto lane_mn = idx2crd(inv_lane_layout_MN(canonical_lane_idx()), shape(lane_layout_MN));
  Layout tv2warp = Layout<Shape<Int<NumThreadsPerWarp>,_W,_1>,Stride<_0,_1,_0>>{};           //   tv_idx -> warp_idx
  Layout ref2warp = composition(tv2warp, ref_layout_MN);                                     //  tile_mn -> warp_idx
  Layout warp_layout_MN = make_layout(filter(get<0>(ref2warp)), filter(get<1>(ref2warp)));   //  warp_mn -> warp_idx
  Layout inv_warp_layout_MN = right_inverse(warp_layout_MN);                                 // warp_idx -> warp_mn
  auto warp_mn = idx2crd(inv_warp_layout_MN(thread_idx / NumThreadsPerWarp), shape(warp_layout_MN));
  return cute::make_tuple(lane_layout_MN, lane_mn, warp_layout_MN, warp_mn);
}

// A thread's partition, (CPY,CPY_M,CPY_N,EPI_M,EPI_N), of a CTA tile broadcast with `stride` ((0, 1):
// one value per column; (1, 0): one per row).
template <bool ReferenceSrc, class CtaMN, class Stride, class EpiTile, class TiledCopy>
CUTLASS_DEVICE auto partition_broadcast(CtaMN cta_mn, Stride stride, EpiTile epi_tile, TiledCopy tiled_copy, int thread_idx) {
  Tensor ref = make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)), make_layout(cta_mn, stride));
  return cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(ref, epi_tile, tiled_copy, thread_idx);
}

// The per-thread registers of the reduced lines (zeroed; stride 0 along the reduced mode, so every
// element of a line reaches the line's register) and each element's visit ordinal within its line,
// numbered compactly in mode order over the reduced mode: the collective visits the modes in order,
// so ordinal 0 is the first element of each line that the thread visits. line_stride keeps the line
// mode ((0, 1) for columns, (1, 0) for rows); along_stride is the other one.
template <bool ReferenceSrc, class CtaMN, class LineStride, class AlongStride, class EpiTile, class TiledCopy>
CUTLASS_DEVICE auto line_registers_and_ordinals(CtaMN cta_mn, LineStride line_stride, AlongStride along_stride,
                                                EpiTile epi_tile, TiledCopy tiled_copy, int thread_idx) {
  Tensor tCgLine = partition_broadcast<ReferenceSrc>(cta_mn, line_stride, epi_tile, tiled_copy, thread_idx);
  Tensor tCrK = make_tensor_like<float>(tCgLine);
  Tensor tCrS1 = make_tensor_like<float>(tCgLine);
  Tensor tCrS2 = make_tensor_like<float>(tCgLine);
  fill(tCrK, 0.0f);
  fill(tCrS1, 0.0f);
  fill(tCrS2, 0.0f);
  Tensor tCgAlong = partition_broadcast<ReferenceSrc>(cta_mn, along_stride, epi_tile, tiled_copy, thread_idx);
  auto ord_layout = make_layout(tCgAlong.shape(), compact_col_major(filter_zeros(tCgAlong.stride(), tCgAlong.shape())));
  static_assert(is_static_v<decltype(ord_layout)>, "ordinal layout must be static");
  return cute::make_tuple(tCrK, tCrS1, tCrS2, make_coord_tensor(ord_layout));
}

// A line's shift, the same in every lane that holds part of it: the median of the values three lanes
// offer (a value past the problem offers NaN, which fminf / fmaxf pass over). Convergent shuffles.
CUTLASS_DEVICE float median_of_three_lanes(float offer, int lane0, int lane1, int lane2) {
  float r0 = __shfl_sync(0xFFFFFFFF, offer, lane0);
  float r1 = __shfl_sync(0xFFFFFFFF, offer, lane1);
  float r2 = __shfl_sync(0xFFFFFFFF, offer, lane2);
  return fmaxf(fminf(r0, r1), fminf(fmaxf(r0, r1), r2));
}

// One value into a line's shifted sums: S1 += v - K, S2 += (v - K)^2.
CUTLASS_DEVICE void add_shifted(float v, float shift, float& s1, float& s2) {
  float d = v - shift;
  s1 += d;
  s2 = fmaf(d, d, s2);
}

// A line's (mean, M2) from its shifted sums over n values: M2 = S2 - S1^2 / n (>= 0, NaN kept), mean = K + S1 / n.
CUTLASS_DEVICE void mean_and_m2(float shift, float s1, float s2, float inv_n, float& mean, float& m2) {
  m2 = s2 - s1 * s1 * inv_n;
  m2 = m2 < 0.0f ? 0.0f : m2;
  mean = shift + s1 * inv_n;
}

}  // namespace detail
}  // namespace fused::epilogue
