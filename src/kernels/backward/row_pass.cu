// [B1] row pass: the row sums sum_n g_in * out_in and sum_n out_in (fused/backward.h, kRowSumsRows),
//      as partial sums over at most 32 column strips; out = exp(z - lse_i) is recomputed from y.
//      Block (32 column threads x 8 row lanes) covers one strip for blocks of 64 rows; each warp sums
//      its row over the strip with shuffles.
// [B2] column partials: the row sums (the strip sums added in strip order), the row's normaliser
//      1 / sum out and r_i = sum g * out / sum out; then per row tile S1 = sum dz and S2 = sum dz * xhat
//      of every column (as invstd * sum dz * (y - shift)), dz = out * (g - r_i) with out divided by its
//      row's sum. Block (32 x 8) covers 256 columns for row tiles; the 8 row lanes are merged in a fixed
//      order. Deterministic, no atomics.
// For fp32 gradients both passes sum in double (BackwardAcc), and [B2] computes dz in double: a scalar
// scale's gradient, sum_n (gamma S2 + beta S1), is a small remainder of terms about |z| times larger,
// and it needs sum_n dz = 0 per row to better than fp32's rounding. That holds only where [B1]'s sums
// and [B2]'s dz are computed alike: the products g * out in double in both.
// Both launch one wave of blocks (kBlocksPerSm per SM), each walking row blocks (tiles) of its strip,
// where one block per row block would queue: a block fills its column maps once, not once per row
// block, and no partial last wave idles SMs. A row's sums and a tile's partials do not depend on which
// block computes them, so the grid does not change any bits.
#include "kernels/backward/backward_kernels.h"
#include "kernels/backward/column_map.cuh"
#include "kernels/backward/launch_step.cuh"
#include "util/cuda_check.h"
#include "kernels/common/vec8.cuh"

