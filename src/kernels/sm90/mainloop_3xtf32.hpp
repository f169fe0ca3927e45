// A 3xTF32 sm90 mainloop with promoted accumulation: an fp32-grade GEMM on TF32 tensor cores.
//
// Each fp32 operand a = big + small, both TF32; the products small_a big_b + big_a small_b + big_a big_b
// drop small_a small_b (< 2^-21 of the product). A (x) and B (W) are split differently:
//   - A goes through registers (register-sourced wgmma, RS): each consumer warpgroup reads its 64 rows
//     of the raw tile and splits them in registers, big and small both rounded to nearest
//     (fused::tf32::split_nearest_fast, within 2^-22 |a|). Nothing is written back for A;
//   - B stays in shared memory (TF32 wgmma has no register-sourced B). The raw tile, loaded as 32-bit
//     words by a UINT32 TMA copy (CUTLASS's fp32 mainloop uses TFLOAT32 descriptors, whose copy rounds
//     the low bits away), is big as it is: the tensor cores read it truncated. The small parts
//     (small_of_truncated_fast, within 2^-21 |b|) go to a ring of three slots, each of the 256
//     consumer threads writing 1/256 of the tile.
//     An MN-major B (the backward's dW = dy^T x, which reads dy as stored) cannot be read by TF32
//     wgmma at all. Its stage is transposed by the consumers instead: each thread reads a 4 x 4 block
//     (four 16-byte loads along n), and writes it K-major into two rings, big and small parts both
//     rounded to nearest as A's are. One more 16 KiB store a k-tile and 48 KiB more of rings (one
//     pipeline stage fewer), against a transposed copy of the operand in global memory.
// Per k-tile t each consumer thread
//   1. waits for the TMA tiles, reads its raw A words into registers and writes its share of B's small
//      parts to slot t % 3 while k-tile t - 1's products still run; votes on the tiles' special values
//      (inf, NaN, an A word whose rounding reaches inf: a shared stamp of t); fences the writes for the
//      tensor cores' async proxy and arrives on the slot's mbarrier;
//   2. waits for its warpgroup's k-tile t - 1 products, adds that k-tile's wgmma accumulator into the
//      fp32 output accumulator ("promotion"), releases its stage and splits A in registers;
//   3. waits on the slot's mbarrier (every thread's share written), redoes the k-tile with the exact
//      split of fused::tf32::split_toward_zero if the stamp says so (big truncated, small parts that
//      keep fp32's inf and NaN products), and issues small_A * big_B and big_A * small_B for every
//      k-block, then big_A * big_B for every k-block, into a freshly zeroed wgmma accumulator.
// So a warpgroup waits for the other only until it has written its share of the slot, not until it
// has finished its own promotion and split: one may run up to a k-tile ahead. The earlier form, a
// named barrier of all 256 threads at the end of step 2 (two slots), kept them in step. Measured on
// the H200 (bench/cpp/variants.sh, alternating runs, the same bits of y): dx of the backward's
// 1024x8192x8192 1.31 -> 1.25 ms, dW from dy 1.53 -> 1.43 ms, the forward's GEMM + statistics
// 1.334-1.340 -> 1.329-1.332 ms (one pipeline stage fewer: the third slot).
// Why promote every k-tile (32 K-elements) and order the products so: the tensor cores' fp32
// accumulation loses a little of the accumulator at every wgmma (it does not round like an fp32
// add), so the error grows with the number of wgmma added into an accumulator of the result's size.
// The small-part products go first, while the accumulator is still small; then only the 4 big * big
// wgmma of a k-tile are added at full size before the fp32 promotion. Promoting every 2 or 4 k-tiles
// from K = 4096 (2-4 % faster on the H200) beat a sequential fp32 sum but not cuBLAS's exact fp32 at
// 256x512x16384 (5.9e-7 against 4.1e-7), whose split K sums are as accurate as this kernel's
// (docs/design-3xtf32-sm90.md, section 7j).
// Measured on the H200 (GEMM + statistics at 1024x8192x8192; relative error against float64 in
// tests/cpp/test_sm90_gemm_stats.cu), from the first version to this one:
//   - promotion every 8 k-tiles, products interleaved per k-block: 1.7e-6 at K = 8192 (exact fp32
//     1.3e-6); every k-tile, small parts first: 4.0e-7;
//   - both operands split in shared memory (SS wgmma): 1.76 ms, shared memory the limit (each SS
//     wgmma reads A's tile too);
//   - A in registers (this): 1.32-1.35 ms with one shared ring (half the split work, five stages),
//     1.29-1.31 ms with A's copy into registers by ldmatrix (1.33 ms on the day of the mbarrier
//     hand-over above);
//     a ring per warpgroup (each splitting all of B, never waiting for the other; three stages fit),
//     staggering or strictly alternating the two warpgroups' products all measured 1.33-1.45 ms
//     (docs/design-3xtf32-sm90.md, section 6c).
// Design: docs/design-3xtf32-sm90.md.
#pragma once

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/gemm/collective/collective_mma.hpp"

