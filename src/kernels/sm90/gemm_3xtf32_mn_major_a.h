// Experimental (CMake option FUSED_3XTF32_MN_A_EXPERIMENT, OFF by default; not used by the op): the
// 3xTF32 GEMM with an MN-major A and a column-major C, so that the backward's dx = dy W needs no
// transposed copy of W (docs/design-3xtf32-sm90.md, section 7):
//   c(m, n) = sum_k a(m, k) b(n, k),  a(m, k) at a[m + k * lda] (m contiguous),
//                                     b(n, k) at b[n * ldb + k] (k contiguous),
//                                     c(m, n) at c[m + n * ldc] (m contiguous).
// For dx (M_x, K_x) = dy (M_x, N_w) W (N_w, K_x): m = K_x, n = M_x, k = N_w, a = W (lda = K_x),
// b = dy (ldb = N_w), c = dx (ldc = K_x).
// fp32 operands; m, lda, ldb, ldc multiples of 4 and 16-byte aligned pointers (TMA).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "fused/types.h"

namespace fused::sm90 {

std::size_t gemm_3xtf32_mn_major_a_workspace_bytes(int64_t m, int64_t n, int64_t k);

Status gemm_3xtf32_mn_major_a(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                              float* c, int64_t ldc, void* workspace, cudaStream_t stream);

}  // namespace fused::sm90
