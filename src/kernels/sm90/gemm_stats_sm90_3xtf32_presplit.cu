// sm90 GEMM + column statistics, fp32 inputs through the presplit 3xTF32 mainloop
// (kernels/sm90/mainloop_3xtf32_presplit.hpp), run as y^T = W x^T: the kernel's A is W (N, K), split
// in registers; its B, the shared-memory operand, is x (M, K), whose small parts a pass writes into
// the workspace first (M x K floats: x's size, against W's for the other order). The kernel's D is y^T
// stored column-major, i.e. y row-major; the bias is a column broadcast and y's column statistics are
// the tile's row partials (kernels/epilogue/sm90_row_partials.hpp), in the 128-row partials format of
// the other 128x128 kernels. 128x128 cooperative tile, cluster 1x1, as the in-loop 3xTF32 kernel.
#include "kernels/sm90/gemm_stats_sm90.cuh"
#include "kernels/epilogue/sm90_row_partials.hpp"
#include "kernels/sm90/mainloop_3xtf32_presplit.hpp"
#include "kernels/sm90/split_small_parts_3xtf32.h"

namespace fused::sm90 {
namespace detail {
namespace {

struct GemmStats3xTf32PresplitKernel {
  using Reference = Tf32ReferenceFor3xTf32;
  using RefMainloop = typename Reference::CollectiveMainloop;
  static constexpr int kTileM = Reference::kTileM, kTileN = Reference::kTileN;
  static constexpr bool kSplitK = false;
  static_assert(kTileM == kTileN, "the partials' row tile (y's rows) is the kernel's N tile");
  using ElementBias = float;
  static constexpr int AlignmentAB = Reference::AlignmentAB, AlignmentD = Reference::AlignmentD;
  using TileShape = typename Reference::TileShape;
  using ClusterShape = typename Reference::ClusterShape;
  using LayoutD = cutlass::layout::ColumnMajor;  // y^T column-major: y row-major

  using Partials = fused::epilogue::Sm90RowPartials<TileShape, ElementBias>;
  using BiasBroadcast = cutlass::epilogue::fusion::Sm90ColBroadcast<0, TileShape, ElementBias, float>;
  using Plus = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, float, float, cutlass::FloatRoundStyle::round_to_nearest>;
  using FusionCallbacks = cutlass::epilogue::fusion::Sm90EVT<
      Plus, cutlass::epilogue::fusion::Sm90EVT<Partials, cutlass::epilogue::fusion::Sm90AccFetch>, BiasBroadcast>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, AlignmentD, float, LayoutD,
      AlignmentD, cutlass::epilogue::TmaWarpSpecializedCooperative, FusionCallbacks>::CollectiveOp;
  // A (W) and B (x) both K-major: the reference's strides and shared-memory atoms.
  using CollectiveMainloop = Mainloop3xTf32PresplitOver<RefMainloop, int(sizeof(typename CollectiveEpilogue::SharedStorage))>;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, CollectiveMainloop,
                                                          CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  static_assert(int(GemmKernel::SharedStorageSize) <= kSm90SharedMemoryBytes, "shared memory overflow");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  // The workspace: the kernel's own part, rounded up to 256 bytes, then x's small parts (M, K) dense
  // and the split pass's inf / NaN flag. run() sets their pointers in the arguments.
  static Status arguments(const GemmStatsArgs& a, typename Gemm::Arguments& out) {
    FUSED_RETURN_IF_ERROR(validate<GemmStats3xTf32PresplitKernel>(a));
    cutlass::KernelHardwareInfo hw_info;
    if (cudaGetDevice(&hw_info.device_id) != cudaSuccess)
      return {StatusCode::kCudaError, "sm90 gemm_stats (3xTF32): cudaGetDevice failed"};
    FUSED_RETURN_IF_ERROR(cuda::util::sm_count(hw_info.device_id, hw_info.sm_count));
    using StrideA = typename CollectiveMainloop::StrideA;
    using StrideB = typename CollectiveMainloop::StrideB;
    using StrideC = typename Gemm::GemmKernel::StrideC;
    using StrideD = typename Gemm::GemmKernel::StrideD;
    StrideA stride_w{};
    cute::get<0>(stride_w) = a.ldw;
    StrideB stride_x{}, stride_x_small{};
    cute::get<0>(stride_x) = a.ldx;
    cute::get<0>(stride_x_small) = a.K;
    StrideC stride_c{};
    StrideD stride_d{};
    cute::get<1>(stride_c) = a.ldy;
    cute::get<1>(stride_d) = a.ldy;
    const auto* bias = static_cast<const float*>(a.bias);
    typename FusionCallbacks::Arguments fusion_args{
        {{}, {a.partials.mean, a.partials.m2, bias}},  // row partials of acc (+ bias in the mean)
        {bias, 0.0f, {}},                              // bias column broadcast (null: adds 0)
        {}};                                           // plus
    out = typename Gemm::Arguments{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {int(a.N), int(a.M), int(a.K), 1},
        {static_cast<const uint32_t*>(a.w), stride_w, static_cast<const uint32_t*>(a.x), stride_x,
         nullptr, stride_x_small, nullptr},
        {fusion_args, nullptr, stride_c, a.y, stride_d},
        hw_info};
    return Status::Ok();
  }

  static std::size_t workspace_bytes(const GemmStatsArgs& given) {
    const GemmStatsArgs a = with_stand_ins(given);
    typename Gemm::Arguments args;
    if (!arguments(a, args).ok()) return 0;
    return presplit_parts_offset(Gemm::get_workspace_size(args)) + std::size_t(a.M * a.K) * 4 + 16;
  }

  static Status run(const GemmStatsArgs& a, void* workspace, cudaStream_t stream) {
    if (workspace == nullptr) return {StatusCode::kInvalidArgument, "sm90 gemm_stats (3xTF32): workspace required"};
    typename Gemm::Arguments args;
    FUSED_RETURN_IF_ERROR(arguments(a, args));
    // x's small parts and the flag go after the kernel's own workspace, whose size the arguments give.
    float* x_small = reinterpret_cast<float*>(static_cast<unsigned char*>(workspace) +
                                              presplit_parts_offset(Gemm::get_workspace_size(args)));
    uint32_t* x_special = reinterpret_cast<uint32_t*>(x_small + a.M * a.K);
    args.mainloop.ptr_B_small = reinterpret_cast<const uint32_t*>(x_small);
    args.mainloop.b_special = x_special;
    FUSED_RETURN_IF_ERROR(
        split_small_parts_3xtf32(static_cast<const float*>(a.x), a.M, a.K, a.ldx, x_small, x_special, stream));
    return launch_gemm<Gemm>(args, workspace, stream);
  }
};

}  // namespace
}  // namespace detail

namespace instances {

Status run_3xtf32_presplit_128x128(const GemmStatsArgs& args, void* workspace, cudaStream_t stream) {
  return detail::GemmStats3xTf32PresplitKernel::run(args, workspace, stream);
}

std::size_t workspace_3xtf32_presplit_128x128(const GemmStatsArgs& args) {
  return detail::GemmStats3xTf32PresplitKernel::workspace_bytes(args);
}

}  // namespace instances
}  // namespace fused::sm90
