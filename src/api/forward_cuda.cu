// The CUDA forward: carves the workspace, runs [1] (sm90 GEMM + statistics epilogue, or cuBLASLt's
// GEMM + the generic column partials), [2] finalize and [3] row softmax, all stream-ordered, no
// host synchronisation, no allocation.
#include <cuda_runtime_api.h>

#include "api/dispatch.h"
#include "api/forward_steps.h"
#include "fused/gemm_bn_softmax.h"
#include "kernels/generic/cublaslt_gemm.h"
#include "util/cuda_check.h"
#include "util/nvtx.h"
#if defined(FUSED_WITH_SM90)
#include "kernels/sm90/gemm_stats_sm90.h"
#endif

namespace fused::cuda {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

#if defined(FUSED_WITH_SM90)
// The sm90 kernel shape for this problem on the current device (properties cached per device).
Status sm90_tile(const ForwardProblem& p, sm90::Sm90Tile& tile) {
  int device = 0;
  FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "cudaGetDevice failed"));
  DeviceProperties props;
  FUSED_RETURN_IF_ERROR(device_properties(device, &props));
  tile = sm90::choose_tile(p.M, p.N, props.multiprocessor_count);
  return Status::Ok();
}
#endif

// Partials geometry of a path.
Status partials_geometry(const ForwardProblem& p, GemmPath path, ColumnStatsPartials& g) {
  g = ColumnStatsPartials{};
#if defined(FUSED_WITH_SM90)
  if (path == GemmPath::kSm90) {
    sm90::Sm90Tile tile = sm90::Sm90Tile::k256x128;
    FUSED_RETURN_IF_ERROR(sm90_tile(p, tile));
    g.row_tile = sm90::partials_row_tile(tile);
    g.ld = sm90::partials_ld(p.N);
  }
#endif
  if (path == GemmPath::kGeneric) {
    g.row_tile = 128;
    g.ld = (p.N + 3) / 4 * 4;
  }
  if (g.row_tile > 0) g.num_row_tiles = util::ceil_div(p.M, g.row_tile);
  return Status::Ok();
}

#if defined(FUSED_WITH_SM90)
// The kernel shape follows the partials geometry, so that both always agree.
sm90::GemmStatsArgs gemm_args(const ForwardProblem& p, const ForwardBuffers& b, const ColumnStatsPartials& partials) {
  sm90::GemmStatsArgs a;
  a.M = p.M; a.N = p.N; a.K = p.K;
  a.x = b.x; a.ldx = b.ldx; a.w = b.weight; a.ldw = b.ldw; a.bias = b.bias;
  a.y = b.y; a.ldy = b.ldy;
  a.tile = partials.row_tile == sm90::partials_row_tile(sm90::Sm90Tile::k128x128) ? sm90::Sm90Tile::k128x128
                                                                                  : sm90::Sm90Tile::k256x128;
  return a;
}
#endif

// The path's own GEMM workspace (after the partials and the folded map).
std::size_t gemm_bytes(const ForwardProblem& p, GemmPath path, const ColumnStatsPartials& partials,
                       bool include_cublaslt_workspace) {
#if defined(FUSED_WITH_SM90)
  if (path == GemmPath::kSm90)
    return align_up(sm90::gemm_workspace_bytes(p.dtype, gemm_args(p, ForwardBuffers{}, partials)));
#else
  (void)partials;
#endif
  if (path == GemmPath::kGeneric)
    return align_up(sizeof(float) * static_cast<std::size_t>(p.N)) +
           (include_cublaslt_workspace ? align_up(generic::cublaslt_workspace_bytes(p)) : 0);
  return 0;
}

// [1] of the generic path: y = x W^T + b through cuBLASLt (bias in fp32 from `bias_f32`, a
// workspace row), then the column partials when batch statistics are used.
Status generic_gemm(const ForwardProblem& p, const ForwardBuffers& b, char* gemm_workspace, std::size_t size,
                    cudaStream_t stream) {
  float* bias_f32 = nullptr;
  if (b.bias != nullptr) {
    if (p.dtype == ElementType::kFloat32 && util::aligned16(b.bias)) {
      bias_f32 = static_cast<float*>(const_cast<void*>(b.bias));
    } else {  // cuBLASLt's bias epilogue reads the bias in y's type, and fastest from aligned memory
      bias_f32 = reinterpret_cast<float*>(gemm_workspace);
      FUSED_RETURN_IF_ERROR(bias_rows(b.bias, p.dtype, bias_f32, p.N, 1, p.N, stream));
    }
  }
  const std::size_t bias_bytes = align_up(sizeof(float) * static_cast<std::size_t>(p.N));
  if (p.K == 0) {  // no product: y = b (or 0)
    if (b.bias != nullptr) return bias_rows(b.bias, p.dtype, b.y, b.ldy, p.M, p.N, stream);
    return util::cuda_status(cudaMemset2DAsync(b.y, sizeof(float) * b.ldy, 0, sizeof(float) * p.N, p.M, stream),
                             "cudaMemset2DAsync(y)");
  }
  if (b.cublaslt_workspace != nullptr)
    return generic::gemm_bias(p, b, bias_f32, static_cast<char*>(b.cublaslt_workspace), b.cublaslt_workspace_size,
                              stream);
  return generic::gemm_bias(p, b, bias_f32, gemm_workspace + bias_bytes, size - bias_bytes, stream);
}

}  // namespace

