// Preconditions of the contract (design.md §1), checked once for every path.
#include <cmath>

#include "fused/gemm_bn_softmax.h"

namespace fused {
namespace {
Status invalid(const char* msg) { return {StatusCode::kInvalidArgument, msg}; }
}  // namespace

Status validate(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn) {
  if (p.M < 0 || p.N < 0 || p.K < 0) return invalid("M, N and K must be non-negative");
  if (p.M > 0 && p.K > 0 && (b.x == nullptr || b.ldx < p.K)) return invalid("x: null or row stride < K");
  if (p.N > 0 && p.K > 0 && (b.weight == nullptr || b.ldw < p.K))
    return invalid("weight: null or row stride < K");
  if (p.M > 0 && p.N > 0) {
    if (b.y == nullptr || b.ldy < p.N) return invalid("y: null or row stride < N");
    if (b.out == nullptr || b.ldo < p.N) return invalid("out: null or row stride < N");
  }
  if (p.N > 0 && (b.save_mean == nullptr || b.save_invstd == nullptr))
    return invalid("save_mean and save_invstd are required");
  if ((bn.running_mean == nullptr) != (bn.running_var == nullptr))
    return invalid("running_mean and running_var must be given together");
  if ((bn.gamma == nullptr) != (bn.beta == nullptr))
    return invalid("bn_weight and bn_bias must be given together (affine)");
  if (!std::isfinite(bn.eps) || bn.eps < 0.0) return invalid("eps must be finite and non-negative");
  if (bn.momentum > 1.0 || std::isnan(bn.momentum)) return invalid("momentum must be in [0, 1] or None");
  if (bn.scale == nullptr || (bn.scale_numel != 1 && bn.scale_numel != p.N))
    return invalid("scale must have 1 or N elements");
  if (bn.momentum < 0.0 && bn.updates_running_stats() && bn.num_batches_tracked == nullptr)
    return invalid("momentum=None needs num_batches_tracked");
  if (bn.uses_batch_stats() && p.M == 1) return invalid("Expected more than 1 value per channel when training");
  if (p.precision == MatmulPrecision::kTF32 && p.dtype != ElementType::kFloat32)
    return invalid("TF32 precision applies to float32 inputs only");
  return Status::Ok();
}

}  // namespace fused
