// The backward's GEMMs at precision 3xTF32 (fused/backward.h): the forward's sm90 3xTF32 kernel with
// neither statistics nor bias, i.e. a plain c = a b^T.
#include "fused/backward.h"
#include "util/cuda_check.h"
#include "util/device_info.h"
#if defined(FUSED_WITH_SM90)
#include "kernels/sm90/gemm_stats_sm90.h"
#endif
#if defined(FUSED_3XTF32_MN_A)
#include "kernels/sm90/gemm_3xtf32_mn_major_a.h"
#endif

namespace fused::cuda {
namespace {

#if defined(FUSED_WITH_SM90)
sm90::GemmStatsArgs plain_gemm_args(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
                                    int64_t ldb, float* c, int64_t ldc) {
  sm90::GemmStatsArgs args;
  args.M = m; args.N = n; args.K = k;
  args.x = a; args.ldx = lda;
  args.w = b; args.ldw = ldb;
  args.y = c; args.ldy = ldc;
  args.tile = sm90::k3xTf32Tile;  // partials and bias stay null: no statistics, no bias
  return args;
}

Status require_hopper() {
  int device = 0, major = 0;
  FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "cudaGetDevice failed"));
  FUSED_RETURN_IF_ERROR(util::compute_capability_major(device, major));
  if (major != 9) return {StatusCode::kNotSupported, "3xTF32 GEMM: the GPU is not compute capability 9.x (Hopper)"};
  return Status::Ok();
}
#endif

}  // namespace

std::size_t gemm_3xtf32_workspace_bytes(int64_t m, int64_t n, int64_t k) {
#if defined(FUSED_WITH_SM90)
  return sm90::gemm_workspace_bytes(ElementType::kFloat32, MatmulPrecision::k3xTF32,
                                    plain_gemm_args(m, n, k, nullptr, 0, nullptr, 0, nullptr, 0));
#else
  (void)m, (void)n, (void)k;
  return 0;
#endif
}

Status gemm_3xtf32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                   int64_t ldc, void* workspace, std::size_t workspace_size, cudaStream_t stream) {
#if defined(FUSED_WITH_SM90)
  FUSED_RETURN_IF_ERROR(require_hopper());
  if (workspace_size < gemm_3xtf32_workspace_bytes(m, n, k))
    return {StatusCode::kInvalidArgument, "3xTF32 GEMM: workspace smaller than gemm_3xtf32_workspace_bytes()"};
  return sm90::run_gemm_stats(ElementType::kFloat32, MatmulPrecision::k3xTF32,
                              plain_gemm_args(m, n, k, a, lda, b, ldb, c, ldc), workspace, stream);
#else
  (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc, (void)workspace,
      (void)workspace_size, (void)stream;
  return {StatusCode::kNotSupported, "3xTF32 GEMM: this build holds no sm90 kernels"};
#endif
}

#if defined(FUSED_3XTF32_MN_A)
std::size_t gemm_3xtf32_mn_major_a_workspace_bytes(int64_t m, int64_t n, int64_t k) {
  return sm90::gemm_3xtf32_mn_major_a_workspace_bytes(m, n, k);
}

Status gemm_3xtf32_mn_major_a(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                              float* c, int64_t ldc, void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  FUSED_RETURN_IF_ERROR(require_hopper());
  if (workspace_size < gemm_3xtf32_mn_major_a_workspace_bytes(m, n, k))
    return {StatusCode::kInvalidArgument, "3xTF32 GEMM: workspace smaller than gemm_3xtf32_mn_major_a_workspace_bytes()"};
  return sm90::gemm_3xtf32_mn_major_a(m, n, k, a, lda, b, ldb, c, ldc, workspace, stream);
}
#endif

}  // namespace fused::cuda