#include "fused/detail/tf32_split.h"

namespace fused::sm90::detail {

using namespace cute;

// Slots of B's rings: a warpgroup may be a k-tile ahead of the other, so slot t % 3 is written for
// k-tile t while the other warpgroup's products may still read slot (t - 1) % 3 (the header's comment).
constexpr int kRingSlots3xTf32 = 3;
// The hand-over's mbarriers and special-value stamps, one each per slot.
constexpr int kRingSyncBytes3xTf32 = 64;

// The rings of B's parts: kRingSlots3xTf32 stages of B each, one ring (small parts) for a K-major B,
// two (big and small parts) for an MN-major B (Mainloop3xTf32 asserts its storage is this size).
template <class TileShape, int kRings>
constexpr int ring_bytes_3xtf32() {
  return kRings * kRingSlots3xTf32 * int(size<1>(TileShape{})) * int(size<2>(TileShape{})) * 4;
}

// What one sm90 CTA may use (227 KiB).
constexpr int kSm90SharedMemoryBytes = 232448;

// Pipeline stages of a 3xTF32 kernel with this CTA tile: what shared memory holds after the
// epilogue's storage, the rings of B's parts and 256 bytes of barriers and scheduler state (each
// kernel asserts its SharedStorageSize). A stage holds one k-tile of A and of B, and two 8-byte
// barriers.

template <class TileShape, int kEpilogueBytes, int kRings>
constexpr int stages_3xtf32() {
  constexpr int stage_bytes = int(size<0>(TileShape{}) + size<1>(TileShape{})) * int(size<2>(TileShape{})) * 4;
  constexpr int stages =
      (kSm90SharedMemoryBytes - kEpilogueBytes - ring_bytes_3xtf32<TileShape, kRings>() - kRingSyncBytes3xTf32 - 256) /
      (stage_bytes + 16);
  static_assert(stages >= 3, "too little shared memory for a pipeline");
  return stages;
}

// The consumers' steps that both 3xTF32 mainloops (this one and mainloop_3xtf32_presplit.hpp) take.

// A's words, in registers, split to nearest (fused::tf32::split_nearest_fast; finite words below the
// first that rounds to inf), or exactly (big truncated, small_toward_zero: fp32's inf and NaN products).
// raw: the words as floats; big, small: uint32_t views of the register-sourced wgmma's A fragments.
template <class Raw, class Bits>
CUTLASS_DEVICE void split_a_nearest(Raw const& raw, Bits& big, Bits& small) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(raw); ++i) {
    const uint32_t b = tf32::round_nearest_away_bits(__float_as_uint(raw(i)));
    big(i) = b;
    small(i) = tf32::round_nearest_away_bits(__float_as_uint(raw(i) - __uint_as_float(b)));
  }
}
template <class Raw, class Bits>
CUTLASS_DEVICE void split_a_exact(Raw const& raw, Bits& big, Bits& small) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(raw); ++i) {
    big(i) = __float_as_uint(tf32::truncate(raw(i)));
    small(i) = __float_as_uint(tf32::small_toward_zero(raw(i)));
  }
}

