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
// The default form. a given transposed with a sum of fewer than kMinPresplitTransposedK terms (dW at a
// batch under 1024) keeps the in-loop form: its transposition rounds both of a's parts to nearest,
// where the presplit kernel reads a's big part truncated (2^-21 against 2^-22 of each word), and over
// a few terms that shows (H100, dW over 3 terms, magnitudes over 16 decades: 1.04e-7 against 7.7e-8,
// exact fp32 2.8e-8; the tests hold short sums to 3x exact fp32).
constexpr int64_t kMinPresplitTransposedK = 1024;
bool presplit(SmallParts small_parts, bool a_transposed, int64_t k) {
  if (small_parts != SmallParts::kDefault) return small_parts == SmallParts::kPresplit;
  return presplit_3xtf32() && (!a_transposed || k >= kMinPresplitTransposedK);
}
}  // namespace

std::size_t gemm_3xtf32_row_major_workspace_bytes(int64_t m, int64_t n, int64_t k, bool a_transposed,
                                                  SmallParts small_parts) {
  if (presplit(small_parts, a_transposed, k))
    return instances::workspace_3xtf32_row_major_presplit(m, n, k, a_transposed);
  return a_transposed ? instances::workspace_3xtf32_row_major_transposed_a(m, n, k) : AsStored::workspace_bytes(m, n, k);
}

Status gemm_3xtf32_row_major(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool a_transposed,
                             const float* b, int64_t ldb, float* c, int64_t ldc, void* workspace, cudaStream_t stream,
                             SmallParts small_parts) {
  if (presplit(small_parts, a_transposed, k))
    return instances::run_3xtf32_row_major_presplit(m, n, k, a, lda, a_transposed, b, ldb, c, ldc, workspace, stream);
  if (a_transposed)
    return instances::run_3xtf32_row_major_transposed_a(m, n, k, a, lda, b, ldb, c, ldc, workspace, stream);
  return AsStored::run(m, n, k, a, lda, b, ldb, c, ldc, workspace, stream);
}

}  // namespace fused::sm90
