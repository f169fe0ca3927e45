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

#include "kernels/epilogue/sm90_partials_common.hpp"

namespace fused::epilogue {

template <
  class CtaTileShapeMNK_,      // (CTA_M,CTA_N,CTA_K), static; fixes the partials format
  class ElementBias_           // element type of the bias folded into the reported mean (may be null)
>
struct Sm90RowPartials : detail::PartialsNodeBase<ElementBias_> {
  using Base = detail::PartialsNodeBase<ElementBias_>;
  using Base::Base;
  using typename Base::Params;
  using CtaTileShapeMNK = CtaTileShapeMNK_;
  static constexpr int CtaM = size<0>(CtaTileShapeMNK{});
  static constexpr int CtaN = size<1>(CtaTileShapeMNK{});
  static_assert(is_static_v<CtaTileShapeMNK>, "CTA tile must be static");

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
          // median of the first values of the three lanes holding the row's first columns; column 0
          // is valid in a CTA with columns.
          tCrK_mn(idx) = detail::median_of_three_lanes(valid ? v : __int_as_float(0x7fc00000), col0_lane,
                                                       col0_lane + int(lane_layout_MN(_0{}, _1{})),
                                                       col0_lane + int(lane_layout_MN(_0{}, _2{})));
        }
        if (valid) {
          detail::add_shifted(v, tCrK_mn(idx), tCrS1_mn(idx), tCrS2_mn(idx));
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
          float mean, m2;
          detail::mean_and_m2(tCrK(e), tCrS1(e), tCrS2(e), inv_n, mean, m2);
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
    auto [lane_layout_MN, lane_mn, warp_layout_MN, warp_mn] =
        detail::lane_and_warp_layouts<ReferenceSrc>(args.tiled_copy, args.thread_idx);
    static_assert(decltype(size<1>(warp_layout_MN))::value == 1,
                  "a row of the epilogue tile must lie in one warp (the reduction has no cross-warp step)");
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    // One register per row (stride 0 along N), and each element's visit ordinal in its row.
    auto [tCrK, tCrS1, tCrS2, tCoD] = detail::line_registers_and_ordinals<ReferenceSrc>(
        take<0,2>(args.tile_shape_mnk), make_stride(_1{}, _0{}), make_stride(_0{}, _1{}), args.epi_tile,
        args.tiled_copy, args.thread_idx);
    static_assert(is_static_v<decltype(args.tCcD.layout())>, "thread coordinates must be static");

    bool cta_has_cols = elem_less(args.cD(_0{},_0{}), args.residue_cD);
    // residue_cD and residue_tCcD are (M, N) less the tile's and the thread's first coordinates.
    int thread_row0 = int(get<0>(args.residue_cD) - get<0>(args.residue_tCcD));

    return ConsumerStoreCallbacks<decltype(tCrK), decltype(args.tCcD), decltype(tCoD),
                                  decltype(args.residue_tCcD), decltype(lane_layout_MN)>(
      cute::move(tCrK), cute::move(tCrS1), cute::move(tCrS2), args.tCcD, tCoD, args.residue_tCcD,
      lane_layout_MN, int(get<1>(lane_mn)), int(lane_layout_MN(get<0>(lane_mn), _0{})), thread_row0, cta_has_cols,
      int(m), int(n), int(M), this->params);
  }
};

}  // namespace fused::epilogue
