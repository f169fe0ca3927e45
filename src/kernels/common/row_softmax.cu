// [3] Row softmax of the BatchNorm logits: out[i, :] = softmax(a * (y[i, :] - shift) + c).
//
// Rows up to 1024 * 4 * 8 elements stay in registers: one read of y, one write of out, 16-byte
// loads; a CTA takes one row or a few (row_softmax_layout() decides). Wider rows (up to any N) take
// the streaming kernel: an online max/sum pass, then a pass that re-reads y (mostly from L2) and
// writes out. Every kernel also writes the row's
// log-normaliser for the backward, and is launched as a programmatic dependent of finalize
// (kernels/common/pdl.cuh).
// (A persistent variant that kept the folded coefficients in registers and walked rows two at a
// time measured slower on the H200: 23.7 vs 18.8 us at 1024x8192, one 1024-thread CTA per SM
// hides too little latency.)
// The row max is subtracted; NaN and +-inf propagate as in torch.softmax. expf (not the
// approximate __expf) keeps exact-fp32 mode within 1e-5; the kernel is memory-bound anyway.
#include <cuda_bf16.h>
#include <cuda_fp16.h>


#include "api/forward_steps.h"
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
using util::block_reduce_rows;

// The folded coefficients of 4 columns starting at col (col % 4 == 0); columns >= N give 0.
struct Coefs4 {
  float4 shift, a, c;
};
template <bool kVec>
__device__ __forceinline__ Coefs4 load_coefs(const ColumnAffine& f, int64_t col, int64_t N) {
  if (kVec && col + 4 <= N)
    return {*reinterpret_cast<const float4*>(f.shift + col), *reinterpret_cast<const float4*>(f.a + col),
            *reinterpret_cast<const float4*>(f.c + col)};
  float s[4], a[4], c[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    s[j] = col + j < N ? f.shift[col + j] : 0.f;
    a[j] = col + j < N ? f.a[col + j] : 0.f;
    c[j] = col + j < N ? f.c[col + j] : 0.f;
  }
  return {make_float4(s[0], s[1], s[2], s[3]), make_float4(a[0], a[1], a[2], a[3]), make_float4(c[0], c[1], c[2], c[3])};
}

// The 4 logits of one row at column col; columns >= N give -inf.
template <bool kVec>
__device__ __forceinline__ float4 logits(const float* __restrict__ yrow, int64_t col, int64_t N, const Coefs4& k) {
  if (kVec && col + 4 <= N) {
    const float4 y4 = *reinterpret_cast<const float4*>(yrow + col);
    return make_float4(detail::bn_logit(y4.x, k.shift.x, k.a.x, k.c.x), detail::bn_logit(y4.y, k.shift.y, k.a.y, k.c.y),
                       detail::bn_logit(y4.z, k.shift.z, k.a.z, k.c.z), detail::bn_logit(y4.w, k.shift.w, k.a.w, k.c.w));
  }
  const float s[4] = {k.shift.x, k.shift.y, k.shift.z, k.shift.w}, a[4] = {k.a.x, k.a.y, k.a.z, k.a.w},
              c[4] = {k.c.x, k.c.y, k.c.z, k.c.w};
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = col + j < N ? detail::bn_logit(yrow[col + j], s[j], a[j], c[j]) : -INFINITY;
  return make_float4(v[0], v[1], v[2], v[3]);
}

template <bool kVec>
__device__ __forceinline__ float4 load_logits(const float* __restrict__ yrow, int64_t col, int64_t N,
                                              const ColumnAffine& f) {
  return logits<kVec>(yrow, col, N, load_coefs<kVec>(f, col, N));
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

// Rows held in registers: kRows rows per CTA, kVecs float4 per thread and row. Each thread loads
// the coefficients of its columns once for the CTA's kRows rows: at one row per CTA they are three
// times the bytes of y. A row's reductions run in the same order whatever kRows, so the results
// are the same bits.
template <int kThreads, int kVecs, int kRows, bool kVec, class TOut>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_in_registers(const float* __restrict__ y, int64_t ldy, int64_t M, int64_t N, ColumnAffine f,
                              TOut* __restrict__ out, int64_t ldo, float* __restrict__ row_lse) {
  __shared__ float smem[kRows][32];
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const float4 empty = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  float4 z[kRows][kVecs];
  float mx[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) mx[r] = -INFINITY;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
    if (col < N) {
      const Coefs4 k = load_coefs<kVec>(f, col, N);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        z[r][v] = row0 + r < M ? logits<kVec>(y + (row0 + r) * ldy, col, N, k) : empty;
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) z[r][v] = empty;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) mx[r] = fmaxf(mx[r], max4(z[r][v]));
  }
  block_reduce_rows<kThreads, true, kRows>(mx, &smem[0][0]);
  float sum[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    sum[r] = 0.f;
    if (row0 + r >= M) continue;  // the same for the whole CTA
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      z[r][v].x = expf(z[r][v].x - mx[r]);
      z[r][v].y = expf(z[r][v].y - mx[r]);
      z[r][v].z = expf(z[r][v].z - mx[r]);
      z[r][v].w = expf(z[r][v].w - mx[r]);
      sum[r] += (z[r][v].x + z[r][v].y) + (z[r][v].z + z[r][v].w);
    }
  }
  block_reduce_rows<kThreads, false, kRows>(sum, &smem[0][0]);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + r;
    if (row >= M) continue;
    if (row_lse != nullptr && threadIdx.x == 0) row_lse[row] = detail::log_normaliser(mx[r], sum[r]);
    const float inv = 1.f / sum[r];
    TOut* orow = out + row * ldo;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
      if (col < N)
        store4<kVec>(orow, col, N, make_float4(z[r][v].x * inv, z[r][v].y * inv, z[r][v].z * inv, z[r][v].w * inv));
    }
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

