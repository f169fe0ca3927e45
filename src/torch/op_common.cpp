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
  TORCH_CHECK(t->scalar_type() == at::kFloat || t->scalar_type() == a.linear_dtype(), name,
              " must be float32 or the Linear's dtype (", a.linear_dtype(), "), got ", t->scalar_type());
}

bool defined(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// nn.BatchNorm1d counts a batch when training with running statistics.
bool counts_batch(const OpArgs& a) { return a.training && a.has_running_stats() && defined(a.num_batches_tracked); }

void check_precision(const std::optional<std::string>& precision) {
  if (!precision.has_value()) return;
  TORCH_CHECK(*precision == "highest" || *precision == "tf32" || *precision == "high" || *precision == "medium" ||
                  *precision == "3xtf32",
              "precision must be None, 'highest', 'high', 'medium', 'tf32' or '3xtf32', got '", *precision, "'");
}

}  // namespace

ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ElementType::kFloat32;
    case at::kBFloat16: return ElementType::kBFloat16;
    case at::kHalf: return ElementType::kFloat16;
    case at::kDouble: return ElementType::kFloat64;  // the CPU backward (gradient checks) only
    default: TORCH_CHECK(false, "unsupported dtype ", t);
  }
}

void check_linear_args(const OpArgs& a) {
  TORCH_CHECK(a.x.dim() == 2, "x must be 2-D (batch, in_features), got shape ", a.x.sym_sizes());
  TORCH_CHECK(a.weight.dim() == 2, "weight must be 2-D (out_features, in_features), got shape ",
              a.weight.sym_sizes());
  TORCH_CHECK(is_supported_dtype(a.x.scalar_type()), "x has unsupported dtype ", a.x.scalar_type(),
              "; expected float32, bfloat16 or float16");
  TORCH_CHECK(!a.compute_dtype || is_supported_dtype(*a.compute_dtype), "compute_dtype must be float32, bfloat16 "
              "or float16, got ", *a.compute_dtype);
  TORCH_CHECK(!a.out_dtype || is_supported_dtype(*a.out_dtype), "out_dtype must be float32, bfloat16 or float16, got ",
              *a.out_dtype);
  // With an explicit compute dtype every Linear operand is rounded to it, whatever its own dtype.
  TORCH_CHECK(is_supported_dtype(a.weight.scalar_type()) &&
                  (a.compute_dtype || a.weight.scalar_type() == a.x.scalar_type()),
              "weight dtype ", a.weight.scalar_type(), " must match x dtype ", a.x.scalar_type(),
              " (or pass compute_dtype)");
  TORCH_CHECK(a.weight.device() == a.x.device(), "weight is on ", a.weight.device(), " but x is on ", a.x.device());
  TORCH_CHECK(a.x.sym_size(1) == a.weight.sym_size(1), "x.size(1) = ", a.x.sym_size(1),
              " must equal weight.size(1) = ", a.weight.sym_size(1), " (in_features)");
  if (defined(a.bias)) {
    TORCH_CHECK(a.bias->device() == a.x.device(), "bias is on ", a.bias->device(), " but x is on ", a.x.device());
    TORCH_CHECK(a.bias->dim() == 1 && a.bias->sym_size(0) == a.sym_N(), "bias must have shape [out_features] = [",
                a.sym_N(), "], got ", a.bias->sym_sizes());
    TORCH_CHECK(is_supported_dtype(a.bias->scalar_type()) &&
                    (a.compute_dtype || a.bias->scalar_type() == a.x.scalar_type()),
                "bias dtype ", a.bias->scalar_type(), " must match x dtype ", a.x.scalar_type(),
                " (or pass compute_dtype)");
  }
  check_precision(a.precision);
  if (a.path.has_value()) {
    TORCH_CHECK(*a.path == "auto" || *a.path == "sm90" || *a.path == "generic" || *a.path == "recompute",
                "path must be None, 'auto', 'sm90', 'generic' or 'recompute', got '", *a.path, "'");
  }
}

void check_args(const OpArgs& a) {
  check_linear_args(a);
  check_bn_args(a);
}

