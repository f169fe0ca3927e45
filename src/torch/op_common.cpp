#include "op_common.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace fused::torch_op {
namespace {

bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

void check_vector(const std::optional<at::Tensor>& t, const char* name, const OpArgs& a) {
  if (!t.has_value() || !t->defined()) return;
  TORCH_CHECK(t->device() == a.x.device(), name, " is on ", t->device(), " but x is on ", a.x.device());
  TORCH_CHECK(t->dim() == 1 && t->sym_size(0) == a.sym_N(), name, " must have shape [out_features] = [",
              a.sym_N(), "], got ", t->sym_sizes());
  TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == a.x.scalar_type(), name,
              " must be float32 or x's dtype (", a.x.scalar_type(), "), got ", t->scalar_type());
}

bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

}  // namespace

ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ElementType::kFloat32;
    case at::kBFloat16: return ElementType::kBFloat16;
    case at::kHalf: return ElementType::kFloat16;
    default: TORCH_CHECK(false, "unsupported dtype ", t);
  }
}

void check_args(const OpArgs& a) {
  TORCH_CHECK(a.x.dim() == 2, "x must be 2-D (batch, in_features), got shape ", a.x.sym_sizes());
  TORCH_CHECK(a.weight.dim() == 2, "weight must be 2-D (out_features, in_features), got shape ",
              a.weight.sym_sizes());
  TORCH_CHECK(is_supported_dtype(a.x.scalar_type()), "x has unsupported dtype ", a.x.scalar_type(),
              "; expected float32, bfloat16 or float16");
  TORCH_CHECK(a.weight.scalar_type() == a.x.scalar_type(), "weight dtype ", a.weight.scalar_type(),
              " must match x dtype ", a.x.scalar_type());
  TORCH_CHECK(a.weight.device() == a.x.device(), "weight is on ", a.weight.device(), " but x is on ", a.x.device());
  TORCH_CHECK(a.x.sym_size(1) == a.weight.sym_size(1), "x.size(1) = ", a.x.sym_size(1),
              " must equal weight.size(1) = ", a.weight.sym_size(1), " (in_features)");
  if (defined(a.bias)) {
    TORCH_CHECK(a.bias->device() == a.x.device(), "bias is on ", a.bias->device(), " but x is on ", a.x.device());
    TORCH_CHECK(a.bias->dim() == 1 && a.bias->sym_size(0) == a.sym_N(), "bias must have shape [out_features] = [",
                a.sym_N(), "], got ", a.bias->sym_sizes());
    TORCH_CHECK(a.bias->scalar_type() == a.x.scalar_type(), "bias dtype ", a.bias->scalar_type(),
                " must match x dtype ", a.x.scalar_type());
  }
  check_vector(a.bn_weight, "bn_weight", a);
  check_vector(a.bn_bias, "bn_bias", a);
  TORCH_CHECK(defined(a.bn_weight) == defined(a.bn_bias),
              "bn_weight and bn_bias must both be given (affine=True) or both be None (affine=False)");
  check_vector(a.running_mean, "running_mean", a);
  check_vector(a.running_var, "running_var", a);
  TORCH_CHECK(defined(a.running_mean) == defined(a.running_var),
              "running_mean and running_var must both be given or both be None");
  if (defined(a.num_batches_tracked)) {
    const at::Tensor& t = *a.num_batches_tracked;
    TORCH_CHECK(t.device() == a.x.device(), "num_batches_tracked is on ", t.device(), " but x is on ", a.x.device());
    TORCH_CHECK(t.scalar_type() == at::kLong && t.sym_numel() == 1,
                "num_batches_tracked must be a one-element int64 tensor, got ", t.scalar_type(), " of shape ",
                t.sym_sizes());
  }
  TORCH_CHECK(a.scale.device() == a.x.device(), "scale is on ", a.scale.device(), " but x is on ", a.x.device());
  TORCH_CHECK(at::isFloatingType(a.scale.scalar_type()), "scale must be a floating-point tensor, got ",
              a.scale.scalar_type());
  const bool scalar_scale = a.scale.sym_numel() == 1 && a.scale.dim() <= 2;
  const bool column_scale = (a.scale.dim() == 1 && a.scale.sym_size(0) == a.sym_N()) ||
                            (a.scale.dim() == 2 && a.scale.sym_size(0) == 1 && a.scale.sym_size(1) == a.sym_N());
  TORCH_CHECK(scalar_scale || column_scale, "scale must be a scalar, shape [1], or per column: shape [", a.sym_N(),
              "] or [1, ", a.sym_N(), "]; got ", a.scale.sym_sizes());
  TORCH_CHECK(std::isfinite(a.eps) && a.eps >= 0.0, "eps must be finite and non-negative, got ", a.eps);
  if (a.momentum.has_value()) {
    TORCH_CHECK(*a.momentum >= 0.0 && *a.momentum <= 1.0, "momentum must be in [0, 1] or None, got ", *a.momentum);
  } else {
    TORCH_CHECK(!a.uses_batch_stats() || !a.has_running_stats() || defined(a.num_batches_tracked),
                "momentum=None (cumulative moving average) needs num_batches_tracked");
  }
  TORCH_CHECK_VALUE(!(a.uses_batch_stats() && a.sym_M() == 1),
                    "Expected more than 1 value per channel when training, got input size [1, ", a.sym_N(), "]");
  if (a.precision.has_value()) {
    TORCH_CHECK(*a.precision == "highest" || *a.precision == "tf32" || *a.precision == "high" ||
                    *a.precision == "medium",
                "precision must be None, 'highest', 'high', 'medium' or 'tf32', got '", *a.precision, "'");
  }
  if (a.path.has_value()) {
    TORCH_CHECK(*a.path == "auto" || *a.path == "sm90" || *a.path == "generic",
                "path must be None, 'auto', 'sm90' or 'generic', got '", *a.path, "'");
  }
}