// The registers kernel holding kVecs float4 per thread and row, kThreads threads, kRows rows per CTA.
template <int kThreads, int kVecs, int kRows, bool kVec, class TOut>
Status launch_in_registers(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f, TOut* out,
                           int64_t ldo, float* row_lse, cudaStream_t stream) {
  static_assert(kThreads * 4 * kVecs >= 512, "");
  const dim3 grid(static_cast<unsigned>((M + kRows - 1) / kRows));
  return util::launch_dependent(softmax_rows_in_registers<kThreads, kVecs, kRows, kVec, TOut>, grid, kThreads, 0,
                                stream, "row_softmax kernel launch", y, ldy, M, N, f, out, ldo, row_lse);
}

// The layouts built (row_softmax_layout() picks among them; benchmarks may ask for any).
#define FUSED_SOFTMAX_LAYOUTS(X) \
  X(128, 1, 1) X(256, 2, 1) X(256, 4, 1) X(256, 8, 1) X(512, 8, 1) X(1024, 8, 1) \
  X(256, 2, 4) X(256, 4, 2) X(256, 4, 4) X(256, 8, 2) X(512, 4, 2) X(512, 4, 4)

template <bool kVec, class TOut>
Status launch_typed(const SoftmaxLayout& l, const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f,
                    TOut* out, int64_t ldo, float* row_lse, cudaStream_t stream) {
  if (l.threads == 0)
    return util::launch_dependent(softmax_rows_streaming<1024, kVec, TOut>, dim3(static_cast<unsigned>(M)), 1024, 0,
                                  stream, "row_softmax kernel launch", y, ldy, N, f, out, ldo, row_lse);
  if (int64_t{l.threads} * 4 * l.vecs < N)
    return {StatusCode::kInvalidArgument, "row_softmax: the layout holds fewer columns than N"};
#define FUSED_SOFTMAX_CASE(T, V, R)                                                                    \
  if (l.threads == T && l.vecs == V && l.rows == R)                                                  \
    return launch_in_registers<T, V, R, kVec>(y, ldy, M, N, f, out, ldo, row_lse, stream);
  FUSED_SOFTMAX_LAYOUTS(FUSED_SOFTMAX_CASE)
#undef FUSED_SOFTMAX_CASE
  return {StatusCode::kNotSupported, "row_softmax: layout not built"};
}

template <class TOut>
Status launch(const SoftmaxLayout& l, const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f,
              void* out, int64_t ldo, float* row_lse, cudaStream_t stream) {
  // 16-byte loads need every row of y and the column vectors 16-byte aligned; 4-wide stores
  // need out rows aligned to 4 elements.
  const bool vec = ldy % 4 == 0 && ldo % 4 == 0 && util::aligned16(y) && util::aligned16(f.shift) && util::aligned16(f.a) &&
                   util::aligned16(f.c) && (reinterpret_cast<uintptr_t>(out) % (4 * sizeof(TOut))) == 0;
  auto* o = static_cast<TOut*>(out);
  return vec ? launch_typed<true>(l, y, ldy, M, N, f, o, ldo, row_lse, stream)
             : launch_typed<false>(l, y, ldy, M, N, f, o, ldo, row_lse, stream);
}

}  // namespace

SoftmaxLayout row_softmax_layout(int64_t M, int64_t N) {
  (void)M;
  // One CTA per row, the row in registers while kThreads * 4 * kVecs >= N; wider rows stream.
  if (N <= 128 * 4 * 1) return {128, 1, 1};
  if (N <= 256 * 4 * 2) return {256, 2, 1};
  if (N <= 256 * 4 * 4) return {256, 4, 1};
  if (N <= 256 * 4 * 8) return {256, 8, 1};
  if (N <= 512 * 4 * 8) return {512, 8, 1};
  if (N <= 1024 * 4 * 8) return {1024, 8, 1};
  return {0, 0, 1};
}

std::vector<SoftmaxLayout> row_softmax_built_layouts() {
  std::vector<SoftmaxLayout> layouts;
#define FUSED_SOFTMAX_LIST(T, V, R) layouts.push_back({T, V, R});
  FUSED_SOFTMAX_LAYOUTS(FUSED_SOFTMAX_LIST)
#undef FUSED_SOFTMAX_LIST
  return layouts;
}

Status row_softmax_with_layout(const SoftmaxLayout& layout, const float* y, int64_t ldy, int64_t M, int64_t N,
                               const ColumnAffine& affine, void* out, int64_t ldo, ElementType dtype, float* row_lse,
                               cudaStream_t stream) {
  if (M == 0 || N == 0) return Status::Ok();
  if (M > 0x7fffffff) return {StatusCode::kNotSupported, "row_softmax: more than 2^31-1 rows"};
  switch (dtype) {
    case ElementType::kFloat32:
      return launch<float>(layout, y, ldy, M, N, affine, out, ldo, row_lse, stream);
    case ElementType::kBFloat16:
      return launch<__nv_bfloat16>(layout, y, ldy, M, N, affine, out, ldo, row_lse, stream);
    case ElementType::kFloat16:
      return launch<__half>(layout, y, ldy, M, N, affine, out, ldo, row_lse, stream);
  }
  return {StatusCode::kInvalidArgument, "row_softmax: unknown dtype"};
}

Status row_softmax(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& affine, void* out,
                   int64_t ldo, ElementType dtype, float* row_lse, cudaStream_t stream) {
  return row_softmax_with_layout(row_softmax_layout(M, N), y, ldy, M, N, affine, out, ldo, dtype, row_lse, stream);
}

}  // namespace fused::cuda
