// Backward of fused Linear -> BatchNorm1d -> scale -> softmax(dim=1): the torch-free public API.
//
// From what the forward kept (y = x W^T + b, the mean and invstd it normalised with, each row's
// softmax log-normaliser lse) and g = dL/dout, per column j over the rows i (s = scale, per column
// or scalar):
//   xhat = (y - mean) * invstd   z = s (gamma xhat + beta)   out = exp(z - lse_i), recomputed in
//   fp32, its exponent in double for fp32 gradients (not read back rounded to the output dtype: more
//   accurate, fewer bytes)
//   dz = out * (g - r_i),  r_i = sum_n g_in * out_in
//   S1_j = sum_i dz_ij    S2_j = sum_i dz_ij * xhat_ij
//   d_beta = s S1   d_gamma = s S2   d_scale = sum_j (gamma S2 + beta S1) (or per column)
//   dy = A dz + B xhat + C,  A = gamma s invstd, and with batch statistics B = -A S2 / M,
//        C = -A S1 / M (running statistics: B = C = 0)
//   d_bias = sum_i dy = 0 exactly with batch statistics (BatchNorm removes any bias), A S1 otherwise
// then dx = dy W and dW = dy^T x: the caller's GEMMs, in the forward's input precision.
//
// Data flow on CUDA, all stream-ordered, deterministic (fixed reduction orders, no atomics on data):
//   [B1] row pass:        partial sums of r_i over column strips (at most 32 per row)
//   [B2] column partials: r_i (the strips summed in order), then per row tile S1 and S2 of each column
//   [B3] column finalize: merges the partials in tile order -> the parameter gradients and dy's b, c
//   [B4] dy pass:         dy in the GEMM's input dtype, and/or dy^T (TF32 GEMMs need K-major operands)
// The CPU implementation follows the same steps in double precision. Every step reads y, never out.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fused/gemm_bn_softmax.h"

namespace fused {

struct BackwardProblem {
  int64_t M = 0;  // batch
  int64_t N = 0;  // out_features
  ElementType grad_dtype = ElementType::kFloat32;   // of grad_out (the forward's out dtype)
  ElementType stats_dtype = ElementType::kFloat32;  // of y, save_mean, save_invstd, row_lse (kFloat64: CPU only)
  bool batch_stats = true;  // the forward normalised with batch statistics (training, or no running stats)
};

// Row-major (M, N) matrices with a row stride in elements; every output is optional (null: not wanted).
struct BackwardBuffers {
  const void* grad_out = nullptr;  // (M, N) grad_dtype
  int64_t ldg = 0;
  const void* y = nullptr;  // (M, N) stats_dtype: x W^T + b as the forward kept it
  int64_t ldy = 0;
  const void* save_mean = nullptr;    // (N) stats_dtype
  const void* save_invstd = nullptr;  // (N) stats_dtype
  const void* row_lse = nullptr;      // (M) stats_dtype: log sum_n exp(z_in), the forward's ForwardBuffers::row_lse
  const void* gamma = nullptr;        // (N) param_dtype, or null (affine=False)
  const void* beta = nullptr;         // (N) param_dtype, or null
  ElementType param_dtype = ElementType::kFloat32;
  const void* scale = nullptr;  // scale_numel (1 or N) elements of scale_dtype
  int64_t scale_numel = 1;
  ElementType scale_dtype = ElementType::kFloat32;

  void* dy = nullptr;  // (M, N) dy_dtype, row stride lddy
  int64_t lddy = 0;
  void* dy_t = nullptr;  // (N, M) dy_dtype, row stride lddy_t: dy transposed
  int64_t lddy_t = 0;
  ElementType dy_dtype = ElementType::kFloat32;
  void* grad_bias = nullptr;  // (N) bias_dtype
  ElementType bias_dtype = ElementType::kFloat32;
  void* grad_gamma = nullptr;  // (N) param_dtype
  void* grad_beta = nullptr;   // (N) param_dtype
  void* grad_scale = nullptr;  // scale_numel elements of scale_dtype

