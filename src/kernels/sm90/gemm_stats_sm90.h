// Internal interface of the sm90 GEMM + column-statistics kernels (one TU per instantiation).
// Torch-free; included by the dispatcher (src/api/forward_cuda.cu) and by tests.
#pragma once

#include "fused/batchnorm.h"
#include "fused/types.h"

namespace fused::sm90 {

// The CTA tile fixes the partials format: one partial per (CTA row tile, column).
// The partials buffer is [ceil(M / kTileM), round_up(N, kTileN)] (see cutlass-notes.md §3).
// (Concrete values are chosen by measurement; every instantiation shares them.)
constexpr int64_t kCtaTileM = 256;       // CTA tile M of every instantiation
constexpr int64_t kCtaTileN = 128;       // CTA tile N of every instantiation
int64_t partials_row_tile();             // == CTA tile M
int64_t partials_ld(int64_t N);          // == round_up(N, CTA tile N)

struct GemmStatsArgs {
  int64_t M = 0, N = 0, K = 0;
  const void* x = nullptr;  // (M, K) row-major, row stride ldx (elements), 16-byte aligned rows
  int64_t ldx = 0;
  const void* w = nullptr;  // (N, K) row-major (nn.Linear weight), row stride ldw
  int64_t ldw = 0;
  const void* bias = nullptr;  // (N) same element type as x, or null (no bias)
  float* y = nullptr;          // (M, N) fp32 row-major, row stride ldy (multiple of 4)
  int64_t ldy = 0;
  // Per-CTA-tile column partials of y (mean, M2; count from geometry). mean == nullptr: the
  // epilogue computes no statistics (eval mode).
  ColumnStatsPartials partials;
};

// Device workspace the GEMM itself needs (tile scheduler etc.), bytes. Dispatches on dtype to the
// per-instantiation functions below (fp32 -> tf32 kernel). 0 if the arguments are invalid.
std::size_t gemm_workspace_bytes(ElementType dtype, const GemmStatsArgs& args);
std::size_t gemm_workspace_bytes_bf16(const GemmStatsArgs& args);
std::size_t gemm_workspace_bytes_fp16(const GemmStatsArgs& args);
std::size_t gemm_workspace_bytes_tf32(const GemmStatsArgs& args);

// One function per instantiation; each lives in its own TU.
//   bf16 / fp16: A, B in that type; tf32: A, B fp32, tf32 tensor-core MMA.
// Requirements (else kNotSupported / kInvalidArgument, nothing launched): K, ldx, ldw multiples of
// 16 bytes; N, ldy multiples of 4; x, w, y 16-byte aligned; M, N, K < 2^31; partials either both
// null or of geometry [>= ceil(M / partials_row_tile()), partials_ld(N)]. The bias needs no alignment.
// Launches on `stream` (the current device); asynchronous.
Status run_gemm_stats_bf16(const GemmStatsArgs& args, void* workspace, cudaStream_t stream);
Status run_gemm_stats_fp16(const GemmStatsArgs& args, void* workspace, cudaStream_t stream);
Status run_gemm_stats_tf32(const GemmStatsArgs& args, void* workspace, cudaStream_t stream);

}  // namespace fused::sm90
