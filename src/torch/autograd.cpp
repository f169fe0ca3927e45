// The Autograd kernel of fused::gemm_bn_softmax: makes the op itself differentiable (eager,
// torch.compile, C++ callers), its backward being fused::gemm_bn_softmax_backward.
//
// With a process group (data_parallel.h) the backward op is given it, and exchanges the column sums
// over it (inside the op: torch.compile's trace of this backward sees one opaque op, no collective
// on a process-group object it could not copy).
//
// Why a C++ Autograd kernel and not torch.library.register_autograd: the forward mutates the
// running statistics and num_batches_tracked, and register_autograd refuses ops that mutate their
// arguments. A functional op would need extra kernels to write the statistics back; this kernel
// keeps the one mutating op (the running statistics are written by the finalize kernel itself,
// torch.compile functionalizes the op as before), as ATen's batch_norm does.
//
// Saved for the backward: y, the mean and invstd used, each row's softmax log-normaliser, the BN
// parameters and scale (not out: the backward recomputes the softmax in fp32 from y, more exactly
// than out rounded to its dtype); x (in the compute dtype) only when weight needs a gradient,
// weight only when x does. The backward of the
// backward is not implemented: differentiating through it raises (never a silently wrong result),
// and so does forward-mode AD (dual tensors).
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <iterator>
#include <string>
#include <type_traits>

#include "data_parallel.h"
#include "op_common.h"
#include "op_schema.h"

namespace fused::torch_op {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool defined(const OptTensor& t) { return t.has_value() && t->defined(); }

// What ADInplaceOrView would do for an ATen op: the mutated buffers' version counters move.
void bump_mutated_versions(const OptTensor& running_mean, const OptTensor& running_var,
                           const OptTensor& num_batches_tracked, bool training) {
  if (!defined(running_mean)) return;
  if (batch_norm_uses_batch_stats(training, true)) {
    torch::autograd::impl::bump_version(*running_mean);
    torch::autograd::impl::bump_version(*running_var);
  }
  if (training && defined(num_batches_tracked)) torch::autograd::impl::bump_version(*num_batches_tracked);
}

// The op below the Autograd key (the Linear operands already in the compute dtype), and the version
// bumps of the buffers it mutates.
Outputs forward_below_autograd(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                               const OptTensor& bn_weight, const OptTensor& bn_bias, const OptTensor& running_mean,
                               const OptTensor& running_var, const OptTensor& num_batches_tracked,
                               const at::Tensor& scale, bool training, std::optional<double> momentum, double eps,
                               const OptString& precision, const OptString& path, at::ScalarType out_dtype,
                               bool keep_y, const OptString& group_name) {
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  Outputs outs = forward_op().call(x, weight, bias, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked,
                                   scale, training, momentum, eps, precision, path, std::nullopt, out_dtype, keep_y,
                                   group_name);
  bump_mutated_versions(running_mean, running_var, num_batches_tracked, training);
  return outs;
}

// The Linear operands in the compute dtype. With one, they are rounded here rather than in the op,
// so the backward's GEMMs reuse the copies (without one the op checks that the dtypes agree).
struct LinearInputs {
  at::ScalarType dtype;
  at::Tensor x, weight;
  OptTensor bias;
};
LinearInputs linear_inputs(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                           std::optional<at::ScalarType> compute_dtype) {
  if (!compute_dtype) return {x.scalar_type(), x, weight, bias};
  const at::ScalarType t = *compute_dtype;
  return {t, x.to(t), weight.to(t), defined(bias) ? OptTensor(bias->to(t)) : bias};
}

// The forward's arguments: 18, the first 9 tensors; the differentiable ones in GradIndex order.
constexpr int kNumForwardArgs = 18;
constexpr int kNumTensorArgs = 9;
constexpr int kArgIndex[6] = {0 /*x*/, 1 /*weight*/, 2 /*bias*/, 3 /*bn_weight*/, 4 /*bn_bias*/, 8 /*scale*/};

// The forward's input edges, kept in the autograd context (a capsule: saved_data holds IValues).
struct InputEdges : torch::CustomClassHolder {
  torch::autograd::edge_list edges;
};

// A node that raises `msg` when the engine reaches it. Autograd nodes are held by std::shared_ptr in
// torch 2.11 and by c10::intrusive_ptr in 2.14: NodePtr is whichever an Edge holds (each branch is
// compiled only for its own kind, ErrorNode being a template parameter).
using NodePtr = decltype(torch::autograd::Edge::function);
template <class ErrorNode = torch::autograd::Error>
NodePtr raising_node(std::string msg, torch::autograd::edge_list&& edges) {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<ErrorNode>(std::move(msg), std::move(edges));
  } else {
    return c10::make_intrusive<ErrorNode>(std::move(msg), std::move(edges));
  }
}

