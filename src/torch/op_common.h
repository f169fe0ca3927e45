// One definition, for every dispatch key (CPU, CUDA, Meta), of how the op's torch arguments are
// validated, which outputs it allocates, and how they map onto the torch-free library's structs.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <optional>
#include <string>

#include "fused/backward.h"
#include "fused/gemm_bn_softmax.h"
#include "op_schema.h"

namespace fused::torch_op {

using Outputs = ForwardOutputs;  // out, save_mean, save_invstd, y, row_lse

// The op's arguments, as the schema names them.
struct OpArgs {
  const at::Tensor& x;
  const at::Tensor& weight;
  const std::optional<at::Tensor>& bias;
  const std::optional<at::Tensor>& bn_weight;
  const std::optional<at::Tensor>& bn_bias;
  const std::optional<at::Tensor>& running_mean;
  const std::optional<at::Tensor>& running_var;
  const std::optional<at::Tensor>& num_batches_tracked;
  const at::Tensor& scale;
  bool training;
  std::optional<double> momentum;
  double eps;
  const std::optional<std::string>& precision;
  const std::optional<std::string>& path;
  // The Linear part runs in compute_dtype (x, weight, bias rounded to it; None: x's dtype); out has
  // out_dtype (None: the compute dtype). Autocast sets both, as the eager block would run.
  std::optional<at::ScalarType> compute_dtype;
  std::optional<at::ScalarType> out_dtype;
  // false: y is not returned (an empty tensor), so the recompute path may run, which never writes it.
  // The Autograd kernel keeps y whenever a gradient may be asked for (the backward reads y).
  bool keep_y = true;

  at::ScalarType linear_dtype() const { return compute_dtype.value_or(x.scalar_type()); }
  at::ScalarType out_scalar_type() const { return out_dtype.value_or(linear_dtype()); }

  // Concrete sizes (CPU / CUDA kernels) and symbolic ones (validation, Meta / dynamic shapes).
  c10::SymInt sym_M() const { return x.sym_size(0); }
  c10::SymInt sym_N() const { return weight.sym_size(0); }
  int64_t M() const { return x.size(0); }
  int64_t N() const { return weight.size(0); }
  int64_t K() const { return x.size(1); }
  bool has_running_stats() const { return running_mean.has_value() && running_mean->defined(); }
  bool uses_batch_stats() const { return batch_norm_uses_batch_stats(training, has_running_stats()); }
};

// Every precondition of the contract the library does not check itself, each failure naming the
// argument. Throws. check_linear_args: those of x, weight, bias, compute_dtype, precision and path
// only (enough to choose a path).
void check_args(const OpArgs& a);
void check_linear_args(const OpArgs& a);
// The BatchNorm part of check_args (BN vectors, running statistics, scale, eps, momentum): reads x
// only for its device, weight only for N.
void check_bn_args(const OpArgs& a);
// The library's batch-of-one rule, for the Meta kernel (the CPU and CUDA kernels get it from the
// library's validation).
void check_batch_size(const OpArgs& a);

// The library's view of a forward whose y is already computed (row-major, dense): y, out and the
// saved statistics; the Linear operands are not read.
ForwardBuffers from_y_buffers(const at::Tensor& y, const at::Tensor& out, const at::Tensor& save_mean,
                              const at::Tensor& save_invstd, const at::Tensor& row_lse);

// Allocates (M, N) out in out_scalar_type(), (N) save_mean / save_invstd, (M, N) fp32 y (shape (0,)
// when not keep_y) and (M) fp32 row_lse on x's device.
Outputs allocate_outputs(const OpArgs& a);
// The (M, N) fp32 y a forward writes: the output y when kept, else a scratch tensor.
at::Tensor y_to_write(const OpArgs& a, const at::Tensor& y_output);

// x, weight and bias in the compute dtype (no copy when they already are).
struct LinearOperands {
  at::Tensor x, weight, bias;  // bias undefined when absent
};
LinearOperands linear_operands(const OpArgs& a);

ElementType element_type(at::ScalarType t);

// "highest" | "tf32" ("high", "medium") | "3xtf32" from the argument, or from torch's float32 matmul
// settings when None (which never select 3xtf32: it is asked for by name).
MatmulPrecision resolve_precision(const OpArgs& a);
MatmulPrecision resolve_precision(at::ScalarType linear_dtype, const std::optional<std::string>& precision);
// The argument value that names a resolved precision: "highest", "tf32" or "3xtf32".
const char* precision_name(MatmulPrecision p);

// The path the op would take for these Linear operands (check_linear_args only, nothing allocated):
// "cpu" (a forced CUDA path is refused; op_cpu.cpp), or "sm90" / "generic" as
// fused::cuda::choose_path decides (op_cuda.cpp).
std::string select_cpu_path(const OpArgs& a);
std::string select_cuda_path(const OpArgs& a);

// BN vectors as the library reads them: as given when they share one dtype and are contiguous
// (no copies); otherwise fp32 contiguous copies, the running statistics written back by `commit()`,
// called once the library's forward succeeded. num_batches_tracked is handed to the library, whose
// last kernel counts the batch (as nn.BatchNorm1d, when training with running statistics); a call
// that fails before it launches changes no buffer.
struct BatchNormTensors {
  at::Tensor gamma, beta, running_mean, running_var, scale;
  ElementType param_dtype = ElementType::kFloat32;
  BatchNormArgs args(const OpArgs& a) const;
  void commit(const OpArgs& a) const;
};
BatchNormTensors prepare_batchnorm(const OpArgs& a);

void throw_on_error(const Status& s, const char* where);

// ---- backward ----------------------------------------------------------------------------
// grad_x, grad_weight, grad_bias, grad_bn_weight, grad_bn_bias, grad_scale (undefined when not asked for)
using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
enum GradIndex : int { kGradX = 0, kGradWeight, kGradBias, kGradBnWeight, kGradBnBias, kGradScale };

// The backward op's arguments, as its schema names them.
struct BackwardArgs {
  const at::Tensor& grad_out;
  const at::Tensor& y;
  const at::Tensor& save_mean;
  const at::Tensor& save_invstd;
  const at::Tensor& row_lse;
  const std::optional<at::Tensor>& x;       // as the GEMM read it (compute dtype); needed for grad_weight
  const std::optional<at::Tensor>& weight;  // likewise; needed for grad_x
  const std::optional<at::Tensor>& bn_weight;
  const std::optional<at::Tensor>& bn_bias;
  const at::Tensor& scale;
  bool batch_stats;
  std::array<bool, 6> output_mask;  // in GradIndex order
  const std::optional<std::string>& precision;
  std::optional<at::ScalarType> linear_grad_dtype;  // of grad_x, grad_weight, grad_bias
  // Data-parallel backward, all or none: what gemm_bn_softmax_backward_sums returned on this rank
  // (row_sums, local_sums) and every rank's sums (rank_sums, [world_size, 2N + 1] float64).
  const std::optional<at::Tensor>& row_sums;
  const std::optional<at::Tensor>& local_sums;
  const std::optional<at::Tensor>& rank_sums;