// One k-tile's products, one wgmma batch into a freshly zeroed partial: small_A big_B and big_A
// small_B for every k-block, then big_A big_B (the small parts' products while the accumulator is
// small; the header says why). b_big, b_small: (MMA,MMA_N,MMA_K) descriptor fragments of one stage.
template <class TiledMma, class FragA, class FragB, class FragBSmall, class Accum>
CUTLASS_DEVICE void issue_3xtf32_products(TiledMma& tiled_mma, FragA& a_big, FragA& a_small, FragB const& b_big,
                                          FragBSmall const& b_small, Accum& partial) {
  constexpr int kBlocks = decltype(size<2>(a_big))::value;
  warpgroup_fence_operand(a_big);
  warpgroup_fence_operand(a_small);
  warpgroup_fence_operand(partial);
  warpgroup_arrive();
  tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int k_block = 0; k_block < kBlocks; ++k_block) {
    cute::gemm(tiled_mma, a_small(_, _, k_block), b_big(_, _, k_block), partial);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
    cute::gemm(tiled_mma, a_big(_, _, k_block), b_small(_, _, k_block), partial);
  }
  CUTLASS_PRAGMA_UNROLL
  for (int k_block = 0; k_block < kBlocks; ++k_block) cute::gemm(tiled_mma, a_big(_, _, k_block), b_big(_, _, k_block), partial);
  warpgroup_commit_batch();
  warpgroup_fence_operand(partial);
  warpgroup_fence_operand(a_big);
  warpgroup_fence_operand(a_small);
}

// The smallest magnitude (fp32 bits without the sign) that round_nearest_away_bits takes to inf: A's
// words at or above it (inf, NaN, or a value whose rounding reaches inf) need the exact split.
constexpr uint32_t kFirstWordRoundingToInf3xTf32 = tf32::kExponentMask - (1u << (tf32::kDroppedBits - 1));

// The largest magnitude among A's raw words (a uint32_t view), for the vote on the exact split.
template <class Bits>
CUTLASS_DEVICE uint32_t max_magnitude_bits(Bits const& raw) {
  uint32_t magnitude = 0;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(raw); ++i) magnitude = max(magnitude, raw(i) & ~tf32::kSignMask);
  return magnitude;
}

// accum += partial, the promotion of a k-tile's wgmma accumulator into the fp32 one.
template <class Accum>
CUTLASS_DEVICE void promote_3xtf32(Accum& accum, Accum& partial) {
  warpgroup_fence_operand(partial);
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(accum); ++i) accum(i) += partial(i);
  warpgroup_fence_operand(partial);
}

// Base: CUTLASS's SS warp-specialized TMA mainloop (CollectiveMma<MainloopSm90TmaGmmaWarpSpecialized
// ...>) instantiated with uint32_t operands (raw words through TMA) and a TF32 TiledMma; it supplies
// the producer (TMA loads), the pipeline and the tail. Only the consumers' k-loop is replaced.
template <class Base>
struct Mainloop3xTf32 : Base {
  using typename Base::TiledMma;
  using typename Base::TileShape;
  using typename Base::SmemLayoutA;
  using typename Base::SmemLayoutB;
  using typename Base::SmemLayoutAtomB;
  using typename Base::MainloopPipeline;
  using typename Base::PipelineState;
  using typename Base::Params;
  using typename Base::DispatchPolicy;

  static constexpr int kMmaThreads = int(size(TiledMma{}));
  static constexpr int kWarpGroupThreads = cutlass::NumThreadsPerWarpGroup;
  static constexpr int kMmaWarpGroups = kMmaThreads / kWarpGroupThreads;
  // The consumers' TiledMma: the base's warpgroup tiling with the register-sourced TF32 atom. The
  // accumulator layout is the same, so the kernel's accumulators and epilogue apply unchanged.
  using TiledMmaRegisterA = decltype(make_tiled_mma(
      GMMA::rs_op_selector<tfloat32_t, tfloat32_t, float, TileShape>(), Layout<Shape<Int<kMmaWarpGroups>, _1, _1>>{}));
  static_assert(int(size(TiledMmaRegisterA{})) == kMmaThreads &&
                    std::is_same_v<typename TiledMmaRegisterA::AtomLayoutC_TV, typename TiledMma::AtomLayoutC_TV>,
                "the register-sourced TiledMma must keep the accumulator layout");