namespace fused::cuda::backward_steps {
namespace {

constexpr int kColThreads = 32;  // x: 8 columns each
constexpr int kRowLanes = 8;     // y: rows strided by 8
constexpr int kStrip = kColThreads * 8;
static_assert(kStrip == kBlockColumns, "one shared column map per block");
constexpr int kRowDotRows = 64;  // rows per [B1] block
constexpr int kRowsPerLane = kRowDotRows / kRowLanes;
constexpr int64_t kMaxRowTile = 1024;  // grad_partials_row_tile()'s largest
// Rows whose loads are in flight together, per thread. The kernels are bound by load latency (two
// blocks of 256 threads per SM, held there by their registers: a third spills). [B1] with 16-byte
// loads takes 4 (its 128 registers still suffice): 3-6 % faster on the H200 at M = 256..4096; [B2]
// stays at 2 (kRowsInFlight), where 4 was 6 % slower at M = 256.
#ifndef FUSED_BWD_ROW_DOT_BATCH
#define FUSED_BWD_ROW_DOT_BATCH 4
#endif
constexpr int kRowDotBatch = FUSED_BWD_ROW_DOT_BATCH;
constexpr int kRowBatch = 2;
// fp32 gradients' [B1] holds its sums in double: 2 rows in flight, as 4 would spill; [B2]'s element-wise
// loads take 1 there (kRowsInFlight) and spill 32-40 bytes all the same (ptxas, sm_75..sm_90).
constexpr int kRowDotBatchWide = 2;

// Bit 0: [B1] launches one wave of blocks, bit 1: [B2] does; a clear bit gives that kernel one block
// per row block (tile) again, the grid before the wave, for A/B runs.
#ifndef FUSED_BWD_ROW_WAVE
#define FUSED_BWD_ROW_WAVE 3
#endif

// A row index that is always valid to read: rows past the end read the last row (masked later).
__device__ __forceinline__ int64_t clamp_row(int64_t i, int64_t rows) { return i < rows ? i : rows - 1; }

// row_parts: (2, strips, M): strip s's sum of g * out at [s * M + i], of out at [(strips + s) * M + i].
template <bool kVec, class T>
__global__ void __launch_bounds__(kColThreads* kRowLanes, kBlocksPerSm)
    row_sums_kernel(BackwardProblem p, BackwardBuffers b, int64_t strip_width, double* __restrict__ row_parts,
                    unsigned* counter) {
  using Acc = BackwardAcc<T>;
  __shared__ SharedColumnMaps shared_maps;
  begin_step();
  const int t = threadIdx.y * kColThreads + threadIdx.x;
  if (blockIdx.x == 0 && blockIdx.y == 0 && t == 0) *counter = 0u;
  const auto* g = static_cast<const T*>(b.grad_out);
  const auto* y = static_cast<const float*>(b.y);
  const auto* lse = static_cast<const float*>(b.row_lse);
  const int64_t c_begin = static_cast<int64_t>(blockIdx.x) * strip_width;
  const int64_t c_end = c_begin + strip_width < p.N ? c_begin + strip_width : p.N;
  // A strip of one chunk (N <= 8192) fills its column maps once for all its row blocks.
  const bool one_chunk = c_end - c_begin <= kStrip;
  if (one_chunk) {
    shared_maps.fill(p, b, c_begin, t);
    __syncthreads();
  }
  const int64_t row_blocks = (p.M + kRowDotRows - 1) / kRowDotRows;
  // the element-wise loads' 4 would spill
  constexpr int kBatch = !kVec ? kRowBatch : (std::is_same_v<Acc, double> ? kRowDotBatchWide : kRowDotBatch);
  for (int64_t rb = blockIdx.y; rb < row_blocks; rb += gridDim.y) {
    const int64_t r0 = rb * kRowDotRows + threadIdx.y;
    // Each row's log-normaliser is loaded with its row's values, not held for the whole strip: the
    // registers hold both sums per row instead.
    Acc acc[kRowsPerLane] = {}, out_sum[kRowsPerLane] = {};
    for (int64_t c0 = c_begin; c0 < c_end; c0 += kStrip) {
      if (!one_chunk) {
        __syncthreads();  // the previous chunk's maps are no longer read
        shared_maps.fill(p, b, c0, t);
        __syncthreads();
      }
      const int64_t col = c0 + threadIdx.x * 8;
      if (col >= c_end) continue;
      ColumnMaps<Acc> maps;
      maps.load(shared_maps, threadIdx.x * 8);
#pragma unroll
      for (int k0 = 0; k0 < kRowsPerLane; k0 += kBatch) {
        // Loads of a batch of rows first (rows past M read the last row: no branch between the loads),
        // then the math, masked.
        float gv[kBatch][8], yv[kBatch][8];
        Acc lse2[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int64_t i = clamp_row(r0 + (k0 + u) * kRowLanes, p.M);
          util::load8<kVec>(g + i * b.ldg, col, c_end, gv[u]);
          util::load8<kVec>(y + i * b.ldy, col, c_end, yv[u]);
          lse2[u] = lse2_of<Acc>(lse[i]);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (r0 + (k0 + u) * kRowLanes >= p.M) continue;
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float out = maps.softmax(j, yv[u][j], lse2[u]);
            acc[k0 + u] = fma(static_cast<Acc>(gv[u][j]), static_cast<Acc>(out), acc[k0 + u]);
            out_sum[k0 + u] += static_cast<Acc>(out);
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kRowsPerLane; ++k) {
      Acc dot = acc[k], sum = out_sum[k];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        dot += __shfl_xor_sync(0xffffffffu, dot, o);
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
      }
      const int64_t i = r0 + k * kRowLanes;
      if (threadIdx.x == 0 && i < p.M) {
        row_parts[blockIdx.x * p.M + i] = dot;
        row_parts[(gridDim.x + blockIdx.x) * p.M + i] = sum;
      }
    }
  }
}

// Blocks run in reverse order of [B1]'s (last row tile and column strip first): what [B1] read last
// is still in L2 when this pass starts.
template <bool kVec, class T>
__global__ void __launch_bounds__(kColThreads* kRowLanes, kBlocksPerSm)
    grad_partials_kernel(BackwardProblem p, BackwardBuffers b, const double* __restrict__ row_parts, int num_strips,
                         double* __restrict__ row_sums, GradPartials partials) {
  using Acc = BackwardAcc<T>;
  constexpr int kHalfLanes = kRowLanes / 2;  // the row lanes' sums are merged in two steps (static smem < 48 KiB)
  __shared__ detail::RowNorm<Acc> norm_tile[kMaxRowTile];
  __shared__ Acc lse2_tile[kMaxRowTile];
  __shared__ SharedColumnMaps shared_maps;
  __shared__ Acc sh1[kHalfLanes][kStrip], sh2[kHalfLanes][kStrip];
  constexpr int kBatch = kRowsInFlight<kVec, Acc>;
  begin_step();
  const auto* g = static_cast<const T*>(b.grad_out);
  const auto* y = static_cast<const float*>(b.y);
  const auto* lse = static_cast<const float*>(b.row_lse);
  const int64_t strip = gridDim.x - 1 - blockIdx.x;
  const int t = threadIdx.y * kColThreads + threadIdx.x;
  const int64_t col = strip * kStrip + threadIdx.x * 8;
  shared_maps.fill(p, b, strip * kStrip, t);
  for (int64_t step = blockIdx.y; step < partials.num_row_tiles; step += gridDim.y) {
    const int64_t tile = partials.num_row_tiles - 1 - step;
    const int64_t r0 = tile * partials.row_tile;
    const int rows = static_cast<int>(detail::row_tile_count(p.M, partials.row_tile, tile));
    __syncthreads();  // the previous tile's row values and sh1, sh2 are no longer read
    for (int i = t; i < rows; i += kColThreads * kRowLanes) {
      double dot = 0.0, out_sum = 0.0;
      for (int s = 0; s < num_strips; ++s) {
        dot += row_parts[s * p.M + r0 + i];
        out_sum += row_parts[(num_strips + s) * p.M + r0 + i];
      }
      norm_tile[i] = detail::row_norm(static_cast<Acc>(dot), static_cast<Acc>(out_sum));
      lse2_tile[i] = lse2_of<Acc>(lse[r0 + i]);
      if (strip == 0) {  // for [B4]
        row_sums[r0 + i] = dot;
        row_sums[p.M + r0 + i] = out_sum;
      }
    }
    __syncthreads();

    Acc s1[8] = {}, s2[8] = {};
    if (col < p.N) {
      ColumnMaps<Acc> maps;
      maps.load(shared_maps, threadIdx.x * 8);
      for (int i0 = threadIdx.y; i0 < rows; i0 += kBatch * kRowLanes) {
        float gv[kBatch][8], yv[kBatch][8];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int64_t i = r0 + clamp_row(i0 + u * kRowLanes, rows);
          util::load8<kVec>(g + i * b.ldg, col, p.N, gv[u]);
          util::load8<kVec>(y + i * b.ldy, col, p.N, yv[u]);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = i0 + u * kRowLanes;
          if (i >= rows) continue;
          const detail::RowNorm<Acc> row = norm_tile[i];
          const Acc lse2 = lse2_tile[i];
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const Acc out = static_cast<Acc>(maps.softmax(j, yv[u][j], lse2)) * row.normaliser;
            const Acc dz = detail::softmax_grad(out, static_cast<Acc>(gv[u][j]), row.r);
            s1[j] += dz;
            s2[j] = fma(dz, maps.centered(j, yv[u][j]), s2[j]);  // times invstd at the merge
          }
        }
      }
    }
    // Lanes 4..7 hand their sums to lanes 0..3, which add them (l + (l + 4)); then one thread per
    // column adds the four in lane order.
    if (threadIdx.y >= kHalfLanes) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sh1[threadIdx.y - kHalfLanes][threadIdx.x * 8 + j] = s1[j];
        sh2[threadIdx.y - kHalfLanes][threadIdx.x * 8 + j] = s2[j];
      }
    }
    __syncthreads();
    if (threadIdx.y < kHalfLanes) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        sh1[threadIdx.y][threadIdx.x * 8 + j] = s1[j] + sh1[threadIdx.y][threadIdx.x * 8 + j];
        sh2[threadIdx.y][threadIdx.x * 8 + j] = s2[j] + sh2[threadIdx.y][threadIdx.x * 8 + j];
      }
    }
    __syncthreads();
    const int64_t c = strip * kStrip + t;  // one column of the strip per thread
    if (c < p.N) {
      Acc a = 0, bsum = 0;
#pragma unroll
      for (int l = 0; l < kHalfLanes; ++l) {
        a += sh1[l][t];
        bsum += sh2[l][t];
      }
      partials.s1[tile * partials.ld + c] = a;
      partials.s2[tile * partials.ld + c] = bsum * static_cast<Acc>(shared_maps.invstd[t]);
    }
  }
}

}  // namespace

