// EXPERIMENTAL (built with -DFUSED_3XTF32_EXPERIMENT=ON only; compiled, not yet run on a GPU):
// a 3xTF32 sm90 mainloop with promoted accumulation, for an fp32-grade GEMM on tensor cores.
//
// Each fp32 operand a = big + small with big = a truncated to TF32 and small = (a - big) rounded to
// nearest TF32 (fused::tf32::split_toward_zero). Per k-tile the two consumer warpgroups
//   1. wait for the TMA tiles of A and B, loaded as raw 32-bit words (a UINT32 TMA descriptor:
//      CUTLASS's fp32 mainloop uses TFLOAT32 descriptors, whose copy rounds the low bits away);
//   2. write the small parts of both tiles to one shared-memory buffer each (same swizzled layout
//      as a pipeline stage, so element i of the stage and of the buffer are the same (m, k)), fence
//      them for the tensor cores' async proxy, and meet at a named barrier;
//   3. issue small_A * big_B, big_A * small_B and big_A * big_B as TF32 wgmma. The raw tile is the
//      big part: the tensor cores truncate raw fp32 operand bits (measured on the H200 with
//      mma.sync: tests/cpp/test_cuda_kernels.cu, Tf32TensorCores.*).
// The wgmma accumulator is added into the output accumulator and restarted every kPromoteKTiles
// k-tiles (a tensor-core accumulation over thousands of K terms loses bits an fp32 sum keeps; the
// same fix as CUTLASS's FP8 mainloop). The small buffers are single: a k-tile's split waits until
// both warpgroups' previous wgmmas are done (a simple first version; a 2-deep ring would overlap
// the split with the previous products). Design: docs/design-3xtf32-sm90.md.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/collective/collective_mma.hpp"

#include "fused/detail/tf32_split.h"

namespace fused::sm90::detail {

using namespace cute;

// Base: CUTLASS's SS warp-specialized TMA mainloop (CollectiveMma<MainloopSm90TmaGmmaWarpSpecialized
// ...>) instantiated with uint32_t operands (raw words through TMA) and a TF32 TiledMma.
template <class Base, int kPromoteKTiles>
struct Mainloop3xTf32 : Base {
  static_assert(kPromoteKTiles >= 1, "promote at least every k-tile count of 1");
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

  // One pipeline stage's layout: the small parts are stored exactly as the raw tile is.
  using SmemLayoutStageA = decltype(tile_to_shape(SmemLayoutAtomA{}, make_shape(shape<0>(TileShape{}), shape<2>(TileShape{}))));
  using SmemLayoutStageB = decltype(tile_to_shape(SmemLayoutAtomB{}, make_shape(shape<1>(TileShape{}), shape<2>(TileShape{}))));
  static constexpr int kStageElementsA = int(size(SmemLayoutStageA{}));
  static constexpr int kStageElementsB = int(size(SmemLayoutStageB{}));
  static_assert(int(cosize_v<SmemLayoutStageA>) == kStageElementsA && int(cosize_v<SmemLayoutStageB>) == kStageElementsB,
                "a stage must be dense for the element-wise split");
  static_assert(int(cosize_v<SmemLayoutA>) == kStageElementsA * DispatchPolicy::Stages &&
                    int(cosize_v<SmemLayoutB>) == kStageElementsB * DispatchPolicy::Stages,
                "stages must follow each other densely");
  static constexpr int kMmaThreads = int(size(TiledMma{}));
  static_assert(kStageElementsA % (4 * kMmaThreads) == 0 && kStageElementsB % (4 * kMmaThreads) == 0,
                "every MMA thread splits whole float4 groups");

  struct SharedStorage {
    struct TensorStorage : Base::TensorStorage {
      alignas(1024) cute::array_aligned<typename TiledMma::ValTypeA, kStageElementsA, 1024> smem_A_small;
      alignas(1024) cute::array_aligned<typename TiledMma::ValTypeB, kStageElementsB, 1024> smem_B_small;
    } tensors;
    using PipelineStorage = typename Base::PipelineStorage;
    PipelineStorage pipeline;
  };
  using TensorStorage = typename SharedStorage::TensorStorage;
  using PipelineStorage = typename SharedStorage::PipelineStorage;

