// CPU kernels of fused::gemm_bn_softmax and its backward: ATen GEMMs, and the library's CPU
// implementation of every other step, parallelised with at::parallel_for.
#include <ATen/Parallel.h>

#include "op_common.h"

namespace fused::torch_op {
namespace {

void parallel(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  at::parallel_for(0, n, grain, body);
}

// GEMM_BN_SOFTMAX_PATH is a process-wide setting for CUDA calls: CPU calls ignore it. The `path`
// argument belongs to this call: a CUDA path forced with CPU tensors is refused.
void refuse_forced_cuda_path(const OpArgs& a) {
  TORCH_CHECK(!a.path.has_value() || *a.path == "auto", "path='", *a.path,
              "' forces a CUDA path, but the inputs are on the CPU");
}

}  // namespace

std::string select_cpu_path(const OpArgs& a) {
  check_linear_args(a);
  refuse_forced_cuda_path(a);
  return "cpu";
}

namespace {

// y = x W^T + b in fp32 (operands rounded to the compute dtype, then upcast: fp32 accumulation, fp32 y).
void linear_into(const OpArgs& a, at::Tensor& y) {
  const LinearOperands lin = linear_operands(a);
  const at::Tensor xf = lin.x.to(at::kFloat), wf = lin.weight.to(at::kFloat);
  if (lin.bias.defined()) {
    at::addmm_out(y, lin.bias.to(at::kFloat), xf, wf.t());
  } else {
    at::mm_out(y, xf, wf.t());
  }
}

ForwardProblem problem_of(int64_t M, int64_t N, const OpArgs& a) {
  ForwardProblem p;
  p.M = M; p.N = N;  // K stays 0: the GEMM is done, the library reads y only
  p.dtype = element_type(a.linear_dtype());
  p.out_dtype = element_type(a.out_scalar_type());
  return p;
}

}  // namespace

Outputs gemm_bn_softmax_cpu(const OpArgs& a) {
  check_args(a);
  refuse_forced_cuda_path(a);
  auto [out, save_mean, save_invstd, y, row_lse] = allocate_outputs(a);
  at::Tensor y_written = y_to_write(a, y);  // the CPU always computes y
  linear_into(a, y_written);
  const BatchNormTensors bnt = prepare_batchnorm(a);
  const ForwardBuffers b = from_y_buffers(y_written, out, save_mean, save_invstd, row_lse);
  throw_on_error(cpu::forward_from_y(problem_of(a.M(), a.N(), a), b, bnt.args(a), parallel), "gemm_bn_softmax");
  bnt.commit(a);
  return {out, save_mean, save_invstd, y, row_lse};
}

MomentsOutputs gemm_column_moments_cpu(const OpArgs& a) {
  check_linear_args(a);
  refuse_forced_cuda_path(a);
  at::Tensor y = at::empty({a.M(), a.N()}, a.x.options().dtype(at::kFloat));
  at::Tensor record = at::empty({2 * a.N() + 1}, a.x.options().dtype(at::kDouble));
  poison({y, record});
  linear_into(a, y);
  throw_on_error(cpu::column_moments(problem_of(a.M(), a.N(), a), y.data_ptr<float>(), a.N(),
                                     record.data_ptr<double>(), parallel),
                 "gemm_column_moments");
  return {y, record};
}

FromMomentsOutputs bn_softmax_from_moments_cpu(const FromMomentsArgs& a) {
  FromMomentsCall c = prepare_from_moments(a);
  throw_on_error(cpu::forward_from_y(c.problem, c.buffers, c.bn, parallel), "bn_softmax_from_moments");
  c.bn_tensors.commit(a.bn);
  return c.outs;
}

SumsOutputs gemm_bn_softmax_backward_sums_cpu(const BackwardArgs& a, const OptTensor& given_row_sums) {
  SumsCall c = prepare_sums(a, given_row_sums);
  auto& [sums, row_sums] = c.outs;
  throw_on_error(cpu::backward_column_sums(c.tensors.problem, c.tensors.buffers, sums.data_ptr<double>(),
                                           row_sums.data_ptr<double>(), parallel),
                 "gemm_bn_softmax_backward_sums");
  return c.outs;
}

Grads gemm_bn_softmax_backward_cpu(const BackwardArgs& a) {
  check_backward_args(a);
  Grads grads = allocate_grads(a);
  BackwardTensors t = prepare_backward(a, grads);
  const auto& m = a.output_mask;
  // The GEMMs run in fp32 (fp64 for float64 gradient checks), as the CPU forward's.
  const at::ScalarType gemm = a.gemm_dtype() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor dy;
  if (m[kGradX] || m[kGradWeight]) {
    dy = at::empty({a.M(), a.N()}, a.grad_out.options().dtype(gemm));
    t.buffers.dy = dy.data_ptr();
    t.buffers.lddy = a.N();
    t.buffers.dy_dtype = element_type(gemm);
  }
  throw_on_error(cpu::backward(t.problem, t.buffers, parallel), "gemm_bn_softmax_backward");
  t.commit(grads);
  if (m[kGradX]) std::get<kGradX>(grads).copy_(at::mm(dy, a.weight->to(gemm)));
  if (m[kGradWeight]) std::get<kGradWeight>(grads).copy_(at::mm(dy.t(), a.x->to(gemm)));
  return grads;
}

}  // namespace fused::torch_op
