#include "cublas_gemm.h"

#include <ATen/cuda/CUDAContext.h>

#include <limits>

namespace fused::torch_op {
namespace {

#define FUSED_CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                                \
    const cublasStatus_t fused_status_ = (expr);                                                      \
    TORCH_CHECK(fused_status_ == CUBLAS_STATUS_SUCCESS, "gemm_bn_softmax: ", #expr, " failed: ",      \
                cublasGetStatusString(fused_status_));                                               \
  } while (0)

cudaDataType_t cublas_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return CUDA_R_32F;
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    default: TORCH_CHECK(false, "gemm_bn_softmax: no cuBLAS type for ", t);
  }
}

// Restores the handle's math mode on scope exit (also when a check throws).
class MathModeGuard {
 public:
  MathModeGuard(cublasHandle_t handle, cublasMath_t mode) : handle_(handle) {
    FUSED_CUBLAS_CHECK(cublasGetMathMode(handle_, &previous_));
    FUSED_CUBLAS_CHECK(cublasSetMathMode(handle_, mode));
  }
  ~MathModeGuard() { cublasSetMathMode(handle_, previous_); }
  MathModeGuard(const MathModeGuard&) = delete;
  MathModeGuard& operator=(const MathModeGuard&) = delete;

 private:
  cublasHandle_t handle_;
  cublasMath_t previous_{};
};

}  // namespace

void gemm_row_major(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, at::ScalarType ab_type,
                    void* c, int64_t ldc, at::ScalarType c_type, MatmulPrecision precision) {
  if (m == 0 || n == 0) return;
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  TORCH_CHECK(m <= kMax && n <= kMax && k <= kMax && a.ld <= kMax && b.ld <= kMax && ldc <= kMax,
              "gemm_bn_softmax: cuBLAS takes 32-bit sizes and strides");
  TORCH_CHECK(precision != MatmulPrecision::k3xTF32,
              "gemm_bn_softmax: cuBLAS has no 3xTF32 GEMM (the sm90 kernel runs it)");
  const bool tf32 = ab_type == at::kFloat && precision == MatmulPrecision::kTF32;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // current stream, workspace set
  // Exact fp32 = COMPUTE_32F under the default math mode, as torch's own fp32 matmul.
  const cublasMath_t mode = tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                 : (ab_type == at::kFloat ? CUBLAS_DEFAULT_MATH
                                                          : static_cast<cublasMath_t>(
                                                                CUBLAS_DEFAULT_MATH |
                                                                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
  MathModeGuard guard(handle, mode);
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f, beta = 0.0f;
  // cuBLAS is column-major: the row-major C = A B is the column-major C^T = B^T A^T, and a row-major
  // matrix read column-major is its transpose.
  FUSED_CUBLAS_CHECK(cublasGemmEx(handle, b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                  static_cast<int>(k), &alpha, b.data, cublas_type(ab_type), static_cast<int>(b.ld),
                                  a.data, cublas_type(ab_type), static_cast<int>(a.ld), &beta, c, cublas_type(c_type),
                                  static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace fused::torch_op
