// The recompute path (GemmPath::kRecompute, run only when asked for): for small K, when the caller
// does not keep y, the forward never writes y. Each pass recomputes its 128x128 tile of
// y = x W^T + b from x and W (whole K in shared memory, tensor-core mma.sync, fp32 accumulation),
// so no (M, N) fp32 buffer exists. Measured on the H200 (4096 x 8192, K = 64, bf16) it is slower
// than the sm90 GEMM + softmax that write and read y (0.176 vs 0.136 ms): a pass takes 45-63 us
// against about 9 us of mma.sync work, running about 1300 instructions per thread per tile (the
// per-element epilogue work outweighs the K = 64 product) at 2.1-2.6 per cycle per SM (of 4).
//   [R1] column partials of y (batch statistics), in the ColumnStatsPartials format ([2] finalize
//        reads them as it reads the other paths')
//   [R2] per row and column tile: the tile's max of the logits z and sum of exp(z - max)
//   [R3] per row: merges [R2]'s pairs into (max, 1 / sum) and the log-normaliser
//   [R4] out = exp(z - max) / sum
// Every pass computes a tile's y with the same code, in the same order: the same bits each time.
// Torch-free; not installed.
#pragma once

#include <cuda_runtime_api.h>

#include "fused/batchnorm.h"
#include "fused/types.h"

namespace fused::cuda::recompute {

constexpr int64_t kTileM = 128;
constexpr int64_t kTileN = 128;
// The most tiles a pass takes (int32 tile indices).
constexpr int64_t kMaxTiles = 0x7fffffff;
inline int64_t num_tiles(int64_t M, int64_t N) { return ((M + kTileM - 1) / kTileM) * ((N + kTileN - 1) / kTileN); }

// The largest K a pass holds in shared memory: 256 bytes of a row (bf16/fp16 K <= 128, fp32 K <= 64).
constexpr int64_t kMaxKBytes = 256;
inline int64_t max_k(ElementType dtype) { return kMaxKBytes / static_cast<int64_t>(element_size(dtype)); }

enum class Pass : int { kColumnPartials = 0, kRowPartials = 1, kWriteOut = 2 };

// One parameter block for every pass; each pass reads what it needs. x (M, K) and W (N, K) are
// row-major in `dtype`, 16-byte aligned, with K and the row strides multiples of 16 bytes (fp32
// operands are rounded to TF32 on their way into shared memory).
struct PassParams {
  int64_t M = 0, N = 0, K = 0;
  ElementType dtype = ElementType::kBFloat16;
  const void* x = nullptr;
  int64_t ldx = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  const void* bias = nullptr;  // (N) in dtype, or null
  ColumnStatsPartials partials;  // [R1] writes (row_tile == kTileM)
  ColumnAffine affine;           // [R2], [R4] read
  float* row_parts = nullptr;    // (ceil(N / kTileN), M) (max, sum) pairs: [R2] writes, [R3] reads
  float* row_stats = nullptr;    // (M) (max, 1 / sum) pairs: [R3] writes, [R4] reads
  void* out = nullptr;           // [R4] writes, (M, N) out_dtype, row stride ldo
  int64_t ldo = 0;
  ElementType out_dtype = ElementType::kFloat32;
};

// Floats of the row_parts and row_stats buffers.
inline int64_t row_parts_floats(int64_t M, int64_t N) { return 2 * M * ((N + kTileN - 1) / kTileN); }
inline int64_t row_stats_floats(int64_t M) { return 2 * M; }

// [R1], [R2], [R4]: one launch of `pass` over the (ceil(M / 128), ceil(N / 128)) tiles, by
// persistent CTAs.
Status run_pass(Pass pass, const PassParams& p, cudaStream_t stream);
// [R3], and the row log-normalisers (row_lse may be null).
Status merge_row_parts(const PassParams& p, float* row_lse, cudaStream_t stream);

// The per-dtype launchers run_pass dispatches to (one translation unit each).
Status run_pass_bf16(Pass pass, const PassParams& p, cudaStream_t stream);
Status run_pass_fp16(Pass pass, const PassParams& p, cudaStream_t stream);
Status run_pass_tf32(Pass pass, const PassParams& p, cudaStream_t stream);

}  // namespace fused::cuda::recompute
