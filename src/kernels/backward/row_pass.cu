// [B1] row pass: r_i = sum_n g_in * out_in (the softmax backward's row dot), one CTA per row.
// [B2] column partials: per row tile, S1 = sum dz and S2 = sum dz * xhat of every column, with
//      dz = out * (g - r_i) and xhat = (y - mean) * invstd. Block (32 column threads x 8 row lanes)
//      covers 256 columns of one row tile; the 8 lanes are merged in a fixed order: deterministic,
//      no atomics.
#include "fused/detail/bn_math.h"
#include "kernels/backward/backward_kernels.h"
#include "kernels/common/block_reduce.cuh"
#include "kernels/common/cuda_check.h"
#include "kernels/common/vec8.cuh"

namespace fused::cuda::backward_steps {
namespace {

constexpr int kRowThreads = 256;
constexpr int kColThreads = 32;  // x: 8 columns each
constexpr int kRowLanes = 8;     // y: rows strided by 8
constexpr int kStrip = kColThreads * 8;

template <bool kVec, class T>
__global__ void __launch_bounds__(kRowThreads)
    row_dot_kernel(const T* __restrict__ g, int64_t ldg, const T* __restrict__ out, int64_t ldo, int64_t N,
                   float* __restrict__ r, unsigned* counter) {
  __shared__ float smem[32];
  if (blockIdx.x == 0 && threadIdx.x == 0) *counter = 0u;
  const int64_t row = blockIdx.x;
  const T* grow = g + row * ldg;
  const T* orow = out + row * ldo;
  float acc = 0.f;
#pragma unroll 2
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * 8; col < N; col += kRowThreads * 8) {
    float gv[8], ov[8];
    util::load8<kVec>(grow, col, N, gv);
    util::load8<kVec>(orow, col, N, ov);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc = fmaf(gv[j], ov[j], acc);
  }
  acc = util::block_sum<kRowThreads>(acc, smem);
  if (threadIdx.x == 0) r[row] = acc;
}

template <bool kVec, class T>
__global__ void __launch_bounds__(kColThreads* kRowLanes)
    grad_partials_kernel(const T* __restrict__ g, int64_t ldg, const T* __restrict__ out, int64_t ldo,
                         const float* __restrict__ y, int64_t ldy, const float* __restrict__ mean,
                         const float* __restrict__ invstd, const float* __restrict__ r, int64_t M, int64_t N,
                         GradPartials partials) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kStrip + threadIdx.x * 8;
  const int64_t tile = blockIdx.y;
  const int64_t r0 = tile * partials.row_tile;
  const int64_t r1 = r0 + detail::row_tile_count(M, partials.row_tile, tile);
  float s1[8] = {}, s2[8] = {};
  if (col < N) {
    float mu[8], is[8];
    util::load8<kVec>(mean, col, N, mu);
    util::load8<kVec>(invstd, col, N, is);
#pragma unroll 2
    for (int64_t i = r0 + threadIdx.y; i < r1; i += kRowLanes) {
      float gv[8], ov[8], yv[8];
      util::load8<kVec>(g + i * ldg, col, N, gv);
      util::load8<kVec>(out + i * ldo, col, N, ov);
      util::load8<kVec>(y + i * ldy, col, N, yv);
      const float ri = r[i];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float dz = detail::softmax_grad(ov[j], gv[j], ri);
        s1[j] += dz;
        s2[j] = fmaf(dz, detail::bn_xhat(yv[j], mu[j], is[j]), s2[j]);
      }
    }
  }
  __shared__ float sh1[kRowLanes][kStrip], sh2[kRowLanes][kStrip];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    sh1[threadIdx.y][threadIdx.x * 8 + j] = s1[j];
    sh2[threadIdx.y][threadIdx.x * 8 + j] = s2[j];
  }
  __syncthreads();
  const int t = threadIdx.y * kColThreads + threadIdx.x;  // one column of the strip per thread
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kStrip + t;
  if (c < N) {
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int l = 0; l < kRowLanes; ++l) {
      a += sh1[l][t];
      b += sh2[l][t];
    }
    partials.s1[tile * partials.ld + c] = a;
    partials.s2[tile * partials.ld + c] = b;
  }
}

// The 16-byte paths need every row and vector 16-byte aligned and whole groups of 8 columns.
bool vectorizable(const BackwardProblem& p, const BackwardBuffers& b) {
  const int64_t g_per16 = 16 / static_cast<int64_t>(element_size(p.grad_dtype));
  return p.N % 8 == 0 && b.ldg % g_per16 == 0 && b.ldo % g_per16 == 0 && b.ldy % 4 == 0 &&
         util::aligned16(b.grad_out) && util::aligned16(b.out) && util::aligned16(b.y) &&
         util::aligned16(b.save_mean) && util::aligned16(b.save_invstd);
}

}  // namespace

int64_t grad_partials_row_tile(int64_t M) {
  // 16 tiles per column strip up to M = 16384 (row tiles of 64..1024 rows), then 1024-row tiles.
  int64_t tile = 64;
  while (tile < 1024 && tile * 16 < M) tile *= 2;
  return tile;
}

Status row_dot(const BackwardProblem& p, const BackwardBuffers& b, float* r, unsigned* counter, cudaStream_t stream) {
  if (p.M > 0x7fffffff) return {StatusCode::kNotSupported, "backward row pass: more than 2^31-1 rows"};
  const bool vec = vectorizable(p, b);
  return util::with_cuda_type(p.grad_dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* g = static_cast<const T*>(b.grad_out);
    const auto* o = static_cast<const T*>(b.out);
    if (vec) {
      row_dot_kernel<true><<<static_cast<unsigned>(p.M), kRowThreads, 0, stream>>>(g, b.ldg, o, b.ldo, p.N, r, counter);
    } else {
      row_dot_kernel<false><<<static_cast<unsigned>(p.M), kRowThreads, 0, stream>>>(g, b.ldg, o, b.ldo, p.N, r, counter);
    }
    return util::launch_status("backward row_dot_kernel launch");
  });
}

Status grad_partials(const BackwardProblem& p, const BackwardBuffers& b, const float* r, const GradPartials& partials,
                     cudaStream_t stream) {
  if (partials.num_row_tiles != util::ceil_div(p.M, partials.row_tile) || partials.ld < p.N)
    return {StatusCode::kInvalidArgument, "backward partials: geometry does not match M, N"};
  if (partials.num_row_tiles > 65535) return {StatusCode::kNotSupported, "backward partials: too many row tiles"};
  const bool vec = vectorizable(p, b);
  const dim3 grid(static_cast<unsigned>(util::ceil_div(p.N, kStrip)), static_cast<unsigned>(partials.num_row_tiles));
  const dim3 block(kColThreads, kRowLanes);
  const auto* y = static_cast<const float*>(b.y);
  const auto* mean = static_cast<const float*>(b.save_mean);
  const auto* invstd = static_cast<const float*>(b.save_invstd);
  return util::with_cuda_type(p.grad_dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* g = static_cast<const T*>(b.grad_out);
    const auto* o = static_cast<const T*>(b.out);
    if (vec) {
      grad_partials_kernel<true><<<grid, block, 0, stream>>>(g, b.ldg, o, b.ldo, y, b.ldy, mean, invstd, r, p.M, p.N,
                                                             partials);
    } else {
      grad_partials_kernel<false><<<grid, block, 0, stream>>>(g, b.ldg, o, b.ldo, y, b.ldy, mean, invstd, r, p.M, p.N,
                                                              partials);
    }
    return util::launch_status("backward grad_partials_kernel launch");
  });
}

}  // namespace fused::cuda::backward_steps
