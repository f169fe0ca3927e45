// The torch ops: schemas, and their CPU / CUDA / Meta kernels. Every kernel validates with the
// same check_args() / check_backward_args() and allocates with the same allocate_outputs() /
// allocate_grads() (op_common.cpp). Autograd: autograd.cpp; autocast: autocast.cpp.
#include <torch/library.h>

#include "data_parallel.h"
#include "op_common.h"
#include "op_schema.h"

namespace fused::torch_op {

Grads gemm_bn_softmax_backward_cpu(const BackwardArgs& a);
Outputs gemm_bn_softmax_cpu(const OpArgs& a);
MomentsOutputs gemm_column_moments_cpu(const OpArgs& a);
FromMomentsOutputs bn_softmax_from_moments_cpu(const FromMomentsArgs& a);
SumsOutputs gemm_bn_softmax_backward_sums_cpu(const BackwardArgs& a, const OptTensor& given_row_sums);
#if defined(FUSED_TORCH_CUDA)
Outputs gemm_bn_softmax_cuda(const OpArgs& a);
Grads gemm_bn_softmax_backward_cuda(const BackwardArgs& a);
MomentsOutputs gemm_column_moments_cuda(const OpArgs& a);
FromMomentsOutputs bn_softmax_from_moments_cuda(const FromMomentsArgs& a);
SumsOutputs gemm_bn_softmax_backward_sums_cuda(const BackwardArgs& a, const OptTensor& given_row_sums);
#endif

namespace {

// Schema order -> OpArgs, and the process group's name.
template <Outputs (*Forward)(const OpArgs&, const OptString&)>
Outputs entry(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias, const OptTensor& bn_weight,
              const OptTensor& bn_bias, const OptTensor& running_mean, const OptTensor& running_var,
              const OptTensor& num_batches_tracked, const at::Tensor& scale, bool training,
              std::optional<double> momentum, double eps, const OptString& precision, const OptString& path,
              OptDtype compute_dtype, OptDtype out_dtype, bool keep_y, const OptString& group_name) {
  return Forward(OpArgs{x, weight, bias, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked, scale,
                        training, momentum, eps, precision, path, compute_dtype, out_dtype, keep_y},
                 group_name);
}

// A device's forward: the data-parallel one when the group exchanges statistics (data_parallel.h).
template <Outputs (*Impl)(const OpArgs&), MomentsKernel Moments, FromMomentsKernel FromMoments>
Outputs device_forward(const OpArgs& a, const OptString& group_name) {
  if (exchanges_statistics(a.training, group_name)) return data_parallel_forward(a, *group_name, Moments, FromMoments);
  return Impl(a);
}

// Schema order -> BackwardArgs, and the process group's name; absent gradients (undefined tensors)
// -> None.
template <Grads (*Backward)(const BackwardArgs&, const OptString&)>
OptGrads backward_entry(const at::Tensor& grad_out, const at::Tensor& y, const at::Tensor& save_mean,
                        const at::Tensor& save_invstd, const at::Tensor& row_lse, const OptTensor& x,
                        const OptTensor& weight, const OptTensor& bn_weight, const OptTensor& bn_bias,
                        const at::Tensor& scale, bool batch_stats, std::array<bool, 6> output_mask,
                        const OptString& precision, OptDtype linear_grad_dtype, const OptTensor& row_sums,
                        const OptTensor& local_sums, const OptTensor& rank_sums, const OptString& group_name) {
  const Grads g = Backward(BackwardArgs{grad_out, y, save_mean, save_invstd, row_lse, x, weight, bn_weight, bn_bias,
                                        scale, batch_stats, output_mask, precision, linear_grad_dtype, row_sums,
                                        local_sums, rank_sums},
                           group_name);
  auto opt = [](const at::Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); };
  return {opt(std::get<0>(g)), opt(std::get<1>(g)), opt(std::get<2>(g)),
          opt(std::get<3>(g)), opt(std::get<4>(g)), opt(std::get<5>(g))};
}

// A device's backward: the data-parallel one when the group exchanges statistics (data_parallel.h).
template <Grads (*Impl)(const BackwardArgs&), SumsKernel Sums>
Grads device_backward(const BackwardArgs& a, const OptString& group_name) {
  if (exchanges_statistics(a.batch_stats, group_name)) return data_parallel_backward(a, *group_name, Sums, Impl);
  return Impl(a);
}

// ---- data parallel: schema order -> the kernels' argument structs ----
template <MomentsOutputs (*Impl)(const OpArgs&)>
MomentsOutputs moments_entry(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                             const OptString& precision, const OptString& path, OptDtype compute_dtype) {
  static const OptTensor none;
  static const at::Tensor no_scale;
  return Impl(OpArgs{x, weight, bias, none, none, none, none, none, no_scale, /*training=*/true, 0.1, 1e-5, precision,
                     path, compute_dtype, std::nullopt});
}

template <FromMomentsOutputs (*Impl)(const FromMomentsArgs&)>
FromMomentsOutputs from_moments_entry(const at::Tensor& y, const at::Tensor& rank_moments, const OptTensor& bn_weight,
                                      const OptTensor& bn_bias, const OptTensor& running_mean,
                                      const OptTensor& running_var, const OptTensor& num_batches_tracked,
                                      const at::Tensor& scale, std::optional<double> momentum, double eps,
                                      OptDtype compute_dtype, OptDtype out_dtype) {
  TORCH_CHECK(y.dim() == 2, "y must be 2-D (batch, out_features), got shape ", y.sym_sizes());
  const at::Tensor columns = y.t();  // stands in for weight: N rows (no GEMM runs here)
  return Impl(FromMomentsArgs{y, rank_moments,
                              OpArgs{y, columns, std::nullopt, bn_weight, bn_bias, running_mean, running_var,
                                     num_batches_tracked, scale, /*training=*/true, momentum, eps, std::nullopt,
                                     std::nullopt, compute_dtype, out_dtype}});
}

template <SumsOutputs (*Impl)(const BackwardArgs&, const OptTensor&)>
SumsOutputs sums_entry(const at::Tensor& grad_out, const at::Tensor& y, const at::Tensor& save_mean,
                       const at::Tensor& save_invstd, const at::Tensor& row_lse, const OptTensor& bn_weight,
                       const OptTensor& bn_bias, const at::Tensor& scale, const OptTensor& row_sums) {
  static const OptTensor none;
  return Impl(BackwardArgs{grad_out, y, save_mean, save_invstd, row_lse, none, none, bn_weight, bn_bias, scale,
                           /*batch_stats=*/true, {}, std::nullopt, std::nullopt, none, none, none},
              row_sums);
}

MomentsOutputs gemm_column_moments_meta(const OpArgs& a) {
  check_linear_args(a);
  return {at::empty_symint({a.sym_M(), a.sym_N()}, a.x.options().dtype(at::kFloat)),
          at::empty_symint({2 * a.sym_N() + 1}, a.x.options().dtype(at::kDouble))};
}

FromMomentsOutputs bn_softmax_from_moments_meta(const FromMomentsArgs& a) {
  check_from_moments_args(a);
  return allocate_from_moments_outputs(a);
}

SumsOutputs gemm_bn_softmax_backward_sums_meta(const BackwardArgs& a, const OptTensor& given_row_sums) {
  check_backward_args(a);
  check_given_row_sums(a, given_row_sums);
  return allocate_sums_outputs(a);
}

// Shapes and errors only: torch.compile / FakeTensor trace through these. With a group that
// exchanges statistics the batch-of-one rule is the whole group's (nn.SyncBatchNorm): a rank may hold
// one row, or none.
Outputs gemm_bn_softmax_meta(const OpArgs& a, const OptString& group_name) {
  check_args(a);
  if (!exchanges_statistics(a.training, group_name)) check_batch_size(a);
  return allocate_outputs(a);
}

Grads gemm_bn_softmax_backward_meta(const BackwardArgs& a, const OptString& /*group_name: same outputs*/) {
  check_backward_args(a);
  return allocate_grads(a);
}

// The path depends on the Linear operands only: the BN arguments are absent (nothing is allocated
// to stand in for them), and the selectors read only what check_linear_args checks.
template <std::string (*Impl)(const OpArgs&)>
std::string path_entry(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                       const OptString& precision, const OptString& path, bool keep_y) {
  static const OptTensor none;
  static const at::Tensor no_scale;
  return Impl(OpArgs{x, weight, bias, none, none, none, none, none, no_scale, /*training=*/false, 0.1, 1e-5,
                     precision, path, std::nullopt, std::nullopt, keep_y});
}

}  // namespace
}  // namespace fused::torch_op

