// CUDA kernels of fused::gemm_bn_softmax and its backward. The forward is the library's whole
// fused::cuda::forward on the path fused::cuda::choose_path picks; the backward runs the library's
// steps up to dy, then cuBLAS GEMMs in the forward's precision. Both allocate through the caching
// allocator (CUDA-graph safe) and launch on the current stream, no host synchronisation.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "cublas_gemm.h"
#include "fused/backward.h"
#include "op_common.h"

namespace fused::torch_op {
namespace {

// The operands as the kernels read them: unit column stride and a row stride >= K, else a
// contiguous copy (transposed or broadcast views give correct results, never garbage).
bool is_row_major(const at::Tensor& t) { return t.stride(1) == 1 && t.stride(0) >= t.size(1) && t.size(1) > 0; }
at::Tensor as_row_major(const at::Tensor& t) { return is_row_major(t) ? t : t.contiguous(); }

// x, weight, bias in the compute dtype, with the rows the kernels can read.
LinearOperands operands(const OpArgs& a) {
  LinearOperands o = linear_operands(a);
  o.x = as_row_major(o.x);
  o.weight = as_row_major(o.weight);
  if (o.bias.defined()) o.bias = o.bias.contiguous();
  return o;
}

ForwardProblem problem(const OpArgs& a) {
  ForwardProblem p;
  p.M = a.M(); p.N = a.N(); p.K = a.K();
  p.dtype = element_type(a.linear_dtype());
  p.out_dtype = element_type(a.out_scalar_type());
  p.precision = resolve_precision(a);
  p.keep_y = a.keep_y;
  return p;
}

// The GEMM's operands in `b` (x, weight, bias, y).
void set_linear_buffers(const LinearOperands& o, const at::Tensor& y, ForwardBuffers& b) {
  b.x = o.x.data_ptr(); b.ldx = std::max<int64_t>(o.x.stride(0), o.x.size(1));
  b.weight = o.weight.data_ptr(); b.ldw = std::max<int64_t>(o.weight.stride(0), o.weight.size(1));
  b.bias = o.bias.defined() ? o.bias.data_ptr() : nullptr;
  b.y = y.defined() ? y.data_ptr<float>() : nullptr;
  b.ldy = y.defined() ? y.size(1) : 0;
}

// y is the output y when kept, else undefined (null in `b`: only the recompute path runs without it).
ForwardBuffers buffers(const LinearOperands& o, const Outputs& outs, const at::Tensor& y) {
  const auto& [out, save_mean, save_invstd, y_output, row_lse] = outs;
  ForwardBuffers b = from_y_buffers(y, out, save_mean, save_invstd, row_lse);
  set_linear_buffers(o, y, b);
  return b;
}

// cuBLASLt runs in PyTorch's own per-stream workspace (what torch's matmuls use; CUDA-graph aware),
// instead of a fresh one of up to 32 MiB in every call.
void use_torch_cublaslt_workspace(cuda::GemmPath path, ForwardBuffers& b) {
  if (path != cuda::GemmPath::kGeneric) return;
  b.cublaslt_workspace = at::cuda::getCUDABlasLtWorkspace();
  b.cublaslt_workspace_size = at::cuda::getCUDABlasLtWorkspaceSize();
}

// The operands' pointers and row strides as the kernels will read them, without converting or
// copying anything: an operand the op would convert or copy first is left null, which
// choose_path takes as a fresh allocation; y is allocated by the op.
ForwardBuffers planned_buffers(const OpArgs& a) {
  ForwardBuffers b;
  auto read_in_place = [&](const at::Tensor& t) {
    return t.scalar_type() == a.linear_dtype() && is_row_major(t);
  };
  if (read_in_place(a.x)) {
    b.x = a.x.data_ptr();
    b.ldx = std::max<int64_t>(a.x.stride(0), a.x.size(1));
  }
  if (read_in_place(a.weight)) {
    b.weight = a.weight.data_ptr();
    b.ldw = std::max<int64_t>(a.weight.stride(0), a.weight.size(1));
  }
  return b;
}

cuda::PathRequest path_request(const OpArgs& a) {
  if (a.path == "sm90") return cuda::PathRequest::kSm90;
  if (a.path == "generic") return cuda::PathRequest::kGeneric;
  if (a.path == "recompute") return cuda::PathRequest::kRecompute;
  return cuda::PathRequest::kAuto;
}

const char* path_name(cuda::GemmPath path) {
  switch (path) {
    case cuda::GemmPath::kSm90: return "sm90";
    case cuda::GemmPath::kGeneric: return "generic";
    case cuda::GemmPath::kRecompute: return "recompute";
  }
  return "unknown";
}

cuda::GemmPath choose(const OpArgs& a, const ForwardBuffers& b) {
  cuda::DeviceProperties device;
  throw_on_error(cuda::device_properties(a.x.get_device(), &device), "gemm_bn_softmax (CUDA)");
  cuda::GemmPath path = cuda::GemmPath::kGeneric;
  throw_on_error(cuda::choose_path(problem(a), b, device, path_request(a), &path), "gemm_bn_softmax (CUDA)");
  return path;
}

// dx = dy W and dW = dy^T x through the 3xTF32 GEMM, c = a b with row-major operands read where
// they are: dy and W for dx; dy (given as the transposed a) and x for dW. A gradient that is not a
// dense fp32 matrix is computed into one and copied.
void linear_grads_3xtf32(const BackwardArgs& a, const at::Tensor& dy, Grads& grads, cudaStream_t stream) {
  const auto& m = a.output_mask;
  const int64_t N = a.N();
  // out (rows, cols) = lhs (rows, inner) rhs (inner, cols); lhs_transposed: lhs given as lhs^T (inner, rows)
  auto gemm = [&](at::Tensor& out, int64_t inner, const at::Tensor& lhs, bool lhs_transposed, const at::Tensor& rhs) {
    const int64_t rows = out.size(0), cols = out.size(1);
    if (rows == 0 || cols == 0) return;
    if (inner == 0) {
      out.zero_();
      return;
    }
    const bool direct = out.scalar_type() == at::kFloat && out.stride(1) == 1 && out.stride(0) % 4 == 0;
    at::Tensor c = direct ? out : at::empty({rows, cols}, lhs.options().dtype(at::kFloat));
    const std::size_t ws_bytes = cuda::gemm_3xtf32_workspace_bytes(rows, cols, inner, lhs_transposed);
    at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, lhs.options().dtype(at::kByte));
    throw_on_error(cuda::gemm_3xtf32(rows, cols, inner, lhs.data_ptr<float>(), lhs.stride(0), rhs.data_ptr<float>(),
                                     rhs.stride(0), c.data_ptr<float>(), c.stride(0), workspace.data_ptr(), ws_bytes,
                                     stream, lhs_transposed),
                   "gemm_bn_softmax_backward (CUDA, 3xTF32 GEMM)");
    if (!direct) out.copy_(c);
  };
  // An fp32 operand as the kernel's TMA reads it in place (the forward's operands always are), else a
  // dense copy in a fresh (aligned) allocation.
  auto readable = [](const at::Tensor& t) {
    const at::Tensor f = t.to(at::kFloat);
    const bool in_place = is_row_major(f) && f.stride(0) % 4 == 0 && reinterpret_cast<uintptr_t>(f.data_ptr()) % 16 == 0;
    return in_place ? f : f.clone(at::MemoryFormat::Contiguous);
  };
  if (m[kGradX]) gemm(std::get<kGradX>(grads), N, dy, /*lhs_transposed=*/false, readable(*a.weight));  // dx (M, K)
  if (m[kGradWeight]) gemm(std::get<kGradWeight>(grads), a.M(), dy, /*lhs_transposed=*/true, readable(*a.x));  // dW (N, K)
}

}  // namespace

