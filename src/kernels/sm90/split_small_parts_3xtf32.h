// The pass before the presplit 3xTF32 GEMM (mainloop_3xtf32_presplit.hpp): the small parts of the
// operand that the kernel keeps in shared memory, written once instead of split every k-tile.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "fused/types.h"

namespace fused::sm90 {

// Whether the 3xTF32 kernels take their shared-memory operand's small parts from a pass (the
// default) or split them in the loop: FUSED_3XTF32_IN_LOOP_SPLIT=1 in the environment (read once)
// picks the latter, for A/B runs. The one place that reads the switch.
bool presplit_3xtf32();

// Where a presplit kernel's workspace holds the pass's output: after the kernel's own part (CUTLASS's
// workspace), rounded up to 256 bytes.
inline std::size_t presplit_parts_offset(std::size_t kernel_workspace_bytes) {
  return (kernel_workspace_bytes + 255) / 256 * 256;
}

// small (rows, cols), dense (row stride cols) = fused::tf32::small_toward_zero of every element of
// a (rows, cols) with row stride lda; *special = 1 if a holds inf or NaN, else 0 (the pass zeroes it
// first). Needs cols and lda multiples of 4 and a, small 16-byte aligned (what the GEMM's TMA copies
// need anyway). Launches on `stream`; asynchronous.
Status split_small_parts_3xtf32(const float* a, int64_t rows, int64_t cols, int64_t lda, float* small,
                                uint32_t* special, cudaStream_t stream);

// The same for an operand given transposed: at (cols, rows) with row stride ldat holds a = at^T.
// Writes a itself (rows, cols) and its small parts (rows, cols), both with row stride ld >= cols,
// ld a multiple of 4 (columns [cols, ld) are left as they were: TMA never reads past cols). No
// alignment needed of at.
Status transpose_split_small_parts_3xtf32(const float* at, int64_t rows, int64_t cols, int64_t ldat, float* a,
                                          float* small, int64_t ld, uint32_t* special, cudaStream_t stream);

}  // namespace fused::sm90
