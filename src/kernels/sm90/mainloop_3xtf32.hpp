// A 3xTF32 sm90 mainloop with promoted accumulation: an fp32-grade GEMM on TF32 tensor cores.
//
// Each fp32 operand a = big + small, big = a rounded to nearest TF32, small = a - big (exact in fp32;
// the tensor cores read its top 11 bits). The products small_a big_b + big_a small_b + big_a big_b
// drop small_a small_b (< 2^-24 of the product). Per k-tile t the two consumer warpgroups
//   1. wait for the TMA tiles of A and B, loaded as raw 32-bit words (a UINT32 TMA descriptor:
//      CUTLASS's fp32 mainloop uses TFLOAT32 descriptors, whose copy rounds the low bits away);
//   2. split their share of both tiles: big rewrites the raw word in place, small goes to slot t % 2
//      of a two-slot shared-memory ring (same swizzled layout as a pipeline stage, so element i of
//      the stage and of the slot are the same (m, k)), while k-tile t - 1's products still run;
//      fence the writes for the tensor cores' async proxy;
//   3. wait for k-tile t - 1's products, add that k-tile's wgmma accumulator into the fp32 output
//      accumulator ("promotion"), release its stage, and meet at a named barrier that also ORs a flag:
//      a tile holding inf, NaN or |a| >= 2^127 is redone with the exact split of
//      fused::tf32::split_toward_zero (the raw word restored, truncated by the tensor cores; small
//      parts that keep fp32's inf and NaN products), then a second barrier;
//   4. issue small_A * big_B and big_A * small_B for every k-block of the tile, then big_A * big_B
//      for every k-block, into a freshly zeroed wgmma accumulator.
// Why promote every k-tile (32 K-elements) and order the products so: the tensor cores' fp32
// accumulation loses a little of the accumulator at every wgmma (it does not round like an fp32
// add), so the error grows with the number of wgmma added into an accumulator of the result's size.
// The small-part products go first, while the accumulator is still small; then only the 4 big * big
// wgmma of a k-tile are added at full size before the fp32 promotion. Measured on the H200 (relative
// error against float64, 1024x8192x8192 time; tests/cpp/test_sm90_gemm_stats.cu):
//   - promotion every 8 k-tiles, products interleaved per k-block: 1.7e-6 at K = 8192 (exact fp32
//     1.3e-6); every k-tile, small parts first: 4.0e-7;
//   - big truncated (the raw word as is, no rewrite): 1.58 ms, 2.5-4.0e-7; big rounded to nearest
//     (this): 1.76 ms, 1.2-3.2e-7, no less accurate than exact fp32 from K = 1024 up;
//   - two alternating wgmma accumulators (t + 1's products issued before t's promotion): 1.93 ms
//     against 1.60 (ptxas serialized the wgmma).
// Design: docs/design-3xtf32-sm90.md.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/collective/collective_mma.hpp"

#include "fused/detail/tf32_split.h"

namespace fused::sm90::detail {

using namespace cute;

// Base: CUTLASS's SS warp-specialized TMA mainloop (CollectiveMma<MainloopSm90TmaGmmaWarpSpecialized
// ...>) instantiated with uint32_t operands (raw words through TMA) and a TF32 TiledMma.
template <class Base>
struct Mainloop3xTf32 : Base {
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutAtomA;
  using typename Base::SmemLayoutAtomB;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::Params;
  using typename Base::DispatchPolicy;

