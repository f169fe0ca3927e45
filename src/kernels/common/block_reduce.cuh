// Block-wide reductions with a fixed order (warp shuffles, then one warp over the warp results):
// the same inputs give the same bits on every run.
#pragma once

#include <cuda_runtime.h>

#include <math_constants.h>

namespace fused::cuda::util {

// Max or sum of one float over the block; every thread gets the result. `smem` holds >= 32 floats.
// kGuarded: a leading barrier lets the next call reuse `smem` (threads may still be reading it from
// this one). Unguarded calls save that barrier; the caller must know nobody reads `smem` any more,
// e.g. by alternating two buffers between calls: every thread reads a buffer before it reaches the
// other call's barrier, which the next writer of that buffer has passed.
template <int kThreads, bool kMax, bool kGuarded = true>
__device__ __forceinline__ float block_reduce(float v, float* smem) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  constexpr int kWarps = kThreads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if constexpr (kGuarded) __syncthreads();  // smem may still be read by a previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  v = lane < kWarps ? smem[lane] : (kMax ? -CUDART_INF_F : 0.f);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  return v;
}

template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* smem) {
  return block_reduce<kThreads, false>(v, smem);
}

// Sum of one double over the block in a fixed tree order; every thread gets it. smem: kThreads doubles.
template <int kThreads>
__device__ __forceinline__ double block_sum_double(double v, double* smem) {
  smem[threadIdx.x] = v;
  __syncthreads();
#pragma unroll
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) smem[threadIdx.x] += smem[threadIdx.x + stride];
    __syncthreads();
  }
  return smem[0];
}

}  // namespace fused::cuda::util
