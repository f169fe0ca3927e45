// Per-column data of the backward kernels: the saved statistics and the softmax logit's map
// (detail::backward_column), computed once per block for its 256 columns (one column per thread,
// into shared memory), then read by each thread for the 8 columns it owns and kept in registers.
// The map is pre-multiplied by log2(e): out = exp2(a2 (y - shift) + c2 - lse2), one MUFU.EX2.
#pragma once

#include "fused/detail/bn_math.h"
#include "kernels/common/vec8.cuh"

namespace fused::cuda::backward_steps {

constexpr int kBlockColumns = 256;  // columns per block of the backward kernels (32 threads x 8)
constexpr double kLog2e = 1.4426950408889634;

struct SharedColumnMaps {
  float shift[kBlockColumns], invstd[kBlockColumns], a2[kBlockColumns], c2[kBlockColumns];

  // Columns [c0, c0 + 256); the block's 256 threads each fill one (columns >= N: zeros, and a logit of
  // -inf). The element-wise paths compute a thread's 8 columns past N too, with g = 0: their softmax
  // must be 0, not exp2(-lse2), which overflows to inf for a row whose log-normaliser is below about
  // -88.7 (every logit that low), and 0 * inf would make the row's dot NaN.
  __device__ __forceinline__ void fill(const BackwardProblem& p, const BackwardBuffers& b, int64_t c0, int t) {
    const int64_t col = c0 + t;
    detail::BackwardColumn k;
    if (col < p.N) k = detail::backward_column(col, p, b);
    shift[t] = static_cast<float>(k.shift);
    invstd[t] = static_cast<float>(k.invstd);
    a2[t] = col < p.N ? static_cast<float>(k.a * kLog2e) : 0.f;
    c2[t] = col < p.N ? static_cast<float>(k.c * kLog2e) : -INFINITY;
  }
};

// The 8 columns of one thread, in registers.
struct ColumnMaps {
  float shift[8], invstd[8], a2[8], c2[8];

  // local: the thread's first column within the block's 256 (a multiple of 8).
  __device__ __forceinline__ void load(const SharedColumnMaps& s, int local) {
    util::load8<true>(s.shift, local, kBlockColumns, shift);
    util::load8<true>(s.invstd, local, kBlockColumns, invstd);
    util::load8<true>(s.a2, local, kBlockColumns, a2);
    util::load8<true>(s.c2, local, kBlockColumns, c2);
  }

  // The forward's softmax output of column j, recomputed from y; lse2 = row_lse * log2(e).
  __device__ __forceinline__ float softmax(int j, float y, float lse2) const {
    return exp2f(fmaf(a2[j], y - shift[j], c2[j]) - lse2);
  }
  __device__ __forceinline__ float xhat(int j, float y) const { return detail::bn_xhat(y, shift[j], invstd[j]); }
  // dy's `a` (the logit map's slope), undoing the log2(e) factor.
  __device__ __forceinline__ float slope(int j) const { return a2[j] * static_cast<float>(1.0 / kLog2e); }
};

__device__ __forceinline__ float lse2_of(float row_lse) { return row_lse * static_cast<float>(kLog2e); }

}  // namespace fused::cuda::backward_steps