std::size_t workspace_bytes(const ForwardProblem& p, GemmPath path, bool include_cublaslt_workspace) {
  ColumnStatsPartials g;
  if (!partials_geometry(p, path, g).ok()) return 0;
  return 2 * align_up(sizeof(float) * static_cast<std::size_t>(g.num_row_tiles * g.ld)) +
         2 * align_up(sizeof(float) * static_cast<std::size_t>(p.N)) + gemm_bytes(p, path, g, include_cublaslt_workspace);
}

Status forward(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn, GemmPath path,
               void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  FUSED_RETURN_IF_ERROR(validate(p, b, bn));
  if (path != GemmPath::kSm90 && path != GemmPath::kGeneric) return {StatusCode::kInvalidArgument, "unknown GemmPath"};
  if (path == GemmPath::kSm90) {
    int device = 0;
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
    DeviceProperties props;
    FUSED_RETURN_IF_ERROR(device_properties(device, &props));
    FUSED_RETURN_IF_ERROR(sm90_device_ok(props));
    FUSED_RETURN_IF_ERROR(sm90_can_implement(p, b));
  }
  if (workspace_size < workspace_bytes(p, path, b.cublaslt_workspace == nullptr) || (reinterpret_cast<uintptr_t>(workspace) % kAlign) != 0)
    return {StatusCode::kInvalidArgument, "workspace too small or not 256-byte aligned (workspace_bytes)"};
  if (p.N == 0) return Status::Ok();

  // Workspace: [partials.mean | partials.m2 | a | c | the path's GEMM workspace]
  ColumnStatsPartials partials;
  FUSED_RETURN_IF_ERROR(partials_geometry(p, path, partials));
  auto* cursor = static_cast<char*>(workspace);
  auto take = [&](std::size_t bytes) {
    char* ptr = cursor;
    cursor += align_up(bytes);
    return ptr;
  };
  const std::size_t partial_bytes = sizeof(float) * static_cast<std::size_t>(partials.num_row_tiles * partials.ld);
  partials.mean = reinterpret_cast<float*>(take(partial_bytes));
  partials.m2 = reinterpret_cast<float*>(take(partial_bytes));
  const ColumnAffine affine{b.save_mean, reinterpret_cast<float*>(take(sizeof(float) * p.N)),
                            reinterpret_cast<float*>(take(sizeof(float) * p.N))};
  const std::size_t gemm_size = workspace_size - static_cast<std::size_t>(cursor - static_cast<char*>(workspace));
  const bool batch_stats = bn.uses_batch_stats();

  if (p.M > 0) {
    if (path == GemmPath::kSm90) {
#if defined(FUSED_WITH_SM90)
      util::NvtxRange range("fused::gemm_stats_sm90");
      sm90::GemmStatsArgs args = gemm_args(p, b, partials);
      if (batch_stats) args.partials = partials;
      switch (p.dtype) {
        case ElementType::kBFloat16: FUSED_RETURN_IF_ERROR(sm90::run_gemm_stats_bf16(args, cursor, stream)); break;
        case ElementType::kFloat16: FUSED_RETURN_IF_ERROR(sm90::run_gemm_stats_fp16(args, cursor, stream)); break;
        case ElementType::kFloat32: FUSED_RETURN_IF_ERROR(sm90::run_gemm_stats_tf32(args, cursor, stream)); break;
        default: return {StatusCode::kNotSupported, "sm90 GEMM: unsupported dtype"};
      }
#endif
    } else {
      {
        util::NvtxRange range("fused::gemm_cublaslt");
        FUSED_RETURN_IF_ERROR(generic_gemm(p, b, cursor, gemm_size, stream));
      }
      if (batch_stats) {
        util::NvtxRange range("fused::column_partials");
        FUSED_RETURN_IF_ERROR(column_partials(b.y, b.ldy, p.M, p.N, partials, stream));
      }
    }
  }
  {
    util::NvtxRange range("fused::finalize");
    FUSED_RETURN_IF_ERROR(finalize(partials, p.M, p.N, bn, b.save_invstd, affine, stream));
  }
  util::NvtxRange range("fused::row_softmax");
  return row_softmax(b.y, b.ldy, p.M, p.N, affine, b.out, b.ldo, p.out_dtype, b.row_lse, stream);
}

}  // namespace fused::cuda