class GemmBnSoftmaxFunction : public torch::autograd::Function<GemmBnSoftmaxFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const OptTensor& bias, const OptTensor& bn_weight, const OptTensor& bn_bias,
                               const OptTensor& running_mean, const OptTensor& running_var,
                               const OptTensor& num_batches_tracked, const at::Tensor& scale, bool training,
                               std::optional<double> momentum, double eps, const OptString& precision,
                               const OptString& path, std::optional<at::ScalarType> compute_dtype,
                               std::optional<at::ScalarType> out_dtype, bool keep_y, const OptString& group_name) {
    const LinearInputs in = linear_inputs(x, weight, bias, compute_dtype);
    auto [out, mean, invstd, y, row_lse] =
        forward_below_autograd(in.x, in.weight, in.bias, bn_weight, bn_bias, running_mean, running_var,
                               num_batches_tracked, scale, training, momentum, eps, precision, path,
                               out_dtype.value_or(in.dtype), keep_y, group_name);
    ctx->mark_non_differentiable({mean, invstd, y, row_lse});
    // No zero-filled gradients for those four (an (M, N) fill each step): the backward reads out's only.
    ctx->set_materialize_grads(false);

    // Which gradients can be asked for, and the edge index of each differentiable argument
    // (edges exist for the tensor arguments that are present, in argument order).
    const OptTensor args[kNumTensorArgs] = {x, weight, bias, bn_weight, bn_bias, running_mean, running_var,
                                            num_batches_tracked, scale};
    std::vector<int64_t> edge(6, -1);
    std::array<bool, 6> wants{};
    int64_t next_edge = 0;
    for (int i = 0, k = 0; i < kNumTensorArgs; ++i) {
      const bool present = defined(args[i]);
      if (k < 6 && kArgIndex[k] == i) {
        wants[k] = present && args[i]->requires_grad();
        edge[k++] = present ? next_edge : -1;
      }
      next_edge += present ? 1 : 0;
    }
    const bool any = std::find(wants.begin(), wants.end(), true) != wants.end();
    ctx->save_for_backward({any ? y : at::Tensor(), any ? mean : at::Tensor(), any ? invstd : at::Tensor(),
                            any ? row_lse : at::Tensor(), wants[kGradWeight] ? in.x : at::Tensor(),
                            wants[kGradX] ? in.weight : at::Tensor(),
                            any ? bn_weight.value_or(at::Tensor()) : at::Tensor(),
                            any ? bn_bias.value_or(at::Tensor()) : at::Tensor(), any ? scale : at::Tensor()});
    // The gradient edges of x, weight and bias (not the tensors: nothing more is saved), for
    // raising_when_differentiated.
    auto input_edges = c10::make_intrusive<InputEdges>();
    if (wants[kGradX]) input_edges->edges.push_back(torch::autograd::impl::gradient_edge(x));
    if (wants[kGradWeight]) input_edges->edges.push_back(torch::autograd::impl::gradient_edge(weight));
    if (wants[kGradBias]) input_edges->edges.push_back(torch::autograd::impl::gradient_edge(*bias));
    ctx->saved_data["input_edges"] = c10::IValue::make_capsule(std::move(input_edges));
    int64_t wants_bits = 0;
    for (int k = 0; k < 6; ++k) wants_bits |= static_cast<int64_t>(wants[k]) << k;
    ctx->saved_data["wants"] = wants_bits;
    ctx->saved_data["edge"] = c10::List<int64_t>(edge);
    ctx->saved_data["batch_stats"] = batch_norm_uses_batch_stats(training, defined(running_mean));
    // Data parallel: the backward's column sums are exchanged over the same group.
    if (exchanges_statistics(training, group_name)) ctx->saved_data["group_name"] = *group_name;
    // The backward GEMMs run in the forward's precision, resolved now (a later flag change does not count).
    ctx->saved_data["precision"] = std::string(precision_name(resolve_precision(in.dtype, precision)));
    // Gradients of x, weight and bias are written in the widest of their three dtypes (fp32 master
    // weights under autocast: the GEMMs write them directly, no bf16 round trip); autograd then rounds
    // each to its own input's dtype, as eager's casts do. Not the weight's alone: an fp32 x beside a
    // bf16 weight would get its gradient through bf16.
    at::ScalarType linear_grad_dtype = c10::promoteTypes(x.scalar_type(), weight.scalar_type());
    if (defined(bias)) linear_grad_dtype = c10::promoteTypes(linear_grad_dtype, bias->scalar_type());
    ctx->saved_data["linear_grad_dtype"] = linear_grad_dtype;
    return {out, mean, invstd, y, row_lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    variable_list grads(kNumForwardArgs);
    const at::Tensor& grad_out = grad_outputs[0];
    if (!grad_out.defined()) return grads;
    const int64_t wants = ctx->saved_data["wants"].toInt();
    const auto edge = ctx->saved_data["edge"].toIntList();
    std::array<bool, 6> mask{};
    for (int k = 0; k < 6; ++k) mask[k] = ((wants >> k) & 1) && ctx->needs_input_grad(static_cast<size_t>(edge[k]));
    if (std::find(mask.begin(), mask.end(), true) == mask.end()) return grads;
    const variable_list saved = ctx->get_saved_variables();
    auto opt = [](const at::Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); };
    const OptString precision = ctx->saved_data["precision"].toStringRef();
    const at::ScalarType linear_grad_dtype = ctx->saved_data["linear_grad_dtype"].toScalarType();
    const bool batch_stats = ctx->saved_data["batch_stats"].toBool();
    // Data parallel: the op exchanges the column sums over the forward's group.
    const auto group = ctx->saved_data.find("group_name");
    const OptString group_name =
        group == ctx->saved_data.end() ? OptString() : OptString(group->second.toStringRef());
    auto result = backward_op().call(grad_out, saved[0], saved[1], saved[2], saved[3], opt(saved[4]), opt(saved[5]),
                                     opt(saved[6]), opt(saved[7]), saved[8], batch_stats, mask, precision,
                                     linear_grad_dtype, std::nullopt, std::nullopt, std::nullopt, group_name);
    auto take = [&](int k, const OptTensor& g) { grads[kArgIndex[k]] = g.value_or(at::Tensor()); };
    take(kGradX, std::get<kGradX>(result));
    take(kGradWeight, std::get<kGradWeight>(result));
    take(kGradBias, std::get<kGradBias>(result));
    take(kGradBnWeight, std::get<kGradBnWeight>(result));
    take(kGradBnBias, std::get<kGradBnBias>(result));
    take(kGradScale, std::get<kGradScale>(result));
    if (at::GradMode::is_enabled()) return raising_when_differentiated(ctx, std::move(grads), saved);
    return grads;
  }

 private:
  // create_graph: the gradients depend on the inputs (grad x on x, through the softmax and the
  // statistics), but the backward op is differentiable only where one of its own inputs requires
  // grad (the fallback registered below); with x alone requiring grad its gradient would come back
  // as a constant, and a gradient penalty or Hessian would be silently wrong. So every gradient
  // returned under create_graph raises when differentiated, as @once_differentiable does in Python:
  // each is its value behind an Error node whose edges lead to every differentiable input (x, weight
  // and bias through the edges the forward kept, the BN parameters and scale as saved), so that every
  // path from a gradient back to an input runs through it (with only the gradients behind it,
  // autograd.grad(..., inputs=x) would skip the node and return zero: a Hessian).
  static variable_list raising_when_differentiated(AutogradContext* ctx, variable_list grads,
                                                   const variable_list& saved) {
    const c10::intrusive_ptr<torch::CustomClassHolder> kept = ctx->saved_data["input_edges"].toCapsule();
    torch::autograd::edge_list edges = static_cast<const InputEdges*>(kept.get())->edges;
    for (size_t i : {size_t{6}, size_t{7}, size_t{8}})  // bn_weight, bn_bias, scale
      if (saved[i].defined() && saved[i].requires_grad()) edges.push_back(torch::autograd::impl::gradient_edge(saved[i]));
    const NodePtr raising = raising_node(
        "the backward of fused::gemm_bn_softmax is not differentiable (no double backward, Hessians or "
        "gradient penalties through it)",
        std::move(edges));
    for (at::Tensor& g : grads) {
      if (!g.defined()) continue;
      g = g.tensor_data();  // the same values, without the backward's own history
      torch::autograd::set_history(g, raising);
    }
    return grads;
  }
};

