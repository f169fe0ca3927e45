// [B4] dy pass: dy = a * dz + b * xhat + c (a from the logit map, b and c from [B3], r_i and the row's
// normaliser from [B2]'s row sums),
// written in the backward GEMMs' input dtype; and/or dy^T, which TF32 GEMMs need for dW = dy^T x
// (TF32 tensor cores take K-major operands only, and dW reduces over M). Block (32 column threads x
// 8 row lanes) covers 256 columns x 32 rows; the transposed tile goes through shared memory so that
// dy^T's rows are written in 32-element runs.
#include "kernels/backward/backward_kernels.h"
#include "kernels/backward/column_map.cuh"
#include "kernels/backward/launch_step.cuh"
#include "util/cuda_check.h"
#include "kernels/common/vec8.cuh"

namespace fused::cuda::backward_steps {
namespace {

constexpr int kColThreads = 32;
constexpr int kRowLanes = 8;
constexpr int kStrip = kColThreads * 8;  // columns per block
// A warp is one row lane (threadIdx.y): its rows are warp-uniform, which the row constants' shuffles rely on.
static_assert(kColThreads == 32, "one warp per row lane");
static_assert(kStrip == kBlockColumns, "one shared column map per block");
constexpr int kTileRows = 32;            // rows per block tile
constexpr int kPitch = kStrip + 4;       // shared tile row pitch: 16-byte rows, 4-way conflicts at most
constexpr size_t kTransposeSmem = sizeof(float) * kTileRows * kPitch;
#ifndef FUSED_BWD_DY_ROW_SHUFFLE
#define FUSED_BWD_DY_ROW_SHUFFLE 1  // 0: every thread computes its rows' constants (before), for A/B runs
#endif
#ifndef FUSED_BWD_DY_WAVE
#define FUSED_BWD_DY_WAVE 1  // 0: one block per row tile (the grid before the wave), for A/B runs
#endif

// What dy needs of row i: the softmax's normaliser and r from the row's sums (in double), and the row's
// log-normaliser in base 2.
template <class Acc>
__device__ __forceinline__ void row_constants(const double* row_sums, const float* lse, int64_t M, int64_t i,
                                              float& normaliser, float& r, Acc& lse2) {
  const detail::RowNorm<double> row = detail::row_norm(row_sums[i], row_sums[M + i]);
  normaliser = static_cast<float>(row.normaliser);
  r = static_cast<float>(row.r);
  lse2 = lse2_of<Acc>(lse[i]);
}

template <bool kVec, class T, class TDy>
__global__ void __launch_bounds__(kColThreads* kRowLanes, kBlocksPerSm)
    dy_kernel(BackwardProblem p, BackwardBuffers bufs, const double* __restrict__ row_sums, DyCoefficients coef) {
  using Acc = BackwardAcc<T>;  // the map's precision, as [B1] and [B2] recompute out
  extern __shared__ float tile[];  // kTileRows x kPitch, only when dy_t is written
  __shared__ SharedColumnMaps shared_maps;
  begin_step();
  const auto* g = static_cast<const T*>(bufs.grad_out);
  const auto* y = static_cast<const float*>(bufs.y);
  const auto* lse = static_cast<const float*>(bufs.row_lse);
  auto* dy = static_cast<TDy*>(bufs.dy);
  auto* dy_t = static_cast<TDy*>(bufs.dy_t);
  const int64_t M = p.M, N = p.N, ldg = bufs.ldg, ldy = bufs.ldy, lddy = bufs.lddy, lddy_t = bufs.lddy_t;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kStrip;
  const int64_t col = c0 + threadIdx.x * 8;
  shared_maps.fill(p, bufs, c0, threadIdx.y * kColThreads + threadIdx.x);
  __syncthreads();
  ColumnMaps<Acc> maps;
  maps.load(shared_maps, threadIdx.x * 8);
  float b[8] = {}, c[8] = {}, slope[8];
  if (col < N) {
    util::load8<kVec>(coef.b, col, N, b);
    util::load8<kVec>(coef.c, col, N, c);
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) slope[j] = maps.slope(j);
  const int64_t row_tiles = (M + kTileRows - 1) / kTileRows;
  for (int64_t rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
    const int64_t r0 = rt * kTileRows;
    constexpr int kRows = kTileRows / kRowLanes;  // rows per thread
    constexpr int kBatch = kRowsInFlight<kVec, Acc>;
#pragma unroll
    for (int k0 = 0; k0 < kRows; k0 += kBatch) {
      float gv[kBatch][8] = {}, yv[kBatch][8] = {};
      if (col < N) {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          // rows past M read the last row (no branch between the loads); nothing is stored for them
          const int64_t i = r0 + threadIdx.y + (k0 + u) * kRowLanes;
          const int64_t iv = i < M ? i : M - 1;
          util::load8<kVec>(g + iv * ldg, col, N, gv[u]);
          util::load8<kVec>(y + iv * ldy, col, N, yv[u]);
        }
      }
      // The batch's rows' constants, behind its loads, for its kBatch rows at once: lane l computes those of
      // the batch's row l % kBatch and the lanes share them by shuffles. A warp's rows are warp-uniform, so
      // computing them row by row ran row_norm's double division kBatch times per batch; now once.
      // Rows past M keep the defaults (nothing is stored for them).
      constexpr bool kShareRowConstants = kBatch > 1 && FUSED_BWD_DY_ROW_SHUFFLE;  // one row: nothing to share
      float row_normaliser = 1.f, row_r = 0.f;
      Acc row_lse2 = 0;
      if constexpr (kShareRowConstants) {
        const int64_t i = r0 + threadIdx.y + (k0 + threadIdx.x % kBatch) * kRowLanes;
        if (i < M) row_constants(row_sums, lse, M, i, row_normaliser, row_r, row_lse2);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int local = threadIdx.y + (k0 + u) * kRowLanes;
        const int64_t i = r0 + local;
        // every lane shuffles, before the lanes past N or rows past M leave
        float norm = 1.f, ri = 0.f;
        Acc li = 0;
        if constexpr (kShareRowConstants) {
          norm = __shfl_sync(0xffffffffu, row_normaliser, u);
          ri = __shfl_sync(0xffffffffu, row_r, u);
          li = __shfl_sync(0xffffffffu, row_lse2, u);
        }
        if (i >= M || col >= N) continue;
        if constexpr (!kShareRowConstants) row_constants(row_sums, lse, M, i, norm, ri, li);
        float d[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float dz = detail::softmax_grad(maps.softmax(j, yv[u][j], li) * norm, gv[u][j], ri);
          d[j] = fmaf(slope[j], dz, fmaf(b[j], maps.xhat(j, yv[u][j]), c[j]));
        }
        if (dy != nullptr) util::store8<kVec>(dy + i * lddy, col, N, d);
        if (dy_t != nullptr) {
          float4* dst = reinterpret_cast<float4*>(tile + local * kPitch + threadIdx.x * 8);
          dst[0] = make_float4(d[0], d[1], d[2], d[3]);
          dst[1] = make_float4(d[4], d[5], d[6], d[7]);
        }
      }
    }
    if (dy_t == nullptr) continue;
    __syncthreads();
    // Warp w writes dy^T rows c0 + w, c0 + w + 8, ...: lane = row within the tile.
    const int lane = threadIdx.x;
    const int64_t i = r0 + lane;
    for (int cc = threadIdx.y; cc < kStrip; cc += kRowLanes) {
      if (i < M && c0 + cc < N) dy_t[(c0 + cc) * lddy_t + i] = util::from_float<TDy>(tile[lane * kPitch + cc]);
    }
    __syncthreads();  // the tile is rewritten by the next row tile
  }
}

// The inputs' rule, and 16-byte aligned rows of dy for its 16-byte stores.
bool vectorizable(const BackwardProblem& p, const BackwardBuffers& b) {
  const int64_t dy_per16 = 16 / static_cast<int64_t>(element_size(b.dy_dtype));
  return inputs_vectorizable(p, b) && (b.dy == nullptr || (b.lddy % dy_per16 == 0 && util::aligned16(b.dy)));
}

}  // namespace

