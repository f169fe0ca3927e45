// Sm90ColumnPartials: an sm90 epilogue visitor tree (EVT) node that writes per-CTA-tile column
// statistics (mean, M2) of its input, modelled on cutlass::epilogue::fusion::Sm90RowReduction with
// FinalReduction = false (one slot per (CTA row tile, column), plain stores, no atomics, no workspace).
//
//   partials layout, n-major:   mean[m_tile * ld + n],  m2[m_tile * ld + n]
//     m_tile in [0, ceil(M / CTA_M)),  ld = round_up(N, CTA_N)
//     mean = mean of the node input over the valid rows (rows < M) of the CTA row tile, plus bias[n]
//     m2   = sum over those rows of (input - mean)^2
//   The count of a slot is min(CTA_M, M - m_tile * CTA_M): it follows from the geometry.
//   Columns in [N, ld) are written with the statistics of the zero-filled OOB accumulators.
//   A CTA that lies wholly past M (possible inside a partially OOB cluster) writes nothing.
//
// Numerics. Raw sums of y and y^2 lose the variance when |mean| / std is large. Instead, shifted sums:
//   1. per warp and column, a shift K = the median of the warp's first three rows in that column
//      (three shuffles at the first visit); per thread S1 = sum(v - K), S2 = sum((v - K)^2) over its
//      valid rows (v - K is exact when |mean| >> std: Sterbenz);
//   2. the lanes of a warp share the shift, so their sums add: a swap-shuffle butterfly of S1 and S2;
//   3. across the warps (smem), one thread per column moves each warp's sums to a common shift C, warp
//      0's mean, and adds them:  d = K_w - C,  S1 += S1_w + n_w d,  S2 += S2_w + d (2 S1_w + n_w d);
//      then M2 = S2 - S1^2 / n and mean = C + S1 / n.
//   S2 - S1^2 / n cancels n (mean - shift)^2, so the shifts set the rounding error, worst where a row
//   that holds most of a column's variance is a shift: the median keeps one such row out of it.
//   bench/partials_rounding.py emulates the tile's order in float32 (relative error of M2, worst of
//   1000 columns): U(-1,1) data 2.0e-7 (the per-thread shifts with Chan merges this replaced: 2.0e-7);
//   an outlier of 1000 spreads in row 0 3.9e-7 (9.5e-7; 8.5e-6 with the first row as the shift, 8.7e-5
//   with one shift for the tile); two outliers of one sign in rows 0 and 1 4.1e-6 (7.8e-7).
//   The sums run in a fixed order: bitwise deterministic. Invalid rows (row >= M, zero-filled by TMA)
//   are skipped. Why not Chan merges: 28 merges per thread and 7 per column a tile, where at K = 64 the
//   epilogue is most of the kernel (H200, GEMM + statistics with the first row as the shift:
//   4096x8192x64 bf16 0.056 against 0.072 ms; 1024x8192x8192 0.179 against 0.183 ms).
//
// Intended placement: reduce the accumulator *before* the bias is added (the bias is folded into
// the reported mean at the end; M2 does not change):
//   Sm90EVT<Sm90Compute<plus>, Sm90EVT<Sm90ColumnPartials<...>, Sm90AccFetch>, Sm90RowBroadcast<bias>>
//
// Registers. Every per-thread array (K, S1, S2 per column) is indexed with compile-time constants only
// (cute::for_each over make_int_sequence, or tensor slices inside the collective's unrolled loops):
// the stock Sm90RowReduction's `m /= 2` loops are not unrolled by nvcc 13 and spill to local memory.
#pragma once

#include "kernels/epilogue/sm90_partials_common.hpp"