  int64_t M() const { return grad_out.size(0); }
  int64_t N() const { return grad_out.size(1); }
  // The backward GEMMs' input dtype: that of the saved x / weight.
  at::ScalarType gemm_dtype() const;
  at::ScalarType grad_linear_dtype() const { return linear_grad_dtype.value_or(gemm_dtype()); }
};

void check_backward_args(const BackwardArgs& a);
Grads allocate_grads(const BackwardArgs& a);

// The torch-free library's view of the backward, with BN vectors of mixed dtypes or strides read
// through fp32 copies whose gradients `commit()` copies into the outputs.
struct BackwardTensors {
  at::Tensor grad_out, y, save_mean, save_invstd, row_lse, gamma, beta, scale;
  at::Tensor row_sums, local_sums, rank_sums;  // data parallel only
  at::Tensor grad_gamma, grad_beta, grad_scale;  // where the library writes
  BackwardProblem problem;
  BackwardBuffers buffers;
  void set_data_parallel(const BackwardArgs& a);
  void commit(Grads& grads) const;
};
// Fills everything but the dy buffers.
BackwardTensors prepare_backward(const BackwardArgs& a, Grads& grads);

// ---- data parallel (nn.SyncBatchNorm's semantics; the collectives are the caller's) ------------
// Step 1 of the forward, gemm_column_moments: y and this rank's moments record ([2N + 1] float64,
// fused/batchnorm.h), from the Linear operands of an OpArgs (check_linear_args).
using MomentsOutputs = std::tuple<at::Tensor, at::Tensor>;
// Step 2, bn_softmax_from_moments: the BatchNorm and softmax of step 1's y with every rank's records.
struct FromMomentsArgs {
  const at::Tensor& y;             // (M, N) float32, step 1's
  const at::Tensor& rank_moments;  // (world_size, 2N + 1) float64, in rank order
  // The BatchNorm arguments (check_bn_args, prepare_batchnorm): x is y (device, M), weight is y.t()
  // (N), compute_dtype the dtype of step 1's GEMM (the BN vectors may have it).
  OpArgs bn;
};
using FromMomentsOutputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;  // out, mean, invstd, row_lse
void check_from_moments_args(const FromMomentsArgs& a);
FromMomentsOutputs allocate_from_moments_outputs(const FromMomentsArgs& a);
// What both kernels of bn_softmax_from_moments hand the library (after checking and allocating).
struct FromMomentsCall {
  FromMomentsOutputs outs;
  at::Tensor y, records;  // contiguous
  BatchNormTensors bn_tensors;
  BatchNormArgs bn;  // with the rank moments
  ForwardProblem problem;  // K = 0: the GEMM is done
  ForwardBuffers buffers;  // y, out, save_mean, save_invstd, row_lse
};
FromMomentsCall prepare_from_moments(const FromMomentsArgs& a);
// A (world_size, 2N + 1) float64 table of rank records (and one rank's own, if given) on `device`.
void check_rank_records(const at::Tensor& records, const std::optional<at::Tensor>& own, const c10::SymInt& N,
                        const at::Device& device, const char* name, const char* own_name);
// The backward's step 1, gemm_bn_softmax_backward_sums: this rank's sums record ([2N + 1] float64)
// and row sums ([2, M] float64: fused/backward.h's kRowSumsRows). Reads the BackwardArgs of the
// backward without x and weight. With a given row_sums (column parallelism's row sums over every
// rank's columns), the sums use it and row_sums_out is a copy of it.
using SumsOutputs = std::tuple<at::Tensor, at::Tensor>;
SumsOutputs allocate_sums_outputs(const BackwardArgs& a);
void check_given_row_sums(const BackwardArgs& a, const std::optional<at::Tensor>& row_sums);
// What both kernels of gemm_bn_softmax_backward_sums hand the library (after checking and allocating).
struct SumsCall {
  SumsOutputs outs;
  BackwardTensors tensors;  // buffers.row_sums set to the given row sums, if any
  at::Tensor given_row_sums;
};
SumsCall prepare_sums(const BackwardArgs& a, const std::optional<at::Tensor>& given_row_sums);

// Test aid (GEMM_BN_SOFTMAX_POISON=1): NaN-fills freshly allocated outputs so that an element a
// kernel forgets to write fails the tests.
void poison(std::initializer_list<at::Tensor> outputs);
bool poison_enabled();

}  // namespace fused::torch_op
