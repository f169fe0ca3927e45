// c = a b^T with a as stored (its small parts split by a pass first) and b given as stored (n, k):
// the forward's y = x W^T in the operand order the presplit kernel needs (x, the shared-memory
// operand, is the one split beforehand; W goes through registers). One instantiation of
// gemm_3xtf32_row_major.cuh. A plain GEMM so far (no bias, no statistics): the forward op does not
// run it yet; the tests and bench_3xtf32_backward do.
#define FUSED_3XTF32_TRANSPOSED_A 0
#define FUSED_3XTF32_PRESPLIT 1
#define FUSED_3XTF32_TRANSPOSED_B 1
#include "kernels/sm90/gemm_3xtf32_row_major.cuh"

namespace fused::sm90 {

using BTransposed = detail::Gemm3xTf32RowMajor;

std::size_t gemm_3xtf32_row_major_b_transposed_workspace_bytes(int64_t m, int64_t n, int64_t k) {
  return BTransposed::workspace_bytes(m, n, k);
}

Status gemm_3xtf32_row_major_b_transposed(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                                          int64_t ldb, float* c, int64_t ldc, void* workspace, cudaStream_t stream) {
  return BTransposed::run(m, n, k, a, lda, b, ldb, c, ldc, workspace, stream);
}

}  // namespace fused::sm90
