// Preconditions of the forward and backward contracts, checked once for every path.
#include <cmath>

#include "fused/backward.h"
#include "fused/gemm_bn_softmax.h"

namespace fused {
namespace {
Status invalid(const char* msg) { return {StatusCode::kInvalidArgument, msg}; }

// One scale for every column, or one per column (none where there are no columns: a column-parallel
// rank without columns holds an empty per-column scale, whose pointer may be null).
bool scale_ok(const void* scale, int64_t scale_numel, int64_t N) {
  return (scale_numel == 1 || scale_numel == N) && (scale != nullptr || scale_numel == 0);
}
}  // namespace

Status validate_linear(const ForwardProblem& p, const ForwardBuffers& b) {
  if (p.M < 0 || p.N < 0 || p.K < 0) return invalid("M, N and K must be non-negative");
  if (p.dtype == ElementType::kFloat64 || p.out_dtype == ElementType::kFloat64)
    return {StatusCode::kNotSupported, "the forward takes float32, bfloat16 or float16"};
  if (p.M > 0 && p.K > 0 && (b.x == nullptr || b.ldx < p.K)) return invalid("x: null or row stride < K");
  if (p.N > 0 && p.K > 0 && (b.weight == nullptr || b.ldw < p.K))
    return invalid("weight: null or row stride < K");
  // y may be null only when it is not kept, for a forward that never writes it then (cuda::y_given).
  if (p.M > 0 && p.N > 0 && (p.keep_y || b.y != nullptr) && (b.y == nullptr || b.ldy < p.N))
    return invalid("y: null or row stride < N");
  if (p.precision != MatmulPrecision::kHighest && p.dtype != ElementType::kFloat32)
    return invalid("TF32 and 3xTF32 precision apply to float32 inputs only");
  return Status::Ok();
}

Status validate(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn) {
  if (Status s = validate_linear(p, b); !s.ok()) return s;
  if (p.M > 0 && p.N > 0 && (b.out == nullptr || b.ldo < p.N)) return invalid("out: null or row stride < N");
  if (p.N > 0 && (b.save_mean == nullptr || b.save_invstd == nullptr))
    return invalid("save_mean and save_invstd are required");
  if ((bn.running_mean == nullptr) != (bn.running_var == nullptr))
    return invalid("running_mean and running_var must be given together");
  if ((bn.gamma == nullptr) != (bn.beta == nullptr))
    return invalid("bn_weight and bn_bias must be given together (affine)");
  if (!std::isfinite(bn.eps) || bn.eps < 0.0) return invalid("eps must be finite and non-negative");
  if (batch_norm_eps_zero_refused(bn.eps, bn.uses_batch_stats())) return invalid(FUSED_EPS_ZERO_MESSAGE);
  if (bn.momentum > 1.0 || std::isnan(bn.momentum)) return invalid("momentum must be in [0, 1] or None");
  if (!scale_ok(bn.scale, bn.scale_numel, p.N)) return invalid("scale must have 1 or N elements");
  if (bn.momentum < 0.0 && bn.updates_running_stats() && bn.num_batches_tracked == nullptr)
    return invalid("momentum=None needs num_batches_tracked");
  if (bn.rank_moments != nullptr && bn.num_ranks < 1) return invalid("rank_moments needs num_ranks >= 1");
  // Data-parallel statistics count every rank's rows: one row here is fine.
  if (bn.rank_moments == nullptr && batch_norm_batch_too_small(p.M, bn.uses_batch_stats()))
    return invalid(FUSED_BATCH_TOO_SMALL_MESSAGE);
  return Status::Ok();
}

Status validate(const BackwardProblem& p, const BackwardBuffers& b) {
  if (p.M < 0 || p.N < 0) return invalid("backward: M and N must be non-negative");
  if (p.M > 0 && p.N > 0) {
    if (b.grad_out == nullptr || b.ldg < p.N) return invalid("backward: grad_out null or row stride < N");
    if (b.row_lse == nullptr) return invalid("backward: row_lse is required");
    if (b.y == nullptr || b.ldy < p.N) return invalid("backward: y null or row stride < N");
    if (b.dy != nullptr && b.lddy < p.N) return invalid("backward: dy row stride < N");
    if (b.dy_t != nullptr && b.lddy_t < p.M) return invalid("backward: dy_t row stride < M");
  }
  if (p.N > 0 && (b.save_mean == nullptr || b.save_invstd == nullptr))
    return invalid("backward: save_mean and save_invstd are required");
  if ((b.gamma == nullptr) != (b.beta == nullptr)) return invalid("backward: gamma and beta must be given together");
  if ((b.grad_gamma != nullptr || b.grad_beta != nullptr) && b.gamma == nullptr)
    return invalid("backward: gamma/beta gradients asked for without affine parameters");
  if (!scale_ok(b.scale, b.scale_numel, p.N)) return invalid("backward: scale must have 1 or N elements");
  if (b.rank_sums != nullptr && (b.num_ranks < 1 || b.local_sums == nullptr || (p.M > 0 && b.row_sums == nullptr)))
    return invalid("backward: rank_sums needs num_ranks >= 1, local_sums and row_sums (backward_column_sums)");
  return Status::Ok();
}

}  // namespace fused
