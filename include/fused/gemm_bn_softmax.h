// Fused Linear -> BatchNorm1d -> scale -> softmax(dim=1): the torch-free public API.
//
//   y   = x W^T + b                  (M, N) fp32, fp32 accumulation
//   mu, var = batch statistics of y  (training, or no running stats) else running stats
//   out = softmax(scale * (gamma * (y - mu) * rsqrt(var + eps) + beta), dim=1)
//
// Data flow on CUDA:
//   [1] y and per-row-tile column partials: the sm90 GEMM with its statistics epilogue
//       (GemmPath::kSm90), or y written by the caller (cuBLAS) + column_partials()
//       (GemmPath::kExternal)
//   [2] finalize(): partials -> mean, invstd, running-stat update, folded ColumnAffine
//   [3] row_softmax(): out = softmax(a * (y - shift) + c), and each row's log-normaliser for the backward
// The CPU implementation (fused::cpu) follows the same steps on host memory.
#pragma once

#include <functional>

#include "fused/batchnorm.h"
#include "fused/types.h"

namespace fused {

struct ForwardProblem {
  int64_t M = 0;  // batch
  int64_t N = 0;  // out_features
  int64_t K = 0;  // in_features
  ElementType dtype = ElementType::kFloat32;      // of x, W, bias: the GEMM's input type
  ElementType out_dtype = ElementType::kFloat32;  // of out (autocast asks for fp32 out of a 16-bit GEMM)
  MatmulPrecision precision = MatmulPrecision::kHighest;  // fp32 only
};

// Row-major matrices with a row stride (elements); unit column stride.
struct ForwardBuffers {
  const void* x = nullptr;       // (M, K) dtype, row stride ldx
  int64_t ldx = 0;
  const void* weight = nullptr;  // (N, K) dtype (nn.Linear layout), row stride ldw
  int64_t ldw = 0;
  const void* bias = nullptr;    // (N) dtype, or null
  float* y = nullptr;            // (M, N) fp32, row stride ldy; kept for the backward
  int64_t ldy = 0;
  void* out = nullptr;           // (M, N) out_dtype, row stride ldo
  int64_t ldo = 0;
  float* save_mean = nullptr;    // (N) the mean used (batch or running)
  float* save_invstd = nullptr;  // (N) 1 / sqrt(var + eps)
  // (M) log sum_n exp(z[i, n]) per row, or null. Kept for the backward, which recomputes the
  // softmax in fp32 from y (exp(z - row_lse)) instead of reading the rounded out.
  float* row_lse = nullptr;
};

// Checks shapes, strides and arguments common to every path (the contract's preconditions).
Status validate(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn);

namespace cpu {

// Runs body(begin, end) over chunks of [0, n) of about `grain` items, possibly in parallel
// (the torch binding passes at::parallel_for). Results never depend on the chunking.
using ParallelFor = std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body)>;
void serial_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// The whole forward on host memory. y must already hold x W^T + b (the caller's GEMM).
// Statistics are split over columns, the softmax over rows.
Status forward_from_y(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn,
                      const ParallelFor& parallel_for = serial_for);

// The steps, exposed for tests. Row tiles of `row_tile` rows, as the CUDA partials.
void column_partials(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnStatsPartials& out);
void finalize(const ColumnStatsPartials& partials, int64_t M, int64_t N, const BatchNormArgs& bn,
              float* save_invstd, const ColumnAffine& affine);
// out has dtype `dtype`; fp32 math, row max subtracted. row_lse (M floats) may be null.
void row_softmax(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& affine, void* out,
                 int64_t ldo, ElementType dtype, float* row_lse = nullptr);

}  // namespace cpu

namespace cuda {

// Where y and the column partials come from.
enum class GemmPath : int {
  kSm90 = 0,      // CUTLASS sm90 GEMM with the column-statistics epilogue (Hopper, bf16/fp16/tf32)
  kExternal = 1,  // the caller wrote y (e.g. cuBLAS); the generic column-partials kernel follows
};

// True when this build holds the sm90 kernels.
bool sm90_compiled();
// Whether the sm90 path takes this problem (dtype, precision, 16-byte TMA alignment of x, W, y).
// Does not query the device; the caller checks for compute capability 9.x.
Status sm90_can_implement(const ForwardProblem& p, const ForwardBuffers& b);
// Whether the sm90 path is expected to be faster than the generic one on a GPU with `num_sms`
// multiprocessors (auto dispatch; both are correct). Grids that 256x128 tiles leave under one wave
// run a 128x128 ping-pong kernel (2x faster there, level with cuBLAS's GEMM alone), so sm90 wins
// almost everywhere; the exception is 16-bit inputs whose 128x128 grid is still under one wave with
// K >= 8192, where cuBLAS's split-K GEMM plus the statistics pass is faster (measured on the H200:
// M = 256, N = K = 8192 bf16, 74 vs 86 us; bench/results/h200-2026-11-30-*).
bool sm90_preferred(const ForwardProblem& p, int num_sms);

// Device workspace for forward(); 256-byte aligned pointer expected. Each region 256-byte aligned:
//   partials mean + M2   2 * ceil(M / row_tile) * ld floats  (sm90: row_tile 256, or 128 for grids
//                                                            under one wave; ld = round_up(N, 128);
//                                                            generic: row_tile 128, ld = round_up(N, 4))
//   folded a, c          2 * N floats
//   the sm90 GEMM's own  (CUTLASS tile-scheduler workspace; 0 for the data-parallel persistent schedule)
// Headline problem (M = 1024, N = 8192): 320 KiB on the sm90 path, 576 KiB on the generic path.
// The outputs (out, y, save_mean, save_invstd) are the caller's, not part of the workspace.
std::size_t workspace_bytes(const ForwardProblem& p, GemmPath path);

// The whole forward, stream-ordered on `stream`, no host synchronisation.
Status forward(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn, GemmPath path,
               void* workspace, std::size_t workspace_size, cudaStream_t stream);

// The architecture-neutral kernels, exposed for tests.
// y[i, :] = bias (x's element type) for i < M: the C operand the generic path hands cuBLAS.
Status bias_rows(const void* bias, ElementType dtype, float* y, int64_t ldy, int64_t M, int64_t N,
                 cudaStream_t stream);
Status column_partials(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnStatsPartials& out,
                       cudaStream_t stream);
Status finalize(const ColumnStatsPartials& partials, int64_t M, int64_t N, const BatchNormArgs& bn,
                float* save_invstd, const ColumnAffine& affine, cudaStream_t stream);
Status row_softmax(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& affine, void* out,
                   int64_t ldo, ElementType dtype, float* row_lse, cudaStream_t stream);

}  // namespace cuda
}  // namespace fused
