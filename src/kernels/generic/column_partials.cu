// [1'] Generic column partials: per-row-tile (mean, M2) of y, in the same format the sm90
// epilogue writes (fused::ColumnStatsPartials). Used when y comes from cuBLASLt.
//
// Block (32 columns, 8 row lanes); grid (column tiles, row tiles). Each thread runs shifted
// sums over its rows (shift = its first value, so no cancellation when |mean| >> std), then the
// 8 row lanes are merged with Chan's formula in a fixed order: deterministic, no atomics.
#include "fused/detail/bn_math.h"
#include "api/forward_steps.h"
#include "util/cuda_check.h"

namespace fused::cuda {
namespace {

constexpr int kCols = 32;
constexpr int kRowLanes = 8;

__global__ void __launch_bounds__(kCols* kRowLanes)
    column_partials_kernel(const float* __restrict__ y, int64_t ldy, int64_t M, int64_t N, ColumnStatsPartials out) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kCols + threadIdx.x;
  const int64_t tile = blockIdx.y;
  const int64_t r0 = tile * out.row_tile;
  const int64_t r1 = r0 + detail::row_tile_count(M, out.row_tile, tile);

  float shift = 0.f, s1 = 0.f, s2 = 0.f;
  int count = 0;
  if (col < N) {
    int64_t r = r0 + threadIdx.y;
    if (r < r1) shift = y[r * ldy + col];
    for (; r < r1; r += kRowLanes) {
      const float d = y[r * ldy + col] - shift;
      s1 += d;
      s2 = fmaf(d, d, s2);
      ++count;
    }
  }
  // Lanes are merged in double from their shifted sums: the lane mean shift + s1/n is never
  // rounded to fp32 before the merge (that rounding costs ~|mean|/std * 2^-24 of the variance).
  __shared__ float sh_shift[kRowLanes][kCols], sh_s1[kRowLanes][kCols], sh_m2[kRowLanes][kCols];
  __shared__ int sh_n[kRowLanes][kCols];
  sh_n[threadIdx.y][threadIdx.x] = count;
  sh_shift[threadIdx.y][threadIdx.x] = shift;
  sh_s1[threadIdx.y][threadIdx.x] = s1;
  sh_m2[threadIdx.y][threadIdx.x] = count > 0 ? fmaxf(s2 - s1 * (s1 / count), 0.f) : 0.f;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    detail::MeanM2 acc;
    for (int l = 0; l < kRowLanes; ++l) {
      const int n = sh_n[l][threadIdx.x];
      if (n == 0) continue;
      const double lane_mean = static_cast<double>(sh_shift[l][threadIdx.x]) + static_cast<double>(sh_s1[l][threadIdx.x]) / n;
      detail::chan_merge(acc, n, lane_mean, sh_m2[l][threadIdx.x]);
    }
    out.mean[tile * out.ld + col] = static_cast<float>(acc.mean);
    out.m2[tile * out.ld + col] = static_cast<float>(acc.m2);
  }
}

}  // namespace

Status column_partials(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnStatsPartials& out,
                       cudaStream_t stream) {
  if (M == 0 || N == 0) return Status::Ok();
  if (out.num_row_tiles != util::ceil_div(M, out.row_tile) || out.ld < N)
    return {StatusCode::kInvalidArgument, "column_partials: partials geometry does not match M, N"};
  if (out.num_row_tiles > 65535) return {StatusCode::kNotSupported, "column_partials: too many row tiles"};
  const dim3 grid(static_cast<unsigned>(util::ceil_div(N, kCols)), static_cast<unsigned>(out.num_row_tiles));
  column_partials_kernel<<<grid, dim3(kCols, kRowLanes), 0, stream>>>(y, ldy, M, N, out);
  return util::launch_status("column_partials_kernel launch");
}

}  // namespace fused::cuda
