// The backward's GEMMs at 3xTF32: c (m, n) = a (m, k) b (k, n), all three row-major fp32, each
// operand read where it is. TF32 wgmma reads its shared-memory operand (B) K-major only; the 3xTF32
// mainloop takes A through registers, where either major works. So the kernel runs the transposed
// problem c^T = b^T a^T: its A is b (MN-major as stored), its B is a (K-major as stored), and it
// stores c^T column-major, which is c row-major. The backward's dx = dy W and dW = dy^T x (dy^T
// written by the dy pass) then need no transposed copy of W or x.
// Needs: n, k, lda, ldb, ldc multiples of 4, 16-byte aligned pointers (TMA); m, n, k > 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "fused/types.h"

namespace fused::sm90 {

std::size_t gemm_3xtf32_row_major_workspace_bytes(int64_t m, int64_t n, int64_t k);

Status gemm_3xtf32_row_major(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                             float* c, int64_t ldc, void* workspace, cudaStream_t stream);

}  // namespace fused::sm90