Outputs allocate_outputs(const OpArgs& a) {
  const auto f32 = a.x.options().dtype(at::kFloat);
  const c10::SymInt M = a.sym_M(), N = a.sym_N();
  Outputs outs{at::empty_symint({M, N}, a.x.options()), at::empty_symint({N}, f32), at::empty_symint({N}, f32),
               at::empty_symint({M, N}, f32)};
  // Test aid: GEMM_BN_SOFTMAX_POISON=1 fills every output with NaN before the kernels run, so
  // an element a kernel forgets to write shows up in the tests.
  if (!a.x.is_meta()) {
    if (const char* env = std::getenv("GEMM_BN_SOFTMAX_POISON"); env != nullptr && env[0] == '1') {
      std::get<0>(outs).fill_(std::numeric_limits<double>::quiet_NaN());
      std::get<1>(outs).fill_(std::numeric_limits<double>::quiet_NaN());
      std::get<2>(outs).fill_(std::numeric_limits<double>::quiet_NaN());
      std::get<3>(outs).fill_(std::numeric_limits<double>::quiet_NaN());
    }
  }
  return outs;
}

MatmulPrecision resolve_precision(const OpArgs& a) {
  if (a.x.scalar_type() != at::kFloat) return MatmulPrecision::kHighest;  // unused for bf16/fp16
  if (a.precision.has_value()) return *a.precision == "highest" ? MatmulPrecision::kHighest : MatmulPrecision::kTF32;
  return at::globalContext().allowTF32CuBLAS() ? MatmulPrecision::kTF32 : MatmulPrecision::kHighest;
}

BatchNormTensors prepare_batchnorm(const OpArgs& a) {
  // The kernels read the BN vectors in their own dtype (fp32 or x's): no copies in the common
  // case. Vectors of mixed dtypes or with strides go through an fp32 contiguous copy instead.
  const std::optional<at::Tensor>* vecs[] = {&a.bn_weight, &a.bn_bias, &a.running_mean, &a.running_var};
  std::optional<at::ScalarType> common;
  bool direct = true;
  for (const auto* v : vecs) {
    if (!defined(*v)) continue;
    if (!common) common = (*v)->scalar_type();
    direct = direct && (*v)->scalar_type() == *common && (*v)->is_contiguous();
  }
  auto take = [&](const std::optional<at::Tensor>& t) {
    if (!defined(t)) return at::Tensor();
    return direct ? *t : t->to(at::kFloat).contiguous();
  };
  BatchNormTensors t;
  t.gamma = take(a.bn_weight);
  t.beta = take(a.bn_bias);
  t.running_mean = take(a.running_mean);
  t.running_var = take(a.running_var);
  t.param_dtype = direct && common ? element_type(*common) : ElementType::kFloat32;
  const bool scale_direct = is_supported_dtype(a.scale.scalar_type()) && a.scale.is_contiguous();
  t.scale = scale_direct ? a.scale : a.scale.to(at::kFloat).contiguous();
  return t;
}

BatchNormArgs BatchNormTensors::args(const OpArgs& a) const {
  BatchNormArgs bn;
  auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; };
  bn.gamma = ptr(gamma);
  bn.beta = ptr(beta);
  bn.running_mean = ptr(running_mean);
  bn.running_var = ptr(running_var);
  bn.param_dtype = param_dtype;
  bn.num_batches_tracked = defined(a.num_batches_tracked) ? a.num_batches_tracked->data_ptr<int64_t>() : nullptr;
  bn.momentum = a.momentum.has_value() ? *a.momentum : -1.0;
  bn.eps = a.eps;
  bn.training = a.training;
  bn.scale = scale.data_ptr();
  bn.scale_numel = scale.numel();
  bn.scale_dtype = element_type(scale.scalar_type());
  return bn;
}

void BatchNormTensors::commit(const OpArgs& a) const {
  if (!a.uses_batch_stats() || !a.has_running_stats()) return;
  if (!running_mean.is_same(*a.running_mean)) a.running_mean->copy_(running_mean);
  if (!running_var.is_same(*a.running_var)) a.running_var->copy_(running_var);
}

void bump_num_batches_tracked(const OpArgs& a) {
  if (a.training && a.has_running_stats() && a.num_batches_tracked.has_value() && a.num_batches_tracked->defined())
    a.num_batches_tracked->add_(1);
}

void throw_on_error(const Status& s, const char* where) {
  if (s.ok()) return;
  if (s.code == StatusCode::kInvalidArgument) TORCH_CHECK_VALUE(false, where, ": ", s.message);
  if (s.code == StatusCode::kNotSupported) TORCH_CHECK_NOT_IMPLEMENTED(false, where, ": ", s.message);
  TORCH_CHECK(false, where, ": ", s.message);
}

}  // namespace fused::torch_op
