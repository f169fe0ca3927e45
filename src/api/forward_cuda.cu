// The CUDA forward: carves the workspace, runs [1] (sm90 GEMM + statistics epilogue, or the
// generic column partials over a caller-written y), [2] finalize and [3] row softmax, all
// stream-ordered, no host synchronisation.
#include "fused/gemm_bn_softmax.h"
#include "kernels/common/cuda_check.h"
#include "kernels/common/device_info.h"
#include "kernels/common/nvtx.h"
#if defined(FUSED_WITH_SM90)
#include "kernels/sm90/gemm_stats_sm90.h"
#endif

namespace fused::cuda {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

#if defined(FUSED_WITH_SM90)
// The sm90 kernel shape for this problem on the current device (SM count cached per device).
Status sm90_tile(const ForwardProblem& p, sm90::Sm90Tile& tile) {
  int device = 0, sms = 0;
  FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "cudaGetDevice failed"));
  FUSED_RETURN_IF_ERROR(util::sm_count(device, sms));
  tile = sm90::choose_tile(p.M, p.N, sms);
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
  if (path == GemmPath::kExternal) {
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

}  // namespace

bool sm90_compiled() {
#if defined(FUSED_WITH_SM90)
  return true;
#else
  return false;
#endif
}

Status sm90_can_implement(const ForwardProblem& p, const ForwardBuffers& b) {
  if (!sm90_compiled()) return {StatusCode::kNotSupported, "sm90 kernels not compiled into this build"};
  if (p.dtype == ElementType::kFloat32 && p.precision != MatmulPrecision::kTF32)
    return {StatusCode::kNotSupported, "exact fp32 (precision 'highest') runs on the generic path"};
  if (p.M == 0 || p.N == 0 || p.K == 0) return {StatusCode::kNotSupported, "empty problem"};
  // TMA: 16-byte aligned base addresses and row strides of x and W; y stored with N % 4 == 0.
  const int64_t per16 = 16 / static_cast<int64_t>(element_size(p.dtype));
  if (p.K % per16 != 0 || b.ldx % per16 != 0 || b.ldw % per16 != 0)
    return {StatusCode::kNotSupported, "K and the row strides of x and W must be multiples of 16 bytes (TMA)"};
  if (p.N % 4 != 0 || b.ldy % 4 != 0) return {StatusCode::kNotSupported, "N must be a multiple of 4 (TMA store of y)"};
  if (!util::aligned16(b.x) || !util::aligned16(b.weight) || !util::aligned16(b.y))
    return {StatusCode::kNotSupported, "x, W and y must be 16-byte aligned (TMA)"};
  if (p.M > 0x7fffffff || p.N > 0x7fffffff || p.K > 0x7fffffff)
    return {StatusCode::kNotSupported, "dimensions must fit in int32"};
  return Status::Ok();
}

bool sm90_preferred(const ForwardProblem& p, int num_sms) {
#if defined(FUSED_WITH_SM90)
  // Measured on the H200 (bench/results/h200-2026-11-30-*): with the 128x128 ping-pong kernel for
  // underfilled grids the sm90 path wins everywhere except 16-bit inputs whose 128x128 grid is still
  // under one wave with a long K loop (M = 256, N = K = 8192: 86 vs 74 us per call), where cuBLAS
  // splits K. tf32 at that shape: sm90 122 vs generic 137 us.
  const int64_t tiles_128x128 = util::ceil_div(p.M, 128) * util::ceil_div(p.N, sm90::kCtaTileN);
  const bool sixteen_bit = p.dtype == ElementType::kBFloat16 || p.dtype == ElementType::kFloat16;
  return !(sixteen_bit && tiles_128x128 < num_sms && p.K >= 8192);
#else
  (void)p, (void)num_sms;
  return false;
#endif
}

std::size_t workspace_bytes(const ForwardProblem& p, GemmPath path) {
  ColumnStatsPartials g;
  if (!partials_geometry(p, path, g).ok()) return 0;
  std::size_t bytes = 2 * align_up(sizeof(float) * static_cast<std::size_t>(g.num_row_tiles * g.ld)) +
                      2 * align_up(sizeof(float) * static_cast<std::size_t>(p.N));
#if defined(FUSED_WITH_SM90)
  if (path == GemmPath::kSm90) {
    ForwardBuffers none;
    bytes += align_up(sm90::gemm_workspace_bytes(p.dtype, gemm_args(p, none, g)));
  }
#endif
  return bytes;
}

Status forward(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn, GemmPath path,
               void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  FUSED_RETURN_IF_ERROR(validate(p, b, bn));
  if (path == GemmPath::kSm90) FUSED_RETURN_IF_ERROR(sm90_can_implement(p, b));
  if (workspace_size < workspace_bytes(p, path) || (reinterpret_cast<uintptr_t>(workspace) % kAlign) != 0)
    return {StatusCode::kInvalidArgument, "workspace too small or not 256-byte aligned"};
  if (p.N == 0) return Status::Ok();

  // Workspace: [partials.mean | partials.m2 | a | c | gemm workspace]
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
    } else if (batch_stats) {
      util::NvtxRange range("fused::column_partials");
      FUSED_RETURN_IF_ERROR(column_partials(b.y, b.ldy, p.M, p.N, partials, stream));
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