void check_bn_args(const OpArgs& a) {
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
  // Bad eps values are ValueErrors, as F.batch_norm raises them.
  TORCH_CHECK_VALUE(std::isfinite(a.eps) && a.eps >= 0.0, "eps must be finite and non-negative, got ", a.eps);
  TORCH_CHECK_VALUE(!batch_norm_eps_zero_refused(a.eps, a.uses_batch_stats()), FUSED_EPS_ZERO_MESSAGE);
  if (a.momentum.has_value()) {
    TORCH_CHECK(*a.momentum >= 0.0 && *a.momentum <= 1.0, "momentum must be in [0, 1] or None, got ", *a.momentum);
  } else {
    TORCH_CHECK(!a.uses_batch_stats() || !a.has_running_stats() || defined(a.num_batches_tracked),
                "momentum=None (cumulative moving average) needs num_batches_tracked");
  }
  // The batch-of-one rule is the library's (fused::validate), checked where it runs; the Meta kernel
  // applies the same predicate (check_batch_size).
}

void check_batch_size(const OpArgs& a) {
  // A symbolic batch is never 1 here: torch.compile specializes sizes 0 and 1.
  const std::optional<int64_t> M = a.sym_M().maybe_as_int();
  TORCH_CHECK_VALUE(!(M.has_value() && batch_norm_batch_too_small(*M, a.uses_batch_stats())),
                    FUSED_BATCH_TOO_SMALL_MESSAGE ", got input size [1, ", a.sym_N(), "]");
}

// Each row's log-normaliser. The kernels write it where N > 0; a row over no columns gets the log of
// an empty sum, -inf (what a column-parallel rank without columns adds to the other ranks').
namespace {
at::Tensor row_lse_output(const c10::SymInt& M, const c10::SymInt& N, const at::TensorOptions& f32) {
  if (N.maybe_as_int() == std::optional<int64_t>(0))
    return at::full_symint({M}, -std::numeric_limits<float>::infinity(), f32);
  at::Tensor row_lse = at::empty_symint({M}, f32);
  poison({row_lse});
  return row_lse;
}
}  // namespace

Outputs allocate_outputs(const OpArgs& a) {
  const auto f32 = a.x.options().dtype(at::kFloat);
  const c10::SymInt M = a.sym_M(), N = a.sym_N();
  at::Tensor y = a.keep_y ? at::empty_symint({M, N}, f32) : at::empty({0}, f32);
  Outputs outs{at::empty_symint({M, N}, a.x.options().dtype(a.out_scalar_type())), at::empty_symint({N}, f32),
               at::empty_symint({N}, f32), y, row_lse_output(M, N, f32)};
  poison({std::get<0>(outs), std::get<1>(outs), std::get<2>(outs), std::get<3>(outs)});
  return outs;
}

at::Tensor y_to_write(const OpArgs& a, const at::Tensor& y_output) {
  if (a.keep_y) return y_output;
  at::Tensor y = at::empty({a.M(), a.N()}, a.x.options().dtype(at::kFloat));
  poison({y});
  return y;
}

bool poison_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("GEMM_BN_SOFTMAX_POISON");
    return env != nullptr && env[0] == '1';
  }();
  return enabled;
}

void poison(std::initializer_list<at::Tensor> outputs) {
  if (!poison_enabled()) return;
  for (const at::Tensor& t : outputs) {
    if (t.defined() && !t.is_meta()) t.fill_(std::numeric_limits<double>::quiet_NaN());
  }
}

void check_from_moments_args(const FromMomentsArgs& a) {
  const at::Tensor& y = a.y;
  TORCH_CHECK(y.dim() == 2 && y.scalar_type() == at::kFloat, "y must be 2-D float32 (gemm_column_moments' y), got ",
              y.scalar_type(), " ", y.sym_sizes());
  check_rank_records(a.rank_moments, std::nullopt, y.sym_size(1), y.device(), "rank_moments", "");
  TORCH_CHECK(!a.bn.compute_dtype || is_supported_dtype(*a.bn.compute_dtype),
              "compute_dtype must be float32, bfloat16 or float16, got ", *a.bn.compute_dtype);
  TORCH_CHECK(!a.bn.out_dtype || is_supported_dtype(*a.bn.out_dtype),
              "out_dtype must be float32, bfloat16 or float16, got ", *a.bn.out_dtype);
  TORCH_CHECK(a.bn.training, "data-parallel statistics apply to training only");
  check_bn_args(a.bn);
}

