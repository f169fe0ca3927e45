// The forward's steps below the public API (fused/gemm_bn_softmax.h): the drivers run them in
// order (src/cpu/forward_cpu.cpp, src/api/forward_cuda.cu) and the tests call them one by one.
// Torch-free; not installed.
#pragma once

#include <vector>

#include "fused/gemm_bn_softmax.h"

namespace fused {

// The problem the steps after the GEMM see (forward_from_y, column_moments, on either device): the
// GEMM is done, so x and W are not read (K = 0), and y is read, so it must be given (keep_y).
inline ForwardProblem problem_from_y(ForwardProblem p) {
  p.K = 0;
  p.keep_y = true;
  return p;
}

namespace cpu {
// Row tiles of `row_tile` rows, as the CUDA partials.
void column_partials(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnStatsPartials& out);
void finalize(const ColumnStatsPartials& partials, int64_t M, int64_t N, const BatchNormArgs& bn,
              float* save_invstd, const ColumnAffine& affine);
// out has dtype `dtype`; fp32 math, row max subtracted. row_lse (M floats) may be null.
void row_softmax(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& affine, void* out,
                 int64_t ldo, ElementType dtype, float* row_lse = nullptr);
}  // namespace cpu

namespace cuda {
// Whether forward() runs this problem on `path` as one kernel (sm90, every 64x64 output tile resident at
// once: kernels/sm90/one_kernel_forward_sm90.h) rather than as its steps [1], [2], [3].
bool forward_runs_one_kernel(const ForwardProblem& p, GemmPath path);
// y[i, :] = bias (bias_dtype) for i < M. The generic path uses it for a 16-bit bias (cuBLASLt's bias
// epilogue reads the bias in y's type, fp32: one row into the workspace) and for K = 0 (y = bias).
Status bias_rows(const void* bias, ElementType bias_dtype, float* y, int64_t ldy, int64_t M, int64_t N,
                 cudaStream_t stream);
// [1'] the generic path's column partials of a written y.
Status column_partials(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnStatsPartials& out,
                       cudaStream_t stream);
// [2] partials -> mean, invstd, running-stat update, folded ColumnAffine.
Status finalize(const ColumnStatsPartials& partials, int64_t M, int64_t N, const BatchNormArgs& bn,
                float* save_invstd, const ColumnAffine& affine, cudaStream_t stream);
// [2'] one rank's moments record (fused/batchnorm.h) from the partials: the data-parallel step 1's end.
Status column_moments(const ColumnStatsPartials& partials, int64_t M, int64_t N, double* record,
                      cudaStream_t stream);
// [3] out = softmax(a * (y - shift) + c) and each row's log-normaliser (row_lse may be null).
// batch_counter (may be null): nn.BatchNorm1d's num_batches_tracked, incremented once by this step
// after it waits for [2] (which reads it): the forward's last kernel, so no kernel of its own.
// Its kernels read y before they wait for the kernel launched just before them, so y must be
// complete before that kernel lets them launch: true after finalize (it waits first) and after
// anything that is not a programmatic-launch kernel (a copy, a synchronisation).
Status row_softmax(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& affine, void* out,
                   int64_t ldo, ElementType dtype, float* row_lse, cudaStream_t stream,
                   int64_t* batch_counter = nullptr);
// Adds 1 to *counter in one thread, after the previous kernel (where no row_softmax kernel runs).
Status count_batch(int64_t* counter, cudaStream_t stream);
// How [3] lays a row over a CTA: `threads`, `vecs` float4 per thread (the row held in registers);
// `staged`: persistent CTAs, each next row brought into shared memory by a bulk copy (sm90, 16-byte
// aligned rows, N % 4 == 0); `clustered` (staged too): a row split over a thread-block cluster of
// ceil(N / (threads * 4 * vecs)) CTAs, at most kMaxSoftmaxClusterCtas; threads == 0: the streaming
// kernel for rows too wide for the others.
constexpr int kMaxSoftmaxClusterCtas = 16;
struct SoftmaxLayout {
  int threads = 0;
  int vecs = 0;
  bool staged = false;
  bool clustered = false;
  // The widest row the layout holds (0: any, the streaming kernel).
  int64_t max_columns() const {
    return int64_t{threads} * 4 * vecs * (clustered ? kMaxSoftmaxClusterCtas : 1);
  }
};
// The layout row_softmax uses for rows of N columns (it runs a staged one unstaged where staging
// cannot run, or where M does not fill the resident CTAs once).
SoftmaxLayout row_softmax_layout(int64_t N);
// Every layout built (row_softmax_with_layout runs these).
std::vector<SoftmaxLayout> row_softmax_built_layouts();
// row_softmax with a given layout (benchmarks, tests); kNotSupported for a layout that is not built
// or a staged one the rows do not allow.
Status row_softmax_with_layout(const SoftmaxLayout& layout, const float* y, int64_t ldy, int64_t M, int64_t N,
                               const ColumnAffine& affine, void* out, int64_t ldo, ElementType dtype, float* row_lse,
                               cudaStream_t stream);
}  // namespace cuda

}  // namespace fused