std::string select_cuda_path(const OpArgs& a) {
  check_linear_args(a);
  c10::cuda::CUDAGuard guard(a.x.device());
  return path_name(choose(a, planned_buffers(a)));
}

Outputs gemm_bn_softmax_cuda(const OpArgs& a) {
  check_args(a);
  c10::cuda::CUDAGuard guard(a.x.device());
  Outputs outs = allocate_outputs(a);
  const LinearOperands o = operands(a);
  ForwardBuffers b = buffers(o, outs, a.keep_y ? std::get<3>(outs) : at::Tensor());
  const cuda::GemmPath path = choose(a, b);
  const BatchNormTensors bnt = prepare_batchnorm(a);
  const ForwardProblem p = problem(a);
  use_torch_cublaslt_workspace(path, b);
  // One allocation holds the workspace and, when y is not kept, the y the path writes (a scratch
  // buffer alive until the kernels are queued): each allocation costs host time on every call.
  const bool y_scratch = cuda::forward_needs_y_scratch(p, path);
  constexpr int64_t kAlign = 256;
  const int64_t y_bytes = y_scratch ? (a.M() * a.N() * int64_t{sizeof(float)} + kAlign - 1) / kAlign * kAlign : 0;
  const std::size_t ws_bytes = cuda::workspace_bytes(p, path, b.cublaslt_workspace == nullptr);
  at::Tensor workspace = at::empty({y_bytes + static_cast<int64_t>(ws_bytes)}, a.x.options().dtype(at::kByte));
  if (y_scratch) {
    b.y = static_cast<float*>(workspace.data_ptr());
    b.ldy = a.N();
    if (poison_enabled()) poison({workspace.narrow(0, 0, y_bytes).view(at::kFloat)});
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.x.get_device()).stream();
  throw_on_error(cuda::forward(p, b, bnt.args(a), path, static_cast<char*>(workspace.data_ptr()) + y_bytes, ws_bytes,
                               stream),
                 "gemm_bn_softmax (CUDA)");
  bnt.commit(a);
  return outs;
}

