// Autocast kernels of fused::gemm_bn_softmax: under torch.autocast the op does what the eager block
// (nn.Linear -> nn.BatchNorm1d -> scale -> nn.Softmax(1)) does there, on its fused 16-bit path:
//   - Linear in the autocast dtype: x, weight, bias rounded to it (compute_dtype);
//   - BatchNorm parameters, running statistics and scale untouched (fp32 stay fp32);
//   - out in the dtype eager produces: on CUDA, softmax is on autocast's fp32 list, so fp32; on
//     the CPU, softmax keeps its input's dtype, which is that of `scale * batch_norm(...)`:
//     the autocast dtype promoted with scale's (a 1-element fp32 Parameter gives fp32, a 0-dim
//     tensor, like a Python float, keeps the autocast dtype).
// An explicit compute_dtype / out_dtype argument is kept as given. As autocast casts only eligible
// tensors (floating point, not float64), a float64 or integer x, weight or bias leaves the call as it
// is: the op refuses those dtypes, where the eager block fails on mixed dtypes (no silent rounding).
#include <ATen/autocast_mode.h>
#include <torch/library.h>

#include "op_schema.h"

namespace fused::torch_op {
namespace {

at::ScalarType eager_out_dtype(c10::DeviceType device, at::ScalarType linear, const at::Tensor& scale) {
  if (device == c10::DeviceType::CUDA) return at::kFloat;
  return at::result_type(scale, at::empty({0}, at::TensorOptions().dtype(linear).device(at::kMeta)));
}

template <c10::DeviceType kDevice>
ForwardOutputs gemm_bn_softmax_autocast(
    const at::Tensor& x, const at::Tensor& weight, const OptTensor& bias, const OptTensor& bn_weight,
    const OptTensor& bn_bias, const OptTensor& running_mean, const OptTensor& running_var,
    const OptTensor& num_batches_tracked, const at::Tensor& scale, bool training, std::optional<double> momentum,
    double eps, const OptString& precision, const OptString& path, OptDtype compute_dtype, OptDtype out_dtype,
    bool keep_y, const OptString& group_name) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
  const bool castable = at::autocast::is_eligible(x, kDevice) && at::autocast::is_eligible(weight, kDevice) &&
                        (!bias.has_value() || at::autocast::is_eligible(*bias, kDevice));
  if (castable && !compute_dtype.has_value()) compute_dtype = at::autocast::get_autocast_dtype(kDevice);
  if (compute_dtype.has_value() && !out_dtype.has_value())
    out_dtype = eager_out_dtype(kDevice, *compute_dtype, scale);
  return forward_op().call(x, weight, bias, bn_weight, bn_bias, running_mean, running_var, num_batches_tracked, scale,
                           training, momentum, eps, precision, path, compute_dtype, out_dtype, keep_y, group_name);
}

}  // namespace
}  // namespace fused::torch_op

TORCH_LIBRARY_IMPL(fused, AutocastCUDA, m) {
  m.impl("gemm_bn_softmax", &fused::torch_op::gemm_bn_softmax_autocast<c10::DeviceType::CUDA>);
}

TORCH_LIBRARY_IMPL(fused, AutocastCPU, m) {
  m.impl("gemm_bn_softmax", &fused::torch_op::gemm_bn_softmax_autocast<c10::DeviceType::CPU>);
}
