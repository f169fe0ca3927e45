// [3] Row softmax of the BatchNorm logits: out[i, :] = softmax(a * (y[i, :] - shift) + c).
//
// One CTA per row. Rows up to 1024 * 4 * 8 elements stay in registers: one read of y, one write of
// out, 16-byte loads. Wider rows (up to any N) take the streaming kernel: an online max/sum pass,
// then a pass that re-reads y (mostly from L2) and writes out. Every kernel also writes the row's
// log-normaliser for the backward, and is launched as a programmatic dependent of finalize
// (kernels/common/pdl.cuh).
// (A persistent variant that kept the folded coefficients in registers and walked rows two at a
// time measured slower on the H200: 23.7 vs 18.8 us at 1024x8192, one 1024-thread CTA per SM
// hides too little latency.)
// The row max is subtracted; NaN and +-inf propagate as in torch.softmax. expf (not the
// approximate __expf) keeps exact-fp32 mode within 1e-5; the kernel is memory-bound anyway.
#include <cuda_bf16.h>
#include <cuda_fp16.h>


#include "fused/detail/bn_math.h"
#include "fused/gemm_bn_softmax.h"
#include "kernels/common/block_reduce.cuh"
#include "util/cuda_check.h"
#include "kernels/common/pdl.cuh"

namespace fused::cuda {
namespace {

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

using util::block_reduce;

// Loads 4 logits starting at column col (col % 4 == 0); columns >= N give -inf.
template <bool kVec>
__device__ __forceinline__ float4 load_logits(const float* __restrict__ yrow, int64_t col, int64_t N,
                                              const ColumnAffine& f) {
  float v[4];
  if (kVec && col + 4 <= N) {
    const float4 y4 = *reinterpret_cast<const float4*>(yrow + col);
    const float4 s4 = *reinterpret_cast<const float4*>(f.shift + col);
    const float4 a4 = *reinterpret_cast<const float4*>(f.a + col);
    const float4 c4 = *reinterpret_cast<const float4*>(f.c + col);
    v[0] = detail::bn_logit(y4.x, s4.x, a4.x, c4.x);
    v[1] = detail::bn_logit(y4.y, s4.y, a4.y, c4.y);
    v[2] = detail::bn_logit(y4.z, s4.z, a4.z, c4.z);
    v[3] = detail::bn_logit(y4.w, s4.w, a4.w, c4.w);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      v[j] = col + j < N ? detail::bn_logit(yrow[col + j], f.shift[col + j], f.a[col + j], f.c[col + j]) : -INFINITY;
  }
  return make_float4(v[0], v[1], v[2], v[3]);
}

template <bool kVec, class TOut>
__device__ __forceinline__ void store4(TOut* __restrict__ orow, int64_t col, int64_t N, float4 v) {
  if constexpr (kVec) {
    if (col + 4 <= N) {
      if constexpr (sizeof(TOut) == 4) {
        *reinterpret_cast<float4*>(orow + col) = v;
      } else {
        union { TOut h[4]; uint2 u; } pack;
        pack.h[0] = OutConvert<TOut>::cvt(v.x);
        pack.h[1] = OutConvert<TOut>::cvt(v.y);
        pack.h[2] = OutConvert<TOut>::cvt(v.z);
        pack.h[3] = OutConvert<TOut>::cvt(v.w);
        *reinterpret_cast<uint2*>(orow + col) = pack.u;
      }
      return;
    }
  }
  const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j)
    if (col + j < N) orow[col + j] = OutConvert<TOut>::cvt(e[j]);
}

__device__ __forceinline__ float max4(float4 v) { return fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)); }

// Row held in registers: kVecs float4 per thread.
template <int kThreads, int kVecs, bool kVec, class TOut>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_in_registers(const float* __restrict__ y, int64_t ldy, int64_t N, ColumnAffine f,
                              TOut* __restrict__ out, int64_t ldo, float* __restrict__ row_lse) {
  __shared__ float smem[32];
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
  const int64_t row = blockIdx.x;
  const float* yrow = y + row * ldy;
  float4 z[kVecs];
  float mx = -INFINITY;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
    z[v] = col < N ? load_logits<kVec>(yrow, col, N, f) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    mx = fmaxf(mx, max4(z[v]));
  }
  mx = block_reduce<kThreads, true>(mx, smem);
  float sum = 0.f;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    z[v].x = expf(z[v].x - mx);
    z[v].y = expf(z[v].y - mx);
    z[v].z = expf(z[v].z - mx);
    z[v].w = expf(z[v].w - mx);
    sum += (z[v].x + z[v].y) + (z[v].z + z[v].w);
  }
  sum = block_reduce<kThreads, false>(sum, smem);
  if (row_lse != nullptr && threadIdx.x == 0) row_lse[row] = detail::log_normaliser(mx, sum);
  const float inv = 1.f / sum;
  TOut* orow = out + row * ldo;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
    if (col < N)
      store4<kVec>(orow, col, N, make_float4(z[v].x * inv, z[v].y * inv, z[v].z * inv, z[v].w * inv));
  }
}

