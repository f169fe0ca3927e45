// The backward's GEMMs at 3xTF32: c (m, n) = a (m, k) b (k, n), all three row-major fp32, each
// operand read where it is. TF32 wgmma reads its shared-memory operand (B) K-major only; the 3xTF32
// mainloop takes A through registers, where either major works. So the kernel runs the transposed
// problem c^T = b^T a^T: its A is b (MN-major as stored), its B is a, and it stores c^T
// column-major, which is c row-major. a is given either as stored (row stride lda; the kernel's B is
// then K-major) or transposed, as a^T (k, m) row-major with row stride lda (the kernel's B is then
// MN-major, and its consumers transpose each tile in shared memory). The backward's dx = dy W and
// dW = dy^T x (a = dy given transposed) then need no transposed copy of dy, W or x.
// Needs: n, lda, ldb, ldc multiples of 4, and k (a as stored) or m (a transposed) too; 16-byte
// aligned pointers (TMA); m, n, k > 0.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "fused/types.h"

namespace fused::sm90 {

std::size_t gemm_3xtf32_row_major_workspace_bytes(int64_t m, int64_t n, int64_t k, bool a_transposed);

Status gemm_3xtf32_row_major(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool a_transposed,
                             const float* b, int64_t ldb, float* c, int64_t ldc, void* workspace, cudaStream_t stream);

}  // namespace fused::sm90