MomentsOutputs gemm_column_moments_cuda(const OpArgs& a) {
  check_linear_args(a);
  c10::cuda::CUDAGuard guard(a.x.device());
  at::Tensor y = at::empty({a.M(), a.N()}, a.x.options().dtype(at::kFloat));
  at::Tensor record = at::empty({2 * a.N() + 1}, a.x.options().dtype(at::kDouble));
  poison({y, record});
  const LinearOperands o = operands(a);
  ForwardBuffers b;
  set_linear_buffers(o, y, b);
  const cuda::GemmPath path = choose(a, b);
  use_torch_cublaslt_workspace(path, b);
  const ForwardProblem p = problem(a);
  const std::size_t ws_bytes = cuda::workspace_bytes(p, path, b.cublaslt_workspace == nullptr);
  at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.x.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.x.get_device()).stream();
  throw_on_error(cuda::gemm_column_moments(p, b, path, record.data_ptr<double>(), workspace.data_ptr(), ws_bytes,
                                           stream),
                 "gemm_column_moments (CUDA)");
  return {y, record};
}

FromMomentsOutputs bn_softmax_from_moments_cuda(const FromMomentsArgs& a) {
  c10::cuda::CUDAGuard guard(a.y.device());
  FromMomentsCall c = prepare_from_moments(a);
  const std::size_t ws_bytes = cuda::forward_from_y_workspace_bytes(c.problem);
  at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.y.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.y.get_device()).stream();
  throw_on_error(cuda::forward_from_y(c.problem, c.buffers, c.bn, workspace.data_ptr(), ws_bytes, stream),
                 "bn_softmax_from_moments (CUDA)");
  c.bn_tensors.commit(a.bn);
  return c.outs;
}