bool inputs_vectorizable(const BackwardProblem& p, const BackwardBuffers& b) {
  const int64_t g_per16 = 16 / static_cast<int64_t>(element_size(p.grad_dtype));
  return p.N % 8 == 0 && b.ldg % g_per16 == 0 && b.ldy % 4 == 0 && util::aligned16(b.grad_out) &&
         util::aligned16(b.y);
}

int64_t grad_partials_row_tile(int64_t M) {
  // 16 tiles per column strip up to M = 16384 (row tiles of 64..1024 rows), then 1024-row tiles.
  int64_t tile = 64;
  while (tile < kMaxRowTile && tile * 16 < M) tile *= 2;
  return tile;
}

int64_t row_strip_width(int64_t N) {  // at least one strip's width: N = 0 has no strips, not a width of 0
  return std::max<int64_t>(1, util::ceil_div(util::ceil_div(N, kStrip), kMaxRowStrips)) * kStrip;
}

int64_t row_strips(int64_t N) { return util::ceil_div(N, row_strip_width(N)); }

Status row_sums(const BackwardProblem& p, const BackwardBuffers& b, double* row_parts, unsigned* counter,
                cudaStream_t stream) {
  const int64_t width = row_strip_width(p.N);
  const int64_t strips = row_strips(p.N);
  int64_t row_blocks = 0;
  const int64_t needed = util::ceil_div(p.M, int64_t{kRowDotRows});
  FUSED_RETURN_IF_ERROR(grid_row_blocks(FUSED_BWD_ROW_WAVE & 1, needed, strips, row_blocks));
  if (row_blocks > 65535) return {StatusCode::kNotSupported, "backward row pass: more than 65535 * 64 rows"};
  const dim3 grid(static_cast<unsigned>(strips), static_cast<unsigned>(row_blocks));
  const dim3 block(kColThreads, kRowLanes);
  const bool vec = inputs_vectorizable(p, b);
  return util::with_cuda_type(p.grad_dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_step(vec ? row_sums_kernel<true, T> : row_sums_kernel<false, T>, grid, block, 0, stream,
                       "backward row_sums_kernel launch", p, b, width, row_parts, counter);
  });
}