  // A's raw words into the registers of the RS wgmma's A fragment. K-major A: ldmatrix, one
  // LDSM.x4 per warp and k-block (the fragment of an m16 x k8 TF32 block is four 8 x 16-byte
  // matrices), instead of four 32-bit loads per thread: 4-5 % faster at the headline, the same bits.
  // An MN-major A (the backward's row-major kernel) has no 32-bit transposing ldmatrix, and takes
  // 32-bit loads.
  using SmemCopyAtomA = std::conditional_t<cutlass::gemm::detail::is_k_major_A<typename Base::StrideA>(),
                                           Copy_Atom<SM75_U32x4_LDSM_N, float>, Copy_Atom<AutoVectorizingCopy, float>>;

  // An MN-major B is transposed into K-major rings by the consumers (the header's comment).
  static constexpr bool kTransposeB = !cutlass::gemm::detail::is_k_major_B<typename Base::StrideB>();
  static constexpr int kRings = kTransposeB ? 2 : 1;

  // B's parts: rings of kRingSlots stages each, K-major. For a K-major B they are laid out as a
  // pipeline stage of B, so element i of the stage and of a slot are the same (n, k); the small parts'
  // ring comes first, then (MN-major B) the big parts'.
  static constexpr int kRingSlots = kRingSlots3xTf32;
  using RingAtomB = std::conditional_t<kTransposeB, GMMA::Layout_K_SW128_Atom<tfloat32_t>, SmemLayoutAtomB>;
  using SmemLayoutStageB = decltype(tile_to_shape(SmemLayoutAtomB{}, make_shape(shape<1>(TileShape{}), shape<2>(TileShape{}))));
  using SmemLayoutRingB = decltype(tile_to_shape(
      RingAtomB{}, make_shape(shape<1>(TileShape{}), shape<2>(TileShape{}), Int<kRingSlots>{})));
  static constexpr int kStageElementsB = int(size(SmemLayoutStageB{}));
  static_assert(int(cosize_v<SmemLayoutStageB>) == kStageElementsB, "a stage must be dense for the element-wise split");
  static_assert(int(cosize_v<SmemLayoutB>) == kStageElementsB * DispatchPolicy::Stages &&
                    int(cosize_v<SmemLayoutRingB>) == kStageElementsB * kRingSlots,
                "stages and ring slots must follow each other densely");
  // Each thread splits kSplitBatch float4 groups of a stage, loaded before any is stored: the compiler
  // cannot move a load above an earlier store (it cannot tell that the ring and the stage do not
  // overlap), so batching is what lets the loads' latencies overlap.
  static constexpr int kSplitBatch = kStageElementsB / 4 / kMmaThreads;
  static_assert(kSplitBatch * 4 * kMmaThreads == kStageElementsB, "every MMA thread splits whole float4 groups");
  static constexpr int kRingBytes = kStageElementsB * kRingSlots * kRings * int(sizeof(float));
  static_assert(kRingBytes == ring_bytes_3xtf32<TileShape, kRings>(), "stages_3xtf32 must leave room for the rings");

  struct SharedStorage {
    struct TensorStorage : Base::TensorStorage {
      // [small parts' ring | big parts' ring (MN-major B only)]
      alignas(1024) cute::array_aligned<typename TiledMma::ValTypeB, kStageElementsB * kRingSlots * kRings, 1024>
          smem_B_rings;
      // Per slot: an mbarrier every MMA thread arrives on once its share of the slot is written, and
      // the ring k-tile number of the last use whose tiles held a special value (inf, NaN, or an A word
      // whose rounding reaches inf).
      alignas(8) uint64_t ring_written[kRingSlots];
      uint32_t ring_special[kRingSlots];
    } tensors;
    using PipelineStorage = typename Base::PipelineStorage;
    PipelineStorage pipeline;
  };
  using TensorStorage = typename SharedStorage::TensorStorage;
  using PipelineStorage = typename SharedStorage::PipelineStorage;