SumsOutputs gemm_bn_softmax_backward_sums_cuda(const BackwardArgs& a, const OptTensor& given_row_sums) {
  c10::cuda::CUDAGuard guard(a.grad_out.device());
  SumsCall c = prepare_sums(a, given_row_sums);
  auto& [sums, row_sums] = c.outs;
  const std::size_t ws_bytes = cuda::backward_workspace_bytes(c.tensors.problem);
  at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.grad_out.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.grad_out.get_device()).stream();
  throw_on_error(cuda::backward_column_sums(c.tensors.problem, c.tensors.buffers, sums.data_ptr<double>(),
                                            row_sums.data_ptr<double>(), workspace.data_ptr(), ws_bytes,
                                            stream),
                 "gemm_bn_softmax_backward_sums (CUDA)");
  return c.outs;
}

Grads gemm_bn_softmax_backward_cuda(const BackwardArgs& a) {
  check_backward_args(a);
  c10::cuda::CUDAGuard guard(a.grad_out.device());
  Grads grads = allocate_grads(a);
  BackwardTensors t = prepare_backward(a, grads);
  const auto& m = a.output_mask;
  const at::ScalarType gemm = a.gemm_dtype();
  const MatmulPrecision precision = resolve_precision(gemm, a.precision);
  const bool three_x_tf32 = precision == MatmulPrecision::k3xTF32;
  // TF32 tensor cores take K-major operands only: at TF32, dW = dy^T x reduces over M, so it reads
  // dy^T (written by the dy pass) instead of a transposed view of dy (1.8x slower in cuBLAS). dx = dy W
  // reads dy itself. The 3xTF32 GEMMs take dy for both: for dW their split pass writes dy^T beside its
  // small parts (below 1024 rows the in-loop kernel transposes dy's tiles in shared memory).
  const bool transposed_dy = m[kGradWeight] && gemm == at::kFloat && precision == MatmulPrecision::kTF32;
  const auto dy_options = a.grad_out.options().dtype(gemm);
  at::Tensor dy, dy_t;
  if (m[kGradX] || (m[kGradWeight] && !transposed_dy)) {
    dy = at::empty({a.M(), a.N()}, dy_options);
    t.buffers.dy = dy.data_ptr();
    t.buffers.lddy = a.N();
  }
  if (transposed_dy) {
    dy_t = at::empty({a.N(), a.M()}, dy_options);
    t.buffers.dy_t = dy_t.data_ptr();
    t.buffers.lddy_t = a.M();
  }
  t.buffers.dy_dtype = element_type(gemm);
  const BackwardProblem& p = t.problem;
  const std::size_t ws_bytes = cuda::backward_workspace_bytes(p);
  at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.grad_out.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.grad_out.get_device()).stream();
  throw_on_error(cuda::backward(p, t.buffers, workspace.data_ptr(), ws_bytes, stream), "gemm_bn_softmax_backward (CUDA)");
  t.commit(grads);

  const int64_t M = a.M(), N = a.N();
  if (three_x_tf32) {
    linear_grads_3xtf32(a, dy, grads, stream);
    return grads;
  }
  if (m[kGradX]) {  // dx (M, K) = dy (M, N) W (N, K)
    at::Tensor& dx = std::get<kGradX>(grads);
    const at::Tensor w = as_row_major(*a.weight);
    if (N == 0) {
      dx.zero_();
    } else {
      gemm_row_major(M, w.size(1), N, {dy.data_ptr(), N, false}, {w.data_ptr(), w.stride(0), false}, gemm,
                     dx.data_ptr(), dx.stride(0), dx.scalar_type(), precision);
    }
  }
  if (m[kGradWeight]) {  // dW (N, K) = dy^T (N, M) x (M, K)
    at::Tensor& dw = std::get<kGradWeight>(grads);
    const at::Tensor x = as_row_major(*a.x);
    const GemmOperand dy_transposed = transposed_dy ? GemmOperand{dy_t.data_ptr(), M, false}
                                                    : GemmOperand{dy.data_ptr(), N, /*transposed=*/true};
    if (M == 0) {
      dw.zero_();
    } else {
      gemm_row_major(N, x.size(1), M, dy_transposed, {x.data_ptr(), x.stride(0), false}, gemm, dw.data_ptr(),
                     dw.stride(0), dw.scalar_type(), precision);
    }
  }
  return grads;
}

}  // namespace fused::torch_op
