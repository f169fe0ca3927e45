// The backward's 3xTF32 GEMM (gemm_3xtf32_row_major.h): c = a b, row-major, run as c^T = b^T a^T.
// The mainloop is the forward's (mainloop_3xtf32.hpp): its A (here b, MN-major) reaches the
// register-sourced wgmma through a copy that partitions the shared-memory tile by its logical
// (m, k) coordinates, so only the TMA box's layout (MN-major, 128-byte swizzle) differs from the
// forward's. Its B (here a) is K-major when a is given as stored (dx = dy W), and MN-major when a is
// given transposed (dW = dy^T x reading dy): the consumers then transpose each B tile into K-major
// rings, as TF32 wgmma requires. The epilogue is CUTLASS's plain one (alpha = 1, beta = 0, no
// source), storing c^T column-major, i.e. c row-major. With a as stored the kernel's B may also come
// with its small parts split beforehand (FUSED_3XTF32_PRESPLIT: mainloop_3xtf32_presplit.hpp; a pass
// writes them into the workspace). One instantiation per TU: gemm_3xtf32_row_major.cu (a as stored,
// split in the loop), gemm_3xtf32_row_major_presplit.cu (a as stored, presplit) and
// gemm_3xtf32_row_major_transposed_a.cu (FUSED_3XTF32_TRANSPOSED_A).
#pragma once

#include "kernels/sm90/gemm_3xtf32_row_major.h"
#include "kernels/sm90/gemm_stats_sm90.cuh"
#include "kernels/sm90/mainloop_3xtf32.hpp"
#include "kernels/sm90/mainloop_3xtf32_presplit.hpp"
#include "kernels/sm90/split_small_parts_3xtf32.h"

namespace fused::sm90::detail {

// One instantiation per TU: the including TU defines FUSED_3XTF32_TRANSPOSED_A (0: a as stored,
// 1: a given transposed) first. A plain struct, not a class template: nvcc's front end drops a
// `typename` inside CUTLASS's epilogue builder when the kernel type is built in a dependent context.
#if !defined(FUSED_3XTF32_TRANSPOSED_A)
#error "define FUSED_3XTF32_TRANSPOSED_A (0 or 1) before including gemm_3xtf32_row_major.cuh"
#endif
#if !defined(FUSED_3XTF32_PRESPLIT)
#define FUSED_3XTF32_PRESPLIT 0
#endif
#if FUSED_3XTF32_PRESPLIT && FUSED_3XTF32_TRANSPOSED_A
#error "the presplit kernel reads a as stored (its B must be K-major)"
#endif
// The presplit form's tile scheduler. 0: CUTLASS's persistent data-parallel scheduler.
// 1 (the default): its stream-K scheduler with its heuristic (StreamKScheduler in gemm_stats_sm90.cuh), which
// splits the K loops of the last two waves' tiles over every CTA where the last wave would be under half
// full, and for grids of a few tiles with long K picks split-K (e.g. 2 tiles split 32 ways). dW at the
// headline is 4096 tiles on 132 SMs: 31 full waves and 4 tiles, so 4 CTAs run a 32nd tile while 128 wait.
// H100, 1024 x 8192 x 8192, alternating builds: dW 1.081 / 1.089 ms against 1.100 / 1.129 data-parallel; dx
// (the last wave 88 % full) stays data-parallel. The first build of 1 ran the library's split-K fixup
// (SplitKScheduler), whose workspace query counts its extra slots only for split-K Arguments, so the
// heuristic's split-K wrote past what the workspace query gave (the row-major gtests' guard after the
// workspace catches it: dx 4 x 256 x 8192 changed 3.8 MB of it). 1 now runs CUTLASS's own fixup and workspace
// in every mode.
// 2: stream-K wherever the last wave is not full (dx 1.063 / 1.069 ms against 0.984 / 0.987: the
// split tiles' partial accumulators cost more than the quarter-empty wave; the forward kernel,
// measured the same way, 1254 against 1168 us).
#ifndef FUSED_3XTF32_STREAM_K
#define FUSED_3XTF32_STREAM_K 1
#endif

namespace {  // each TU's own kernel type

struct Gemm3xTf32RowMajor {
  static constexpr bool kTransposedA = FUSED_3XTF32_TRANSPOSED_A != 0;
  using Reference = Tf32ReferenceFor3xTf32;
  using RefMainloop = typename Reference::CollectiveMainloop;
  using TileShape = typename Reference::TileShape;
  using ClusterShape = typename Reference::ClusterShape;
  static constexpr int64_t kTileM = cute::size<0>(TileShape{}), kTileN = cute::size<1>(TileShape{});
  // The kernel's (m, n, k) is the row-major problem's (n, m, k).
  using StrideA = cute::Stride<cute::_1, int64_t, int64_t>;  // (m, k, l): m contiguous (b as stored)
  using SmemLayoutAtomA = cute::GMMA::Layout_MN_SW128_Atom<cute::tfloat32_t>;
  // (n, k, l): k contiguous (a as stored), or n contiguous (a given as a^T, row-major)
  using StrideB = std::conditional_t<kTransposedA, cute::Stride<cute::_1, int64_t, int64_t>,
                                     typename RefMainloop::StrideB>;
  using SmemLayoutAtomB = std::conditional_t<kTransposedA, cute::GMMA::Layout_MN_SW128_Atom<cute::tfloat32_t>,
                                             typename RefMainloop::SmemLayoutAtomB>;
  using LayoutC = cutlass::layout::ColumnMajor;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutC, 4, float, LayoutC, 4,
      cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

#if FUSED_3XTF32_PRESPLIT
  static constexpr bool kPresplit = true;
  using CollectiveMainloop =
      Mainloop3xTf32PresplitOver<RefMainloop, int(sizeof(typename CollectiveEpilogue::SharedStorage)), StrideA,
                                 SmemLayoutAtomA>;
#else
  static constexpr bool kPresplit = false;
  using CollectiveMainloop =
      Mainloop3xTf32Over<RefMainloop, int(sizeof(typename CollectiveEpilogue::SharedStorage)), StrideA,
                         SmemLayoutAtomA, StrideB, SmemLayoutAtomB>;
  static_assert(CollectiveMainloop::kTransposeB == kTransposedA, "B's major follows a's layout");
#endif

