// The backward's 3xTF32 GEMM with a given transposed (dW = dy^T x reading dy as stored): one
// instantiation of gemm_3xtf32_row_major.cuh, whose B tiles the consumers transpose.
#define FUSED_3XTF32_TRANSPOSED_A 1
#include "kernels/sm90/gemm_3xtf32_row_major.cuh"

namespace fused::sm90::instances {

using TransposedA = detail::Gemm3xTf32RowMajor;  // a given transposed

std::size_t workspace_3xtf32_row_major_transposed_a(int64_t m, int64_t n, int64_t k) {
  return TransposedA::workspace_bytes(m, n, k);
}

Status run_3xtf32_row_major_transposed_a(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                                         int64_t ldb, float* c, int64_t ldc, void* workspace, cudaStream_t stream) {
  return TransposedA::run(m, n, k, a, lda, b, ldb, c, ldc, workspace, stream);
}

}  // namespace fused::sm90::instances
