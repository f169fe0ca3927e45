// The presplit 3xTF32 GEMM's pass over its shared-memory operand (split_small_parts_3xtf32.h).
#include "kernels/sm90/split_small_parts_3xtf32.h"

#include <algorithm>
#include <cstdlib>

#include "fused/detail/tf32_split.h"
#include "util/cuda_check.h"
#include "util/device_info.h"

namespace fused::sm90 {
namespace {

// One float4 of a row a thread, grid-stride. A warp that met inf or NaN sets the flag once.
__global__ void __launch_bounds__(256) split_small_parts_kernel(const float* __restrict__ a, int64_t rows,
                                                                int64_t cols4, int64_t lda4,
                                                                float* __restrict__ small, uint32_t* special) {
  const float4* a4 = reinterpret_cast<const float4*>(a);
  float4* small4 = reinterpret_cast<float4*>(small);
  const int64_t total = rows * cols4;
  bool seen = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols4, c = i - r * cols4;
    const float4 v = a4[r * lda4 + c];
    seen |= !tf32::finite(v.x) || !tf32::finite(v.y) || !tf32::finite(v.z) || !tf32::finite(v.w);
    small4[i] = make_float4(tf32::small_toward_zero(v.x), tf32::small_toward_zero(v.y), tf32::small_toward_zero(v.z),
                            tf32::small_toward_zero(v.w));
  }
  if (__any_sync(0xFFFFFFFF, seen) && (threadIdx.x % 32) == 0) *special = 1u;
}

// A 32 x 32 tile of a a block (32 x 8 threads): read along at's rows, written along a's rows,
// through shared memory (one padding column against bank conflicts).
__global__ void __launch_bounds__(256) transpose_split_kernel(const float* __restrict__ at, int64_t rows, int64_t cols,
                                                              int64_t ldat, float* __restrict__ a,
                                                              float* __restrict__ small, int64_t ld, uint32_t* special) {
  __shared__ float tile[32][33];
  const int64_t r0 = int64_t(blockIdx.x) * 32, c0 = int64_t(blockIdx.y) * 32;
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  for (int i = ty; i < 32; i += 8) {  // at's row c0 + i, column r0 + tx
    if (c0 + i < cols && r0 + tx < rows) tile[i][tx] = at[(c0 + i) * ldat + r0 + tx];
  }
  __syncthreads();
  bool seen = false;
  for (int i = ty; i < 32; i += 8) {  // a's row r0 + i, column c0 + tx
    if (r0 + i < rows && c0 + tx < cols) {
      const float v = tile[tx][i];
      seen |= !tf32::finite(v);
      a[(r0 + i) * ld + c0 + tx] = v;
      small[(r0 + i) * ld + c0 + tx] = tf32::small_toward_zero(v);
    }
  }
  if (__any_sync(0xFFFFFFFF, seen) && tx == 0) *special = 1u;
}

}  // namespace

bool presplit_3xtf32() {
  static const bool in_loop = [] {
    const char* v = std::getenv("FUSED_3XTF32_IN_LOOP_SPLIT");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return !in_loop;
}

Status transpose_split_small_parts_3xtf32(const float* at, int64_t rows, int64_t cols, int64_t ldat, float* a,
                                          float* small, int64_t ld, uint32_t* special, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || ldat < rows || ld < cols || ld % 4 != 0)
    return {StatusCode::kInvalidArgument,
            "3xTF32 transposing split pass: rows, cols positive, ldat >= rows, ld >= cols and a multiple of 4"};
  if (at == nullptr || a == nullptr || small == nullptr || special == nullptr)
    return {StatusCode::kInvalidArgument, "3xTF32 transposing split pass: null pointer"};
  if (cuda::util::ceil_div(cols, 32) > 65535)
    return {StatusCode::kNotSupported, "3xTF32 transposing split pass: cols must be below 2^21"};
  FUSED_RETURN_IF_ERROR(cuda::util::cuda_status(cudaMemsetAsync(special, 0, sizeof(uint32_t), stream),
                                                "3xTF32 transposing split pass: cudaMemsetAsync"));
  const dim3 grid(unsigned(cuda::util::ceil_div(rows, 32)), unsigned(cuda::util::ceil_div(cols, 32)));
  transpose_split_kernel<<<grid, 256, 0, stream>>>(at, rows, cols, ldat, a, small, ld, special);
  return cuda::util::launch_status("3xTF32 transposing split pass");
}

Status split_small_parts_3xtf32(const float* a, int64_t rows, int64_t cols, int64_t lda, float* small,
                                uint32_t* special, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || lda < cols)
    return {StatusCode::kInvalidArgument, "3xTF32 split pass: rows, cols must be positive and lda >= cols"};
  if (cols % 4 != 0 || lda % 4 != 0 || !cuda::util::aligned16(a) || !cuda::util::aligned16(small) || special == nullptr)
    return {StatusCode::kInvalidArgument,
            "3xTF32 split pass: cols and lda must be multiples of 4, a and small 16-byte aligned, special non-null"};
  FUSED_RETURN_IF_ERROR(cuda::util::cuda_status(cudaMemsetAsync(special, 0, sizeof(uint32_t), stream),
                                                "3xTF32 split pass: cudaMemsetAsync"));
  int device = 0, sms = 0;
  FUSED_RETURN_IF_ERROR(cuda::util::cuda_status(cudaGetDevice(&device), "3xTF32 split pass: cudaGetDevice"));
  FUSED_RETURN_IF_ERROR(cuda::util::sm_count(device, sms));
  const int64_t vectors = rows * (cols / 4);
  const int64_t blocks = std::min<int64_t>(cuda::util::ceil_div(vectors, 256), int64_t(sms) * 8);
  split_small_parts_kernel<<<unsigned(blocks), 256, 0, stream>>>(a, rows, cols / 4, lda / 4, small, special);
  return cuda::util::launch_status("3xTF32 split pass");
}

}  // namespace fused::sm90
