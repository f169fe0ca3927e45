// The backward's 3xTF32 GEMM with a as stored, split in the loop: one instantiation of
// gemm_3xtf32_row_major.cuh. The entry points for all three instantiations are here.
#define FUSED_3XTF32_TRANSPOSED_A 0
#include "kernels/sm90/gemm_3xtf32_row_major.cuh"

namespace fused::sm90 {

namespace instances {
std::size_t workspace_3xtf32_row_major_transposed_a(int64_t m, int64_t n, int64_t k);
Status run_3xtf32_row_major_transposed_a(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                                         int64_t ldb, float* c, int64_t ldc, void* workspace, cudaStream_t stream);
std::size_t workspace_3xtf32_row_major_presplit(int64_t m, int64_t n, int64_t k, bool a_transposed);
Status run_3xtf32_row_major_presplit(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool a_transposed,
                                     const float* b, int64_t ldb, float* c, int64_t ldc, void* workspace,
                                     cudaStream_t stream);
}  // namespace instances

using AsStored = detail::Gemm3xTf32RowMajor;  // a as stored, split in the loop

namespace {
bool presplit(SmallParts small_parts) {
  return small_parts == SmallParts::kDefault ? presplit_3xtf32() : small_parts == SmallParts::kPresplit;
}
}  // namespace

std::size_t gemm_3xtf32_row_major_workspace_bytes(int64_t m, int64_t n, int64_t k, bool a_transposed,
                                                  SmallParts small_parts) {
  if (presplit(small_parts)) return instances::workspace_3xtf32_row_major_presplit(m, n, k, a_transposed);
  return a_transposed ? instances::workspace_3xtf32_row_major_transposed_a(m, n, k) : AsStored::workspace_bytes(m, n, k);
}

Status gemm_3xtf32_row_major(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool a_transposed,
                             const float* b, int64_t ldb, float* c, int64_t ldc, void* workspace, cudaStream_t stream,
                             SmallParts small_parts) {
  if (presplit(small_parts))
    return instances::run_3xtf32_row_major_presplit(m, n, k, a, lda, a_transposed, b, ldb, c, ldc, workspace, stream);
  if (a_transposed)
    return instances::run_3xtf32_row_major_transposed_a(m, n, k, a, lda, b, ldb, c, ldc, workspace, stream);
  return AsStored::run(m, n, k, a, lda, b, ldb, c, ldc, workspace, stream);
}

}  // namespace fused::sm90
