// Launch template of the sm90 GEMM + column-statistics kernel:
//   y = x * W^T + bias  (fp32 accumulation, fp32 y)   and per-CTA-tile column partials (mean, M2) of y.
// CUTLASS 3.x: CollectiveBuilder, TMA, warp-specialized cooperative kernel, persistent tile scheduler,
// epilogue visitor tree  y = Sm90ColumnPartials(acc) + RowBroadcast(bias).
// Included by exactly one TU per element type (gemm_stats_sm90_{bf16,fp16,tf32}.cu).
#pragma once

#include <atomic>
#include <cstdint>

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"

#include "kernels/epilogue/sm90_column_partials.hpp"
#include "kernels/sm90/gemm_stats_sm90.h"

namespace fused::sm90::detail {

using namespace cute;

// ElementIn: cutlass::bfloat16_t, cutlass::half_t, or float (tf32 tensor-core MMA).
template <class ElementIn>
struct GemmStatsKernel {
  using ElementA = ElementIn;                     // x (M,K) row-major: K-major
  using LayoutA = cutlass::layout::RowMajor;
  using ElementB = ElementIn;                     // W (N,K) row-major == B (K,N) column-major: K-major
  using LayoutB = cutlass::layout::ColumnMajor;
  using ElementBias = ElementIn;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementD = float;                         // y (M,N) row-major
  using LayoutD = cutlass::layout::RowMajor;
  using ElementC = void;                          // no source tensor

  static constexpr int AlignmentAB = 128 / cutlass::sizeof_bits<ElementIn>::value;   // 16-byte TMA rows
  static constexpr int AlignmentD = 128 / cutlass::sizeof_bits<ElementD>::value;

  // 256x128 cooperative tile (two consumer warpgroups of 128x128), 128-byte K slices (bf16/fp16: 64,
  // tf32: 32), cluster 2x1x1 (W tile multicast to both CTAs of the cluster).
  using TileShape = Shape<_256, _128, Int<128 / int(sizeof(ElementIn))>>;
  using ClusterShape = Shape<_2, _1, _1>;
  static_assert(size<0>(TileShape{}) == kCtaTileM && size<1>(TileShape{}) == kCtaTileN,
                "partials format (gemm_stats_sm90.h) and kernel tile disagree");

  using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  static constexpr auto RoundStyle = cutlass::FloatRoundStyle::round_to_nearest;

  // Epilogue visitor tree: y = partials(acc) + bias.  The statistics see acc (before the bias).
  using AccFetch = cutlass::epilogue::fusion::Sm90AccFetch;
  using Partials = fused::epilogue::Sm90ColumnPartials<TileShape, ElementBias>;
  using BiasBroadcast = cutlass::epilogue::fusion::Sm90RowBroadcast<0, TileShape, ElementBias, ElementCompute>;
  using Plus = cutlass::epilogue::fusion::Sm90Compute<cutlass::plus, ElementD, ElementCompute, RoundStyle>;
  using FusionCallbacks = cutlass::epilogue::fusion::Sm90EVT<
      Plus, cutlass::epilogue::fusion::Sm90EVT<Partials, AccFetch>, BiasBroadcast>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto,
      ElementAccumulator, ElementCompute,
      ElementC, LayoutD, AlignmentD,
      ElementD, LayoutD, AlignmentD,
      EpilogueSchedule,
      FusionCallbacks>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementA, LayoutA, AlignmentAB,
      ElementB, LayoutB, AlignmentAB,
      ElementAccumulator,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<
      Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue, cutlass::gemm::PersistentScheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;

  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
};

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// SM count per device, queried once (cudaDeviceGetAttribute is cheap but not free).
inline Status sm_count(int device, int& count) {
  static std::atomic<int> cache[64] = {};
  if (device >= 0 && device < 64) {
    int c = cache[device].load(std::memory_order_relaxed);
    if (c > 0) { count = c; return Status::Ok(); }
  }
  int c = 0;
  if (cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || c <= 0) {
    return {StatusCode::kCudaError, "sm90 gemm_stats: cudaDeviceGetAttribute(MultiProcessorCount) failed"};
  }
  if (device >= 0 && device < 64) cache[device].store(c, std::memory_order_relaxed);
  count = c;
  return Status::Ok();
}

template <class ElementIn>
Status validate(const GemmStatsArgs& a) {
  using K = GemmStatsKernel<ElementIn>;
  constexpr int64_t kIntMax = 0x7fffffff;
  if (a.M <= 0 || a.N <= 0 || a.K <= 0)
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: M, N, K must be positive"};
  if (a.M > kIntMax || a.N > kIntMax || a.K > kIntMax)
    return {StatusCode::kNotSupported, "sm90 gemm_stats: M, N, K must fit in int32"};
  if (a.x == nullptr || a.w == nullptr || a.y == nullptr)
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: x, w, y must be non-null"};
  if (a.ldx < a.K || a.ldw < a.K || a.ldy < a.N)
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: leading dimension smaller than the row"};
  if (a.K % K::AlignmentAB != 0 || a.ldx % K::AlignmentAB != 0 || a.ldw % K::AlignmentAB != 0)
    return {StatusCode::kNotSupported, "sm90 gemm_stats: K, ldx, ldw must be multiples of 16 bytes (TMA)"};
  if (a.N % K::AlignmentD != 0 || a.ldy % K::AlignmentD != 0)
    return {StatusCode::kNotSupported, "sm90 gemm_stats: N and ldy must be multiples of 4 (TMA store of y)"};
  if (!aligned16(a.x) || !aligned16(a.w) || !aligned16(a.y))
    return {StatusCode::kNotSupported, "sm90 gemm_stats: x, w, y must be 16-byte aligned"};
  const ColumnStatsPartials& p = a.partials;
  if ((p.mean == nullptr) != (p.m2 == nullptr))
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: partials.mean and partials.m2 must both be set or both null"};
  if (p.mean != nullptr) {
    if (p.row_tile != kCtaTileM || p.ld != partials_ld(a.N) ||
        p.num_row_tiles < (a.M + kCtaTileM - 1) / kCtaTileM)
      return {StatusCode::kInvalidArgument,
              "sm90 gemm_stats: partials geometry must be [ceil(M/partials_row_tile()), partials_ld(N)]"};
  }
  return Status::Ok();
}

template <class ElementIn>
Status make_arguments(const GemmStatsArgs& a, typename GemmStatsKernel<ElementIn>::Gemm::Arguments& out) {
  using KC = GemmStatsKernel<ElementIn>;
  using Gemm = typename KC::Gemm;
  Status st = validate<ElementIn>(a);
  if (!st.ok()) return st;

  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess)
    return {StatusCode::kCudaError, "sm90 gemm_stats: cudaGetDevice failed"};
  cutlass::KernelHardwareInfo hw_info;
  hw_info.device_id = device;
  st = sm_count(device, hw_info.sm_count);
  if (!st.ok()) return st;