namespace fused::epilogue {

template <
  class CtaTileShapeMNK_,      // (CTA_M,CTA_N,CTA_K), static; fixes the partials format
  class ElementBias_           // element type of the bias folded into the reported mean (may be null)
>
struct Sm90ColumnPartials : detail::PartialsNodeBase<ElementBias_> {
  using Base = detail::PartialsNodeBase<ElementBias_>;
  using Base::Base;
  using typename Base::Params;
  using CtaTileShapeMNK = CtaTileShapeMNK_;
  static constexpr int CtaM = size<0>(CtaTileShapeMNK{});
  static constexpr int CtaN = size<1>(CtaTileShapeMNK{});
  static_assert(is_static_v<CtaTileShapeMNK>, "CTA tile must be static");

  template <
    class RTensor,          // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) fp32 registers, stride 0 over the M modes
    class CTensor,          // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) static coordinates relative to the thread
    class OrdTensor,        // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) -> visit ordinal of the element in its column
    class ThrResidue,       // (m,n) residue relative to the thread's first element
    class LaneLayoutMN,     // lane_mn -> lane_idx
    class WarpLayoutMN,     // warp_mn -> warp_idx
    class EpiTile,          // (EPI_TILE_M,EPI_TILE_N)
    class TiledCopy         // reference tiled copy of the collective
  >
  struct ConsumerStoreCallbacks : EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE
    ConsumerStoreCallbacks(RTensor&& tCrK_, RTensor&& tCrS1_, RTensor&& tCrS2_, CTensor tCcD_, OrdTensor tCoD_,
                           ThrResidue residue_tCcD_, LaneLayoutMN lane_layout_MN_, int lane_m_, int row0_lane_,
                           WarpLayoutMN warp_layout_MN_, int warp_m_, bool cta_has_rows_,
                           int m_tile_, int n_tile_, int N_, EpiTile epi_tile_,
                           TiledCopy tiled_copy_, int thread_idx_, Params const& params_)
      : tCrK(cute::forward<RTensor>(tCrK_)), tCrS1(cute::forward<RTensor>(tCrS1_)),
        tCrS2(cute::forward<RTensor>(tCrS2_)), tCcD(tCcD_), tCoD(tCoD_), residue_tCcD(residue_tCcD_),
        lane_layout_MN(lane_layout_MN_), lane_m(lane_m_), row0_lane(row0_lane_), warp_layout_MN(warp_layout_MN_), warp_m(warp_m_),
        cta_has_rows(cta_has_rows_), m_tile(m_tile_), n_tile(n_tile_), N(N_),
        epi_tile(epi_tile_), tiled_copy(tiled_copy_), thread_idx(thread_idx_), params(params_) { }

    RTensor tCrK;                     // shift K per column             (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    RTensor tCrS1;                    // sum (v - K)                    (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    RTensor tCrS2;                    // sum (v - K)^2, later M2        (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    CTensor tCcD;                     // relative coordinates           (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    OrdTensor tCoD;                   // visit ordinal within column    (CPY,CPY_M,CPY_N,EPI_M,EPI_N)
    ThrResidue residue_tCcD;          // (m,n)
    LaneLayoutMN lane_layout_MN;
    int lane_m;
    int row0_lane;                    // the lane holding the warp's first row of this thread's columns
    WarpLayoutMN warp_layout_MN;
    int warp_m;
    bool cta_has_rows;                // false: CTA wholly past M (or N) in a partially OOB cluster
    int m_tile, n_tile, N;
    EpiTile epi_tile;
    TiledCopy tiled_copy;
    int thread_idx;
    Params const& params;

