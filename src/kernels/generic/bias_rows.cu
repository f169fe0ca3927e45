// [1, generic] y[i, :] = b for i < M, in fp32: one row into the workspace for a 16-bit or unaligned
// bias (cuBLASLt's bias epilogue reads it in y's type), or every row of y when K = 0. A plain store
// stream; float4 stores when the rows allow it.
//
// Block 256 threads, each owning 4 consecutive columns (their bias values converted once, held in
// registers); grid (column chunks, row groups), rows strided by the row groups.
#include <algorithm>

#include "fused/detail/half_bits.h"
#include "api/forward_steps.h"
#include "util/cuda_check.h"

namespace fused::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColsPerThread = 4;

template <bool kVector>
__global__ void __launch_bounds__(kThreads)
    bias_rows_kernel(const void* __restrict__ bias, ElementType dtype, float* __restrict__ y, int64_t ldy, int64_t M,
                     int64_t N) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * kColsPerThread;
  if (c0 >= N) return;
  float b[kColsPerThread];
#pragma unroll
  for (int j = 0; j < kColsPerThread; ++j) b[j] = c0 + j < N ? half_bits::load(bias, dtype, c0 + j) : 0.f;
  for (int64_t r = blockIdx.y; r < M; r += gridDim.y) {
    float* row = y + r * ldy + c0;
    if constexpr (kVector) {
      *reinterpret_cast<float4*>(row) = make_float4(b[0], b[1], b[2], b[3]);
    } else {
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j)
        if (c0 + j < N) row[j] = b[j];
    }
  }
}

}  // namespace

Status bias_rows(const void* bias, ElementType dtype, float* y, int64_t ldy, int64_t M, int64_t N,
                 cudaStream_t stream) {
  if (M == 0 || N == 0) return Status::Ok();
  if (bias == nullptr || y == nullptr || ldy < N) return {StatusCode::kInvalidArgument, "bias_rows: bad arguments"};
  const int64_t col_blocks = util::ceil_div(util::ceil_div(N, kColsPerThread), kThreads);
  if (col_blocks > 0x7fffffff) return {StatusCode::kNotSupported, "bias_rows: N too large"};
  // Enough blocks to fill the GPU several times over; each walks its rows.
  const int64_t row_groups = std::min<int64_t>(M, std::max<int64_t>(1, 2048 / col_blocks));
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_groups));
  const bool vector = N % kColsPerThread == 0 && ldy % kColsPerThread == 0 && util::aligned16(y);
  if (vector) {
    bias_rows_kernel<true><<<grid, kThreads, 0, stream>>>(bias, dtype, y, ldy, M, N);
  } else {
    bias_rows_kernel<false><<<grid, kThreads, 0, stream>>>(bias, dtype, y, ldy, M, N);
  }
  return util::launch_status("bias_rows_kernel launch");
}

}  // namespace fused::cuda