  static constexpr int kStreamK = kPresplit ? FUSED_3XTF32_STREAM_K : 0;
  using SchedulerTag = std::conditional_t<kStreamK != 0, StreamKSchedulerTag, cutlass::gemm::PersistentScheduler>;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, SchedulerTag>;
  static_assert(int(GemmKernel::SharedStorageSize) <= kSm90SharedMemoryBytes, "shared memory overflow");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // The presplit form's part of the workspace, after the kernel's own (rounded up to 256 bytes): a's
  // small parts (m, k) with row stride ld_small(k), then the pass's inf / NaN flag; with a given
  // transposed, first a itself, transposed by the pass into the same layout.
  static int64_t ld_small(int64_t k) { return (k + 3) / 4 * 4; }
  static std::size_t presplit_bytes(int64_t m, int64_t k, bool a_given_transposed) {
    return kPresplit ? std::size_t(m * ld_small(k)) * 4 * (a_given_transposed ? 2 : 1) + 16 : 0;
  }

  // The kernel's arguments for the row-major c (m, n) = a (m, k) b (k, n) (a given as a^T (k, m)
  // when kTransposedA), or the error of the device query (the per-device SM count cache). The
  // presplit form also reads a's small parts (m, k, row stride ld_small(k)) and the pass's flag: run()
  // sets their pointers, which are in the workspace after the part whose size these arguments give.
  static Status arguments(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                          float* c, int64_t ldc, typename Gemm::Arguments& out) {
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    const StrideA stride_b{cute::_1{}, ldb, int64_t{0}};  // the kernel's A: b^T
    // The kernel's B: a. Element (i, p) of a at a[p * lda + i] (given transposed), or a[i * lda + p].
#if FUSED_3XTF32_TRANSPOSED_A
    const StrideB stride_a{cute::_1{}, lda, int64_t{0}};
#else
    StrideB stride_a{};
    cute::get<0>(stride_a) = lda;
#endif
    StrideC stride_c{};
    StrideD stride_d{};
    cute::get<1>(stride_c) = ldc;
    cute::get<1>(stride_d) = ldc;
    cutlass::KernelHardwareInfo hw_info;
    if (cudaGetDevice(&hw_info.device_id) != cudaSuccess)
      return {StatusCode::kCudaError, "3xTF32 GEMM: cudaGetDevice failed"};
    FUSED_RETURN_IF_ERROR(cuda::util::sm_count(hw_info.device_id, hw_info.sm_count));
#if FUSED_3XTF32_PRESPLIT
    StrideB stride_a_small{};
    cute::get<0>(stride_a_small) = ld_small(k);
    typename CollectiveMainloop::Arguments mainloop{reinterpret_cast<const uint32_t*>(b), stride_b,
                                                    reinterpret_cast<const uint32_t*>(a), stride_a,
                                                    nullptr, stride_a_small, nullptr};
#else
    typename CollectiveMainloop::Arguments mainloop{reinterpret_cast<const uint32_t*>(b), stride_b,
                                                    reinterpret_cast<const uint32_t*>(a), stride_a};
#endif
    out = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                                   {int(n), int(m), int(k), 1},
                                   mainloop,
                                   {{1.0f, 0.0f}, nullptr, stride_c, c, stride_d},
                                   hw_info};
    // Large grids (swizzles_large_grid; dW at the headline: 64 x 64 tiles): swizzle 4, so that the CTAs
    // running together share their operand tiles in L2. Nsight Compute had that dW at 90 % of L2 and
    // 64 % of DRAM throughput (dx, a 64 x 8 grid: 60 % and 18 %); H100, dW 1024 x 8192 x 8192: 1.111
    // against 1.165 ms, the pass included; dx unchanged. The kernel's (m, n) is the problem's (n, m).
    if (swizzles_large_grid(n, m, kTileM, kTileN)) out.scheduler.max_swizzle_size = 4;
#if FUSED_3XTF32_PRESPLIT && FUSED_3XTF32_STREAM_K  // (not `if constexpr`: a plain struct, both branches compile)
    using Scheduler = typename Gemm::GemmKernel::TileScheduler;
    out.scheduler.reduction_mode = Scheduler::ReductionMode::Deterministic;  // same bits run to run
    out.scheduler.decomposition_mode =
        kStreamK == 2 ? Scheduler::DecompositionMode::StreamK : Scheduler::DecompositionMode::Heuristic;
#endif
    return Status::Ok();
  }

