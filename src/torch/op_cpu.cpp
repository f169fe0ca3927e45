// CPU kernel of fused::gemm_bn_softmax: ATen GEMM for y, then the library's CPU forward
// (column partials -> finalize -> row softmax), parallelised with at::parallel_for.
#include <ATen/Parallel.h>

#include "op_common.h"

namespace fused::torch_op {

Outputs gemm_bn_softmax_cpu(const OpArgs& a) {
  check_args(a);
  auto [out, save_mean, save_invstd, y] = allocate_outputs(a);
  // y = x W^T + b in fp32 (bf16/fp16 inputs are upcast: fp32 accumulation, fp32 y).
  const at::Tensor xf = a.x.to(at::kFloat), wf = a.weight.to(at::kFloat);
  if (a.bias.has_value() && a.bias->defined()) {
    at::addmm_out(y, a.bias->to(at::kFloat), xf, wf.t());
  } else {
    at::mm_out(y, xf, wf.t());
  }
  bump_num_batches_tracked(a);
  const BatchNormTensors bnt = prepare_batchnorm(a);

  ForwardProblem p;
  p.M = a.M(); p.N = a.N(); p.K = a.K();
  p.dtype = element_type(a.x.scalar_type());
  ForwardBuffers b;
  b.x = xf.data_ptr(); b.ldx = a.K();  // the GEMM is done: the library reads y only
  b.weight = wf.data_ptr(); b.ldw = a.K();
  b.y = y.data_ptr<float>(); b.ldy = p.N;
  b.out = out.data_ptr(); b.ldo = p.N;
  b.save_mean = save_mean.data_ptr<float>(); b.save_invstd = save_invstd.data_ptr<float>();
  const cpu::ParallelFor pf = [](int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
    at::parallel_for(0, n, grain, body);
  };
  throw_on_error(cpu::forward_from_y(p, b, bnt.args(a), pf), "gemm_bn_softmax");
  bnt.commit(a);
  return {out, save_mean, save_invstd, y};
}

}  // namespace fused::torch_op