  // This thread's share of B's small parts (fast split). Returns a value that is NaN when the share
  // holds inf or NaN (b - truncate(b) is NaN exactly then), else 0: one fused multiply-add a word
  // instead of a compare and an OR.
  CUTLASS_DEVICE static float write_small_parts_fast(float const* raw_stage, float* small, int thread_idx) {
    float4 const* raw4 = reinterpret_cast<float4 const*>(raw_stage);
    float4* small4 = reinterpret_cast<float4*>(small);
    float probe = 0.0f;
    auto small_of = [&probe](float b) {
      const float rest = b - __uint_as_float(__float_as_uint(b) & ~tf32::kDroppedMask);  // exact for finite b
      probe = __fmaf_rn(rest, 0.0f, probe);
      return __uint_as_float(tf32::round_nearest_away_bits(__float_as_uint(rest)));
    };
    float4 b[kSplitBatch];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kSplitBatch; ++j) b[j] = raw4[thread_idx + j * kMmaThreads];
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kSplitBatch; ++j)
      small4[thread_idx + j * kMmaThreads] = make_float4(small_of(b[j].x), small_of(b[j].y), small_of(b[j].z), small_of(b[j].w));
    return probe;
  }

  // The same share with the exact split's small parts (small_toward_zero: fp32's inf and NaN products).
  CUTLASS_DEVICE static void write_small_parts_exact(float const* raw_stage, float* small, int thread_idx) {
    float4 const* raw4 = reinterpret_cast<float4 const*>(raw_stage);
    float4* small4 = reinterpret_cast<float4*>(small);
    CUTLASS_PRAGMA_UNROLL
    for (int j = 0; j < kSplitBatch; ++j) {
      const float4 b = raw4[thread_idx + j * kMmaThreads];
      small4[thread_idx + j * kMmaThreads] = make_float4(tf32::small_toward_zero(b.x), tf32::small_toward_zero(b.y),
                                                         tf32::small_toward_zero(b.z), tf32::small_toward_zero(b.w));
    }
  }

  // MN-major B: thread t's 4 x 4 block of the (n, k) stage, n in [4 nb, 4 nb + 4), k in [4 kb, 4 kb + 4).
  // A warp's 16-byte accesses go to shared memory 8 lanes at a time, and each 8 must hit 8 different
  // 16-byte bank groups. Under the 128-byte swizzles a load (4 n at one k, MN-major) lands on group
  // (nb ^ k) % 8 and a store (4 k at one n, K-major) on (kb ^ n) % 8. Lanes 8p..8p+7 take nb = 8c + a,
  // kb = a ^ g (a = lane % 8; c, g from p): both are then permutations of 0..7, for every i. The first
  // mapping tried (8 nb by 4 kb a warp) put 4 lanes of each 8 on one group for every store: 4x the
  // wavefronts, and dW took 1.86 ms instead of 1.36 on the H200. Offsets in floats, from the stage's
  // and the slot's first element.
  struct TransposeOffsets {
    int load[4];   // (4 nb, 4 kb + i) in the MN-major stage
    int store[4];  // (4 nb + i, 4 kb) in a K-major ring slot
  };
  CUTLASS_DEVICE static TransposeOffsets transpose_offsets(int thread_idx) {
    static_assert(kMmaThreads == 256 && size<1>(TileShape{}) == 128 && size<2>(TileShape{}) == 32,
                  "the 4 x 4 blocks cover a 128 x 32 tile with 256 threads");
    // The base tiles an MN-major B's stages in its own order: offsets from its layout, at stage 0.
    auto stage = as_position_independent_swizzle_layout(SmemLayoutB{});
    auto slot = as_position_independent_swizzle_layout(SmemLayoutRingB{});
    const int eight = thread_idx / 8, a = thread_idx % 8;  // 32 groups of 8 lanes: (c, g) = (eight % 4, eight / 4)
    const int n0 = 4 * (8 * (eight % 4) + a), k0 = 4 * (a ^ (eight / 4));
    TransposeOffsets o;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) {
      o.load[i] = int(stage(n0, k0 + i, 0));
      o.store[i] = int(slot(n0 + i, k0, 0));
    }
    return o;
  }

  // Thread t's block of an MN-major stage, transposed into its big and small parts (both rounded to
  // nearest, as A's). Returns a value that is NaN when the block holds inf or NaN or a word whose
  // rounding reaches inf (b - big is then inf or NaN), else 0.
  CUTLASS_DEVICE static float write_parts_transposed_fast(float const* raw_stage, float* big, float* small,
                                                          TransposeOffsets const& o) {
    float4 v[4];
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = *reinterpret_cast<float4 const*>(raw_stage + o.load[i]);  // v[k](n)
    float probe = 0.0f;
    auto split = [&probe](float b, float& small_part) {
      const uint32_t big_bits = tf32::round_nearest_away_bits(__float_as_uint(b));
      const float rest = b - __uint_as_float(big_bits);
      probe = __fmaf_rn(rest, 0.0f, probe);
      small_part = __uint_as_float(tf32::round_nearest_away_bits(__float_as_uint(rest)));
      return __uint_as_float(big_bits);
    };
    auto column = [&](int n) {  // the 4 k of row n of the block
      return n == 0 ? make_float4(v[0].x, v[1].x, v[2].x, v[3].x)
           : n == 1 ? make_float4(v[0].y, v[1].y, v[2].y, v[3].y)
           : n == 2 ? make_float4(v[0].z, v[1].z, v[2].z, v[3].z)
                    : make_float4(v[0].w, v[1].w, v[2].w, v[3].w);
    };
    CUTLASS_PRAGMA_UNROLL
    for (int n = 0; n < 4; ++n) {
      const float4 b = column(n);
      float4 s4;
      const float4 b4 = make_float4(split(b.x, s4.x), split(b.y, s4.y), split(b.z, s4.z), split(b.w, s4.w));
      *reinterpret_cast<float4*>(big + o.store[n]) = b4;
      *reinterpret_cast<float4*>(small + o.store[n]) = s4;
    }
    return probe;
  }

  // The same block with the exact split (big truncated, small_toward_zero: fp32's inf and NaN products).
  CUTLASS_DEVICE static void write_parts_transposed_exact(float const* raw_stage, float* big, float* small,
                                                          TransposeOffsets const& o) {
    float4 v[4];
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = *reinterpret_cast<float4 const*>(raw_stage + o.load[i]);
    float const* w = reinterpret_cast<float const*>(v);  // w[4 k + n]
    CUTLASS_PRAGMA_UNROLL
    for (int n = 0; n < 4; ++n) {
      *reinterpret_cast<float4*>(big + o.store[n]) =
          make_float4(tf32::truncate(w[n]), tf32::truncate(w[4 + n]), tf32::truncate(w[8 + n]), tf32::truncate(w[12 + n]));
      *reinterpret_cast<float4*>(small + o.store[n]) =
          make_float4(tf32::small_toward_zero(w[n]), tf32::small_toward_zero(w[4 + n]),
                      tf32::small_toward_zero(w[8 + n]), tf32::small_toward_zero(w[12 + n]));
    }
  }

  // This CTA's k-tiles so far, over all its tiles: the ring's position.
  uint32_t ring_k_tiles_ = 0;

  static constexpr uint32_t kBarrier = static_cast<uint32_t>(cutlass::arch::ReservedNamedBarriers::TransformBarrier);

  CUTLASS_DEVICE static void sync_mma_threads() { cutlass::arch::NamedBarrier::sync(kMmaThreads, kBarrier); }

  // The consumers' k-loop (hides Base::mma): accum = A * B over k_tile_count k-tiles in 3xTF32.
  // Releases every stage but the last, as Base::mma does, so Base::mma_tail applies unchanged.
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(MainloopPipeline pipeline, PipelineState smem_pipe_read, FrgTensorC& accum, int k_tile_count,
                          int thread_idx, TensorStorage& shared_tensors, Params const& /*mainloop_params*/) {
    static_assert(is_rmem<FrgTensorC>::value, "C tensor must be rmem resident.");
    const int warp_group_idx = __shfl_sync(0xFFFFFFFF, thread_idx / kWarpGroupThreads, 0);
    Layout warp_group_thread_layout = make_layout(Int<kMmaWarpGroups>{}, Int<kWarpGroupThreads>{});

    // A as raw fp32 words (the copy into registers reads them as they are).
    Tensor sA = as_position_independent_swizzle_tensor(
        make_tensor(make_smem_ptr(reinterpret_cast<float*>(shared_tensors.smem_A.data())), SmemLayoutA{}));  // (BLK_M,BLK_K,PIPE)
    // What the wgmma read as B's big parts: the stage itself (K-major B), or the big parts' ring.
    auto ring_data = shared_tensors.smem_B_rings.data();
    Tensor sB_big = [&]() {
      if constexpr (kTransposeB)
        return make_tensor(make_smem_ptr(ring_data + kStageElementsB * kRingSlots), SmemLayoutRingB{});  // (..,SLOT)
      else
        return make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N,BLK_K,PIPE)
    }();
    Tensor sB_small = make_tensor(make_smem_ptr(ring_data), SmemLayoutRingB{});  // (BLK_N,BLK_K,SLOT)

    TiledMmaRegisterA tiled_mma;
    auto thread_mma = tiled_mma.get_thread_slice(thread_idx);
    auto warp_group_mma = tiled_mma.get_slice(warp_group_thread_layout(warp_group_idx));
    Tensor tCrA_big = thread_mma.partition_fragment_A(sA(_, _, Int<0>{}));                     // (MMA,MMA_M,MMA_K)
    Tensor tCrA_small = make_fragment_like(tCrA_big);
    Tensor tCrA_raw = make_fragment_like<float>(tCrA_big);
    auto smem_copy_A = make_tiled_copy_A(SmemCopyAtomA{}, tiled_mma);
    auto smem_thread_copy_A = smem_copy_A.get_thread_slice(thread_idx);
    Tensor tCsA_copy = smem_thread_copy_A.partition_S(sA);                                      // (CPY,CPY_M,CPY_K,PIPE)
    Tensor tCrA_raw_copy = smem_thread_copy_A.retile_D(tCrA_raw);                               // (CPY,CPY_M,CPY_K)
    Tensor tCrB = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sB_big));          // (MMA,MMA_N,MMA_K,PIPE|SLOT)
    Tensor tCrB_small = warp_group_mma.make_fragment_B(warp_group_mma.partition_B(sB_small));  // (MMA,MMA_N,MMA_K,SLOT)
    Tensor a_raw = recast<uint32_t>(tCrA_raw);
    Tensor a_big = recast<uint32_t>(tCrA_big);
    Tensor a_small = recast<uint32_t>(tCrA_small);

    // The wgmma accumulator of one k-tile, promoted into accum after it.
    Tensor partial = make_fragment_like(accum);
    clear(accum);
    PipelineState smem_pipe_release = smem_pipe_read;
    const TransposeOffsets transpose = transpose_offsets(thread_idx);  // used for an MN-major B only

    uint64_t* written = shared_tensors.ring_written;
    volatile uint32_t* special = shared_tensors.ring_special;
    if (ring_k_tiles_ == 0) {  // this CTA's first tile: set up the hand-over's barriers
      if (thread_idx == 0) {
        for (int s = 0; s < kRingSlots; ++s) {
          cutlass::arch::ClusterBarrier::init(&written[s], kMmaThreads);
          special[s] = 0xffffffffu;  // no ring k-tile has this number
        }
        cutlass::arch::fence_barrier_init();
      }
      sync_mma_threads();
    }
    CUTLASS_PRAGMA_NO_UNROLL
    for (int k_tile = 0; k_tile < k_tile_count; ++k_tile) {
      auto barrier_token = pipeline.consumer_try_wait(smem_pipe_read);
      pipeline.consumer_wait(smem_pipe_read, barrier_token);
      const int read_stage = smem_pipe_read.index();
      // Ring k-tiles count on across this CTA's tiles, so a slot's uses and stamps never repeat.
      const uint32_t ring = ring_k_tiles_;
      const int slot = int(ring % kRingSlots);

      // While k-tile t - 1's products run: A's raw words into registers, and this thread's share of
      // B's parts into slot t % 3. Its last readers were k-tile t - 3's products: this warpgroup
      // waited for its own before k-tile t - 2's, and the other warpgroup waited for its own before
      // writing its share of k-tile t - 1, which this thread waited for before k-tile t - 1's.
      copy(smem_copy_A, tCsA_copy(_, _, _, read_stage), tCrA_raw_copy);
      float const* raw_b = reinterpret_cast<float const*>(shared_tensors.smem_B.data()) + read_stage * kStageElementsB;
      float* small_b = reinterpret_cast<float*>(ring_data) + slot * kStageElementsB;
      float* big_b = reinterpret_cast<float*>(ring_data) + (kRingSlots + slot) * kStageElementsB;  // MN-major B only
      float probe;
      if constexpr (kTransposeB)
        probe = write_parts_transposed_fast(raw_b, big_b, small_b, transpose);
      else
        probe = write_small_parts_fast(raw_b, small_b, thread_idx);
      // A's vote from its raw words (a value of the split would keep the registers that the pending
      // products read): inf, NaN, or a magnitude that rounds to inf.
      if (probe != probe || max_magnitude_bits(a_raw) >= kFirstWordRoundingToInf3xTf32) special[slot] = ring;
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma (async proxy)
      cutlass::arch::ClusterBarrier::arrive(&written[slot]);

      warpgroup_wait<0>();
      if (k_tile > 0) {
        promote_3xtf32(accum, partial);
        pipeline.consumer_release(smem_pipe_release);
        ++smem_pipe_release;
      }
      warpgroup_fence_operand(tCrA_big);
      warpgroup_fence_operand(tCrA_small);
      split_a_nearest(tCrA_raw, a_big, a_small);
      cutlass::arch::ClusterBarrier::wait(&written[slot], (ring / kRingSlots) & 1u);
      if (special[slot] == ring) {
        // inf or NaN in this k-tile (every thread reads the same stamp): the exact split, as above.
        split_a_exact(tCrA_raw, a_big, a_small);
        if constexpr (kTransposeB)
          write_parts_transposed_exact(raw_b, big_b, small_b, transpose);
        else
          write_small_parts_exact(raw_b, small_b, thread_idx);
        cutlass::arch::fence_view_async_shared();
        sync_mma_threads();
      }
      // The products of k-tile t from the registers and ring slot.
      const int big_index = kTransposeB ? slot : read_stage;
      issue_3xtf32_products(tiled_mma, tCrA_big, tCrA_small, tCrB(_, _, _, big_index), tCrB_small(_, _, _, slot), partial);
      ++smem_pipe_read;
      ++ring_k_tiles_;
    }
    warpgroup_wait<0>();
    promote_3xtf32(accum, partial);
    warpgroup_fence_operand(accum);
  }
};

