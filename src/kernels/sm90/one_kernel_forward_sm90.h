// The whole forward in one sm90 kernel, for problems whose 64x64 output tiles all fit on the GPU at
// once (at most kOneKernelCtasPerSm CTAs per SM). Torch-free; included by the dispatcher
// (src/api/forward_cuda.cu) and by tests.
//
// Each CTA owns one 64x64 tile of y and never writes it out to be read back:
//   [1] its GEMM (CUTLASS's TMA + wgmma mainloop, one producer and one consumer warpgroup) leaves the
//       tile in registers; the CTA adds the bias, keeps the tile in shared memory, and writes its
//       column partials (mean, M2 over its 64 rows: the partials format of fused/batchnorm.h with
//       row_tile 64);
//   -- grid-wide barrier (the launch is cooperative, so every CTA is resident) --
//   [2] every CTA writes y where the caller keeps it; merges its 64 columns' partials over all row
//       tiles, in order (the library's two-pass merge, four threads to a column, their parts added in
//       a fixed order: every CTA of a column gets the same bits), and folds BatchNorm + scale into its
//       map; the CTAs of row tile 0 also write save_mean / save_invstd and move the running statistics;
//       then it writes each of its rows' (max, sum of exp) over its 64 columns;
//   -- grid-wide barrier --
//   [3] every CTA merges its rows' (max, sum) over all column tiles, in order, and writes out (and the
//       CTAs of column tile 0 the rows' log-normaliser); one thread adds the batch to num_batches_tracked.
// In eval mode (running statistics) [1] writes no partials and the first barrier is skipped.
// Against the three kernels (GEMM + statistics, finalize, softmax) it saves y's round trip through
// memory, two launches and their gaps: what dominates small problems (N = 512 at M = 1024).
#pragma once

#include "fused/batchnorm.h"
#include "fused/types.h"
#include "kernels/sm90/gemm_stats_sm90.h"

namespace fused::sm90 {

constexpr int64_t kOneKernelTile = 64;       // the CTA tile's rows and columns (partials row tile)
constexpr int kOneKernelCtasPerSm = 2;       // resident CTAs per SM (shared memory: 6 stages of 16 KiB)

// 64x64 tiles of an M x N output.
int64_t one_kernel_tiles(int64_t M, int64_t N);
constexpr int64_t kOneKernelMaxKTilesPerSm = 128;  // K loop per SM, in k-tiles of 128 bytes of K
// Whether the forward runs as one kernel on `num_sms` SMs: every tile resident at once, at least a
// quarter of the SMs busy, and at most kOneKernelMaxKTilesPerSm k-tiles of K loop per SM (tiles x
// ceil(K * element_bytes / 128) <= 128 x SMs). The measurements behind it are in the .cu.
bool one_kernel_forward_fits(int64_t M, int64_t N, int64_t K, int element_bytes, int num_sms);
// Floats of the rows' (max, sum) per column tile: 2 * ceil(N / 64) * M.
int64_t one_kernel_row_parts_floats(int64_t M, int64_t N);

struct OneKernelForwardArgs {
  // M, N, K, x, w, bias, y (null: y not written) and the partials (row_tile 64, ld >= round_up(N, 64),
  // ceil(M / 64) row tiles; needed when bn uses batch statistics). gemm.tile is ignored.
  GemmStatsArgs gemm;
  BatchNormArgs bn;  // rank_moments must be null: one GPU's rows
  float* save_mean = nullptr;    // (N)
  float* save_invstd = nullptr;  // (N)
  void* out = nullptr;           // (M, N) out_dtype, row stride ldo
  int64_t ldo = 0;
  ElementType out_dtype = ElementType::kFloat32;
  float* row_lse = nullptr;      // (M) or null
  float* row_parts = nullptr;    // one_kernel_row_parts_floats(M, N), any contents
};

// Launches the kernel for x's element type (bf16, fp16, or fp32 with TF32 tensor cores) on `stream`,
// cooperatively (kCudaError if the device cannot hold the grid). Same operand rules as
// run_gemm_stats; kNotSupported where one_kernel_forward_fits's residency does not hold.
Status run_one_kernel_forward(ElementType dtype, const OneKernelForwardArgs& args, cudaStream_t stream);

namespace instances {
Status run_one_kernel_bf16(const OneKernelForwardArgs& args, cudaStream_t stream);
Status run_one_kernel_fp16(const OneKernelForwardArgs& args, cudaStream_t stream);
Status run_one_kernel_tf32(const OneKernelForwardArgs& args, cudaStream_t stream);
}  // namespace instances

}  // namespace fused::sm90