  // One pipeline stage's layout; the small parts are stored exactly as the raw tile is, in a ring
  // of kSmallSlots such stages.
  static constexpr int kSmallSlots = 2;
  using SmemLayoutStageA = decltype(tile_to_shape(SmemLayoutAtomA{}, make_shape(shape<0>(TileShape{}), shape<2>(TileShape{}))));
  using SmemLayoutStageB = decltype(tile_to_shape(SmemLayoutAtomB{}, make_shape(shape<1>(TileShape{}), shape<2>(TileShape{}))));
  using SmemLayoutSmallA = decltype(tile_to_shape(SmemLayoutAtomA{}, make_shape(shape<0>(TileShape{}), shape<2>(TileShape{}), Int<kSmallSlots>{})));
  using SmemLayoutSmallB = decltype(tile_to_shape(SmemLayoutAtomB{}, make_shape(shape<1>(TileShape{}), shape<2>(TileShape{}), Int<kSmallSlots>{})));
  static constexpr int kStageElementsA = int(size(SmemLayoutStageA{}));
  static constexpr int kStageElementsB = int(size(SmemLayoutStageB{}));
  static_assert(int(cosize_v<SmemLayoutStageA>) == kStageElementsA && int(cosize_v<SmemLayoutStageB>) == kStageElementsB,
                "a stage must be dense for the element-wise split");
  static_assert(int(cosize_v<SmemLayoutA>) == kStageElementsA * DispatchPolicy::Stages &&
                    int(cosize_v<SmemLayoutB>) == kStageElementsB * DispatchPolicy::Stages &&
                    int(cosize_v<SmemLayoutSmallA>) == kStageElementsA * kSmallSlots &&
                    int(cosize_v<SmemLayoutSmallB>) == kStageElementsB * kSmallSlots,
                "stages and ring slots must follow each other densely");
  static constexpr int kMmaThreads = int(size(TiledMma{}));
  static_assert(kStageElementsA % (4 * kMmaThreads) == 0 && kStageElementsB % (4 * kMmaThreads) == 0,
                "every MMA thread splits whole float4 groups");

  struct SharedStorage {
    struct TensorStorage : Base::TensorStorage {
      alignas(1024) cute::array_aligned<typename TiledMma::ValTypeA, kStageElementsA * kSmallSlots, 1024> smem_A_small;
      alignas(1024) cute::array_aligned<typename TiledMma::ValTypeB, kStageElementsB * kSmallSlots, 1024> smem_B_small;
    } tensors;
    using PipelineStorage = typename Base::PipelineStorage;
    PipelineStorage pipeline;
  };
  using TensorStorage = typename SharedStorage::TensorStorage;
  using PipelineStorage = typename SharedStorage::PipelineStorage;

  // The fast split of one word of a k-tile: the raw word becomes split_nearest_exact's big part
  // (rewritten in place: the tensor cores read it) and the small part is exact, so raw + small
  // restores the word. Words of magnitude >= 2^127, inf or NaN keep their raw bits and a zero small
  // part (restored alike) and set `large`: the caller then redoes the k-tile with the exact split.
  CUTLASS_DEVICE static float fast_split(float a, float& big, bool& large) {
    const bool keep = (__float_as_uint(a) & tf32::kExponentMask) >= 0x7f000000u;
    large |= keep;
    const tf32::Split s = tf32::split_nearest_exact(a);
    big = keep ? a : s.big;
    return keep ? 0.0f : s.small;
  }

  // This thread's share of a stage's split, as float4 groups. kFast: fast_split, returning whether a
  // word needs the exact split. Else the exact split: the raw words are restored (raw + small), the
  // tensor cores read them truncated (split_toward_zero's big part), and the small parts are
  // small_toward_zero's, which keep fp32's inf and NaN products.
  template <int kStageElements, bool kFast>
  CUTLASS_DEVICE static bool write_small_parts(float* raw_stage, float* small, int thread_idx) {
    float4* raw4 = reinterpret_cast<float4*>(raw_stage);
    float4* small4 = reinterpret_cast<float4*>(small);
    bool large = false;
    CUTLASS_PRAGMA_UNROLL
    for (int i = thread_idx; i < kStageElements / 4; i += kMmaThreads) {
      float4 a = raw4[i];
      if constexpr (kFast) {
        float4 big;
        small4[i] = make_float4(fast_split(a.x, big.x, large), fast_split(a.y, big.y, large),
                                fast_split(a.z, big.z, large), fast_split(a.w, big.w, large));
        raw4[i] = big;
      } else {
        const float4 s = small4[i];
        a = make_float4(a.x + s.x, a.y + s.y, a.z + s.z, a.w + s.w);
        raw4[i] = a;
        small4[i] = make_float4(tf32::small_toward_zero(a.x), tf32::small_toward_zero(a.y),
                                tf32::small_toward_zero(a.z), tf32::small_toward_zero(a.w));
      }
    }
    return large;
  }

  static constexpr uint32_t kBarrier = static_cast<uint32_t>(cutlass::arch::ReservedNamedBarriers::TransformBarrier);

  CUTLASS_DEVICE static void sync_mma_threads() { cutlass::arch::NamedBarrier::sync(kMmaThreads, kBarrier); }

  // A barrier of the MMA threads that also returns whether any of them passed true.
  CUTLASS_DEVICE static bool sync_mma_threads_or(bool value) {
    uint32_t any;
    asm volatile(
        "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
        : "=r"(any)
        : "r"(static_cast<uint32_t>(value)), "r"(kBarrier), "r"(static_cast<uint32_t>(kMmaThreads))
        : "memory");
    return any != 0;
  }

