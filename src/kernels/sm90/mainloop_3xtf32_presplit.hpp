// A 3xTF32 sm90 mainloop whose shared-memory operand (B) comes with its small parts already split:
// a pass over B (split_small_parts_3xtf32.h) wrote small_toward_zero(b) for every element into a
// buffer of B's shape, and the producer loads that buffer's tile by TMA beside B's raw tile, into the
// same pipeline stage. The consumers then only split A in registers, issue the products and promote.
//
// Against mainloop_3xtf32.hpp (B's small parts split by the consumers into a ring of shared memory
// every k-tile, handed between the two warpgroups through mbarriers) this takes out of the k-loop:
//   - B's split: four 16-byte loads, four 16-byte stores and about 60 more instructions a consumer
//     thread a k-tile, all on the SM's one shared-memory pipe beside the wgmma's own operand reads;
//   - the hand-over (an arrive and a wait a k-tile) and the ring's stamps and votes on B.
// Nsight Compute put the consumers' instruction streams, not the tensor pipe, at the k-tile's length
// (docs/design-3xtf32-sm90.md, section 7h); leaving B's split and the hand-over out of the old loop
// was 11-20 % of the forward there. What it costs instead: a buffer of B's size and one pass over B
// (read once, written once), and a TMA load of 16 KiB more a stage (the three-slot ring it replaces
// took as much shared memory).
//
// Numerics are the in-loop kernel's: A split to nearest in registers (or exactly, see below), B's big
// part the raw word the tensor cores read truncated, its small part rounded to nearest; the
// small-part products first, then big * big, into a wgmma accumulator promoted into fp32 every k-tile.
// B's small parts are the exact split's everywhere (small_toward_zero, whose tiny nonzero small part
// of a value TF32 holds exactly keeps inf * small = inf), so B's tiles need no special case. A's
// split is exact (fused::tf32::split_toward_zero) where a thread's own words hold inf, NaN or a value
// whose rounding reaches inf, and everywhere when the pass found inf or NaN in B (its flag): then
// every product keeps fp32's inf and NaN.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/gemm/collective/collective_mma.hpp"

#include "fused/detail/tf32_split.h"
#include "kernels/sm90/mainloop_3xtf32.hpp"

namespace fused::sm90::detail {

using namespace cute;

// Pipeline stages of the presplit kernel with this CTA tile: a stage holds one k-tile of A, of B and
// of B's small parts, and two 8-byte barriers; 256 bytes for the scheduler and the rest.
template <class TileShape, int kEpilogueBytes>
constexpr int stages_3xtf32_presplit() {
  constexpr int stage_bytes = int(size<0>(TileShape{}) + 2 * size<1>(TileShape{})) * int(size<2>(TileShape{})) * 4;
  constexpr int stages = (kSm90SharedMemoryBytes - kEpilogueBytes - 256) / (stage_bytes + 16);
  static_assert(stages >= 3, "too little shared memory for a pipeline");
  return stages;
}

// Base: CUTLASS's SS warp-specialized TMA mainloop (CollectiveMma<MainloopSm90TmaGmmaWarpSpecialized
// ...>) with uint32_t operands and a TF32 TiledMma, as for Mainloop3xTf32; it supplies the types,
// the A and B TMA copies and the tail. The producer's load and the consumers' k-loop are this one's.
template <class Base>
struct Mainloop3xTf32Presplit : Base {
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::DispatchPolicy;
  using typename Base::ElementA;
  using typename Base::ElementB;
  using typename Base::StrideA;
  using typename Base::StrideB;
  using typename Base::GmemTiledCopyB;
  using ClusterShape = typename DispatchPolicy::ClusterShape;
  static_assert(size(ClusterShape{}) == 1, "one CTA a cluster: the loads are not multicast");
  static_assert(cutlass::gemm::detail::is_k_major_B<StrideB>(), "TF32 wgmma reads a K-major B only");

