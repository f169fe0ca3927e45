// sm90 GEMM + column statistics, fp32 inputs through the 3xTF32 mainloop (kernels/sm90/mainloop_3xtf32.hpp),
// 128x128 cooperative tile, cluster 1x1; the statistics epilogue is the tf32 kernel's.
#include "kernels/sm90/gemm_stats_sm90.cuh"
#include "kernels/sm90/mainloop_3xtf32.hpp"

namespace fused::sm90 {
namespace detail {
namespace {

struct GemmStats3xTf32Kernel {
  using Reference = Tf32ReferenceFor3xTf32;
  using RefMainloop = typename Reference::CollectiveMainloop;
  static constexpr int kTileM = Reference::kTileM, kTileN = Reference::kTileN;
  static constexpr bool kSplitK = false;
  using ElementA = uint32_t;  // raw fp32 words: a UINT32 TMA copy keeps the low mantissa bits
  using ElementB = uint32_t;
  using ElementBias = typename Reference::ElementBias;
  static constexpr int AlignmentAB = Reference::AlignmentAB, AlignmentD = Reference::AlignmentD;
  using TileShape = typename Reference::TileShape;
  using ClusterShape = typename Reference::ClusterShape;
  using FusionCallbacks = typename Reference::FusionCallbacks;
  using CollectiveEpilogue = typename Reference::CollectiveEpilogue;

  using CollectiveMainloop = Mainloop3xTf32Over<RefMainloop, int(sizeof(typename CollectiveEpilogue::SharedStorage))>;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  static_assert(int(GemmKernel::SharedStorageSize) <= kSm90SharedMemoryBytes, "shared memory overflow");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
};

}  // namespace
}  // namespace detail

namespace instances {

Status run_3xtf32_128x128(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::run_kernel<detail::GemmStats3xTf32Kernel>(args, workspace, stream);
}

std::size_t workspace_3xtf32_128x128(const GemmStatsArgs& args) {
  return detail::kernel_workspace_bytes<detail::GemmStats3xTf32Kernel>(args);
}

}  // namespace instances
}  // namespace fused::sm90
