// [3] Row softmax of the BatchNorm logits: out[i, :] = softmax(a * (y[i, :] - shift) + c).
//
// Rows up to 8192 wide (16-byte aligned): softmax_rows_blocked. A persistent grid (one wave); each
// CTA keeps the folded BatchNorm coefficients of the whole row width in registers, loaded once, and
// walks rows two at a time: one read of y, one write of out, 16-byte accesses, one block reduction
// per row pair. (One CTA per row would re-read the three coefficient vectors for every row: three
// times the bytes of y, from L2.)
// Wider or unaligned rows: one CTA per row. Rows up to 1024 * 4 * 8 elements stay in registers;
// wider rows (up to any N) take the streaming kernel: an online max/sum pass, then a pass that
// re-reads y (mostly from L2) and writes out. Every kernel also writes the row's log-normaliser
// for the backward, and is launched as a programmatic dependent of finalize (kernels/common/pdl.cuh).
// The row max is subtracted; NaN and +-inf propagate as in torch.softmax. expf (not the
// approximate __expf) keeps exact-fp32 mode within 1e-5; the kernel is memory-bound anyway.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>

#include "fused/detail/bn_math.h"
#include "fused/gemm_bn_softmax.h"
#include "kernels/common/block_reduce.cuh"
#include "util/cuda_check.h"
#include "util/device_info.h"
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

// Max or sum over a warp by butterfly: every lane gets the same bits.
template <bool kMax>
__device__ __forceinline__ float warp_reduce(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  return v;
}

// Rows blocked in a persistent CTA; thread t owns columns (v * kThreads + t) * 4 + [0, 4), v < kVecs.
// Requires N <= kThreads * 4 * kVecs and 16-byte aligned rows of y and out-rows aligned to 4 elements.
template <int kThreads, int kVecs, int kRows, class TOut>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_blocked(const float* __restrict__ y, int64_t ldy, int64_t M, int64_t N, ColumnAffine f,
                         TOut* __restrict__ out, int64_t ldo, float* __restrict__ row_lse) {
  constexpr int kWarps = kThreads / 32;
  // Per-warp partials of the row block; each phase's array is rewritten only after a barrier that
  // follows every read of it, so one array per phase suffices.
  __shared__ float warp_max[kRows][kWarps], warp_sum[kRows][kWarps];
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float4 shift[kVecs], a[kVecs], c[kVecs];
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
    shift[v] = a[v] = c[v] = make_float4(0.f, 0.f, 0.f, 0.f);  // columns past N are never used
    if (col + 4 <= N) {
      shift[v] = *reinterpret_cast<const float4*>(f.shift + col);
      a[v] = *reinterpret_cast<const float4*>(f.a + col);
      c[v] = *reinterpret_cast<const float4*>(f.c + col);
    } else if (col < N) {  // the row's ragged end (N % 4 != 0)
      float sv[4] = {0.f, 0.f, 0.f, 0.f}, av[4] = {0.f, 0.f, 0.f, 0.f}, cv[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (col + j < N) sv[j] = f.shift[col + j], av[j] = f.a[col + j], cv[j] = f.c[col + j];
      shift[v] = make_float4(sv[0], sv[1], sv[2], sv[3]);
      a[v] = make_float4(av[0], av[1], av[2], av[3]);
      c[v] = make_float4(cv[0], cv[1], cv[2], cv[3]);
    }
  }
  for (int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows; row0 < M;
       row0 += static_cast<int64_t>(gridDim.x) * kRows) {
    float4 e[kRows][kVecs];
    float row_max[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + r;
      float mx = -INFINITY;
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
        float4 z = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
        if (row < M && col < N) {
          if (col + 4 <= N) {
            const float4 y4 = __ldcs(reinterpret_cast<const float4*>(y + row * ldy + col));  // read once
            z.x = detail::bn_logit(y4.x, shift[v].x, a[v].x, c[v].x);
            z.y = detail::bn_logit(y4.y, shift[v].y, a[v].y, c[v].y);
            z.z = detail::bn_logit(y4.z, shift[v].z, a[v].z, c[v].z);
            z.w = detail::bn_logit(y4.w, shift[v].w, a[v].w, c[v].w);
          } else {
            const float* yr = y + row * ldy;
            const float s4[4] = {shift[v].x, shift[v].y, shift[v].z, shift[v].w};
            const float a4[4] = {a[v].x, a[v].y, a[v].z, a[v].w};
            const float c4[4] = {c[v].x, c[v].y, c[v].z, c[v].w};
            float zz[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) zz[j] = col + j < N ? detail::bn_logit(yr[col + j], s4[j], a4[j], c4[j]) : -INFINITY;
            z = make_float4(zz[0], zz[1], zz[2], zz[3]);
          }
        }
        e[r][v] = z;
        mx = fmaxf(mx, max4(z));
      }
      row_max[r] = warp_reduce<true>(mx);
      if (lane == 0) warp_max[r][warp] = row_max[r];
    }
    __syncthreads();
    float row_sum[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // every warp reduces the warps' maxima the same way: the same bits in every thread
      row_max[r] = warp_reduce<true>(lane < kWarps ? warp_max[r][lane] : -INFINITY);
      float sum = 0.f;
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        e[r][v] = make_float4(expf(e[r][v].x - row_max[r]), expf(e[r][v].y - row_max[r]), expf(e[r][v].z - row_max[r]),
                              expf(e[r][v].w - row_max[r]));
        sum += (e[r][v].x + e[r][v].y) + (e[r][v].z + e[r][v].w);
      }
      row_sum[r] = warp_reduce<false>(sum);
      if (lane == 0) warp_sum[r][warp] = row_sum[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = row0 + r;
      const float total = warp_reduce<false>(lane < kWarps ? warp_sum[r][lane] : 0.f);
      if (row >= M) break;
      if (row_lse != nullptr && threadIdx.x == 0) row_lse[row] = detail::log_normaliser(row_max[r], total);
      const float inv = 1.f / total;
      TOut* orow = out + row * ldo;
#pragma unroll
      for (int v = 0; v < kVecs; ++v) {
        const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
        if (col < N)
          store4<true>(orow, col, N, make_float4(e[r][v].x * inv, e[r][v].y * inv, e[r][v].z * inv, e[r][v].w * inv));
      }
    }
  }
}

