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

// How the kernel gets the small parts of its shared-memory operand, a:
//   kPresplit: a pass writes them into the workspace (m x k floats more) and the kernel loads them by
//              TMA beside a's tiles (mainloop_3xtf32_presplit.hpp); a given transposed is transposed
//              by the same pass into the workspace (m x k floats more again). The default: on the
//              H100 at dx = dy W 1024 x 8192 x 8192, 1.00 ms against 1.39 ms in the loop;
//   kInLoop:   the consumers split each tile of a in shared memory (mainloop_3xtf32.hpp) and, given
//              transposed, transpose it there too: no memory beyond the kernel's own workspace.
// kDefault is kPresplit unless FUSED_3XTF32_IN_LOOP_SPLIT=1 is set (presplit_3xtf32(), for A/B runs),
// or a is given transposed with k < 1024 (dW at a small batch: the in-loop form is the more accurate
// over short sums, see gemm_3xtf32_row_major.cu).
enum class SmallParts { kDefault, kPresplit, kInLoop };

std::size_t gemm_3xtf32_row_major_workspace_bytes(int64_t m, int64_t n, int64_t k, bool a_transposed,
                                                  SmallParts small_parts = SmallParts::kDefault);

Status gemm_3xtf32_row_major(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, bool a_transposed,
                             const float* b, int64_t ldb, float* c, int64_t ldc, void* workspace, cudaStream_t stream,
                             SmallParts small_parts = SmallParts::kDefault);

}  // namespace fused::sm90