    CUTLASS_DEVICE bool enabled() const { return params.ptr_mean != nullptr; }

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE Array<ElementInput, FragmentSize>
    visit(Array<ElementAccumulator, FragmentSize> const&, int epi_v, int epi_m, int epi_n,
          Array<ElementInput, FragmentSize> const& frg_input) {
      if (not enabled()) {
        return frg_input;
      }
      Tensor tCrK_mn = tCrK(_,_,_,epi_m,epi_n);                                 // (CPY,CPY_M,CPY_N)
      Tensor tCrS1_mn = tCrS1(_,_,_,epi_m,epi_n);                               // (CPY,CPY_M,CPY_N)
      Tensor tCrS2_mn = tCrS2(_,_,_,epi_m,epi_n);                               // (CPY,CPY_M,CPY_N)
      Tensor tCcD_mn = tCcD(_,_,_,epi_m,epi_n);                                 // (CPY,CPY_M,CPY_N)
      Tensor tCoD_mn = tCoD(_,_,_,epi_m,epi_n);                                 // (CPY,CPY_M,CPY_N)
      // Indices below are compile-time constants once the collective's loops are unrolled.
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) {
        int idx = epi_v * FragmentSize + i;
        float v = static_cast<float>(frg_input[i]);
        bool valid = get<0>(tCcD_mn(idx)) < get<0>(residue_tCcD);                // row < M
        if (tCoD_mn(idx) == 0) {
          // First visit (every lane's, here: the shuffles are convergent): the shift, the median of
          // the warp's first three rows in this column; row 0 is valid whenever the warp has a valid row.
          tCrK_mn(idx) = detail::median_of_three_lanes(valid ? v : __int_as_float(0x7fc00000), row0_lane,
                                                       row0_lane + int(lane_layout_MN(_1{}, _0{})),
                                                       row0_lane + int(lane_layout_MN(_2{}, _0{})));
        }
        if (valid) {
          detail::add_shifted(v, tCrK_mn(idx), tCrS1_mn(idx), tCrS2_mn(idx));
        }
      }
      return frg_input;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void
    reduce(STensor&& smem_buffer, SyncFn const& sync_fn, int, int, bool is_last_iteration, VTensor) {
      if (not is_last_iteration || not enabled() || not cta_has_rows) {
        return;   // all three are uniform over the CTA's consumer threads
      }

      // 1. This thread's count of valid rows: its elements in its first column (relative col 0).
      int n_thr = 0;
      for_each(make_int_sequence<decltype(size(tCcD))::value>{}, [&](auto e) {
        auto crd = tCcD(e);
        if (get<1>(crd) == 0 && get<0>(crd) < get<0>(residue_tCcD)) { ++n_thr; }
      });

      Tensor fK = filter(tCrK);                                                  // (COLS)
      Tensor fS1 = filter(tCrS1);                                                // (COLS)
      Tensor fS2 = filter(tCrS2);                                                // (COLS)
      constexpr int Cols = decltype(size(fK))::value;
      constexpr int LanesM = decltype(size<0>(lane_layout_MN))::value;
      static_assert(Cols % LanesM == 0, "columns per thread must split over the lanes in M");
      constexpr int Chunk = Cols / LanesM;
      constexpr int Stages = cute::log_2(static_cast<unsigned>(LanesM));
      static_assert((1 << Stages) == LanesM && LanesM >= 4, "lanes in M: a power of two, at least 4 (the shift's three rows)");

      // 2. Warp: the lanes share each column's shift, so their sums add. Swap-shuffle butterfly over
      //    the lanes that share columns: at the stage with lane-M distance m, the lane with
      //    (lane_m & m) == 0 keeps the lower half of its live chunks and sends the upper half; its
      //    partner does the opposite. After all stages lane lane_m holds chunk lane_m (Cols / LanesM
      //    consecutive entries) summed over the warp's rows. A shift stays put: the partner has it too.
      for_each(make_int_sequence<Stages>{}, [&](auto s) {
        constexpr int m = LanesM >> (decltype(s)::value + 1);
        constexpr int Half = m * Chunk;
        int lane_xor = lane_layout_MN(m, _0{});
        bool upper = (lane_m & m) != 0;
        n_thr += __shfl_xor_sync(0xFFFFFFFF, n_thr, lane_xor);
        for_each(make_int_sequence<Half>{}, [&](auto r) {
          constexpr int lo = decltype(r)::value;
          constexpr int hi = lo + Half;
          float keepK  = upper ? fK(Int<hi>{})  : fK(Int<lo>{});
          float keepS1 = upper ? fS1(Int<hi>{}) : fS1(Int<lo>{});
          float keepS2 = upper ? fS2(Int<hi>{}) : fS2(Int<lo>{});
          float sendS1 = upper ? fS1(Int<lo>{}) : fS1(Int<hi>{});
          float sendS2 = upper ? fS2(Int<lo>{}) : fS2(Int<hi>{});
          float recvS1 = __shfl_xor_sync(0xFFFFFFFF, sendS1, lane_xor);
          float recvS2 = __shfl_xor_sync(0xFFFFFFFF, sendS2, lane_xor);
          fK(Int<lo>{}) = keepK;
          fS1(Int<lo>{}) = keepS1 + recvS1;   // an fp32 add commutes: both lanes get the same bits
          fS2(Int<lo>{}) = keepS2 + recvS2;
        });
      });
      // A warp without valid rows took its shift from a zero-filled row (NaN where W's row holds inf
      // or NaN): 0 instead, so that step 4's d stays finite (the warp adds nothing there anyway).
      for_each(make_int_sequence<Chunk>{}, [&](auto j) {
        fK(j) = n_thr > 0 ? fK(j) : 0.0f;
      });

      // 3. CTA: dump each warp's partial to smem (the current D staging buffer, as Sm90RowReduction).
      constexpr int WarpsM = decltype(size<0>(warp_layout_MN))::value;
      constexpr int NumThreads = decltype(size(tiled_copy))::value;
      auto sBuf_layout = make_layout(make_shape(Int<CtaM>{}, Int<CtaN>{}, Int<WarpsM>{}),
                                     make_stride(_0{}, _1{}, Int<CtaN>{}));                  // (CTA_M,CTA_N,WARPS_M)
      constexpr int BufElems = CtaN * WarpsM;
      static_assert((3 * BufElems + WarpsM) * sizeof(float) <=
                    decltype(cosize(smem_buffer.layout()))::value * sizeof(typename remove_cvref_t<STensor>::value_type),
                    "smem reduction buffer not large enough, use a larger epilogue tile");
      float* smem = reinterpret_cast<float*>(raw_pointer_cast(smem_buffer.data()));
      Tensor sK  = make_tensor(make_smem_ptr(smem), sBuf_layout);
      Tensor sS1 = make_tensor(make_smem_ptr(smem + BufElems), sBuf_layout);
      Tensor sS2 = make_tensor(make_smem_ptr(smem + 2 * BufElems), sBuf_layout);
      int* sCount = reinterpret_cast<int*>(smem + 3 * BufElems);                             // (WARPS_M)

      sync_fn();   // the staging buffer may still be read by other threads

      {
        constexpr bool RefSrc = true;
        Tensor tCsK  = filter(cutlass::epilogue::fusion::sm90_partition_for_epilogue<RefSrc>(
                         sK(_,_,warp_m), epi_tile, tiled_copy, thread_idx));                  // (COLS)
        Tensor tCsS1 = filter(cutlass::epilogue::fusion::sm90_partition_for_epilogue<RefSrc>(
                         sS1(_,_,warp_m), epi_tile, tiled_copy, thread_idx));                 // (COLS)
        Tensor tCsS2 = filter(cutlass::epilogue::fusion::sm90_partition_for_epilogue<RefSrc>(
                         sS2(_,_,warp_m), epi_tile, tiled_copy, thread_idx));                 // (COLS)
        static_assert(decltype(size(tCsK))::value == Cols, "smem and register partitions disagree");
        for_each(make_int_sequence<Chunk>{}, [&](auto i) {
          int f = lane_m * Chunk + decltype(i)::value;   // original filtered index of this entry
          tCsK(f) = fK(i);
          tCsS1(f) = fS1(i);
          tCsS2(f) = fS2(i);
        });
        if (canonical_lane_idx() == 0) {
          sCount[warp_m] = n_thr;
        }
      }

      sync_fn();

      // 4. One thread per column adds the warps' sums, moved to a common shift C = warp 0's mean
      //    (the header's step 3), in warp order, folds in the bias, and stores the tile's partial
      //    with plain (coalesced) stores. Warp 0 holds the tile's first row, valid since
      //    cta_has_rows: n_0 > 0.
      static_assert(CtaN <= NumThreads, "one consumer thread per tile column");
      if (thread_idx < CtaN) {
        int col = thread_idx;
        float C = sK(0, col, 0) + sS1(0, col, 0) / float(sCount[0]);
        float S1 = 0.0f, S2 = 0.0f;
        int n = 0;
        for_each(make_int_sequence<WarpsM>{}, [&](auto w) {
          int nw = sCount[w];
          float fnw = float(nw);
          float d = sK(0, col, w) - C;     // exact when the shift and C are close (Sterbenz)
          float s1 = sS1(0, col, w);
          S2 += nw > 0 ? fmaf(d, fmaf(fnw, d, 2.0f * s1), sS2(0, col, w)) : 0.0f;
          S1 += nw > 0 ? fmaf(fnw, d, s1) : 0.0f;
          n += nw;
        });
        float mean, m2;
        detail::mean_and_m2(C, S1, S2, 1.0f / float(n), mean, m2);
        int gcol = n_tile * CtaN + col;
        if (params.ptr_bias != nullptr && gcol < N) {
          mean += static_cast<float>(params.ptr_bias[gcol]);
        }
        int64_t ld = int64_t((N + CtaN - 1) / CtaN) * CtaN;
        int64_t offset = int64_t(m_tile) * ld + gcol;
        params.ptr_mean[offset] = mean;
        params.ptr_m2[offset] = m2;
      }

      sync_fn();   // the collective reuses the staging buffer right after reduce()
    }
  };