FromMomentsOutputs allocate_from_moments_outputs(const FromMomentsArgs& a) {
  const auto f32 = a.y.options().dtype(at::kFloat);
  const c10::SymInt M = a.y.sym_size(0), N = a.y.sym_size(1);
  FromMomentsOutputs outs{at::empty_symint({M, N}, a.y.options().dtype(a.bn.out_scalar_type())),
                          at::empty_symint({N}, f32), at::empty_symint({N}, f32), row_lse_output(M, N, f32)};
  poison({std::get<0>(outs), std::get<1>(outs), std::get<2>(outs)});
  return outs;
}

ForwardBuffers from_y_buffers(const at::Tensor& y, const at::Tensor& out, const at::Tensor& save_mean,
                              const at::Tensor& save_invstd, const at::Tensor& row_lse) {
  ForwardBuffers b;
  b.y = y.defined() ? y.data_ptr<float>() : nullptr;
  b.ldy = y.defined() ? y.size(1) : 0;
  b.out = out.data_ptr(); b.ldo = out.size(1);
  b.save_mean = save_mean.data_ptr<float>(); b.save_invstd = save_invstd.data_ptr<float>();
  b.row_lse = row_lse.data_ptr<float>();
  return b;
}

FromMomentsCall prepare_from_moments(const FromMomentsArgs& a) {
  check_from_moments_args(a);
  FromMomentsCall c{allocate_from_moments_outputs(a), a.y.contiguous(), a.rank_moments.contiguous(),
                    prepare_batchnorm(a.bn)};
  c.bn = c.bn_tensors.args(a.bn);
  c.bn.rank_moments = c.records.data_ptr<double>();
  c.bn.num_ranks = c.records.size(0);
  ForwardProblem& p = c.problem;
  p.M = c.y.size(0); p.N = c.y.size(1);
  p.dtype = element_type(a.bn.linear_dtype());
  p.out_dtype = element_type(a.bn.out_scalar_type());
  const auto& [out, save_mean, save_invstd, row_lse] = c.outs;
  c.buffers = from_y_buffers(c.y, out, save_mean, save_invstd, row_lse);
  return c;
}

SumsCall prepare_sums(const BackwardArgs& a, const std::optional<at::Tensor>& given_row_sums) {
  check_backward_args(a);
  check_given_row_sums(a, given_row_sums);
  Grads none;
  SumsCall c{allocate_sums_outputs(a), prepare_backward(a, none)};
  if (defined(given_row_sums)) {
    c.given_row_sums = given_row_sums->contiguous();
    c.tensors.buffers.row_sums = c.given_row_sums.data_ptr<double>();
  }
  return c;
}

SumsOutputs allocate_sums_outputs(const BackwardArgs& a) {
  const c10::SymInt M = a.grad_out.sym_size(0), N = a.grad_out.sym_size(1);
  SumsOutputs outs{at::empty_symint({2 * N + 1}, a.grad_out.options().dtype(at::kDouble)),
                   at::empty_symint({c10::SymInt(kRowSumsRows), M}, a.y.options().dtype(at::kDouble))};
  poison({std::get<0>(outs), std::get<1>(outs)});
  return outs;
}

MatmulPrecision resolve_precision(at::ScalarType linear_dtype, const std::optional<std::string>& precision) {
  if (linear_dtype != at::kFloat) return MatmulPrecision::kHighest;  // unused for bf16/fp16
  if (precision.has_value()) {
    if (*precision == "highest") return MatmulPrecision::kHighest;
    return *precision == "3xtf32" ? MatmulPrecision::k3xTF32 : MatmulPrecision::kTF32;
  }
  return at::globalContext().allowTF32CuBLAS() ? MatmulPrecision::kTF32 : MatmulPrecision::kHighest;
}

MatmulPrecision resolve_precision(const OpArgs& a) { return resolve_precision(a.linear_dtype(), a.precision); }

const char* precision_name(MatmulPrecision p) {
  switch (p) {
    case MatmulPrecision::kTF32: return "tf32";
    case MatmulPrecision::k3xTF32: return "3xtf32";
    default: return "highest";
  }
}