TORCH_LIBRARY(fused, m) {
  // Outputs: out (M, N) in out_dtype (default: the compute dtype, default x's); save_mean,
  // save_invstd (N) fp32 (the statistics used, batch or running); y = x W^T + b (M, N) fp32, or an
  // empty tensor with keep_y=False (then y need not be written at all: the recompute path); row_lse
  // (M) fp32, each row's softmax log-normaliser. The last four are what the backward needs.
  // group_name: a torch.distributed process group (Python: `group.group_name`); in training with
  // more than one rank the batch statistics are those of every rank's rows, as nn.SyncBatchNorm's
  // (data_parallel.h: one all_gather in the forward, one in the backward).
  // Differentiable (autograd.cpp); autocast-aware (autocast.cpp).
  m.def(
      "gemm_bn_softmax(Tensor x, Tensor weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, "
      "Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, Tensor scale, "
      "bool training, float? momentum, float eps, str? precision=None, str? path=None, "
      "ScalarType? compute_dtype=None, ScalarType? out_dtype=None, bool keep_y=True, str? group_name=None) "
      "-> (Tensor out, Tensor save_mean, Tensor save_invstd, Tensor y, Tensor row_lse)");
  // The backward, from the forward's outputs (it recomputes the softmax from y and row_lse): gradients
  // of x, weight, bias, bn_weight, bn_bias and scale, each computed only when output_mask asks for
  // it (else None). x and weight are the
  // forward's GEMM operands (compute dtype); the gradients of x, weight and bias come in
  // linear_grad_dtype (default: the GEMM's dtype). batch_stats: the forward normalised with batch
  // statistics. precision: of fp32 GEMMs ('highest' exact, 'tf32'...), as the forward's.
  // group_name: the forward's group, whose column sums it exchanges (data_parallel.h).
  m.def(
      "gemm_bn_softmax_backward(Tensor grad_out, Tensor y, Tensor save_mean, Tensor save_invstd, Tensor row_lse, "
      "Tensor? x, Tensor? weight, Tensor? bn_weight, Tensor? bn_bias, Tensor scale, bool batch_stats, "
      "bool[6] output_mask, str? precision=None, ScalarType? linear_grad_dtype=None, Tensor? row_sums=None, "
      "Tensor? local_sums=None, Tensor? rank_sums=None, str? group_name=None) "
      "-> (Tensor? grad_x, Tensor? grad_weight, Tensor? grad_bias, Tensor? grad_bn_weight, Tensor? grad_bn_bias, "
      "Tensor? grad_scale)");
  // The data-parallel steps (nn.SyncBatchNorm's semantics), split at the exchange of statistics; the
  // ops with a group_name run them around their collective (data_parallel.h), and callers that make
  // the exchange themselves can too:
  //   forward:  gemm_column_moments -> all_gather(moments) -> bn_softmax_from_moments
  //   backward: gemm_bn_softmax_backward_sums -> all_gather(sums) -> gemm_bn_softmax_backward(...,
  //             row_sums, local_sums=sums, rank_sums)
  // Column parallelism (W's rows split over ranks) reuses them: the backward's row sums ([2, M]: each
  // row's sum of grad_out * out, then of out) are added over ranks and given back to
  // gemm_bn_softmax_backward_sums (row_sums=) and the backward.
  // A rank's record is [count, mean or S1 (N), M2 or S2 (N)] in float64; rank_* stack them in rank order.
  m.def(
      "gemm_column_moments(Tensor x, Tensor weight, Tensor? bias, str? precision=None, str? path=None, "
      "ScalarType? compute_dtype=None) -> (Tensor y, Tensor moments)");
  m.def(
      "bn_softmax_from_moments(Tensor y, Tensor rank_moments, Tensor? bn_weight, Tensor? bn_bias, "
      "Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, Tensor scale, "
      "float? momentum, float eps, ScalarType? compute_dtype=None, ScalarType? out_dtype=None) "
      "-> (Tensor out, Tensor save_mean, Tensor save_invstd, Tensor row_lse)");
  m.def(
      "gemm_bn_softmax_backward_sums(Tensor grad_out, Tensor y, Tensor save_mean, Tensor save_invstd, "
      "Tensor row_lse, Tensor? bn_weight, Tensor? bn_bias, Tensor scale, Tensor? row_sums=None) "
      "-> (Tensor sums, Tensor row_sums_out)");
  // Debug query: the path gemm_bn_softmax takes for these operands ("cpu", "sm90", "generic",
  // "recompute"); keep_y=False for a call no gradient can be asked of.
  m.def("dispatch_path(Tensor x, Tensor weight, Tensor? bias, str? precision=None, str? path=None, "
        "bool keep_y=True) -> str");
}

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  using namespace fused::torch_op;
  m.impl("gemm_bn_softmax",
         &entry<device_forward<gemm_bn_softmax_cpu, gemm_column_moments_cpu, bn_softmax_from_moments_cpu>>);
  m.impl("gemm_bn_softmax_backward",
         &backward_entry<device_backward<gemm_bn_softmax_backward_cpu, gemm_bn_softmax_backward_sums_cpu>>);
  m.impl("dispatch_path", &path_entry<select_cpu_path>);
  m.impl("gemm_column_moments", &moments_entry<gemm_column_moments_cpu>);
  m.impl("bn_softmax_from_moments", &from_moments_entry<bn_softmax_from_moments_cpu>);
  m.impl("gemm_bn_softmax_backward_sums", &sums_entry<gemm_bn_softmax_backward_sums_cpu>);
}

