// CUDA kernels of fused::gemm_bn_softmax and its backward. The forward picks the path (sm90 GEMM
// with the statistics epilogue, or cuBLAS + the generic column-partials kernel); the backward runs
// the library's steps up to dy, then cuBLAS GEMMs in the forward's precision. Both allocate through
// the caching allocator (CUDA-graph safe) and launch on the current stream, no host synchronisation.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <limits>

#include "cublas_gemm.h"
#include "op_common.h"

namespace fused::torch_op {
namespace {

// A device attribute, cached per device (cudaDeviceGetAttribute does not synchronise).
template <cudaDeviceAttr kAttr>
int device_attribute(int device) {
  static std::array<std::atomic<int>, 64> cache{};  // 0 = unknown
  if (device < 0 || device >= static_cast<int>(cache.size())) return 0;
  int value = cache[device].load(std::memory_order_relaxed);
  if (value == 0) {
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttr, device));
    cache[device].store(value, std::memory_order_relaxed);
  }
  return value;
}

// The operands as the kernels read them: unit column stride and a row stride >= K, else a
// contiguous copy (transposed or broadcast views give correct results, never garbage).
at::Tensor as_row_major(const at::Tensor& t) {
  return (t.stride(1) == 1 && t.stride(0) >= t.size(1) && t.size(1) > 0) ? t : t.contiguous();
}

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
  return p;
}

ForwardBuffers buffers(const LinearOperands& o, const Outputs& outs) {
  const auto& [out, save_mean, save_invstd, y, row_lse] = outs;
  ForwardBuffers b;
  b.x = o.x.data_ptr(); b.ldx = std::max<int64_t>(o.x.stride(0), o.x.size(1));
  b.weight = o.weight.data_ptr(); b.ldw = std::max<int64_t>(o.weight.stride(0), o.weight.size(1));
  b.bias = o.bias.defined() ? o.bias.data_ptr() : nullptr;
  b.y = y.data_ptr<float>(); b.ldy = y.size(1);
  b.out = out.data_ptr(); b.ldo = out.size(1);
  b.save_mean = save_mean.data_ptr<float>(); b.save_invstd = save_invstd.data_ptr<float>();
  b.row_lse = row_lse.data_ptr<float>();
  return b;
}

std::string select(const OpArgs& a, const LinearOperands& o, const Outputs& outs) {
  std::string want = a.path.value_or("auto");
  if (want == "auto") {
    if (const char* env = std::getenv("GEMM_BN_SOFTMAX_PATH"); env != nullptr && *env != '\0') {
      want = env;
      TORCH_CHECK(want == "auto" || want == "sm90" || want == "generic",
                  "GEMM_BN_SOFTMAX_PATH must be 'auto', 'sm90' or 'generic', got '", want, "'");
    }
  }
  if (want == "generic") return want;
  std::string why;
  const int device = a.x.get_device();
  if (device_attribute<cudaDevAttrComputeCapabilityMajor>(device) != 9) {
    why = "the GPU is not compute capability 9.x (Hopper)";
  } else if (Status s = cuda::sm90_can_implement(problem(a), buffers(o, outs)); !s.ok()) {
    why = s.message;
  }
  if (why.empty()) {
    const bool faster = cuda::sm90_preferred(problem(a), device_attribute<cudaDevAttrMultiProcessorCount>(device));
    return (want == "sm90" || faster) ? "sm90" : "generic";
  }
  TORCH_CHECK(want != "sm90", "path='sm90' was requested but the sm90 kernel cannot run this problem: ", why);
  return "generic";
}

// y = x W^T + b in fp32 through cuBLAS (the generic path's [1]); the bias goes in as C, beta = 1.
void external_gemm(const OpArgs& a, const LinearOperands& o, at::Tensor& y) {
  if (a.M() == 0 || a.N() == 0) return;
  float beta = 0.0f;
  if (o.bias.defined()) {  // fp32 C = b broadcast over the rows
    throw_on_error(cuda::bias_rows(o.bias.data_ptr(), element_type(o.bias.scalar_type()), y.data_ptr<float>(),
                                   y.stride(0), a.M(), a.N(), c10::cuda::getCurrentCUDAStream().stream()),
                   "gemm_bn_softmax (CUDA)");
    beta = 1.0f;
  }
  if (a.K() == 0) {  // cuBLAS needs k >= 1 for a defined product; y = b (or 0)
    if (!o.bias.defined()) y.zero_();
    return;
  }
  gemm_row_major(a.M(), a.N(), a.K(), {o.x.data_ptr(), o.x.stride(0), false},
                 {o.weight.data_ptr(), o.weight.stride(0), /*transposed=*/true}, o.x.scalar_type(), y.data_ptr(),
                 y.stride(0), at::kFloat, resolve_precision(a), beta);
}

}  // namespace

std::string select_cuda_path(const OpArgs& a) {
  check_args(a);
  c10::cuda::CUDAGuard guard(a.x.device());
  return select(a, operands(a), allocate_outputs(a));
}

Outputs gemm_bn_softmax_cuda(const OpArgs& a) {
  check_args(a);
  c10::cuda::CUDAGuard guard(a.x.device());
  Outputs outs = allocate_outputs(a);
  const LinearOperands o = operands(a);
  const std::string path = select(a, o, outs);
  const cuda::GemmPath gemm_path = path == "sm90" ? cuda::GemmPath::kSm90 : cuda::GemmPath::kExternal;
  if (gemm_path == cuda::GemmPath::kExternal) external_gemm(a, o, std::get<3>(outs));

  const BatchNormTensors bnt = prepare_batchnorm(a);
  const ForwardProblem p = problem(a);
  const std::size_t ws_bytes = cuda::workspace_bytes(p, gemm_path);
  at::Tensor workspace = at::empty({static_cast<int64_t>(ws_bytes)}, a.x.options().dtype(at::kByte));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.x.get_device()).stream();
  throw_on_error(cuda::forward(p, buffers(o, outs), bnt.args(a), gemm_path, workspace.data_ptr(), ws_bytes, stream),
                 "gemm_bn_softmax (CUDA)");
  bnt.commit(a);
  return outs;
}

Grads gemm_bn_softmax_backward_cuda(const BackwardArgs& a) {
  check_backward_args(a);
  c10::cuda::CUDAGuard guard(a.grad_out.device());
  Grads grads = allocate_grads(a);
  BackwardTensors t = prepare_backward(a, grads);
  const auto& m = a.output_mask;
  const at::ScalarType gemm = a.gemm_dtype();
  const MatmulPrecision precision = resolve_precision(gemm, a.precision);
  // TF32 tensor cores take K-major operands only: dW = dy^T x reduces over M, so it reads dy^T
  // (written by the dy pass) instead of a transposed view of dy (1.8x slower in cuBLAS). dx = dy W
  // reads dy itself.
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