Status grad_partials(const BackwardProblem& p, const BackwardBuffers& b, const double* row_parts, double* row_sums,
                     const GradPartials& partials, cudaStream_t stream) {
  if (partials.num_row_tiles != util::ceil_div(p.M, partials.row_tile) || partials.ld < p.N ||
      partials.row_tile > kMaxRowTile)
    return {StatusCode::kInvalidArgument, "backward partials: geometry does not match M, N"};
  const int strips = static_cast<int>(row_strips(p.N));
  const int64_t column_strips = util::ceil_div(p.N, int64_t{kStrip});
  int64_t tile_blocks = 0;
  FUSED_RETURN_IF_ERROR(grid_row_blocks(FUSED_BWD_ROW_WAVE & 2, partials.num_row_tiles, column_strips, tile_blocks));
  if (tile_blocks > 65535) return {StatusCode::kNotSupported, "backward partials: too many row tiles"};
  const dim3 grid(static_cast<unsigned>(column_strips), static_cast<unsigned>(tile_blocks));
  const dim3 block(kColThreads, kRowLanes);
  const bool vec = inputs_vectorizable(p, b);
  return util::with_cuda_type(p.grad_dtype, [&](auto tag) {
    using T = decltype(tag);
    return launch_step(vec ? grad_partials_kernel<true, T> : grad_partials_kernel<false, T>, grid, block, 0, stream,
                       "backward grad_partials_kernel launch", p, b, row_parts, strips, row_sums, partials);
  });
}

}  // namespace fused::cuda::backward_steps
