// [B3] column finalize: one thread per column merges the per-row-tile sums S1, S2 in tile order
// (double), then detail::finalize_column_grad writes d_gamma, d_beta, d_bias, a per-column scale's
// gradient, and the dy coefficients. A scalar scale's gradient is a sum over all columns: each block
// sums its columns in a fixed tree, and the last block to finish (a counter, as CUTLASS's
// FinalReduction) adds the block sums in block order: deterministic whatever the finishing order.
#include "fused/detail/bn_math.h"
#include "kernels/backward/backward_kernels.h"
#include "kernels/common/block_reduce.cuh"
#include "util/cuda_check.h"

namespace fused::cuda::backward_steps {
namespace {

constexpr int kThreads = kFinalizeThreads;

__global__ void __launch_bounds__(kThreads)
    column_finalize_kernel(BackwardProblem p, BackwardBuffers b, GradPartials partials, DyCoefficients coef,
                           double* block_sums, unsigned* counter) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  double scale_term = 0.0;
  if (col < p.N) {
    double s1 = 0.0, s2 = 0.0;
    for (int64_t t = 0; t < partials.num_row_tiles; ++t) {
      s1 += partials.s1[t * partials.ld + col];
      s2 += partials.s2[t * partials.ld + col];
    }
    const detail::ColumnGrad g = detail::finalize_column_grad(col, s1, s2, p, b);
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
  column_finalize_kernel<<<blocks, kThreads, 0, stream>>>(p, b, partials, coef, block_sums, counter);
  return util::launch_status("backward column_finalize_kernel launch");
}

}  // namespace fused::cuda::backward_steps