  const int M = int(a.M), N = int(a.N), K = int(a.K);
  typename KC::StrideA stride_a = make_stride(a.ldx, _1{}, a.ldx * a.M);
  typename KC::StrideB stride_b = make_stride(a.ldw, _1{}, a.ldw * a.N);
  typename KC::StrideC stride_c = make_stride(a.ldy, _1{}, a.ldy * a.M);
  typename KC::StrideD stride_d = make_stride(a.ldy, _1{}, a.ldy * a.M);

  using ElementBias = typename KC::ElementBias;
  const auto* bias = static_cast<const ElementBias*>(a.bias);
  const auto* x = static_cast<const ElementIn*>(a.x);
  const auto* w = static_cast<const ElementIn*>(a.w);

  typename KC::FusionCallbacks::Arguments fusion_args{
      {                                                  // Sm90EVT<Partials, AccFetch>
          {},                                            //   acc
          {a.partials.mean, a.partials.m2, bias}},       //   column partials of acc (+ bias in the mean)
      {bias, ElementBias(0), {}},                        // bias row broadcast (null: adds 0)
      {}};                                               // plus

  out = typename Gemm::Arguments{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {M, N, K, 1},
      {x, stride_a, w, stride_b},
      {fusion_args, nullptr, stride_c, a.y, stride_d},
      hw_info};
  return Status::Ok();
}

template <class ElementIn>
std::size_t workspace_bytes(GemmStatsArgs a) {
  // The workspace depends on the problem shape only: the caller may ask before it has buffers,
  // so stand in aligned non-null pointers and dense strides where none are given yet.
  void* const stand_in = reinterpret_cast<void*>(std::uintptr_t{256});
  if (a.x == nullptr) a.x = stand_in;
  if (a.w == nullptr) a.w = stand_in;
  if (a.y == nullptr) a.y = static_cast<float*>(stand_in);
  if (a.ldx == 0) a.ldx = a.K;
  if (a.ldw == 0) a.ldw = a.K;
  if (a.ldy == 0) a.ldy = a.N;
  using Gemm = typename GemmStatsKernel<ElementIn>::Gemm;
  typename Gemm::Arguments args;
  if (!make_arguments<ElementIn>(a, args).ok()) return 0;
  return Gemm::get_workspace_size(args);
}

template <class ElementIn>
Status run(const GemmStatsArgs& a, void* workspace, cudaStream_t stream) {
  using Gemm = typename GemmStatsKernel<ElementIn>::Gemm;
  typename Gemm::Arguments args;
  Status st = make_arguments<ElementIn>(a, args);
  if (!st.ok()) return st;

  if (Gemm::can_implement(args) != cutlass::Status::kSuccess)
    return {StatusCode::kNotSupported, "sm90 gemm_stats: CUTLASS can_implement rejected the problem"};
  if (Gemm::get_workspace_size(args) > 0 && workspace == nullptr)
    return {StatusCode::kInvalidArgument, "sm90 gemm_stats: workspace required (gemm_workspace_bytes)"};

  Gemm gemm;
  if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess)
    return {StatusCode::kCudaError, "sm90 gemm_stats: CUTLASS initialize failed"};
  if (gemm.run(stream) != cutlass::Status::kSuccess)
    return {StatusCode::kCudaError, "sm90 gemm_stats: kernel launch failed"};
  return Status::Ok();
}

}  // namespace fused::sm90::detail