TORCH_LIBRARY_IMPL(fused, Meta, m) {
  using namespace fused::torch_op;
  m.impl("gemm_bn_softmax", &entry<gemm_bn_softmax_meta>);
  m.impl("gemm_bn_softmax_backward", &backward_entry<gemm_bn_softmax_backward_meta>);
  m.impl("gemm_column_moments", &moments_entry<gemm_column_moments_meta>);
  m.impl("bn_softmax_from_moments", &from_moments_entry<bn_softmax_from_moments_meta>);
  m.impl("gemm_bn_softmax_backward_sums", &sums_entry<gemm_bn_softmax_backward_sums_meta>);
}

#if defined(FUSED_TORCH_CUDA)
TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  using namespace fused::torch_op;
  m.impl("gemm_bn_softmax",
         &entry<device_forward<gemm_bn_softmax_cuda, gemm_column_moments_cuda, bn_softmax_from_moments_cuda>>);
  m.impl("gemm_bn_softmax_backward",
         &backward_entry<device_backward<gemm_bn_softmax_backward_cuda, gemm_bn_softmax_backward_sums_cuda>>);
  m.impl("dispatch_path", &path_entry<select_cuda_path>);
  m.impl("gemm_column_moments", &moments_entry<gemm_column_moments_cuda>);
  m.impl("bn_softmax_from_moments", &from_moments_entry<bn_softmax_from_moments_cuda>);
  m.impl("gemm_bn_softmax_backward_sums", &sums_entry<gemm_bn_softmax_backward_sums_cuda>);
}
#endif