  template <
    bool ReferenceSrc,  // do register tensors reference the src or dst layout of the tiled copy
    class... Args
  >
  CUTLASS_DEVICE auto
  get_consumer_store_callbacks(ConsumerStoreArgs<Args...> const& args) {
    auto [lane_layout_MN, lane_mn, warp_layout_MN, warp_mn] =
        detail::lane_and_warp_layouts<ReferenceSrc>(args.tiled_copy, args.thread_idx);
    auto [M, N, K, L] = args.problem_shape_mnkl;
    auto [m, n, k, l] = args.tile_coord_mnkl;
    // One register per column (stride 0 along M), and each element's visit ordinal in its column.
    auto [tCrK, tCrS1, tCrS2, tCoD] = detail::line_registers_and_ordinals<ReferenceSrc>(
        take<0,2>(args.tile_shape_mnk), make_stride(_0{}, _1{}), make_stride(_1{}, _0{}), args.epi_tile,
        args.tiled_copy, args.thread_idx);
    static_assert(is_static_v<decltype(args.tCcD.layout())>, "thread coordinates must be static");

    bool cta_has_rows = elem_less(args.cD(_0{},_0{}), args.residue_cD);

    return ConsumerStoreCallbacks<decltype(tCrK), decltype(args.tCcD), decltype(tCoD),
                                  decltype(args.residue_tCcD), decltype(lane_layout_MN),
                                  decltype(warp_layout_MN), decltype(args.epi_tile),
                                  decltype(args.tiled_copy)>(
      cute::move(tCrK), cute::move(tCrS1), cute::move(tCrS2), args.tCcD, tCoD, args.residue_tCcD,
      lane_layout_MN, int(get<0>(lane_mn)), int(lane_layout_MN(_0{}, get<1>(lane_mn))), warp_layout_MN, int(get<0>(warp_mn)), cta_has_rows,
      int(m), int(n), int(N), args.epi_tile, args.tiled_copy, args.thread_idx, this->params);
  }
};

}  // namespace fused::epilogue
