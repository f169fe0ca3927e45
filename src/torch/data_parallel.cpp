// The op's data-parallel forward and its one collective (data_parallel.h). Done here in C++ rather
// than in Python around two op calls: the host time to issue a data-parallel step is what bounds a
// training loop on fast GPUs, and each Python-level call (autograd Function, op dispatch, the
// collective's Python checks) costs tens of microseconds.
#include "data_parallel.h"

// torch's c10d: the process-group registry (the names Python's groups carry) and ProcessGroup.
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>

namespace fused::torch_op {
namespace {

c10::intrusive_ptr<c10d::ProcessGroup> group_of(const std::string& group_name) {
  return c10d::resolve_process_group(group_name);  // throws, naming the group, when it is unknown
}

}  // namespace

bool exchanges_statistics(bool training, const OptString& group_name) {
  return training && group_name.has_value() && group_of(*group_name)->getSize() > 1;
}

at::Tensor exchange_records(const at::Tensor& record, const std::string& group_name) {
  const c10::intrusive_ptr<c10d::ProcessGroup> group = group_of(group_name);
  const int64_t world = group->getSize();
  at::Tensor input = record.contiguous();
  at::Tensor gathered = at::empty({world * input.numel()}, input.options());
  // What torch.distributed.all_gather_into_tensor(async_op=False) asks of the process group: NCCL
  // then runs the collective on the current stream (stream-ordered, CUDA-graph capturable) and may
  // return no Work; a backend that returns one (gloo) is waited on before the records are read.
  c10d::AllgatherOptions options;
  options.asyncOp = false;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // torch >= 2.14 calls it all_gather_single
  const c10::intrusive_ptr<c10d::Work> work = group->_allgather_base(gathered, input, options);
#pragma GCC diagnostic pop
  if (work) work->wait();
  return gathered.view({world, input.numel()});
}

Outputs data_parallel_forward(const OpArgs& a, const std::string& group_name, MomentsKernel moments,
                              FromMomentsKernel from_moments) {
  check_args(a);  // every argument, before this rank joins the collective
  static const OptTensor none;
  static const at::Tensor no_scale;
  const at::ScalarType linear = a.linear_dtype();
  const auto [y, record] = moments(OpArgs{a.x, a.weight, a.bias, none, none, none, none, none, no_scale,
                                          /*training=*/true, a.momentum, a.eps, a.precision, a.path,
                                          a.compute_dtype, std::nullopt});
  const at::Tensor rank_moments = exchange_records(record, group_name);
  const at::Tensor columns = y.t();  // stands in for weight: N rows (the GEMM is done)
  const OptTensor no_bias;
  auto [out, mean, invstd, row_lse] = from_moments(FromMomentsArgs{
      y, rank_moments,
      OpArgs{y, columns, no_bias, a.bn_weight, a.bn_bias, a.running_mean, a.running_var, a.num_batches_tracked,
             a.scale, /*training=*/true, a.momentum, a.eps, std::nullopt, std::nullopt, linear,
             a.out_scalar_type()}});
  return {out, mean, invstd, a.keep_y ? y : at::empty({0}, y.options()), row_lse};
}

Grads data_parallel_backward(const BackwardArgs& a, const std::string& group_name, SumsKernel sums,
                             BackwardKernel backward) {
  TORCH_CHECK(!a.row_sums.has_value() && !a.local_sums.has_value() && !a.rank_sums.has_value(),
              "gemm_bn_softmax_backward: with group_name the op exchanges the sums itself; row_sums, local_sums "
              "and rank_sums must be None");
  check_backward_args(a);  // every argument, before this rank joins the collective
  const auto [local_sums, row_sums] = sums(a, std::nullopt);
  const OptTensor rank_sums = exchange_records(local_sums, group_name);
  const OptTensor row_sums_arg = row_sums, local_sums_arg = local_sums;
  return backward(BackwardArgs{a.grad_out, a.y, a.save_mean, a.save_invstd, a.row_lse, a.x, a.weight, a.bn_weight,
                               a.bn_bias, a.scale, a.batch_stats, a.output_mask, a.precision, a.linear_grad_dtype,
                               row_sums_arg, local_sums_arg, rank_sums});
}

}  // namespace fused::torch_op
