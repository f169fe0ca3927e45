// The backward's 3xTF32 GEMMs with a's small parts split by a pass first: one instantiation of
// gemm_3xtf32_row_major.cuh over mainloop_3xtf32_presplit.hpp. It reads a as stored (dx = dy W), or,
// for a given transposed (dW = dy^T x from dy), a copy of a that the pass writes beside the small parts.
#define FUSED_3XTF32_TRANSPOSED_A 0
#define FUSED_3XTF32_PRESPLIT 1
#include "kernels/sm90/gemm_3xtf32_row_major.cuh"

namespace fused::sm90::instances {

using Presplit = detail::Gemm3xTf32RowMajor;  // a as stored, presplit

std::size_t workspace_3xtf32_row_major_presplit(int64_t m, int64_t n, int64_t k, bool a_transposed) {
  return Presplit::workspace_bytes(m, n, k, a_transposed);
}

Status run_3xtf32_row_major_presplit(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool a_transposed,
                                     const float* b, int64_t ldb, float* c, int64_t ldc, void* workspace,
                                     cudaStream_t stream) {
  return Presplit::run(m, n, k, a, lda, b, ldb, c, ldc, workspace, stream, a_transposed);
}

}  // namespace fused::sm90::instances
