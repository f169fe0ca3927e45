// Data parallelism with nn.SyncBatchNorm's semantics, inside the op: gemm_bn_softmax(...,
// group_name=) normalises with the statistics of every rank's rows of a torch.distributed process
// group (named as torch registers it: `group.group_name` in Python). One all_gather each way:
//   forward:  gemm_column_moments -> all_gather(moments) -> bn_softmax_from_moments
//   backward: gemm_bn_softmax_backward_sums -> all_gather(sums) -> gemm_bn_softmax_backward
// All-gathers rather than all-reduces: every rank merges the records in rank order, so every rank
// gets the same bits run to run, whatever the backend's reduction order.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "op_common.h"

namespace fused::torch_op {

// nn.SyncBatchNorm's rule: statistics are exchanged when training, in a group of more than one rank
// (false without a group name).
bool exchanges_statistics(bool training, const OptString& group_name);

// (world_size, record.numel()): every rank's record in rank order, by one all_gather through the
// group, on the current stream (NCCL) or waited for (backends that run it elsewhere, e.g. gloo).
at::Tensor exchange_records(const at::Tensor& record, const std::string& group_name);

// The forward with statistics over the group (exchanges_statistics() true): the device's
// gemm_column_moments and bn_softmax_from_moments kernels around exchange_records.
using MomentsKernel = MomentsOutputs (*)(const OpArgs&);
using FromMomentsKernel = FromMomentsOutputs (*)(const FromMomentsArgs&);
Outputs data_parallel_forward(const OpArgs& a, const std::string& group_name, MomentsKernel moments,
                              FromMomentsKernel from_moments);

// The backward with sums over the group (batch statistics; exchanges_statistics() true): the
// device's gemm_bn_softmax_backward_sums kernel, exchange_records, then its backward kernel with
// this rank's row dots and sums and every rank's sums (which the caller must not give).
using SumsKernel = SumsOutputs (*)(const BackwardArgs&, const OptTensor&);
using BackwardKernel = Grads (*)(const BackwardArgs&);
Grads data_parallel_backward(const BackwardArgs& a, const std::string& group_name, SumsKernel sums,
                             BackwardKernel backward);

}  // namespace fused::torch_op