  static constexpr int kMmaThreads = int(size(TiledMma{}));
  static constexpr int kWarpGroupThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr int kMmaWarpGroups = kMmaThreads / kWarpGroupThreads;
  // The register-sourced TF32 TiledMma and A's copy into registers: as in Mainloop3xTf32.
  using TiledMmaRegisterA = decltype(make_tiled_mma(
      GMMA::rs_op_selector<tfloat32_t, tfloat32_t, float, TileShape>(), Layout<Shape<Int<kMmaWarpGroups>, _1, _1>>{}));
  static_assert(int(size(TiledMmaRegisterA{})) == kMmaThreads &&
                    std::is_same_v<typename TiledMmaRegisterA::AtomLayoutC_TV, typename TiledMma::AtomLayoutC_TV>,
                "the register-sourced TiledMma must keep the accumulator layout");
  using SmemCopyAtomA = std::conditional_t<cutlass::gemm::detail::is_k_major_A<StrideA>(),
                                           Copy_Atom<SM75_U32x4_LDSM_N, float>, Copy_Atom<AutoVectorizingCopy, float>>;

  struct SharedStorage {
    struct TensorStorage : Base::TensorStorage {
      // B's small parts, one tile a stage, laid out as smem_B (the same swizzle, the same stage order).
      alignas(1024) cute::array_aligned<typename TiledMma::ValTypeB, cute::cosize_v<SmemLayoutB>, 1024> smem_B_small;
    } tensors;
    using PipelineStorage = typename Base::PipelineStorage;
    PipelineStorage pipeline;
  };
  using TensorStorage = typename SharedStorage::TensorStorage;
  using PipelineStorage = typename SharedStorage::PipelineStorage;

  struct Arguments {
    ElementA const* ptr_A;
    StrideA dA;
    ElementB const* ptr_B;
    StrideB dB;
    ElementB const* ptr_B_small;   // small_toward_zero of every element of B, B's shape
    StrideB dB_small;
    uint32_t const* b_special;     // nonzero: B holds inf or NaN (written by the split pass)
  };

  using TmaA = typename Base::Params::TMA_A;
  using TmaB = typename Base::Params::TMA_B;
  struct Params {
    TmaA tma_load_a;
    TmaB tma_load_b;
    TmaB tma_load_b_small;
    uint32_t tma_transaction_bytes;
    uint32_t const* b_special;
  };

  static constexpr uint32_t TmaTransactionBytes = Base::TmaTransactionBytes + Base::TmaTransactionBytesNK;

  static typename Base::Arguments base_arguments(Arguments const& args) {
    return {args.ptr_A, args.dA, args.ptr_B, args.dB};
  }

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const& problem_shape, Arguments const& args, void* workspace) {
    auto base = Base::to_underlying_arguments(problem_shape, base_arguments(args), workspace);
    auto [M, N, K, L] = append<4>(problem_shape, 1);
    Tensor tensor_b_small = make_tensor(reinterpret_cast<typename Base::InternalElementB const*>(args.ptr_B_small),
                                        make_layout(make_shape(N, K, L), args.dB_small));
    TmaB tma_load_b_small = make_tma_copy_B_sm90(GmemTiledCopyB{}, tensor_b_small, SmemLayoutB{}(_, _, Int<0>{}),
                                                 TileShape{}, ClusterShape{});
    return {base.tma_load_a, base.tma_load_b, tma_load_b_small, TmaTransactionBytes, args.b_special};
  }

