// A max that keeps NaN: fmaxf(a, NaN) is a, which lets a row's NaN vanish from a max that decides
// whether the row has any values at all (a running max still at -inf means "nothing seen yet").
// torch.softmax gives NaN across a row holding a NaN; the kernels whose max can skip a value (the
// streaming softmax's online max, the one-kernel forward's tile max) take their max from here.
#pragma once

#include <cuda_runtime.h>

namespace fused::cuda::util {

// NaN when either operand is NaN, else fmaxf(a, b).
__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (a != a || b != b) ? a + b : fmaxf(a, b);  // a + b: NaN, as one of them is
#endif
}

__device__ __forceinline__ float max_nan4(float4 v) { return max_nan(max_nan(v.x, v.y), max_nan(v.z, v.w)); }

}  // namespace fused::cuda::util
