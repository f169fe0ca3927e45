// Per-column data of the backward kernels: the saved statistics and the softmax logit's map
// (detail::backward_column), computed once per block for its 256 columns (one column per thread,
// into shared memory), then read by each thread for the 8 columns it owns and kept in registers.
// The map is pre-multiplied by log2(e): out = exp2(a2 (y - shift) + c2 - lse2), one MUFU.EX2.
//
// fp32 gradients (kWide) take the exponent's offset c2 - lse2 and its fma in double: at logits of
// about 100 (a scale of 10, BatchNorm shifts of 10 sigma) fp32's rounding of c2 and of the fma is
// 4e-6 of out, per element, more than eager's own softmax makes, and the gradients carried it (x and
// W at 1-4x eager's error; in double 0.35x). bf16 and fp16 gradients keep the fp32 map.
#pragma once

#include <type_traits>

#include "fused/detail/bn_math.h"
#include "kernels/common/vec8.cuh"

namespace fused::cuda::backward_steps {

constexpr int kBlockColumns = 256;  // columns per block of the backward kernels (32 threads x 8)
constexpr double kLog2e = 1.4426950408889634;

// The backward's arithmetic for gradients of type T: double for fp32 gradients (see above).
template <class T>
using BackwardAcc = std::conditional_t<std::is_same_v<T, float>, double, float>;

struct SharedColumnMaps {
  float shift[kBlockColumns], invstd[kBlockColumns], a2[kBlockColumns];
  double c2[kBlockColumns];  // kept in double for the wide map; the fp32 map rounds it when loading

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
    c2[t] = col < p.N ? k.c * kLog2e : -INFINITY;
  }
};

// The row's log-normaliser in log2 units, in the map's precision (Acc). Its rounding scales the whole
// recomputed row alike, which the row's normaliser (detail::row_norm) takes out; every pass must
// compute it the same way, so that they recompute the same out.
template <class Acc>
__device__ __forceinline__ Acc lse2_of(float row_lse) {
  return static_cast<Acc>(row_lse) * static_cast<Acc>(kLog2e);
}

// The 8 columns of one thread, in registers; Acc = BackwardAcc of the gradient type.
template <class Acc>
struct ColumnMaps {
  static constexpr bool kWide = std::is_same_v<Acc, double>;
  float shift[8], invstd[8], a2[8];
  Acc c2[8];

  // local: the thread's first column within the block's 256 (a multiple of 8).
  __device__ __forceinline__ void load(const SharedColumnMaps& s, int local) {
    util::load8<true>(s.shift, local, kBlockColumns, shift);
    util::load8<true>(s.invstd, local, kBlockColumns, invstd);
    util::load8<true>(s.a2, local, kBlockColumns, a2);
#pragma unroll
    for (int j = 0; j < 8; ++j) c2[j] = static_cast<Acc>(s.c2[local + j]);
  }

  // The forward's softmax output of column j, recomputed from y; lse2 = lse2_of<Acc>(row_lse).
  __device__ __forceinline__ float softmax(int j, float y, Acc lse2) const {
    if constexpr (kWide) {
      return exp2f(static_cast<float>(fma(static_cast<double>(a2[j]), static_cast<double>(y - shift[j]), c2[j] - lse2)));
    } else {
      return exp2f(fmaf(a2[j], y - shift[j], c2[j]) - lse2);
    }
  }
  __device__ __forceinline__ float xhat(int j, float y) const { return detail::bn_xhat(y, shift[j], invstd[j]); }
  // y - shift in Acc: xhat before its factor invstd. A column sum of dz * xhat is taken as invstd times
  // the sum of dz * (y - shift): the wide map has already converted y - shift, and xhat's own rounding
  // goes.
  __device__ __forceinline__ Acc centered(int j, float y) const { return static_cast<Acc>(y - shift[j]); }
  // dy's `a` (the logit map's slope), undoing the log2(e) factor.
  __device__ __forceinline__ float slope(int j) const { return a2[j] * static_cast<float>(1.0 / kLog2e); }
};

// Rows whose loads are in flight together, per thread, in [B2] and [B4]: 2, but 1 where the wide map
// meets the element-wise loads (kVec false: N % 8 != 0 or unaligned rows), where 2 would spill.
template <bool kVec, class Acc>
constexpr int kRowsInFlight = kVec || !ColumnMaps<Acc>::kWide ? 2 : 1;

}  // namespace fused::cuda::backward_steps
