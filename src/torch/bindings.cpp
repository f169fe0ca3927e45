// The torch op: schema, and its CPU / CUDA / Meta kernels. Every kernel validates with the same
// check_args() and allocates with the same allocate_outputs() (op_common.cpp).
#include <torch/library.h>

#include "op_common.h"

namespace fused::torch_op {

Outputs gemm_bn_softmax_cpu(const OpArgs& a);
#if defined(FUSED_TORCH_CUDA)
Outputs gemm_bn_softmax_cuda(const OpArgs& a);
#endif

namespace {

using OptTensor = std::optional<at::Tensor>;
using OptString = std::optional<std::string>;

// Schema order -> OpArgs.
template <Outputs (*Impl)(const OpArgs&)>
Outputs entry(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias, const OptTensor& bn_weight,
              const OptTensor& bn_bias, const OptTensor& running_mean, const OptTensor& running_var,
              const OptTensor& num_batches_tracked, const at::Tensor& scale, bool training,
              std::optional<double> momentum, double eps, const OptString& precision, const OptString& path) {
  return Impl(OpArgs{x, weight, bias, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked, scale,
                     training, momentum, eps, precision, path});
}

// Shapes and errors only: torch.compile / FakeTensor trace through this.
Outputs gemm_bn_softmax_meta(const OpArgs& a) {
  check_args(a);
  return allocate_outputs(a);
}

template <std::string (*Impl)(const OpArgs&)>
std::string path_entry(const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias,
                       const OptString& precision, const OptString& path) {
  const OptTensor none;
  const at::Tensor scale = at::ones({1}, x.options().dtype(at::kFloat));
  // Path selection does not depend on the BN arguments: a training problem with M >= 2 rows.
  return Impl(OpArgs{x, weight, bias, none, none, none, none, none, scale, /*training=*/x.size(0) > 1, 0.1, 1e-5,
                     precision, path});
}

std::string cpu_path(const OpArgs& a) {
  check_args(a);
  return "cpu";
}

}  // namespace
}  // namespace fused::torch_op

TORCH_LIBRARY(fused, m) {
  // Outputs: out (M, N) in x's dtype; save_mean, save_invstd (N) fp32 (the statistics used,
  // batch or running); y = x W^T + b (M, N) fp32. The last three are what a backward needs.
  m.def(
      "gemm_bn_softmax(Tensor x, Tensor weight, Tensor? bias, Tensor? bn_weight, Tensor? bn_bias, "
      "Tensor(a!)? running_mean, Tensor(b!)? running_var, Tensor(c!)? num_batches_tracked, Tensor scale, "
      "bool training, float? momentum, float eps, str? precision=None, str? path=None) "
      "-> (Tensor out, Tensor save_mean, Tensor save_invstd, Tensor y)");
  // Debug query: the path gemm_bn_softmax takes for these operands ("cpu", "sm90", "generic").
  m.def("dispatch_path(Tensor x, Tensor weight, Tensor? bias, str? precision=None, str? path=None) -> str");
}

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  using namespace fused::torch_op;
  m.impl("gemm_bn_softmax", &entry<gemm_bn_softmax_cpu>);
  m.impl("dispatch_path", &path_entry<cpu_path>);
}

TORCH_LIBRARY_IMPL(fused, Meta, m) {
  using namespace fused::torch_op;
  m.impl("gemm_bn_softmax", &entry<gemm_bn_softmax_meta>);
}

#if defined(FUSED_TORCH_CUDA)
TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  using namespace fused::torch_op;
  m.impl("gemm_bn_softmax", &entry<gemm_bn_softmax_cuda>);
  m.impl("dispatch_path", &path_entry<select_cuda_path>);
}
#endif
