// One definition, for every dispatch key (CPU, CUDA, Meta), of how the op's torch arguments are
// validated, which outputs it allocates, and how they map onto the torch-free library's structs.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>

#include "fused/gemm_bn_softmax.h"

namespace fused::torch_op {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;  // out, save_mean, save_invstd, y

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

  // Concrete sizes (CPU / CUDA kernels) and symbolic ones (validation, Meta / dynamic shapes).
  c10::SymInt sym_M() const { return x.sym_size(0); }
  c10::SymInt sym_N() const { return weight.sym_size(0); }
  int64_t M() const { return x.size(0); }
  int64_t N() const { return weight.size(0); }
  int64_t K() const { return x.size(1); }
  bool has_running_stats() const { return running_mean.has_value() && running_mean->defined(); }
  bool uses_batch_stats() const { return batch_norm_uses_batch_stats(training, has_running_stats()); }
};

// Every precondition of the contract, each failure naming the argument. Throws.
void check_args(const OpArgs& a);

// Allocates (M, N) out in x's dtype, (N) save_mean / save_invstd and (M, N) fp32 y on x's device.
Outputs allocate_outputs(const OpArgs& a);

ElementType element_type(at::ScalarType t);

// "highest" | "tf32" from the argument, or from torch's float32 matmul settings when None.
MatmulPrecision resolve_precision(const OpArgs& a);

// The CUDA path the op takes: "sm90" or "generic" (forced by the `path` argument or the
// GEMM_BN_SOFTMAX_PATH environment variable; forcing an impossible path throws). op_cuda.cpp.
std::string select_cuda_path(const OpArgs& a);

// BN vectors as the library reads them: as given when they share one dtype and are contiguous
// (no copies); otherwise fp32 contiguous copies, the running statistics written back by `commit()`.
struct BatchNormTensors {
  at::Tensor gamma, beta, running_mean, running_var, scale;
  ElementType param_dtype = ElementType::kFloat32;
  BatchNormArgs args(const OpArgs& a) const;
  void commit(const OpArgs& a) const;
};
BatchNormTensors prepare_batchnorm(const OpArgs& a);

// Increments num_batches_tracked when the op updates running statistics (as nn.BatchNorm1d).
void bump_num_batches_tracked(const OpArgs& a);

void throw_on_error(const Status& s, const char* where);

}  // namespace fused::torch_op