// The 3xTF32 mainloop over a CUTLASS sm90 TF32 mainloop `RefMainloop` (its tile, cluster, TiledMma
// and TMA copies), with raw 32-bit operand words, each operand's stride and shared-memory atom as
// given (the forward: the reference's own, K-major; the backward's row-major kernel: A MN-major, B
// K-major or MN-major) and as many pipeline stages as fit beside an epilogue of kEpilogueBytes.
template <class RefMainloop, int kEpilogueBytes, class StrideA = typename RefMainloop::StrideA,
          class SmemLayoutAtomA = typename RefMainloop::SmemLayoutAtomA, class StrideB = typename RefMainloop::StrideB,
          class SmemLayoutAtomB = typename RefMainloop::SmemLayoutAtomB>
using Mainloop3xTf32Over = Mainloop3xTf32<cutlass::gemm::collective::CollectiveMma<
    cutlass::gemm::MainloopSm90TmaGmmaWarpSpecialized<
        stages_3xtf32<typename RefMainloop::TileShape, kEpilogueBytes,
                      cutlass::gemm::detail::is_k_major_B<StrideB>() ? 1 : 2>(),
        typename RefMainloop::DispatchPolicy::ClusterShape, cutlass::gemm::KernelTmaWarpSpecializedCooperative>,
    typename RefMainloop::TileShape, uint32_t, StrideA, uint32_t, StrideB, typename RefMainloop::TiledMma,
    typename RefMainloop::GmemTiledCopyA, SmemLayoutAtomA, void, cute::identity, typename RefMainloop::GmemTiledCopyB,
    SmemLayoutAtomB, void, cute::identity>>;

}  // namespace fused::sm90::detail