  // What TMA needs: 16-byte aligned base addresses and strides. Unlike CUTLASS's check, the extents
  // along the contiguous modes may be any (the backward's dW has K = the batch, often odd): TMA reads
  // zeros past them.
  template <class Stride>
  static bool strides_aligned(Stride const& stride) {
    bool ok = true;
    for_each(stride, [&](auto s) {
      if constexpr (!is_static_v<decltype(s)>) ok = ok && (int64_t(s) * 4) % 16 == 0;
    });
    return ok;
  }
  static bool aligned16(void const* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    static_assert(sizeof(ElementA) == 4 && sizeof(ElementB) == 4, "32-bit words");
    return args.b_special != nullptr && aligned16(args.ptr_A) && aligned16(args.ptr_B) && aligned16(args.ptr_B_small) &&
           strides_aligned(args.dA) && strides_aligned(args.dB) && strides_aligned(args.dB_small);
  }

  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const& params) {
    cute::prefetch_tma_descriptor(params.tma_load_a.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_load_b.get_tma_descriptor());
    cute::prefetch_tma_descriptor(params.tma_load_b_small.get_tma_descriptor());
  }

  // The tiled TMA tensors: A (BLK_M,BLK_K,m,k,l), B and B's small parts (BLK_N,BLK_K,n,k,l).
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_MNKL, Params const& params) const {
    using X = Underscore;
    auto [M, N, K, L] = problem_shape_MNKL;
    Tensor mA_mkl = params.tma_load_a.get_tma_tensor(make_shape(M, K, L));
    Tensor mB_nkl = params.tma_load_b.get_tma_tensor(make_shape(N, K, L));
    Tensor mBs_nkl = params.tma_load_b_small.get_tma_tensor(make_shape(N, K, L));
    Tensor gA_mkl = local_tile(mA_mkl, TileShape{}, make_coord(_, _, _), Step<_1, X, _1>{});
    Tensor gB_nkl = local_tile(mB_nkl, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
    Tensor gBs_nkl = local_tile(mBs_nkl, TileShape{}, make_coord(_, _, _), Step<X, _1, _1>{});
    return cute::make_tuple(gA_mkl, gB_nkl, gBs_nkl);
  }

  // The producer: Base::load's loop with a third TMA copy into each stage (no multicast: one CTA a cluster).
  template <class TensorA, class TensorB, class TensorBs, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& params, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB, TensorBs> const& load_inputs, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int /*thread_idx*/,
                           uint32_t /*block_rank_in_cluster*/, TensorStorage& shared_tensors) {
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});         // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});         // (BLK_N,BLK_K,PIPE)
    Tensor sBs = make_tensor(make_smem_ptr(shared_tensors.smem_B_small.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor gA = get<0>(load_inputs)(_, _, m_coord, _, l_coord);   // (BLK_M,BLK_K,k)
    Tensor gB = get<1>(load_inputs)(_, _, n_coord, _, l_coord);   // (BLK_N,BLK_K,k)
    Tensor gBs = get<2>(load_inputs)(_, _, n_coord, _, l_coord);  // (BLK_N,BLK_K,k)
    auto block_tma_a = params.tma_load_a.get_slice(0);
    auto block_tma_b = params.tma_load_b.get_slice(0);
    auto block_tma_bs = params.tma_load_b_small.get_slice(0);
    Tensor tAgA = block_tma_a.partition_S(gA);     // (TMA,TMA_M,TMA_K,k)
    Tensor tAsA = block_tma_a.partition_D(sA);     // (TMA,TMA_M,TMA_K,PIPE)
    Tensor tBgB = block_tma_b.partition_S(gB);     // (TMA,TMA_N,TMA_K,k)
    Tensor tBsB = block_tma_b.partition_D(sB);     // (TMA,TMA_N,TMA_K,PIPE)
    Tensor tBgBs = block_tma_bs.partition_S(gBs);  // (TMA,TMA_N,TMA_K,k)
    Tensor tBsBs = block_tma_bs.partition_D(sBs);  // (TMA,TMA_N,TMA_K,PIPE)
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);  // expects TmaTransactionBytes: the three tiles
      auto* tma_barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int write_stage = smem_pipe_write.index();
      copy(params.tma_load_a.with(*tma_barrier), tAgA(_, _, _, *k_tile_iter), tAsA(_, _, _, write_stage));
      copy(params.tma_load_b.with(*tma_barrier), tBgB(_, _, _, *k_tile_iter), tBsB(_, _, _, write_stage));
      copy(params.tma_load_b_small.with(*tma_barrier), tBgBs(_, _, _, *k_tile_iter), tBsBs(_, _, _, write_stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  // The consumers' k-loop (hides Base::mma): accum = A * B over k_tile_count k-tiles in 3xTF32.
  // Releases every stage but the last, as Base::mma does, so Base::mma_tail applies unchanged.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& params) {
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    const int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / kWarpGroupThreads, 0);
    Layout warp_group_thread_layout = make_layout(Int<kMmaWarpGroups>{}, Int<kWarpGroupThreads>{});

    Tensor sA = as_position_independent_swizzle_tensor(
        make_tensor(make_smem_ptr(reinterpret_cast<float*>(shared_tensors.smem_A.data())), SmemLayoutA{}));  // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});                    // (BLK_N,BLK_K,PIPE)
    Tensor sBs = make_tensor(make_smem_ptr(shared_tensors.smem_B_small.data()), SmemLayoutB{});             // (BLK_N,BLK_K,PIPE)

    TiledMmaRegisterA tiled_mma;
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);
    auto warp_group_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    Tensor tCrA_big = thread_mma.partition_fragment_A(sA(_, _, Int<0>{}));            // (MMA,MMA_M,MMA_K)
    Tensor tCrA_small = make_fragment_like(tCrA_big);
    Tensor tCrA_raw = make_fragment_like<float>(tCrA_big);
    auto smem_copy_A = make_tiled_copy_A(SmemCopyAtomA{}, tiled_mma);
    auto smem_thread_copy_A = smem_copy_A.get_thread_slice(thread_idx);
    Tensor tCsA_copy = smem_thread_copy_A.partition_S(sA);                             // (CPY,CPY_M,CPY_K,PIPE)
    Tensor tCrA_raw_copy = smem_thread_copy_A.retile_D(tCrA_raw);                      // (CPY,CPY_M,CPY_K)
    Tensor tCrB = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sB));     // (MMA,MMA_N,MMA_K,PIPE)
    Tensor tCrBs = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sBs));   // (MMA,MMA_N,MMA_K,PIPE)
    Tensor a_raw = recast<uint32_t>(tCrA_raw);
    Tensor a_big = recast<uint32_t>(tCrA_big);
    Tensor a_small = recast<uint32_t>(tCrA_small);

    // The wgmma accumulator of one k-tile, promoted into accum after it.
    Tensor partial = make_fragment_like(accum);
    clear(accum);
    PipelineState smem_pipe_release = smem_pipe_read;
    bool b_special = b_special_ > 0;

    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      const int read_stage = smem_pipe_read.index();
      // The split pass's flag, read once the first tiles are in: the producer waited for the grids
      // before this kernel (programmatic dependent launch) before loading them. L2, not L1: the
      // caching allocator hands the same workspace to every call. Once a CTA: the load's latency is
      // exposed in the first k-tile of a tile (dW at the headline runs 31 tiles a CTA).
      if (k_tile == 0 && b_special_ < 0) {
        b_special_ = __ldcg(params.b_special) != 0u ? 1 : 0;
        b_special = b_special_ > 0;
      }

      // While k-tile t - 1's products run: A's raw words into registers, and the vote on them.
      copy(smem_copy_A, tCsA_copy(_, _, _, read_stage), tCrA_raw_copy);
      const uint32_t a_magnitude = max_magnitude_bits(a_raw);

      warpgroup_wait<0>();
      if (k_tile > 0) {
        promote_3xtf32(accum, partial);
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
      warpgroup_fence_operand(tCrA_big);
      warpgroup_fence_operand(tCrA_small);
      if (!b_special && a_magnitude < kFirstWordRoundingToInf3xTf32)
        split_a_nearest(tCrA_raw, a_big, a_small);
      else  // this thread's words hold inf, NaN or a value rounding to inf, or B does
        split_a_exact(tCrA_raw, a_big, a_small);
      issue_3xtf32_products(tiled_mma, tCrA_big, tCrA_small, tCrB(_, _, _, read_stage), tCrBs(_, _, _, read_stage), partial);
      ++smem_pipe_read;
    }
    warpgroup_wait<0>();
    promote_3xtf32(accum, partial);
    warpgroup_fence_operand(accum);
  }

 private:
  // The pass's flag as this thread read it (-1: not yet). The kernel keeps one mainloop object a
  // thread across its tiles.
  int b_special_ = -1;
};

// The presplit mainloop over a CUTLASS sm90 TF32 mainloop `RefMainloop` (tile, TiledMma, TMA copies),
// raw 32-bit operand words, A's stride and shared-memory atom as given, B K-major as the reference's.
template <class RefMainloop, int kEpilogueBytes, class StrideA = typename RefMainloop::StrideA,
          class SmemLayoutAtomA = typename RefMainloop::SmemLayoutAtomA>
using Mainloop3xTf32PresplitOver = Mainloop3xTf32Presplit<cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<
        stages_3xtf32_presplit<typename RefMainloop::TileShape, kEpilogueBytes>(),
        typename RefMainloop::DispatchPolicy::ClusterShape, cutlass::gemm::KernelTmaWarpSpecializedCooperative>,
    typename RefMainloop::TileShape, uint32_t, StrideA, uint32_t, typename RefMainloop::StrideB,
    typename RefMainloop::TiledMma, typename RefMainloop::GmemTiledCopyA, SmemLayoutAtomA, void, cute::identity,
    typename RefMainloop::GmemTiledCopyB, typename RefMainloop::SmemLayoutAtomB, void, cute::identity>>;

}  // namespace fused::sm90::detail
