// Sm90RowPartials: an sm90 epilogue visitor tree (EVT) node that writes per-CTA-tile *row* statistics
// (mean, M2) of its input: the column statistics of y for a kernel that computes y^T = W x^T (the
// presplit 3xTF32 forward, whose tile rows are y's columns and whose tile columns are y's rows). It
// writes the same partials format as Sm90ColumnPartials does for y = x W^T:
//
//   partials layout, one slot per (tile column block, tile row):  mean[n_tile * ld + m],  m2[n_tile * ld + m]
//     n_tile in [0, ceil(N / CTA_N)) (y's row tiles),  m in [0, ld) (y's columns),  ld = round_up(M, CTA_M)
//     mean = mean of the node input over the valid columns (columns < N) of the tile's row, plus bias[m]
//     m2   = sum over those columns of (input - mean)^2
//   Rows in [M, ld) are written with the statistics of the zero-filled OOB accumulators.
//
// Numerics: Sm90ColumnPartials's, with rows and columns swapped. Each row's shift is the median of the
// tile's first three columns in that row (three lanes' first values), so the lanes holding a row share
// it and their shifted sums S1 = sum(v - K), S2 = sum((v - K)^2) add; M2 = S2 - S1^2 / n, mean = K + S1 / n.
// The sums run in a fixed order: bitwise deterministic. Invalid columns (column >= N) are skipped.
//
// The reduction stays inside a warp: with the sm90 accumulator layout every row of a warpgroup's
// 64-row slice lies in one warp (a quad of lanes holds it), so the lanes that share a row add their
// sums with shuffles and no shared memory or barrier is needed (asserted below).
//
// Placement, as Sm90ColumnPartials: reduce the accumulator before the bias is added (folded into the
// reported mean at the end):
//   Sm90EVT<Sm90Compute<plus>, Sm90EVT<Sm90RowPartials<...>, Sm90AccFetch>, Sm90ColBroadcast<bias>>
#pragma once

#include "cutlass/cutlass.h"
#include "cutlass/numeric_conversion.h"
#include "cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp"
#include "cute/tensor.hpp"

#include "kernels/epilogue/sm90_column_partials.hpp"

namespace fused::epilogue {

template <
  class CtaTileShapeMNK_,      // (CTA_M,CTA_N,CTA_K), static; fixes the partials format
  class ElementBias_           // element type of the bias folded into the reported mean (may be null)
>
struct Sm90RowPartials {
  using CtaTileShapeMNK = CtaTileShapeMNK_;
  using ElementBias = ElementBias_;
  static constexpr int CtaM = size<0>(CtaTileShapeMNK{});
  static constexpr int CtaN = size<1>(CtaTileShapeMNK{});
  static_assert(is_static_v<CtaTileShapeMNK>, "CTA tile must be static");

  struct SharedStorage { };

  struct Arguments {
    float* ptr_mean = nullptr;               // (ceil(N/CTA_N), round_up(M,CTA_M)) m-major, or null
    float* ptr_m2 = nullptr;                 // same layout as ptr_mean
    ElementBias const* ptr_bias = nullptr;   // (M) added to the reported mean, or null
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

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  CUTLASS_HOST_DEVICE Sm90RowPartials() { }
  CUTLASS_HOST_DEVICE Sm90RowPartials(Params const& params, SharedStorage const&) : params(params) { }

  Params params;

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(ProducerLoadArgs<Args...> const&) {
    return EmptyProducerLoadCallbacks{};
  }

  template <
    class RTensor,          // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) fp32 registers, stride 0 over the N modes
    class CTensor,          // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) static coordinates relative to the thread
    class OrdTensor,        // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) -> visit ordinal of the element in its row
    class ThrResidue,       // (m,n) residue relative to the thread's first element
    class LaneLayoutMN      // lane_mn -> lane_idx
  >
  struct ConsumerStoreCallbacks : EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(RTensor&& tCrK_, RTensor&& tCrS1_, RTensor&& tCrS2_, CTensor tCcD_, OrdTensor tCoD_,
                           ThrResidue residue_tCcD_, LaneLayoutMN lane_layout_MN_, int lane_n_, int col0_lane_,
                           int thread_row0_, bool cta_has_cols_, int m_tile_, int n_tile_, int M_, Params const& params_)
      : tCrK(cute::forward<RTensor>(tCrK_)), tCrS1(cute::forward<RTensor>(tCrS1_)),
        tCrS2(cute::forward<RTensor>(tCrS2_)), tCcD(tCcD_), tCoD(tCoD_), residue_tCcD(residue_tCcD_),
        lane_layout_MN(lane_layout_MN_), lane_n(lane_n_), col0_lane(col0_lane_), thread_row0(thread_row0_),
        cta_has_cols(cta_has_cols_), m_tile(m_tile_), n_tile(n_tile_), M(M_), params(params_) { }

