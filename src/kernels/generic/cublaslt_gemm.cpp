#include "kernels/generic/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

#include "util/cuda_check.h"

namespace fused::cuda::generic {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr int kMaxDevices = 64;

Status lt_status(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return util::error_status(StatusCode::kCudaError, what, cublasLtGetStatusString(s));
}

#define FUSED_LT_CHECK(expr) FUSED_RETURN_IF_ERROR(lt_status((expr), #expr))

// Handles no thread uses any more, per device: a thread that ends gives its handles back here and
// the next thread takes them, so handles are created once per concurrently running thread. Never
// destroyed: at process exit the CUDA runtime may already be gone (PyTorch leaks its own likewise).
struct HandlePool {
  std::mutex mutex;
  std::array<std::vector<cublasLtHandle_t>, kMaxDevices> free;
};
HandlePool& pool() {
  static HandlePool* p = new HandlePool;  // never destroyed, see above
  return *p;
}

struct ThreadHandles {
  std::array<cublasLtHandle_t, kMaxDevices> handle{};
  ~ThreadHandles() {
    HandlePool& p = pool();
    std::lock_guard<std::mutex> lock(p.mutex);
    for (int d = 0; d < kMaxDevices; ++d)
      if (handle[d] != nullptr) p.free[d].push_back(handle[d]);
  }
};

// This thread's handle for the current device (a cuBLAS handle belongs to the device that was
// current when it was created).
Status current_handle(cublasLtHandle_t* out) {
  int device = 0;
  FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  if (device < 0 || device >= kMaxDevices) return {StatusCode::kNotSupported, "cuBLASLt: device index above 63"};
  thread_local ThreadHandles mine;
  cublasLtHandle_t& h = mine.handle[device];
  if (h == nullptr) {
    HandlePool& p = pool();
    {
      std::lock_guard<std::mutex> lock(p.mutex);
      if (!p.free[device].empty()) {
        h = p.free[device].back();
        p.free[device].pop_back();
      }
    }
    if (h == nullptr) FUSED_LT_CHECK(cublasLtCreate(&h));
  }
  *out = h;
  return Status::Ok();
}

cudaDataType_t cuda_type(ElementType t) {
  switch (t) {
    case ElementType::kBFloat16: return CUDA_R_16BF;
    case ElementType::kFloat16: return CUDA_R_16F;
    default: return CUDA_R_32F;
  }
}

// The largest power of two (<= 256) dividing the address: cuBLASLt assumes 256-byte aligned
// operands unless told otherwise, and would pick kernels that fault on a view's offset pointer.
uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && (v % a) != 0) a /= 2;
  return a;
}

}  // namespace

std::size_t cublaslt_workspace_bytes(const ForwardProblem& p) {
  const std::size_t y_bytes = sizeof(float) * static_cast<std::size_t>(p.M) * static_cast<std::size_t>(p.N);
  return std::min<std::size_t>(32 * kMiB, kMiB + 8 * y_bytes);
}

MatmulPrecision gemm_precision(const ForwardProblem& p) {
  if (p.dtype != ElementType::kFloat32) return MatmulPrecision::kHighest;  // 16-bit: fp32 accumulation
  return p.M <= kExactFp32MaxBatch ? MatmulPrecision::kHighest : p.precision;
}

Status gemm_bias(const ForwardProblem& p, const ForwardBuffers& b, const float* bias_f32, void* workspace,
                 std::size_t workspace_size, cudaStream_t stream) {
  if (p.M <= 0 || p.N <= 0 || p.K <= 0) return {StatusCode::kInvalidArgument, "cuBLASLt GEMM: M, N, K must be positive"};
  cublasLtHandle_t handle = nullptr;
  FUSED_RETURN_IF_ERROR(current_handle(&handle));

  const bool tf32 = p.dtype == ElementType::kFloat32 && gemm_precision(p) == MatmulPrecision::kTF32;
  // Exact fp32 is COMPUTE_32F on fp32 operands (no TF32); 16-bit operands accumulate in fp32.
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  cublasLtMatmulDescOpaque_t op_storage;
  cublasLtMatmulDesc_t op = &op_storage;
  FUSED_LT_CHECK(cublasLtMatmulDescInit(op, compute, CUDA_R_32F));
  // cuBLASLt is column-major: the row-major y (M x N) is the column-major y^T (N x M) = W x^T, where
  // the row-major W (N x K) read column-major is W^T (K x N), hence op(A) = transpose, and the
  // row-major x (M x K) read column-major is x^T (K x M), op(B) = none.
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  FUSED_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa)));
  FUSED_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb)));
  if (bias_f32 != nullptr) {
    // The bias vector runs along D's rows (length N), broadcast over its M columns.
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    FUSED_LT_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    FUSED_LT_CHECK(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_f32, sizeof(bias_f32)));
  }

  const cudaDataType_t ab = cuda_type(p.dtype);
  const auto M = static_cast<uint64_t>(p.M), N = static_cast<uint64_t>(p.N), K = static_cast<uint64_t>(p.K);
  cublasLtMatrixLayoutOpaque_t a_storage, b_storage, d_storage;
  cublasLtMatrixLayout_t a_layout = &a_storage, b_layout = &b_storage, d_layout = &d_storage;
  FUSED_LT_CHECK(cublasLtMatrixLayoutInit(a_layout, ab, K, N, b.ldw));
  FUSED_LT_CHECK(cublasLtMatrixLayoutInit(b_layout, ab, K, M, b.ldx));
  FUSED_LT_CHECK(cublasLtMatrixLayoutInit(d_layout, CUDA_R_32F, N, M, b.ldy));

  cublasLtMatmulPreferenceOpaque_t pref_storage;
  cublasLtMatmulPreference_t pref = &pref_storage;
  FUSED_LT_CHECK(cublasLtMatmulPreferenceInit(pref));
  const uint64_t ws_limit = std::min<std::size_t>(workspace_size, cublaslt_workspace_bytes(p));
  FUSED_LT_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_limit, sizeof(ws_limit)));
  const uint32_t align_a = alignment_of(b.weight), align_b = alignment_of(b.x), align_d = alignment_of(b.y);
  FUSED_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                      sizeof(align_a)));
  FUSED_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                      sizeof(align_b)));
  FUSED_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                      sizeof(align_d)));
  FUSED_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                      sizeof(align_d)));

  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  FUSED_LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, a_layout, b_layout, d_layout, d_layout, pref, 1,
                                                &heuristic, &found));
  if (found == 0)
    return {StatusCode::kNotSupported, "cuBLASLt found no algorithm for this GEMM (dtype, strides or alignment)"};

  const float alpha = 1.0f, beta = 0.0f;
  FUSED_LT_CHECK(cublasLtMatmul(handle, op, &alpha, b.weight, a_layout, b.x, b_layout, &beta, b.y, d_layout, b.y,
                                d_layout, &heuristic.algo, workspace, ws_limit, stream));
  return Status::Ok();
}

}  // namespace fused::cuda::generic