LinearOperands linear_operands(const OpArgs& a) {
  const at::ScalarType t = a.linear_dtype();
  LinearOperands o{a.x.to(t), a.weight.to(t), at::Tensor()};
  if (defined(a.bias)) o.bias = a.bias->to(t);
  return o;
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
  // The library counts the batch in it (its last kernel): no ATen add_ of our own after the kernels.
  bn.num_batches_tracked = counts_batch(a) ? a.num_batches_tracked->data_ptr<int64_t>() : nullptr;
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

void throw_on_error(const Status& s, const char* where) {
  if (s.ok()) return;
  if (s.code == StatusCode::kInvalidArgument) TORCH_CHECK_VALUE(false, where, ": ", s.message);
  if (s.code == StatusCode::kNotSupported) TORCH_CHECK_NOT_IMPLEMENTED(false, where, ": ", s.message);
  TORCH_CHECK(false, where, ": ", s.message);
}

// ---- backward ----------------------------------------------------------------------------

at::ScalarType BackwardArgs::gemm_dtype() const {
  if (defined(x)) return x->scalar_type();
  if (defined(weight)) return weight->scalar_type();
  return y.scalar_type();  // no GEMM runs: only the dtype of grad_bias can depend on it
}

void check_backward_args(const BackwardArgs& a) {
  const auto& g = a.grad_out;
  TORCH_CHECK(g.dim() == 2, "grad_out must be 2-D (batch, out_features), got shape ", g.sym_sizes());
  TORCH_CHECK(a.y.sym_sizes() == g.sym_sizes(), "grad_out and y must have the same shape, got ", g.sym_sizes(),
              " and ", a.y.sym_sizes());
  auto floating = [](at::ScalarType t) { return is_supported_dtype(t) || t == at::kDouble; };
  TORCH_CHECK(floating(g.scalar_type()), "grad_out has unsupported dtype ", g.scalar_type());
  TORCH_CHECK(a.y.scalar_type() == at::kFloat || a.y.scalar_type() == at::kDouble,
              "y must be float32 (float64 for gradient checks on the CPU), got ", a.y.scalar_type());
  const c10::SymInt N = g.sym_size(1);
  for (const at::Tensor* t : {&a.save_mean, &a.save_invstd}) {
    TORCH_CHECK(t->dim() == 1 && t->sym_size(0) == N && t->scalar_type() == a.y.scalar_type(),
                "save_mean and save_invstd must be [out_features] = [", N, "] of y's dtype, got ", t->sym_sizes(),
                " ", t->scalar_type());
  }
  TORCH_CHECK(a.row_lse.dim() == 1 && a.row_lse.sym_size(0) == g.sym_size(0) &&
                  a.row_lse.scalar_type() == a.y.scalar_type(),
              "row_lse must be [batch] = [", g.sym_size(0), "] of y's dtype, got ", a.row_lse.sym_sizes(), " ",
              a.row_lse.scalar_type());
  std::vector<const at::Tensor*> all = {&a.y, &a.save_mean, &a.save_invstd, &a.row_lse, &a.scale};
  if (defined(a.x)) {
    TORCH_CHECK(a.x->dim() == 2 && a.x->sym_size(0) == g.sym_size(0), "x must be (batch, in_features) with batch ",
                g.sym_size(0), ", got ", a.x->sym_sizes());
    TORCH_CHECK(floating(a.x->scalar_type()), "x has unsupported dtype ", a.x->scalar_type());
    all.push_back(&*a.x);
  }
  if (defined(a.weight)) {
    TORCH_CHECK(a.weight->dim() == 2 && a.weight->sym_size(0) == N, "weight must be (out_features, in_features) with "
                "out_features ", N, ", got ", a.weight->sym_sizes());
    TORCH_CHECK(floating(a.weight->scalar_type()), "weight has unsupported dtype ", a.weight->scalar_type());
    all.push_back(&*a.weight);
  }
  if (defined(a.x) && defined(a.weight)) {
    TORCH_CHECK(a.x->sym_size(1) == a.weight->sym_size(1), "x.size(1) = ", a.x->sym_size(1),
                " must equal weight.size(1) = ", a.weight->sym_size(1));
    TORCH_CHECK(a.x->scalar_type() == a.weight->scalar_type(), "x and weight must have one dtype (the GEMM's), got ",
                a.x->scalar_type(), " and ", a.weight->scalar_type());
  }
  TORCH_CHECK(defined(a.bn_weight) == defined(a.bn_bias), "bn_weight and bn_bias must both be given or both be None");
  for (const auto* v : {&a.bn_weight, &a.bn_bias}) {
    if (!defined(*v)) continue;
    TORCH_CHECK((*v)->dim() == 1 && (*v)->sym_size(0) == N && floating((*v)->scalar_type()),
                "bn_weight and bn_bias must be floating [out_features] = [", N, "], got ", (*v)->sym_sizes(), " ",
                (*v)->scalar_type());
    all.push_back(&**v);
  }
  TORCH_CHECK(floating(a.scale.scalar_type()) && (a.scale.sym_numel() == 1 || a.scale.sym_numel() == N),
              "scale must have 1 or out_features elements, got shape ", a.scale.sym_sizes());
  for (const at::Tensor* t : all) {
    TORCH_CHECK(t->device() == g.device(), "every backward input must be on grad_out's device ", g.device(), ", got ",
                t->device());
  }
  const auto& m = a.output_mask;
  TORCH_CHECK(!m[kGradX] || defined(a.weight), "grad_x needs weight");
  TORCH_CHECK(!m[kGradWeight] || defined(a.x), "grad_weight needs x");
  TORCH_CHECK(!(m[kGradBnWeight] || m[kGradBnBias]) || defined(a.bn_weight), "grad_bn_weight / grad_bn_bias need "
              "bn_weight and bn_bias");
  TORCH_CHECK(!a.linear_grad_dtype || floating(*a.linear_grad_dtype), "linear_grad_dtype must be floating, got ",
              *a.linear_grad_dtype);
  check_precision(a.precision);
  const bool data_parallel = defined(a.rank_sums);
  TORCH_CHECK(data_parallel == defined(a.local_sums) && data_parallel == defined(a.row_sums),
              "row_sums, local_sums and rank_sums (data-parallel backward) must be given together");
  if (data_parallel) {
    check_rank_records(*a.rank_sums, *a.local_sums, N, g.device(), "rank_sums", "local_sums");
    check_given_row_sums(a, a.row_sums);
  }
}

void check_given_row_sums(const BackwardArgs& a, const std::optional<at::Tensor>& row_sums) {
  if (!defined(row_sums)) return;
  const at::Tensor& g = a.grad_out;
  TORCH_CHECK(row_sums->dim() == 2 && row_sums->sym_size(0) == kRowSumsRows && row_sums->sym_size(1) == g.sym_size(0) &&
                  row_sums->scalar_type() == at::kDouble && row_sums->device() == g.device(),
              "row_sums must be [2, batch] = [2, ", g.sym_size(0), "] (each row's sum of grad_out * out, then of out) "
              "of float64 on grad_out's device, got ", row_sums->sym_sizes(), " ", row_sums->scalar_type());
}

void check_rank_records(const at::Tensor& records, const std::optional<at::Tensor>& own, const c10::SymInt& N,
                        const at::Device& device, const char* name, const char* own_name) {
  const c10::SymInt size = 2 * N + 1;
  TORCH_CHECK(records.dim() == 2 && records.sym_size(0) >= 1 && records.sym_size(1) == size &&
                  records.scalar_type() == at::kDouble && records.device() == device,
              name, " must be float64 of shape [world_size, 2 * out_features + 1] = [*, ", size, "] on ", device,
              " (every rank's record, in rank order), got ", records.scalar_type(), " ", records.sym_sizes(), " on ",
              records.device());
  if (own.has_value()) {
    TORCH_CHECK(own->dim() == 1 && own->sym_size(0) == size && own->scalar_type() == at::kDouble &&
                    own->device() == device,
                own_name, " must be float64 of shape [2 * out_features + 1] = [", size, "] on ", device, ", got ",
                own->scalar_type(), " ", own->sym_sizes());
  }
}

Grads allocate_grads(const BackwardArgs& a) {
  const auto& m = a.output_mask;
  const auto lin = a.grad_out.options().dtype(a.grad_linear_dtype());
  const c10::SymInt M = a.grad_out.sym_size(0), N = a.grad_out.sym_size(1);
  Grads g;
  if (m[kGradX]) std::get<kGradX>(g) = at::empty_symint({M, a.weight->sym_size(1)}, lin);
  if (m[kGradWeight]) std::get<kGradWeight>(g) = at::empty_symint({N, a.x->sym_size(1)}, lin);
  if (m[kGradBias]) std::get<kGradBias>(g) = at::empty_symint({N}, lin);
  if (m[kGradBnWeight]) std::get<kGradBnWeight>(g) = at::empty_symint({N}, a.bn_weight->options());
  if (m[kGradBnBias]) std::get<kGradBnBias>(g) = at::empty_symint({N}, a.bn_bias->options());
  if (m[kGradScale]) std::get<kGradScale>(g) = at::empty_symint(a.scale.sym_sizes(), a.scale.options());
  return g;
}

BackwardTensors prepare_backward(const BackwardArgs& a, Grads& grads) {
  BackwardTensors t;
  t.grad_out = a.grad_out.contiguous();  // e.g. the expanded ones of out.sum().backward()
  t.y = a.y.contiguous();
  t.save_mean = a.save_mean.contiguous();
  t.save_invstd = a.save_invstd.contiguous();
  t.row_lse = a.row_lse.contiguous();
  // BN vectors: as given when gamma and beta share a dtype and are contiguous, else fp32 copies.
  const bool affine = defined(a.bn_weight);
  const bool direct = !affine || (a.bn_weight->scalar_type() == a.bn_bias->scalar_type() &&
                                  a.bn_weight->is_contiguous() && a.bn_bias->is_contiguous());
  if (affine) {
    t.gamma = direct ? *a.bn_weight : a.bn_weight->to(at::kFloat).contiguous();
    t.beta = direct ? *a.bn_bias : a.bn_bias->to(at::kFloat).contiguous();
  }
  auto target = [&](int i, const at::Tensor& like) {
    at::Tensor& out = (i == kGradBnWeight)   ? std::get<kGradBnWeight>(grads)
                      : (i == kGradBnBias) ? std::get<kGradBnBias>(grads)
                                           : std::get<kGradScale>(grads);
    if (!a.output_mask[i]) return at::Tensor();
    return (out.scalar_type() == like.scalar_type() && out.is_contiguous()) ? out : at::empty_like(like);
  };
  t.scale = a.scale.is_contiguous() ? a.scale : a.scale.contiguous();
  if (affine) {
    t.grad_gamma = target(kGradBnWeight, t.gamma);
    t.grad_beta = target(kGradBnBias, t.beta);
  }
  t.grad_scale = target(kGradScale, t.scale);

  BackwardProblem& p = t.problem;
  p.M = a.M();
  p.N = a.N();
  p.grad_dtype = element_type(t.grad_out.scalar_type());
  p.stats_dtype = element_type(t.y.scalar_type());
  p.batch_stats = a.batch_stats;
  BackwardBuffers& b = t.buffers;
  auto ptr = [](const at::Tensor& x) -> void* { return x.defined() ? x.data_ptr() : nullptr; };
  b.grad_out = ptr(t.grad_out); b.ldg = p.N;
  b.y = ptr(t.y); b.ldy = p.N;
  b.save_mean = ptr(t.save_mean);
  b.save_invstd = ptr(t.save_invstd);
  b.row_lse = ptr(t.row_lse);
  b.gamma = ptr(t.gamma);
  b.beta = ptr(t.beta);
  b.param_dtype = affine ? element_type(t.gamma.scalar_type()) : ElementType::kFloat32;
  b.scale = ptr(t.scale);
  b.scale_numel = t.scale.numel();
  b.scale_dtype = element_type(t.scale.scalar_type());
  b.grad_bias = ptr(std::get<kGradBias>(grads));
  b.bias_dtype = element_type(a.grad_linear_dtype());
  b.grad_gamma = ptr(t.grad_gamma);
  b.grad_beta = ptr(t.grad_beta);
  b.grad_scale = ptr(t.grad_scale);
  t.set_data_parallel(a);
  return t;
}

void BackwardTensors::set_data_parallel(const BackwardArgs& a) {
  if (!defined(a.rank_sums)) return;
  row_sums = a.row_sums->contiguous();
  local_sums = a.local_sums->contiguous();
  rank_sums = a.rank_sums->contiguous();
  buffers.row_sums = row_sums.data_ptr<double>();
  buffers.local_sums = local_sums.data_ptr<double>();
  buffers.rank_sums = rank_sums.data_ptr<double>();
  buffers.num_ranks = rank_sums.size(0);
}

void BackwardTensors::commit(Grads& grads) const {
  auto copy_into = [](at::Tensor& out, const at::Tensor& written) {
    if (written.defined() && !written.is_same(out)) out.copy_(written);
  };
  copy_into(std::get<kGradBnWeight>(grads), grad_gamma);
  copy_into(std::get<kGradBnBias>(grads), grad_beta);
  copy_into(std::get<kGradScale>(grads), grad_scale);
}

}  // namespace fused::torch_op
