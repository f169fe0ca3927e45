// CUDA kernel of fused::gemm_bn_softmax: picks the path (sm90 GEMM with the statistics
// epilogue, or cuBLAS + the generic column-partials kernel), allocates through the caching
// allocator (CUDA-graph safe) and launches on the current stream, no host synchronisation.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <limits>

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

struct Operands {
  at::Tensor x, weight, bias;
};

Operands operands(const OpArgs& a) {
  Operands o{as_row_major(a.x), as_row_major(a.weight), at::Tensor()};
  if (a.bias.has_value() && a.bias->defined()) o.bias = a.bias->contiguous();
  return o;
}

ForwardProblem problem(const OpArgs& a) {
  ForwardProblem p;
  p.M = a.M(); p.N = a.N(); p.K = a.K();
  p.dtype = element_type(a.x.scalar_type());
  p.precision = resolve_precision(a);
  return p;
}

ForwardBuffers buffers(const Operands& o, const Outputs& outs) {
  const auto& [out, save_mean, save_invstd, y] = outs;
  ForwardBuffers b;
  b.x = o.x.data_ptr(); b.ldx = std::max<int64_t>(o.x.stride(0), o.x.size(1));
  b.weight = o.weight.data_ptr(); b.ldw = std::max<int64_t>(o.weight.stride(0), o.weight.size(1));
  b.bias = o.bias.defined() ? o.bias.data_ptr() : nullptr;
  b.y = y.data_ptr<float>(); b.ldy = y.size(1);
  b.out = out.data_ptr(); b.ldo = out.size(1);
  b.save_mean = save_mean.data_ptr<float>(); b.save_invstd = save_invstd.data_ptr<float>();
  return b;
}

std::string select(const OpArgs& a, const Operands& o, const Outputs& outs) {
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

#define FUSED_CUBLAS_CHECK(expr)                                                              \
  do {                                                                                        \
    const cublasStatus_t fused_status_ = (expr);                                              \
    TORCH_CHECK(fused_status_ == CUBLAS_STATUS_SUCCESS, "gemm_bn_softmax: ", #expr, " failed: ", \
                cublasGetStatusString(fused_status_));                                       \
  } while (0)

cudaDataType_t cublas_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return CUDA_R_32F;
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    default: TORCH_CHECK(false, "gemm_bn_softmax: no cuBLAS type for ", t);
  }
}

// y = x W^T + b in fp32 through cuBLAS (the generic path's [1]).
// The fp32 precision is chosen per call (compute type + math mode on torch's handle for this
// thread, restored afterwards) instead of flipping torch's process-wide TF32 flag, which another
// thread's matmul could read in the meantime. The bias goes in as C with beta = 1.
void external_gemm(const OpArgs& a, const Operands& o, at::Tensor& y) {
  if (a.M() == 0 || a.N() == 0) return;
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  TORCH_CHECK(a.M() <= kMax && a.N() <= kMax && a.K() <= kMax && o.x.stride(0) <= kMax && o.weight.stride(0) <= kMax,
              "gemm_bn_softmax: the generic path's cuBLAS call takes 32-bit sizes and strides");
  const bool tf32 = a.x.scalar_type() == at::kFloat && resolve_precision(a) == MatmulPrecision::kTF32;
  float beta = 0.0f;
  if (o.bias.defined()) {  // fp32 C = b broadcast over the rows
    throw_on_error(cuda::bias_rows(o.bias.data_ptr(), element_type(a.x.scalar_type()), y.data_ptr<float>(),
                                   y.stride(0), a.M(), a.N(), c10::cuda::getCurrentCUDAStream().stream()),
                   "gemm_bn_softmax (CUDA)");
    beta = 1.0f;
  }
  const float alpha = 1.0f;
  if (a.K() == 0) {  // cuBLAS needs k >= 1 for a defined product; y = b (or 0)
    if (!o.bias.defined()) y.zero_();
    return;
  }
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // current stream, workspace set
  cublasMath_t previous_math;
  FUSED_CUBLAS_CHECK(cublasGetMathMode(handle, &previous_math));
  FUSED_CUBLAS_CHECK(cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  // Exact fp32 = COMPUTE_32F under the default math mode, as torch's own fp32 matmul.
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cudaDataType_t in_type = cublas_type(a.x.scalar_type());
  // Column-major view: y^T (N x M, ld N) = W (K x N, ld ldw)^T * x^T (K x M, ld ldx).
  const cublasStatus_t status = cublasGemmEx(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(a.N()), static_cast<int>(a.M()), static_cast<int>(a.K()),
      &alpha, o.weight.data_ptr(), in_type, static_cast<int>(o.weight.stride(0)), o.x.data_ptr(), in_type,
      static_cast<int>(o.x.stride(0)), &beta, y.data_ptr<float>(), CUDA_R_32F, static_cast<int>(y.stride(0)), compute,
      CUBLAS_GEMM_DEFAULT);
  FUSED_CUBLAS_CHECK(cublasSetMathMode(handle, previous_math));
  FUSED_CUBLAS_CHECK(status);
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
  const Operands o = operands(a);
  const std::string path = select(a, o, outs);
  const cuda::GemmPath gemm_path = path == "sm90" ? cuda::GemmPath::kSm90 : cuda::GemmPath::kExternal;
  if (gemm_path == cuda::GemmPath::kExternal) external_gemm(a, o, std::get<3>(outs));

  bump_num_batches_tracked(a);
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

}  // namespace fused::torch_op