bool has_forward_grad(const OptTensor& t) { return defined(t) && t->_fw_grad(/*level=*/0).defined(); }

Outputs gemm_bn_softmax_autograd(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                                 const OptTensor& bn_weight, const OptTensor& bn_bias, const OptTensor& running_mean,
                                 const OptTensor& running_var, const OptTensor& num_batches_tracked,
                                 const at::Tensor& scale, bool training, std::optional<double> momentum, double eps,
                                 const OptString& precision, const OptString& path,
                                 std::optional<at::ScalarType> compute_dtype,
                                 std::optional<at::ScalarType> out_dtype, bool keep_y,
                                 const OptString& group_name) {
  // As ATen's batch_norm: the running statistics are buffers, never differentiated.
  for (const auto& [buffer, name] : {std::pair{&running_mean, "running_mean"}, std::pair{&running_var, "running_var"}})
    TORCH_CHECK(!at::GradMode::is_enabled() || !defined(*buffer) || !(*buffer)->requires_grad(),
                "fused::gemm_bn_softmax is not differentiable with respect to argument '", name,
                "'. This input cannot have requires_grad True.");
  // The backward reads y: keep it whenever this call can be differentiated. Dual tensors (forward-mode
  // AD) take the autograd node too, whose missing jvp raises, instead of losing their tangents.
  const OptTensor inputs[] = {x, weight, bias, bn_weight, bn_bias, scale};  // the differentiable ones
  const bool differentiable = std::any_of(std::begin(inputs), std::end(inputs), [](const OptTensor& t) {
    return (at::GradMode::is_enabled() && defined(t) && t->requires_grad()) || has_forward_grad(t);
  });
  if (!differentiable) {
    // No gradient can be asked for: the op itself, without an autograd node (host time per call).
    const LinearInputs in = linear_inputs(x, weight, bias, compute_dtype);
    return forward_below_autograd(in.x, in.weight, in.bias, bn_weight, bn_bias, running_mean, running_var,
                                  num_batches_tracked, scale, training, momentum, eps, precision, path,
                                  out_dtype.value_or(in.dtype), keep_y, group_name);
  }
  const variable_list outs = GemmBnSoftmaxFunction::apply(x, weight, bias, bn_weight, bn_bias, running_mean,
                                                          running_var, num_batches_tracked, scale, training, momentum,
                                                          eps, precision, path, compute_dtype, out_dtype,
                                                          keep_y || differentiable, group_name);
  return {outs[0], outs[1], outs[2], outs[3], outs[4]};
}

}  // namespace
}  // namespace fused::torch_op

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("gemm_bn_softmax", &fused::torch_op::gemm_bn_softmax_autograd);
  // Differentiating the backward (double backward) raises "derivative ... not implemented".
  m.impl("gemm_bn_softmax_backward", torch::autograd::autogradNotImplementedFallback());
}
