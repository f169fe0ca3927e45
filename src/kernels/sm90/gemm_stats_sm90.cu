// Geometry of the sm90 partials format and workspace dispatch (no CUTLASS here).
#include "kernels/sm90/gemm_stats_sm90.h"

namespace fused::sm90 {

int64_t partials_row_tile() { return kCtaTileM; }

int64_t partials_ld(int64_t N) { return (N + kCtaTileN - 1) / kCtaTileN * kCtaTileN; }

std::size_t gemm_workspace_bytes(ElementType dtype, const GemmStatsArgs& args) {
  switch (dtype) {
    case ElementType::kBFloat16: return gemm_workspace_bytes_bf16(args);
    case ElementType::kFloat16: return gemm_workspace_bytes_fp16(args);
    case ElementType::kFloat32: return gemm_workspace_bytes_tf32(args);
    default: return 0;
  }
  return 0;
}

}  // namespace fused::sm90