// One wave of the persistent kernel: CTAs per SM (occupancy, queried once) times the SMs.
template <class Kernel>
Status persistent_grid(Kernel kernel, int threads, int64_t work_items, unsigned& grid) {
  static std::atomic<int> blocks_per_sm{0};
  int per_sm = blocks_per_sm.load(std::memory_order_relaxed);
  if (per_sm == 0) {
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0),
                                            "row_softmax: occupancy query failed"));
    if (per_sm <= 0) return {StatusCode::kCudaError, "row_softmax: kernel cannot be resident"};
    blocks_per_sm.store(per_sm, std::memory_order_relaxed);
  }
  int device = 0, sms = 0;
  FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "row_softmax: cudaGetDevice failed"));
  FUSED_RETURN_IF_ERROR(util::sm_count(device, sms));
  grid = static_cast<unsigned>(std::min<int64_t>(work_items, static_cast<int64_t>(per_sm) * sms));
  return Status::Ok();
}

template <int kThreads, int kVecs, class TOut>
Status launch_blocked(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f, TOut* out, int64_t ldo,
                      float* row_lse, cudaStream_t stream) {
  constexpr int kRows = 2;
  auto kernel = softmax_rows_blocked<kThreads, kVecs, kRows, TOut>;
  unsigned grid = 0;
  FUSED_RETURN_IF_ERROR(persistent_grid(kernel, kThreads, util::ceil_div(M, kRows), grid));
  return util::launch_dependent(kernel, dim3(grid), dim3(kThreads), 0, stream, "row_softmax kernel launch", y, ldy, M,
                                N, f, out, ldo, row_lse);
}

template <bool kVec, class TOut>
Status launch_typed(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f, TOut* out, int64_t ldo,
                    float* row_lse, cudaStream_t stream) {
  if constexpr (kVec) {
    // Blocked rows (coefficients loaded once per CTA): 2 float4 per thread, up to 1024 threads.
    if (N <= 128 * 4 * 2) return launch_blocked<128, 2>(y, ldy, M, N, f, out, ldo, row_lse, stream);
    if (N <= 256 * 4 * 2) return launch_blocked<256, 2>(y, ldy, M, N, f, out, ldo, row_lse, stream);
    if (N <= 512 * 4 * 2) return launch_blocked<512, 2>(y, ldy, M, N, f, out, ldo, row_lse, stream);
    if (N <= 1024 * 4 * 2) return launch_blocked<1024, 2>(y, ldy, M, N, f, out, ldo, row_lse, stream);
  }
  const dim3 grid(static_cast<unsigned>(M));
  const char* what = "row_softmax kernel launch";
  // One CTA per row; registers path while kThreads * 4 * kVecs >= N.
  if (N <= 128 * 4 * 1)
    return util::launch_dependent(softmax_rows_in_registers<128, 1, kVec, TOut>, grid, 128, 0, stream, what, y, ldy, N,
                                  f, out, ldo, row_lse);
  if (N <= 256 * 4 * 2)
    return util::launch_dependent(softmax_rows_in_registers<256, 2, kVec, TOut>, grid, 256, 0, stream, what, y, ldy, N,
                                  f, out, ldo, row_lse);
  if (N <= 256 * 4 * 4)
    return util::launch_dependent(softmax_rows_in_registers<256, 4, kVec, TOut>, grid, 256, 0, stream, what, y, ldy, N,
                                  f, out, ldo, row_lse);
  if (N <= 256 * 4 * 8)
    return util::launch_dependent(softmax_rows_in_registers<256, 8, kVec, TOut>, grid, 256, 0, stream, what, y, ldy, N,
                                  f, out, ldo, row_lse);
  if (N <= 512 * 4 * 8)
    return util::launch_dependent(softmax_rows_in_registers<512, 8, kVec, TOut>, grid, 512, 0, stream, what, y, ldy, N,
                                  f, out, ldo, row_lse);
  if (N <= 1024 * 4 * 8)
    return util::launch_dependent(softmax_rows_in_registers<1024, 8, kVec, TOut>, grid, 1024, 0, stream, what, y, ldy,
                                  N, f, out, ldo, row_lse);
  return util::launch_dependent(softmax_rows_streaming<1024, kVec, TOut>, grid, 1024, 0, stream, what, y, ldy, N, f,
                                out, ldo, row_lse);
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