  // a_given_transposed (presplit form only): a is given as a^T (k, m) with row stride lda, and the pass
  // writes a as stored beside its small parts (the kernel then reads that copy).
  static std::size_t workspace_bytes(int64_t m, int64_t n, int64_t k, bool a_given_transposed = false) {
    float* const stand_in = reinterpret_cast<float*>(std::uintptr_t{256});
    typename Gemm::Arguments args;
    if (!arguments(m, n, k, stand_in, kTransposedA ? m : ld_small(k), stand_in, n, stand_in, n, args).ok())
      return 0;
    const std::size_t kernel_bytes = Gemm::get_workspace_size(args);
    return kPresplit ? presplit_parts_offset(kernel_bytes) + presplit_bytes(m, k, a_given_transposed) : kernel_bytes;
  }

  static Status run(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                    int64_t ldc, void* workspace, cudaStream_t stream, bool a_given_transposed = false) {
    typename Gemm::Arguments args;
#if FUSED_3XTF32_PRESPLIT  // (not `if constexpr`: the in-loop mainloop's arguments have no small parts)
    {
      // The workspace's layout (workspace_bytes): after the kernel's own part, [a as stored | ] a's
      // small parts, then the flag. With a given transposed the kernel reads the pass's copy of a.
      FUSED_RETURN_IF_ERROR(arguments(m, n, k, a, a_given_transposed ? ld_small(k) : lda, b, ldb, c, ldc, args));
      auto* base = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                                            presplit_parts_offset(Gemm::get_workspace_size(args)));
      const int64_t elements = m * ld_small(k);
      float* const a_small = a_given_transposed ? base + elements : base;
      uint32_t* const a_special = reinterpret_cast<uint32_t*>(a_small + elements);
      if (a_given_transposed) {
        FUSED_RETURN_IF_ERROR(
            transpose_split_small_parts_3xtf32(a, m, k, lda, base, a_small, ld_small(k), a_special, stream));
        args.mainloop.ptr_B = reinterpret_cast<const uint32_t*>(base);
      } else {
        FUSED_RETURN_IF_ERROR(split_small_parts_3xtf32(a, m, k, lda, a_small, a_special, stream));
      }
      args.mainloop.ptr_B_small = reinterpret_cast<const uint32_t*>(a_small);
      args.mainloop.b_special = a_special;
    }
#else
    (void)a_given_transposed;  // the in-loop forms read a in the instantiation's own layout (kTransposedA)
    FUSED_RETURN_IF_ERROR(arguments(m, n, k, a, lda, b, ldb, c, ldc, args));
#endif
    return launch_gemm<Gemm>(args, workspace, stream);
  }
};

}  // namespace
}  // namespace fused::sm90::detail
