// Per-thread column data of the backward kernels: for the 8 columns a thread owns, the saved
// statistics and the softmax logit's map (detail::backward_column), loaded once and kept in registers.
#pragma once

#include "fused/detail/bn_math.h"

namespace fused::cuda::backward_steps {

struct ColumnMaps {
  float shift[8], invstd[8], a[8], c[8];

  // Columns >= N get zeros (their g and y read as 0, so they add nothing).
  __device__ __forceinline__ void load(const BackwardProblem& p, const BackwardBuffers& b, int64_t col) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      detail::BackwardColumn k;
      if (col + j < p.N) k = detail::backward_column(col + j, p, b);
      shift[j] = static_cast<float>(k.shift);
      invstd[j] = static_cast<float>(k.invstd);
      a[j] = col + j < p.N ? static_cast<float>(k.a) : 0.f;
      c[j] = static_cast<float>(k.c);
    }
  }

  // out = exp(z - lse) of column j, from y.
  __device__ __forceinline__ float softmax(int j, float y, float row_lse) const {
    return detail::softmax_from_logit(detail::bn_logit(y, shift[j], a[j], c[j]), row_lse);
  }
  __device__ __forceinline__ float xhat(int j, float y) const { return detail::bn_xhat(y, shift[j], invstd[j]); }
};

}  // namespace fused::cuda::backward_steps
