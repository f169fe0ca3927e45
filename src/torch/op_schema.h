// The C++ signatures of the op's schemas (bindings.cpp), shared by every kernel registered for them
// (CPU, CUDA, Meta, Autograd, Autocast) and by the kernels that call the ops through the dispatcher.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <array>
#include <optional>
#include <string>
#include <tuple>

namespace fused::torch_op {

using OptTensor = std::optional<at::Tensor>;
using OptString = std::optional<std::string>;
using OptDtype = std::optional<at::ScalarType>;

// gemm_bn_softmax(x, weight, bias, bn_weight, bn_bias, running_mean!, running_var!, num_batches_tracked!,
//                 scale, training, momentum, eps, precision, path, compute_dtype, out_dtype, keep_y, group_name)
//   -> (out, save_mean, save_invstd, y, row_lse)   (y empty when keep_y is false)
using ForwardOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using ForwardSignature = ForwardOutputs(
    const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
    const OptTensor&, const OptTensor&, const at::Tensor&, bool, std::optional<double>, double, const OptString&,
    const OptString&, OptDtype, OptDtype, bool, const OptString&);

// gemm_bn_softmax_backward(grad_out, y, save_mean, save_invstd, row_lse, x, weight, bn_weight, bn_bias,
//                          scale, batch_stats, output_mask, precision, linear_grad_dtype,
//                          row_sums, local_sums, rank_sums, group_name)
//   -> (grad_x, grad_weight, grad_bias, grad_bn_weight, grad_bn_bias, grad_scale)
using OptGrads = std::tuple<OptTensor, OptTensor, OptTensor, OptTensor, OptTensor, OptTensor>;
using BackwardSignature = OptGrads(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                   const OptTensor&, const at::Tensor&, bool, std::array<bool, 6>, const OptString&,
                                   OptDtype, const OptTensor&, const OptTensor&, const OptTensor&,
                                   const OptString&);

// The ops through the dispatcher, for kernels that call them again below their own key (Autograd,
// Autocast).
inline const c10::TypedOperatorHandle<ForwardSignature>& forward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("fused::gemm_bn_softmax", "").typed<ForwardSignature>();
  return op;
}

inline const c10::TypedOperatorHandle<BackwardSignature>& backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("fused::gemm_bn_softmax_backward", "")
                             .typed<BackwardSignature>();
  return op;
}

}  // namespace fused::torch_op