  // small = split_toward_zero(raw).small for kStageElements words, this thread's share of float4s.
  template <int kStageElements>
  CUTLASS_DEVICE static void write_small_parts(const void* raw_stage, void* small, int thread_idx) {
    const float4* in = static_cast<const float4*>(raw_stage);
    float4* out = static_cast<float4*>(small);
    CUTLASS_PRAGMA_UNROLL
    for (int i = thread_idx; i < kStageElements / 4; i += kMmaThreads) {
      const float4 a = in[i];
      out[i] = make_float4(tf32::split_toward_zero(a.x).small, tf32::split_toward_zero(a.y).small,
                           tf32::split_toward_zero(a.z).small, tf32::split_toward_zero(a.w).small);
    }
  }

  CUTLASS_DEVICE static void sync_mma_threads() {
    cutlass::arch::NamedBarrier::sync(kMmaThreads,
                                      static_cast<uint32_t>(cutlass::arch::ReservedNamedBarriers::TransformBarrier));
  }

  // The consumers' k-loop (hides Base::mma): accum = A * B over k_tile_count k-tiles in 3xTF32.
  // Releases every stage but the last, as Base::mma does, so Base::mma_tail applies unchanged.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& /*mainloop_params*/) {
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});        // (BLK_M,BLK_K,PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});        // (BLK_N,BLK_K,PIPE)
    Tensor sA_small = make_tensor(make_smem_ptr(shared_tensors.smem_A_small.data()), SmemLayoutStageA{});
    Tensor sB_small = make_tensor(make_smem_ptr(shared_tensors.smem_B_small.data()), SmemLayoutStageB{});

    constexpr int kMmaWarpGroups = kMmaThreads / cutlass::NumThreadsPerWarpGroup;
    Layout warp_group_thread_layout = make_layout(Int<kMmaWarpGroups>{}, Int<cutlass::NumThreadsPerWarpGroup>{});
    const int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / cutlass::NumThreadsPerWarpGroup, 0);
    TiledMma tiled_mma;
    auto thread_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    Tensor tCrA = thread_mma.make_fragment_A(thread_mma.partition_A(sA));                      // (MMA,MMA_M,MMA_K,PIPE)
    Tensor tCrB = thread_mma.make_fragment_B(thread_mma.partition_B(sB));                      // (MMA,MMA_N,MMA_K,PIPE)
    Tensor tCrA_small = thread_mma.make_fragment_A(thread_mma.partition_A(sA_small));          // (MMA,MMA_M,MMA_K)
    Tensor tCrB_small = thread_mma.make_fragment_B(thread_mma.partition_B(sB_small));          // (MMA,MMA_N,MMA_K)

    // The wgmma accumulator, promoted into accum every kPromoteKTiles k-tiles.
    Tensor partial = make_fragment_like(accum);
    clear(accum);
    auto promote = [&]() {
      warpgroup_fence_operand(partial);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < size(accum); ++i) accum(i) += partial(i);
      tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    };
    tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
    PipelineState smem_pipe_release = smem_pipe_read;

    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      const int read_stage = smem_pipe_read.index();

      // This warpgroup's products of the previous k-tile are done: its stage can go back to the
      // producer, and the partial sum may be promoted.
      warpgroup_wait<0>();
      if (k_tile > 0) {
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
        if (k_tile % kPromoteKTiles == 0) promote();
      }
      sync_mma_threads();  // both warpgroups are done reading the small buffers

      write_small_parts<kStageElementsA>(shared_tensors.smem_A.data() + read_stage * kStageElementsA,
                                         shared_tensors.smem_A_small.data(), thread_idx);
      write_small_parts<kStageElementsB>(shared_tensors.smem_B.data() + read_stage * kStageElementsB,
                                         shared_tensors.smem_B_small.data(), thread_idx);
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma (async proxy)
      sync_mma_threads();

      warpgroup_fence_operand(partial);
      warpgroup_arrive();
      CUTLASS_PRAGMA_UNROLL
      for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
        // Smallest terms first, big * big last.
        cute::gemm(tiled_mma, tCrA_small(_, _, k_block), tCrB(_, _, k_block, read_stage), partial);
        tiled_mma.accumulate_ = GMMA::ScaleOut::One;
        cute::gemm(tiled_mma, tCrA(_, _, k_block, read_stage), tCrB_small(_, _, k_block), partial);
        cute::gemm(tiled_mma, tCrA(_, _, k_block, read_stage), tCrB(_, _, k_block, read_stage), partial);
      }
      warpgroup_commit_batch();
      ++smem_pipe_read;
    }
    warpgroup_wait<0>();
    promote();
    warpgroup_fence_operand(accum);
  }
};

}  // namespace fused::sm90::detail