  // The consumers' k-loop (hides Base::mma): accum = A * B over k_tile_count k-tiles in 3xTF32.
  // Releases every stage but the last, as Base::mma does, so Base::mma_tail applies unchanged.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& /*mainloop_params*/) {
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});        // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});        // (BLK_N,BLK_K,PIPE)
    Tensor sA_small = make_tensor(make_smem_ptr(shared_tensors.smem_A_small.data()), SmemLayoutSmallA{});  // (..,SLOT)
    Tensor sB_small = make_tensor(make_smem_ptr(shared_tensors.smem_B_small.data()), SmemLayoutSmallB{});  // (..,SLOT)

    constexpr int kMmaWarpGroups = kMmaThreads / cutlass::NumThreadsPerWarpGroup;
    Layout warp_group_thread_layout = make_layout(Int<kMmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));                      // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));                      // (MMA,MMA_N,MMA_K,PIPE)
    Tensor tCrA_small = thread_mma.make_fragment_A(thread_mma.partition_A(sA_small));          // (MMA,MMA_M,MMA_K,SLOT)
    Tensor tCrB_small = thread_mma.make_fragment_B(thread_mma.partition_B(sB_small));          // (MMA,MMA_N,MMA_K,SLOT)
    constexpr int kBlocks = size<2>(tCrA);

    // The wgmma accumulator of one k-tile, promoted into accum after it. (Two of them, alternating so
    // that k-tile t + 1's products could start before k-tile t's are promoted, measured slower on
    // the H200: 1.93 against 1.60 ms at the headline; ptxas serialized the wgmma.)
    Tensor partial = make_fragment_like(accum);
    clear(accum);
    auto promote = [&]() {
      warpgroup_fence_operand(partial);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += partial(i);
      warpgroup_fence_operand(partial);
    };
    PipelineState smem_pipe_release = smem_pipe_read;

    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      const int read_stage = smem_pipe_read.index();
      const int slot = k_tile % kSmallSlots;

      // Slot k_tile % 2 was last read by k-tile t - 2's products, which both warpgroups finished
      // before the previous iteration's barrier. The previous k-tile's products may still run.
      float* raw_a = reinterpret_cast<float*>(shared_tensors.smem_A.data()) + read_stage * kStageElementsA;
      float* raw_b = reinterpret_cast<float*>(shared_tensors.smem_B.data()) + read_stage * kStageElementsB;
      float* small_a = reinterpret_cast<float*>(shared_tensors.smem_A_small.data()) + slot * kStageElementsA;
      float* small_b = reinterpret_cast<float*>(shared_tensors.smem_B_small.data()) + slot * kStageElementsB;
      bool special = write_small_parts<kStageElementsA, true>(raw_a, small_a, thread_idx);
      special |= write_small_parts<kStageElementsB, true>(raw_b, small_b, thread_idx);
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma (async proxy)

      warpgroup_wait<0>();
      if (k_tile > 0) {
        promote();
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
      if (sync_mma_threads_or(special)) {
        // An inf or NaN in this k-tile (uniform across the CTA): every thread redoes its share with
        // the exact split, whose small parts keep fp32's inf and NaN products.
        write_small_parts<kStageElementsA, false>(raw_a, small_a, thread_idx);
        write_small_parts<kStageElementsB, false>(raw_b, small_b, thread_idx);
        cutlass::arch::fence_view_async_shared();
        sync_mma_threads();
      }

      warpgroup_fence_operand(partial);
      warpgroup_arrive();
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < kBlocks; ++k_block) {
        cute::gemm(tiled_mma, tCrA_small(_, _, k_block, slot), tCrB(_, _, k_block, read_stage), partial);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        cute::gemm(tiled_mma, tCrA(_, _, k_block, read_stage), tCrB_small(_, _, k_block, slot), partial);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < kBlocks; ++k_block)
        cute::gemm(tiled_mma, tCrA(_, _, k_block, read_stage), tCrB(_, _, k_block, read_stage), partial);
      warpgroup_commit_batch();
      warpgroup_fence_operand(partial);
      ++smem_pipe_read;
    }
    warpgroup_wait<0>();
    promote();
    warpgroup_fence_operand(accum);
  }
};

}  // namespace fused::sm90::detail
