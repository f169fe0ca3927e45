// The backward's 3xTF32 GEMM (gemm_3xtf32_row_major.h): c = a b, row-major, run as c^T = b^T a^T.
// The mainloop is the forward's (mainloop_3xtf32.hpp): its A (here b, MN-major) reaches the
// register-sourced wgmma through a copy that partitions the shared-memory tile by its logical
// (m, k) coordinates, so only the TMA box's layout (MN-major, 128-byte swizzle) differs from the
// forward's; its B (here a) stays K-major, as TF32 wgmma requires. The epilogue is CUTLASS's plain
// one (alpha = 1, beta = 0, no source), storing c^T column-major, i.e. c row-major.
#include "kernels/sm90/gemm_3xtf32_row_major.h"

#include "kernels/sm90/gemm_stats_sm90.cuh"
#include "kernels/sm90/mainloop_3xtf32.hpp"

namespace fused::sm90 {
namespace detail {
namespace {

struct Gemm3xTf32RowMajor {
  using Reference = Tf32ReferenceFor3xTf32;
  using RefMainloop = typename Reference::CollectiveMainloop;
  using TileShape = typename Reference::TileShape;
  using ClusterShape = typename Reference::ClusterShape;
  // The kernel's (m, n, k) is the row-major problem's (n, m, k).
  using StrideA = cute::Stride<cute::_1, int64_t, int64_t>;  // (m, k, l): m contiguous (b as stored)
  using StrideB = typename RefMainloop::StrideB;             // (n, k, l): k contiguous (a as stored)
  using LayoutC = cutlass::layout::ColumnMajor;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutC, 4, float, LayoutC, 4,
      cutlass::epilogue::TmaWarpSpecializedCooperative>::CollectiveOp;

  using CollectiveMainloop = Mainloop3xTf32Over<RefMainloop, int(sizeof(typename CollectiveEpilogue::SharedStorage)),
                                                StrideA, cute::GMMA::Layout_MN_SW128_Atom<cute::tfloat32_t>>;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  static_assert(int(GemmKernel::SharedStorageSize) <= kSm90SharedMemoryBytes, "shared memory overflow");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
};

using Kernel = Gemm3xTf32RowMajor;

// The kernel's arguments for the row-major c (m, n) = a (m, k) b (k, n), or the error of the device
// query (the per-device SM count cache).
Status row_major_arguments(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                           float* c, int64_t ldc, typename Kernel::Gemm::Arguments& out) {
  using Gemm = typename Kernel::Gemm;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  const typename Kernel::StrideA stride_b{cute::_1{}, ldb, int64_t{0}};  // the kernel's A: b^T
  typename Kernel::StrideB stride_a{};                                   // the kernel's B: a
  cute::get<0>(stride_a) = lda;
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
                                 {reinterpret_cast<const uint32_t*>(b), stride_b, reinterpret_cast<const uint32_t*>(a),
                                  stride_a},
                                 {{1.0f, 0.0f}, nullptr, stride_c, c, stride_d},
                                 hw_info};
  return Status::Ok();
}

}  // namespace
}  // namespace detail

std::size_t gemm_3xtf32_row_major_workspace_bytes(int64_t m, int64_t n, int64_t k) {
  float* const stand_in = reinterpret_cast<float*>(std::uintptr_t{256});
  typename detail::Kernel::Gemm::Arguments args;
  if (!detail::row_major_arguments(m, n, k, stand_in, k, stand_in, n, stand_in, n, args).ok()) return 0;
  return detail::Kernel::Gemm::get_workspace_size(args);
}

Status gemm_3xtf32_row_major(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                             float* c, int64_t ldc, void* workspace, cudaStream_t stream) {
  typename detail::Kernel::Gemm::Arguments args;
  FUSED_RETURN_IF_ERROR(detail::row_major_arguments(m, n, k, a, lda, b, ldb, c, ldc, args));
  return detail::launch_gemm<typename detail::Kernel::Gemm>(args, workspace, stream);
}

}  // namespace fused::sm90
