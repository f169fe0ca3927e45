// fp32 -> the output's element type, rounding to nearest even (the softmax kernels' stores).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fused::cuda {

template <class T>
struct OutConvert;
template <>
struct OutConvert<float> {
  __device__ static float cvt(float v) { return v; }
};
template <>
struct OutConvert<__nv_bfloat16> {
  __device__ static __nv_bfloat16 cvt(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct OutConvert<__half> {
  __device__ static __half cvt(float v) { return __float2half_rn(v); }
};

}  // namespace fused::cuda
