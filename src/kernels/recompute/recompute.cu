// The recompute path's dispatch on the input type, and [R3]: each row's (max, sum) pairs of [R2],
// one per column tile, merged in column-tile order into (max, 1 / sum) and the log-normaliser.
#include "fused/detail/bn_math.h"
#include "kernels/common/nan_max.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/recompute/recompute.h"
#include "util/cuda_check.h"

namespace fused::cuda::recompute {
namespace {

// One warp per row: its lanes take the column tiles lane, lane + 32, ... (fixed shuffle trees:
// deterministic). A thread per row walking all tiles was latency-bound (64 dependent L2 round trips
// at N = 8192).
constexpr int kMergeThreads = 256;
constexpr int kRowsPerBlock = kMergeThreads / 32;

__global__ void __launch_bounds__(kMergeThreads)
    merge_row_parts_kernel(int64_t M, int64_t col_tiles, const float* __restrict__ row_parts,
                           float* __restrict__ row_stats, float* __restrict__ row_lse) {
  util::wait_for_prerequisites();  // [R2]'s pairs
  util::allow_dependents_to_launch();
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= M) return;
  float mx = -INFINITY;  // NaN from any tile's max stays NaN (a tile's NaN reaches the row)
  for (int64_t b = lane; b < col_tiles; b += 32) mx = util::max_nan(mx, row_parts[2 * (b * M + row)]);
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) mx = util::max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, offset));
  float sum = 0.f;
  for (int64_t b = lane; b < col_tiles; b += 32) {
    const float2 pair = *reinterpret_cast<const float2*>(row_parts + 2 * (b * M + row));
    if (pair.x != -INFINITY) sum += pair.y * expf(pair.x - mx);  // a tile of -inf logits adds 0
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane != 0) return;
  row_stats[2 * row] = mx;
  row_stats[2 * row + 1] = 1.f / sum;
  if (row_lse != nullptr) row_lse[row] = detail::log_normaliser(mx, sum);
}

}  // namespace

Status run_pass(Pass pass, const PassParams& p, cudaStream_t stream) {
  if (p.M == 0 || p.N == 0) return Status::Ok();
  if (p.K < 1 || p.K > max_k(p.dtype)) return {StatusCode::kNotSupported, "recompute pass: K outside [1, max_k]"};
  if (num_tiles(p.M, p.N) > kMaxTiles) return {StatusCode::kNotSupported, "recompute pass: more than 2^31 - 1 tiles"};
  switch (p.dtype) {
    case ElementType::kBFloat16: return run_pass_bf16(pass, p, stream);
    case ElementType::kFloat16: return run_pass_fp16(pass, p, stream);
    case ElementType::kFloat32: return run_pass_tf32(pass, p, stream);
    default: break;
  }
  return {StatusCode::kInvalidArgument, "recompute pass: unsupported input dtype"};
}

Status merge_row_parts(const PassParams& p, float* row_lse, cudaStream_t stream) {
  if (p.M == 0 || p.N == 0) return Status::Ok();
  return util::launch_dependent(merge_row_parts_kernel,
                                dim3(static_cast<unsigned>(util::ceil_div(p.M, kRowsPerBlock))), dim3(kMergeThreads),
                                0, stream, "merge_row_parts kernel launch", p.M, util::ceil_div(p.N, kTileN),
                                static_cast<const float*>(p.row_parts), p.row_stats, row_lse);
}

}  // namespace fused::cuda::recompute
