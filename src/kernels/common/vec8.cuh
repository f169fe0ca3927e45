// Eight consecutive elements of a row as floats: one 16-byte access for bf16 / fp16, two for fp32.
// kVec = false is the fallback for rows or pointers without that alignment: element by element,
// columns >= N read as 0 and are not written.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "fused/types.h"

namespace fused::cuda::util {

// Calls f(T{}) with the CUDA type of t (float, __nv_bfloat16 or __half), for host-side dispatch.
template <class F>
Status with_cuda_type(ElementType t, F&& f) {
  switch (t) {
    case ElementType::kFloat32: return f(float{});
    case ElementType::kBFloat16: return f(__nv_bfloat16{});
    case ElementType::kFloat16: return f(__half{});
    default: return {StatusCode::kNotSupported, "the CUDA kernels take float32, bfloat16 or float16"};
  }
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// v[j] = row[col + j]. kVec: col + 8 <= N, row + col 16-byte aligned.
template <bool kVec, class T>
__device__ __forceinline__ void load8(const T* __restrict__ row, int64_t col, int64_t N, float (&v)[8]) {
  if constexpr (kVec) {
    if constexpr (sizeof(T) == 4) {
      const float4 a = *reinterpret_cast<const float4*>(row + col);
      const float4 b = *reinterpret_cast<const float4*>(row + col + 4);
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
      v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
      union { uint4 u; T h[8]; } pack;
      pack.u = *reinterpret_cast<const uint4*>(row + col);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = to_float(pack.h[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = col + j < N ? to_float(row[col + j]) : 0.f;
  }
}

// row[col + j] = v[j] for columns < N.
template <bool kVec, class T>
__device__ __forceinline__ void store8(T* __restrict__ row, int64_t col, int64_t N, const float (&v)[8]) {
  if constexpr (kVec) {
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<float4*>(row + col) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(row + col + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      union { uint4 u; T h[8]; } pack;
#pragma unroll
      for (int j = 0; j < 8; ++j) pack.h[j] = from_float<T>(v[j]);
      *reinterpret_cast<uint4*>(row + col) = pack.u;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j)
      if (col + j < N) row[col + j] = from_float<T>(v[j]);
  }
}

}  // namespace fused::cuda::util
