// The backward's 3xTF32 GEMM (gemm_3xtf32_row_major.h): c = a b, row-major, run as c^T = b^T a^T.
// The mainloop is the forward's (mainloop_3xtf32.hpp): its A (here b, MN-major) reaches the
// register-sourced wgmma through a copy that partitions the shared-memory tile by its logical
// (m, k) coordinates, so only the TMA box's layout (MN-major, 128-byte swizzle) differs from the
// forward's. Its B (here a) is K-major when a is given as stored (dx = dy W), and MN-major when a is
// given transposed (dW = dy^T x reading dy): the consumers then transpose each B tile into K-major
// rings, as TF32 wgmma requires. The epilogue is CUTLASS's plain one (alpha = 1, beta = 0, no
// source), storing c^T column-major, i.e. c row-major. One instantiation per TU:
// gemm_3xtf32_row_major.cu (a as stored) and gemm_3xtf32_row_major_transposed_a.cu (FUSED_3XTF32_TRANSPOSED_A).
#pragma once

#include "kernels/sm90/gemm_3xtf32_row_major.h"
#include "kernels/sm90/gemm_stats_sm90.cuh"
#include "kernels/sm90/mainloop_3xtf32.hpp"

namespace fused::sm90::detail {

// One instantiation per TU: the including TU defines FUSED_3XTF32_TRANSPOSED_A (0: a as stored,
// 1: a given transposed) first. A plain struct, not a class template: nvcc's front end drops a
// `typename` inside CUTLASS's epilogue builder when the kernel type is built in a dependent context.
#if !defined(FUSED_3XTF32_TRANSPOSED_A)
#error "define FUSED_3XTF32_TRANSPOSED_A (0 or 1) before including gemm_3xtf32_row_major.cuh"
#endif

namespace {  // each TU's own kernel type

struct Gemm3xTf32RowMajor {
  static constexpr bool kTransposedA = FUSED_3XTF32_TRANSPOSED_A != 0;
  using Reference = Tf32ReferenceFor3xTf32;
  using RefMainloop = typename Reference::CollectiveMainloop;
  using TileShape = typename Reference::TileShape;
  using ClusterShape = typename Reference::ClusterShape;
  // The kernel's (m, n, k) is the row-major problem's (n, m, k).
  using StrideA = cute::Stride<cute::_1, int64_t, int64_t>;  // (m, k, l): m contiguous (b as stored)
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

  using CollectiveMainloop =
      Mainloop3xTf32Over<RefMainloop, int(sizeof(typename CollectiveEpilogue::SharedStorage)), StrideA,
                         cute::GMMA::Layout_MN_SW128_Atom<cute::tfloat32_t>, StrideB, SmemLayoutAtomB>;
  static_assert(CollectiveMainloop::kTransposeB == kTransposedA, "B's major follows a's layout");

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  static_assert(int(GemmKernel::SharedStorageSize) <= kSm90SharedMemoryBytes, "shared memory overflow");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // The kernel's arguments for the row-major c (m, n) = a (m, k) b (k, n) (a given as a^T (k, m)
  // when kTransposedA), or the error of the device query (the per-device SM count cache).
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
    out = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                                   {int(n), int(m), int(k), 1},
                                   {reinterpret_cast<const uint32_t*>(b), stride_b,
                                    reinterpret_cast<const uint32_t*>(a), stride_a},
                                   {{1.0f, 0.0f}, nullptr, stride_c, c, stride_d},
                                   hw_info};
    return Status::Ok();
  }

  static std::size_t workspace_bytes(int64_t m, int64_t n, int64_t k) {
    float* const stand_in = reinterpret_cast<float*>(std::uintptr_t{256});
    typename Gemm::Arguments args;
    if (!arguments(m, n, k, stand_in, kTransposedA ? m : k, stand_in, n, stand_in, n, args).ok()) return 0;
    return Gemm::get_workspace_size(args);
  }

  static Status run(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                    int64_t ldc, void* workspace, cudaStream_t stream) {
    typename Gemm::Arguments args;
    FUSED_RETURN_IF_ERROR(arguments(m, n, k, a, lda, b, ldb, c, ldc, args));
    return launch_gemm<Gemm>(args, workspace, stream);
  }
};

}  // namespace
}  // namespace fused::sm90::detail