  // Data-parallel backward (nn.SyncBatchNorm's), optional: what backward_column_sums() returned on
  // this rank (its column-sums record and row sums) and every rank's records gathered in rank order
  // (fused/batchnorm.h: [count, S1, S2]). When rank_sums is set the sums are not recomputed: dy's
  // coefficients use the global sums and count, the parameter gradients this rank's own (the data-
  // parallel wrapper then averages them over ranks, as for any parameter). Column parallelism
  // passes its own record as the only rank (BatchNorm is per column) and the row sums of all
  // columns, so that the softmax's backward spans every rank's columns.
  const double* local_sums = nullptr;  // rank_record_size(N) doubles
  const double* rank_sums = nullptr;   // num_ranks records
  int64_t num_ranks = 0;
  const double* row_sums = nullptr;  // (2, M): see kRowSumsRows
};

// The backward's row sums, (2, M) doubles: row 0 holds sum_n g_in out_in, row 1 sum_n out_in, out being the
// softmax recomputed from y and row_lse. Both are sums over columns, so column-parallel ranks add
// theirs. The softmax backward's r_i is their ratio, and every recomputed out is divided by the
// row's sum: row_lse, rounded to the stats dtype, scales a whole recomputed row by exp(its rounding
// error), up to half an ulp of row_lse (3.8e-6 at |row_lse| = 100, logits that large being common at a
// scale of 10). Dividing by the row's own sum takes that common factor out. They are kept in double
// because, for fp32 gradients, [B2] computes dz in double from them, and rounded sums would leave
// sum_n dz_n != 0 at fp32's level, which a scalar scale's gradient amplifies by the logits' size.
constexpr int kRowSumsRows = 2;  // detail::row_norm() turns the two into r_i and the divisor

// Checks shapes, strides and arguments common to every path.
Status validate(const BackwardProblem& p, const BackwardBuffers& b);

namespace cpu {
// The whole backward up to dy on host memory, double-precision math (any stats_dtype, fp64 included).
Status backward(const BackwardProblem& p, const BackwardBuffers& b, const ParallelFor& parallel_for = serial_for);
// Data-parallel step 1: this rank's column-sums record (rank_record_size(N) doubles, count = M) and
// row sums ((2, M) doubles), for the caller to exchange; then backward() with local_sums /
// rank_sums / row_sums set. With b.row_sums given (column parallelism: the row sums added over every
// rank's columns), the sums use it and row_sums (the output) may be null.
Status backward_column_sums(const BackwardProblem& p, const BackwardBuffers& b, double* sums, double* row_sums,
                            const ParallelFor& parallel_for = serial_for);
}  // namespace cpu

namespace cuda {
// Device workspace for backward(), 256-byte aligned pointer expected:
//   the row sums and their strip partials (66 M doubles at most), S1 and S2 partials (2 * ceil(M / row_tile) * N
//   doubles, row_tile 64..1024 rows), dy's b and c (2 N floats), per-block d_scale sums and a counter.
// Headline problem (M = 1024, N = 8192): about 2.6 MiB.
std::size_t backward_workspace_bytes(const BackwardProblem& p);
// [B1]..[B4], stream-ordered on `stream`, no host synchronisation. stats_dtype must be fp32 and
// grad_dtype / dy_dtype fp32, bf16 or fp16.
Status backward(const BackwardProblem& p, const BackwardBuffers& b, void* workspace, std::size_t workspace_size,
                cudaStream_t stream);
// Data-parallel step 1 ([B1], [B2] and the tile sums): as cpu::backward_column_sums, on device
// memory; the same workspace as backward().
Status backward_column_sums(const BackwardProblem& p, const BackwardBuffers& b, double* sums, double* row_sums,
                            void* workspace, std::size_t workspace_size, cudaStream_t stream);

// The backward's GEMMs at precision k3xTF32: c (m, n) = a (m, k) b (k, n), all three row-major
// fp32. a is given as stored (row stride lda) or, with a_transposed, as a^T (k, m) row-major with row
// stride lda: dx = dy W is a = dy, b = W; dW = dy^T x is a = dy given transposed, b = x. b is read where
// it is; a's small parts (and, given transposed from k >= 1024 on, a itself, transposed) are written
// into the workspace by a pass before the kernel: m x k floats, twice that for a transposed (the
// workspace function says how much). fp32-grade accuracy on TF32 tensor cores (the forward's 3xTF32
// kernels, without statistics or bias). Needs the sm90 build and a Hopper GPU; n, lda, ldb and ldc
// multiples of 4, and k (a as stored) or m (a transposed) too; 16-byte aligned pointers; else
// kNotSupported with the reason, nothing launched. 0 < m, n, k < 2^31 (else kInvalidArgument, kNotSupported).
std::size_t gemm_3xtf32_workspace_bytes(int64_t m, int64_t n, int64_t k, bool a_transposed = false);
Status gemm_3xtf32(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                   int64_t ldc, void* workspace, std::size_t workspace_size, cudaStream_t stream,
                   bool a_transposed = false);
}  // namespace cuda

}  // namespace fused