    RTensor tCrK;                     // shift K per row                (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    RTensor tCrS1;                    // sum (v - K)                    (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    RTensor tCrS2;                    // sum (v - K)^2                  (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    CTensor tCcD;                     // relative coordinates           (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    OrdTensor tCoD;                   // visit ordinal within row       (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    ThrResidue residue_tCcD;          // (m,n)
    LaneLayoutMN lane_layout_MN;
    int lane_n;
    int col0_lane;                    // the lane holding the tile's first column of this thread's rows
    int thread_row0;                  // the tile row of this thread's first element (tCcD is relative to it)
    bool cta_has_cols;                // false: CTA wholly past N (or M)
    int m_tile, n_tile, M;
    Params const& params;

    CUTLASS_DEVICE bool enabled() const { return params.ptr_mean != nullptr; }

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE Array<ElementInput, FragmentSize>
    visit(Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
          Array<ElementInput, FragmentSize> const& frg_input) {
      if (not enabled()) {
        return frg_input;
      }
      Tensor tCrK_mn = tCrK(_,_,_,epi_m,epi_n);
      Tensor tCrS1_mn = tCrS1(_,_,_,epi_m,epi_n);
      Tensor tCrS2_mn = tCrS2(_,_,_,epi_m,epi_n);
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);
      Tensor tCoD_mn = tCoD(_,_,_,epi_m,epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        int idx = epi_v * FragmentSize + i;
        float v = static_cast<float>(frg_input[i]);
        bool valid = get<1>(tCcD_mn(idx)) < get<1>(residue_tCcD);                // column < N
        if (tCoD_mn(idx) == 0) {
          // First visit of the row (the same element index in every lane: convergent shuffles): the
          // median of the first values of the three lanes holding the row's first columns. A column
          // past N offers NaN, which fminf / fmaxf pass over; column 0 is valid in a CTA with columns.
          float offer = valid ? v : __int_as_float(0x7fc00000);
          float r0 = __shfl_sync(0xFFFFFFFF, offer, col0_lane);
          float r1 = __shfl_sync(0xFFFFFFFF, offer, col0_lane + int(lane_layout_MN(_0{}, _1{})));
          float r2 = __shfl_sync(0xFFFFFFFF, offer, col0_lane + int(lane_layout_MN(_0{}, _2{})));
          tCrK_mn(idx) = fmaxf(fminf(r0, r1), fminf(fmaxf(r0, r1), r2));
        }
        if (valid) {
          float d = v - tCrK_mn(idx);
          tCrS1_mn(idx) += d;
          tCrS2_mn(idx) = fmaf(d, d, tCrS2_mn(idx));
        }
      }
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&&, SyncFn const&, int, int, bool is_last_iteration, VTensor) {
      if (not is_last_iteration || not enabled() || not cta_has_cols) {
        return;
      }
      // This thread's count of valid columns: its elements in its first row (relative row 0).
      constexpr int Elements = decltype(size(tCcD))::value;
      int n_thr = 0;
      for_each(make_int_sequence<Elements>{}, [&](auto e) {
        auto crd = tCcD(e);
        if (get<0>(crd) == 0 && get<1>(crd) < get<1>(residue_tCcD)) { ++n_thr; }
      });
      constexpr int LanesN = decltype(size<1>(lane_layout_MN))::value;
      constexpr int Stages = cute::log_2(static_cast<unsigned>(LanesN));
      static_assert((1 << Stages) == LanesN && LanesN >= 4, "lanes in N: a power of two, at least 4 (the shift's three columns)");
      // The lanes that share a row share its shift, so their sums add: a butterfly, after which every
      // lane holds the row's sums (the same bits in each: an fp32 add commutes). A row's registers are
      // reached through its first element (visit ordinal 0), whose index is a compile-time constant.
      for_each(make_int_sequence<Stages>{}, [&](auto s) {
        int lane_xor = lane_layout_MN(_0{}, Int<(LanesN >> (decltype(s)::value + 1))>{});
        n_thr += __shfl_xor_sync(0xFFFFFFFF, n_thr, lane_xor);
        for_each(make_int_sequence<Elements>{}, [&](auto e) {
          if (tCoD(e) == 0) {
            tCrS1(e) += __shfl_xor_sync(0xFFFFFFFF, tCrS1(e), lane_xor);
            tCrS2(e) += __shfl_xor_sync(0xFFFFFFFF, tCrS2(e), lane_xor);
          }
        });
      });
      if (lane_n != 0) {
        return;
      }
      // The quad's first lane stores its rows' partials (plain stores, one slot each).
      const int64_t ld = int64_t((M + CtaM - 1) / CtaM) * CtaM;
      const float inv_n = 1.0f / float(n_thr);
      for_each(make_int_sequence<Elements>{}, [&](auto e) {
        if (tCoD(e) == 0) {
          float m2 = tCrS2(e) - tCrS1(e) * tCrS1(e) * inv_n;
          m2 = m2 < 0.0f ? 0.0f : m2;                                            // keeps NaN
          float mean = tCrK(e) + tCrS1(e) * inv_n;
          int grow = m_tile * CtaM + thread_row0 + int(get<0>(tCcD(e)));
          if (params.ptr_bias != nullptr && grow < M) {
            mean += static_cast<float>(params.ptr_bias[grow]);
          }
          if (grow < ld) {
            int64_t offset = int64_t(n_tile) * ld + grow;
            params.ptr_mean[offset] = mean;
            params.ptr_m2[offset] = m2;
          }
        }
      });
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(ConsumerStoreArgs<Args...> const& args) {
    // Lane and warp layouts over the epilogue tile, as Sm90ColumnPartials (and CUTLASS's reductions) derive them.
    Layout ref_layout_MN = [&] () {
      auto mn_shape = shape(typename decltype(args.tiled_copy)::Tiler_MN{});
      if constexpr (ReferenceSrc) { return right_inverse(args.tiled_copy.get_layoutS_TV()).with_shape(mn_shape); }
      else                        { return right_inverse(args.tiled_copy.get_layoutD_TV()).with_shape(mn_shape); }
    }();                                                                                        // tile_mn -> tv_idx
    using _W = Int<decltype(args.tiled_copy)::TiledNumThr::value / NumThreadsPerWarp>;
    Layout tv2lane = Layout<Shape<Int<NumThreadsPerWarp>,_W,_1>,Stride<_1,_0,_0>>{};           //   tv_idx -> lane_idx
    Layout ref2lane = composition(tv2lane, ref_layout_MN);                                     //  tile_mn -> lane_idx
    Layout lane_layout_MN = make_layout(filter(get<0>(ref2lane)), filter(get<1>(ref2lane)));   //  lane_mn -> lane_idx
    Layout inv_lane_layout_MN = right_inverse(lane_layout_MN);                                 // lane_idx -> lane_mn
    auto lane_mn = idx2crd(inv_lane_layout_MN(canonical_lane_idx()), shape(lane_layout_MN));

    Layout tv2warp = Layout<Shape<Int<NumThreadsPerWarp>,_W,_1>,Stride<_0,_1,_0>>{};           //   tv_idx -> warp_idx
    Layout ref2warp = composition(tv2warp, ref_layout_MN);                                     //  tile_mn -> warp_idx
    Layout warp_layout_MN = make_layout(filter(get<0>(ref2warp)), filter(get<1>(ref2warp)));   //  warp_mn -> warp_idx
    static_assert(decltype(size<1>(warp_layout_MN))::value == 1,
                  "a row of the epilogue tile must lie in one warp (the reduction has no cross-warp step)");

    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    auto cta_mn = take<0,2>(args.tile_shape_mnk);

    // Column-broadcast reference (stride 0 along N): its register image holds one value per row.
    Tensor gColRef = make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)),
                                 make_layout(cta_mn, make_stride(_1{}, _0{})));                 // (CTA_M,CTA_N)
    Tensor tCgCol = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
                      gColRef, args.epi_tile, args.tiled_copy, args.thread_idx);             // (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    Tensor tCrK = make_tensor_like<float>(tCgCol);
    Tensor tCrS1 = make_tensor_like<float>(tCgCol);
    Tensor tCrS2 = make_tensor_like<float>(tCgCol);
    fill(tCrK, 0.0f);
    fill(tCrS1, 0.0f);
    fill(tCrS2, 0.0f);

    // Row-broadcast reference (stride 0 along M), numbered compactly in mode order: ordinal 0 is the
    // first element of each row that the thread visits (the collective visits the modes in order).
    Tensor gRowRef = make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)),
                                 make_layout(cta_mn, make_stride(_0{}, _1{})));                 // (CTA_M,CTA_N)
    Tensor tCgRow = cutlass::epilogue::fusion::sm90_partition_for_epilogue<ReferenceSrc>(
                      gRowRef, args.epi_tile, args.tiled_copy, args.thread_idx);             // (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    auto ord_layout = make_layout(tCgRow.shape(),
                                  compact_col_major(filter_zeros(tCgRow.stride(), tCgRow.shape())));
    Tensor tCoD = make_coord_tensor(ord_layout);                                              // (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    static_assert(is_static_v<decltype(ord_layout)>, "ordinal layout must be static");
    static_assert(is_static_v<decltype(args.tCcD.layout())>, "thread coordinates must be static");

    bool cta_has_cols = elem_less(args.cD(_0{},_0{}), args.residue_cD);
    // residue_cD and residue_tCcD are (M, N) less the tile's and the thread's first coordinates.
    int thread_row0 = int(get<0>(args.residue_cD) - get<0>(args.residue_tCcD));

    return ConsumerStoreCallbacks<decltype(tCrK), decltype(args.tCcD), decltype(tCoD),
                                  decltype(args.residue_tCcD), decltype(lane_layout_MN)>(
      cute::move(tCrK), cute::move(tCrS1), cute::move(tCrS2), args.tCcD, tCoD, args.residue_tCcD,
      lane_layout_MN, int(get<1>(lane_mn)), int(lane_layout_MN(get<0>(lane_mn), _0{})), thread_row0, cta_has_cols,
      int(m), int(n), int(M), params);
  }
};

}  // namespace fused::epilogue