// Any N: online (max, sum) over the row, then a second pass that writes.
template <int kThreads, bool kVec, class TOut>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_streaming(const float* __restrict__ y, int64_t ldy, int64_t N, ColumnAffine f, TOut* __restrict__ out,
                           int64_t ldo, float* __restrict__ row_lse) {
  __shared__ float smem[32];
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
  const int64_t row = blockIdx.x;
  const float* yrow = y + row * ldy;
  float mx = -INFINITY, sum = 0.f;
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * 4; col < N; col += kThreads * 4) {
    const float4 z = load_logits<kVec>(yrow, col, N, f);
    const float m4 = fmaxf(mx, max4(z));
    // m4 == -inf only if everything so far is -inf: keep sum at 0 instead of exp(nan).
    if (m4 != -INFINITY) {
      sum = sum * expf(mx - m4) + ((expf(z.x - m4) + expf(z.y - m4)) + (expf(z.z - m4) + expf(z.w - m4)));
    }
    mx = m4;
  }
  const float row_max = block_reduce<kThreads, true>(mx, smem);
  sum = mx == -INFINITY ? 0.f : sum * expf(mx - row_max);
  sum = block_reduce<kThreads, false>(sum, smem);
  if (row_lse != nullptr && threadIdx.x == 0) row_lse[row] = detail::log_normaliser(row_max, sum);
  const float inv = 1.f / sum;
  TOut* orow = out + row * ldo;
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * 4; col < N; col += kThreads * 4) {
    const float4 z = load_logits<kVec>(yrow, col, N, f);
    store4<kVec>(orow, col, N,
                 make_float4(expf(z.x - row_max) * inv, expf(z.y - row_max) * inv, expf(z.z - row_max) * inv,
                             expf(z.w - row_max) * inv));
  }
}

// The registers kernel holding kVecs float4 per thread, kThreads threads per row.
template <int kThreads, int kVecs, bool kVec, class TOut>
Status launch_in_registers(dim3 grid, const float* y, int64_t ldy, int64_t N, const ColumnAffine& f, TOut* out,
                           int64_t ldo, float* row_lse, cudaStream_t stream) {
  return util::launch_dependent(softmax_rows_in_registers<kThreads, kVecs, kVec, TOut>, grid, kThreads, 0, stream,
                                "row_softmax kernel launch", y, ldy, N, f, out, ldo, row_lse);
}

template <bool kVec, class TOut>
Status launch_typed(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f, TOut* out, int64_t ldo,
                    float* row_lse, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(M));
  // One CTA per row; registers path while kThreads * 4 * kVecs >= N.
  if (N <= 128 * 4 * 1) return launch_in_registers<128, 1, kVec>(grid, y, ldy, N, f, out, ldo, row_lse, stream);
  if (N <= 256 * 4 * 2) return launch_in_registers<256, 2, kVec>(grid, y, ldy, N, f, out, ldo, row_lse, stream);
  if (N <= 256 * 4 * 4) return launch_in_registers<256, 4, kVec>(grid, y, ldy, N, f, out, ldo, row_lse, stream);
  if (N <= 256 * 4 * 8) return launch_in_registers<256, 8, kVec>(grid, y, ldy, N, f, out, ldo, row_lse, stream);
  if (N <= 512 * 4 * 8) return launch_in_registers<512, 8, kVec>(grid, y, ldy, N, f, out, ldo, row_lse, stream);
  if (N <= 1024 * 4 * 8) return launch_in_registers<1024, 8, kVec>(grid, y, ldy, N, f, out, ldo, row_lse, stream);
  return util::launch_dependent(softmax_rows_streaming<1024, kVec, TOut>, grid, 1024, 0, stream,
                                "row_softmax kernel launch", y, ldy, N, f, out, ldo, row_lse);
}

template <class TOut>
Status launch(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f, void* out, int64_t ldo,
              float* row_lse, cudaStream_t stream) {
  // 16-byte loads need every row of y and the column vectors 16-byte aligned; 4-wide stores
  // need out rows aligned to 4 elements.
  const bool vec = ldy % 4 == 0 && ldo % 4 == 0 && util::aligned16(y) && util::aligned16(f.shift) && util::aligned16(f.a) &&
                   util::aligned16(f.c) && (reinterpret_cast<uintptr_t>(out) % (4 * sizeof(TOut))) == 0;
  auto* o = static_cast<TOut*>(out);
  return vec ? launch_typed<true>(y, ldy, M, N, f, o, ldo, row_lse, stream)
             : launch_typed<false>(y, ldy, M, N, f, o, ldo, row_lse, stream);
}

}  // namespace

Status row_softmax(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& affine, void* out,
                   int64_t ldo, ElementType dtype, float* row_lse, cudaStream_t stream) {
  if (M == 0 || N == 0) return Status::Ok();
  if (M > 0x7fffffff) return {StatusCode::kNotSupported, "row_softmax: more than 2^31-1 rows"};
  switch (dtype) {
    case ElementType::kFloat32:
      return launch<float>(y, ldy, M, N, affine, out, ldo, row_lse, stream);
    case ElementType::kBFloat16:
      return launch<__nv_bfloat16>(y, ldy, M, N, affine, out, ldo, row_lse, stream);
    case ElementType::kFloat16:
      return launch<__half>(y, ldy, M, N, affine, out, ldo, row_lse, stream);
  }
  return {StatusCode::kInvalidArgument, "row_softmax: unknown dtype"};
}

}  // namespace fused::cuda