Status dy_pass(const BackwardProblem& p, const BackwardBuffers& b, const double* row_sums, const DyCoefficients& coef,
               cudaStream_t stream) {
  if (p.M == 0 || p.N == 0 || (b.dy == nullptr && b.dy_t == nullptr)) return Status::Ok();
  const int64_t row_tiles = util::ceil_div(p.M, kTileRows);
  const int64_t strips = util::ceil_div(p.N, kStrip);
  if (strips > 0x7fffffff) return {StatusCode::kNotSupported, "backward dy: N too large"};
  // One wave of blocks (kBlocksPerSm per SM, as the registers allow), each looping over row tiles,
  // where more would queue: the per-block column maps are then computed once per wave rather than
  // once per 32 rows, and no partial last wave idles SMs. Each element of dy is computed alone, so the grid
  // does not change its bits. H200, N = 8192, bf16: 19.6 us against 23.4 with the unbounded grid
  // (FUSED_BWD_DY_WAVE=0) at M = 1024, 80.1 against 102.2 at M = 4096, level at M = 256.
  int64_t row_blocks = 0;
  FUSED_RETURN_IF_ERROR(grid_row_blocks(FUSED_BWD_DY_WAVE, row_tiles < 65535 ? row_tiles : 65535, strips, row_blocks));
  const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(row_blocks));
  const dim3 block(kColThreads, kRowLanes);
  const size_t smem = b.dy_t != nullptr ? kTransposeSmem : 0;
  const bool vec = vectorizable(p, b);
  return util::with_cuda_type(p.grad_dtype, [&](auto grad_tag) {
    using T = decltype(grad_tag);
    return util::with_cuda_type(b.dy_dtype, [&](auto dy_tag) {
      using TDy = decltype(dy_tag);
      return launch_step(vec ? dy_kernel<true, T, TDy> : dy_kernel<false, T, TDy>, grid, block, smem, stream,
                         "backward dy_kernel launch", p, b, row_sums, coef);
    });
  });
}

}  // namespace fused::cuda::backward_steps
