// The backward's GEMMs at precision 3xTF32 (fused/backward.h): c = a b, row-major, on the sm90
// 3xTF32 kernel that reads both operands as stored (kernels/sm90/gemm_3xtf32_row_major.h).
#include "fused/backward.h"
#include "util/cuda_check.h"
#include "util/device_info.h"
#if defined(FUSED_WITH_SM90)
#include "kernels/sm90/gemm_3xtf32_row_major.h"
#endif

namespace fused::cuda {
namespace {

#if defined(FUSED_WITH_SM90)
Status require_hopper() {
  int device = 0, major = 0;
  FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "cudaGetDevice failed"));
  FUSED_RETURN_IF_ERROR(util::compute_capability_major(device, major));
  if (major != 9) return {StatusCode::kNotSupported, "3xTF32 GEMM: the GPU is not compute capability 9.x (Hopper)"};
  return Status::Ok();
}

// What the kernel's TMA copies take: rows of a multiple of 16 bytes, 16-byte aligned.
Status require_tma_layout(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool a_transposed,
                          const float* b, int64_t ldb, const float* c, int64_t ldc) {
  if ((a_transposed ? m : k) % 4 != 0)
    return {StatusCode::kNotSupported, a_transposed ? "3xTF32 GEMM: m must be a multiple of 4 (a given transposed)"
                                                    : "3xTF32 GEMM: k must be a multiple of 4 (a given as stored)"};
  if (n % 4 != 0 || lda % 4 != 0 || ldb % 4 != 0 || ldc % 4 != 0)
    return {StatusCode::kNotSupported, "3xTF32 GEMM: n, lda, ldb and ldc must be multiples of 4"};
  if (!util::aligned16(a) || !util::aligned16(b) || !util::aligned16(c))
    return {StatusCode::kNotSupported, "3xTF32 GEMM: a, b and c must be 16-byte aligned"};
  return Status::Ok();
}
#endif

}  // namespace

std::size_t gemm_3xtf32_workspace_bytes(int64_t m, int64_t n, int64_t k, bool a_transposed) {
#if defined(FUSED_WITH_SM90)
  return sm90::gemm_3xtf32_row_major_workspace_bytes(m, n, k, a_transposed);
#else
  (void)m, (void)n, (void)k, (void)a_transposed;
  return 0;
#endif
}

Status gemm_3xtf32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                   int64_t ldc, void* workspace, std::size_t workspace_size, cudaStream_t stream, bool a_transposed) {
#if defined(FUSED_WITH_SM90)
  // The arguments first: their errors do not depend on the device.
  if (m <= 0 || n <= 0 || k <= 0) return {StatusCode::kInvalidArgument, "3xTF32 GEMM: m, n and k must be positive"};
  constexpr int64_t kInt32Limit = int64_t{1} << 31;  // the kernel's problem shape is int
  if (m >= kInt32Limit || n >= kInt32Limit || k >= kInt32Limit)
    return {StatusCode::kNotSupported, "3xTF32 GEMM: m, n and k must be below 2^31"};
  if (lda < (a_transposed ? m : k) || ldb < n || ldc < n)
    return {StatusCode::kInvalidArgument, a_transposed ? "3xTF32 GEMM: a row stride is shorter than its row (lda < m "
                                                         "with a given transposed, ldb < n or ldc < n)"
                                                       : "3xTF32 GEMM: a row stride is shorter than its row (lda < k, "
                                                         "ldb < n or ldc < n)"};
  FUSED_RETURN_IF_ERROR(require_hopper());
  FUSED_RETURN_IF_ERROR(require_tma_layout(m, n, k, a, lda, a_transposed, b, ldb, c, ldc));
  if (workspace_size < gemm_3xtf32_workspace_bytes(m, n, k, a_transposed))
    return {StatusCode::kInvalidArgument, "3xTF32 GEMM: workspace smaller than gemm_3xtf32_workspace_bytes()"};
  return sm90::gemm_3xtf32_row_major(m, n, k, a, lda, a_transposed, b, ldb, c, ldc, workspace, stream);
#else
  (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc, (void)workspace,
      (void)workspace_size, (void)stream, (void)a_transposed;
  return {StatusCode::kNotSupported, "3xTF32 GEMM: this build holds no sm90 kernels"};
#endif
}

}  // namespace fused::cuda
