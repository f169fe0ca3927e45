// [B3] column finalize: one thread per column merges the per-row-tile sums S1, S2 in tile order
// (double) (data parallel: reads this rank's and every rank's sums instead), then
// detail::finalize_column_grad writes d_gamma, d_beta, d_bias, a per-column scale's
// gradient, and the dy coefficients. A scalar scale's gradient is a sum over all columns: each block
// sums its columns in a fixed tree, and the last block to finish (a counter, as CUTLASS's
// FinalReduction) adds the block sums in block order: deterministic whatever the finishing order.
#include "fused/detail/bn_math.h"
#include "kernels/backward/backward_kernels.h"
#include "kernels/backward/launch_step.cuh"
#include "kernels/common/block_reduce.cuh"
#include "util/cuda_check.h"

namespace fused::cuda::backward_steps {
namespace {

constexpr int kThreads = kFinalizeThreads;

// S1 and S2 of column `col`: its row tiles' sums added in tile order.
__device__ detail::ColumnSums merge_tiles(const GradPartials& partials, int64_t M, int64_t col) {
  detail::ColumnSums sums{static_cast<double>(M), 0.0, 0.0};
  for (int64_t t = 0; t < partials.num_row_tiles; ++t) {
    sums.s1 += partials.s1[t * partials.ld + col];
    sums.s2 += partials.s2[t * partials.ld + col];
  }
  return sums;
}

// The data-parallel step 1's end: this rank's column-sums record [M, S1[N], S2[N]].
__global__ void __launch_bounds__(kThreads) column_sums_kernel(int64_t M, int64_t N, GradPartials partials, double* sums) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (col == 0) sums[0] = static_cast<double>(M);
  if (col >= N) return;
  const detail::ColumnSums s = merge_tiles(partials, M, col);
  sums[1 + col] = s.s1;
  sums[1 + N + col] = s.s2;
}

__global__ void __launch_bounds__(kThreads)
    column_finalize_kernel(BackwardProblem p, BackwardBuffers b, GradPartials partials, DyCoefficients coef,
                           double* block_sums, unsigned* counter) {
  begin_step();
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  double scale_term = 0.0;
  if (col < p.N) {
    detail::ColumnGrad g;
    if (b.rank_sums != nullptr) {  // data parallel: this rank's sums and every rank's, given
      const detail::ColumnSums local{b.local_sums[0], b.local_sums[1 + col], b.local_sums[1 + p.N + col]};
      g = detail::finalize_column_grad(col, local, detail::sum_rank_records(b.rank_sums, b.num_ranks, p.N, col), p, b);
    } else {
      const detail::ColumnSums sums = merge_tiles(partials, p.M, col);
      g = detail::finalize_column_grad(col, sums, sums, p, b);
    }
    coef.b[col] = static_cast<float>(g.b);
    coef.c[col] = static_cast<float>(g.c);
    scale_term = g.d_scale_term;
  }
  if (b.grad_scale == nullptr || b.scale_numel != 1) return;  // uniform over the grid

  __shared__ double smem[kThreads];
  __shared__ bool last;
  const double block_total = util::block_sum_double<kThreads>(scale_term, smem);
  if (threadIdx.x == 0) {
    block_sums[blockIdx.x] = block_total;
    __threadfence();  // the sum is visible before the counter says so
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    __threadfence();
    const volatile double* sums = block_sums;  // written by other blocks: not from L1
    double total = 0.0;
    for (unsigned i = 0; i < gridDim.x; ++i) total += sums[i];
    half_bits::store_double(b.grad_scale, b.scale_dtype, 0, total);
    *counter = 0u;  // ready for the next launch
  }
}

}  // namespace

Status column_finalize(const BackwardProblem& p, const BackwardBuffers& b, const GradPartials& partials,
                       const DyCoefficients& coef, double* block_sums, unsigned* counter, cudaStream_t stream) {
  if (p.N == 0) return Status::Ok();
  const unsigned blocks = static_cast<unsigned>(util::ceil_div(p.N, kThreads));
  return launch_step(column_finalize_kernel, dim3(blocks), dim3(kThreads), 0, stream,
                     "backward column_finalize_kernel launch", p, b, partials, coef, block_sums, counter);
}

Status column_sums(int64_t M, int64_t N, const GradPartials& partials, double* sums, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(util::ceil_div(N > 0 ? N : 1, kThreads));  // the count even when N = 0
  column_sums_kernel<<<blocks, kThreads, 0, stream>>>(M, N, partials, sums);
  return util::launch_status("backward column_sums_kernel launch");
}

}  // namespace fused::cuda::backward_steps
