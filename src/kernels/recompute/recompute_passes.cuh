// The recompute path's tile kernel (kernels/recompute/recompute.h): one CTA per 128x128 tile of y,
// 8 warps of 32x64, the whole K of x's and W's tile rows in shared memory (cp.async), mma.sync with
// fp32 accumulation (bf16/fp16: m16n8k16 fed by ldmatrix; fp32: m16n8k8 TF32, operands rounded to
// nearest as the fragments are read), then the pass's epilogue on the tile held in registers.
// Included by one translation unit per input type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "fused/detail/bn_math.h"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/nan_max.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/recompute/recompute.h"
#include "util/cuda_check.h"
#include "util/device_info.h"

namespace fused::cuda::recompute {
namespace tile {

constexpr int kThreads = 256;  // warp w: rows 32 * (w / 2) .. +32, columns 64 * (w % 2) .. +64
constexpr int kTM = static_cast<int>(kTileM);
constexpr int kTN = static_cast<int>(kTileN);
constexpr int kStageRowPad = 8;  // elements after each staged out row: conflict-free 4- and 8-byte stores
// Shared memory of one stage at most: the two tiles of kMaxKBytes rows (padded), or the staged fp32
// out tile.
constexpr int kMaxStageBytes = 2 * kTM * (static_cast<int>(kMaxKBytes) / 4 + 4) * 4;
static_assert(kMaxStageBytes >= kTM * (kTN + kStageRowPad) * 4, "the staged fp32 out tile must fit");

// Row stride, in 32-bit words, of a tile row of x or W in shared memory: K padded to 8 words (one
// k-step), plus 4 words, so that the 8 rows one fragment load touches fall in distinct banks.
__host__ __device__ inline int row_words(int64_t K, int element_bytes) {
  const int64_t words = (K * element_bytes + 3) / 4;
  return static_cast<int>((words + 7) / 8 * 8 + 4);
}

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

// fp32 -> TF32, round to nearest (ties away from zero).
__device__ __forceinline__ uint32_t round_tf32(uint32_t bits) {
  uint32_t r = bits;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(__uint_as_float(bits)));
#endif
  return r;
}

// The tile's rows of a row-major (rows_total, K) operand into shared memory (row stride S words),
// 16-byte asynchronous copies (cp.async: every copy in flight at once, no registers held); rows past
// rows_left and columns past K are zero-filled. The caller commits the group, waits and synchronises.
template <class T>
__device__ __forceinline__ void copy_tile_rows(uint32_t* dst, const T* __restrict__ src, int64_t ld, int64_t rows_left,
                                               int64_t K, int S) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Thread i copies vector i % 16 of rows i / 16, i / 16 + 16, ...: a row holds at most 16 vectors
  // (kMaxKBytes), and no division by the row length.
  constexpr int kPerVec = 16 / static_cast<int>(sizeof(T));
  constexpr int kRowsPerPass = kThreads / 16;
  static_assert(kMaxKBytes <= 16 * 16, "a row's vectors exceed the 16 lanes of a row");
  const int cv = threadIdx.x & 15;
  if (cv >= (S - 4) / 4) return;
  const int64_t k0 = static_cast<int64_t>(cv) * kPerVec;
  const uint32_t dst0 = util::shared_address(dst + cv * 4);
#pragma unroll
  for (int i = 0; i < kTM / kRowsPerPass; ++i) {
    const int r = static_cast<int>(threadIdx.x >> 4) + i * kRowsPerPass;
    const bool in = r < rows_left && k0 < K;
    const T* from = in ? src + r * ld + k0 : src;  // a zero-byte copy still names a valid address
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst0 + static_cast<uint32_t>(r * S * 4)),
                 "l"(from), "r"(in ? 16 : 0)
                 : "memory");
  }
#endif
}

__device__ __forceinline__ void commit_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
#endif
}

template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (sizeof(T) == 4) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// acc[mi][ni] += the warp's 16x8 blocks of A B^T over the whole (padded) K: one k-step is 8 words
// (16 elements of 16 bits, or 8 TF32). Fragment layouts as PTX's mma.m16n8k16 / m16n8k8.
template <class T>
__device__ __forceinline__ void tile_product(float (&acc)[2][8][4], const uint32_t* As, const uint32_t* Bs, int S,
                                             int warp_m, int warp_n, int lane) {
  const int ksteps = (S - 4) / 8;
  if constexpr (sizeof(T) == 2) {
    const uint32_t a_base = util::shared_address(As), b_base = util::shared_address(Bs);
    // ldmatrix.x4: lane l gives the address of row l % 16 (A) or of n row (l / 16) * 8 + l % 8 (B).
    const int a_row = warp_m * 32 + (lane & 15), a_word = (lane >> 4) * 4;
    const int b_row = warp_n * 64 + ((lane >> 4) << 3) + (lane & 7), b_word = ((lane >> 3) & 1) * 4;
    for (int ks = 0; ks < ksteps; ++ks) {
      uint32_t a[2][4], b[8][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(a[mi], a_base + static_cast<uint32_t>(((a_row + mi * 16) * S + ks * 8 + a_word) * 4));
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {
        uint32_t r[4];
        ldmatrix_x4(r, b_base + static_cast<uint32_t>(((b_row + nj * 16) * S + ks * 8 + b_word) * 4));
        b[2 * nj][0] = r[0];
        b[2 * nj][1] = r[1];
        b[2 * nj + 1][0] = r[2];
        b[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) mma<T>(acc[mi][ni], a[mi], b[ni]);
    }
  } else {
    const int g = lane >> 2, t = lane & 3;
    for (int ks = 0; ks < ksteps; ++ks) {
      const int k = ks * 8 + t;
      uint32_t a[2][4], b[8][2];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        const int r0 = warp_m * 32 + mi * 16 + g;
        a[mi][0] = round_tf32(As[r0 * S + k]);
        a[mi][1] = round_tf32(As[(r0 + 8) * S + k]);
        a[mi][2] = round_tf32(As[r0 * S + k + 4]);
        a[mi][3] = round_tf32(As[(r0 + 8) * S + k + 4]);
      }
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        const int n = warp_n * 64 + ni * 8 + g;
        b[ni][0] = round_tf32(Bs[n * S + k]);
        b[ni][1] = round_tf32(Bs[n * S + k + 4]);
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 8; ++ni) mma<T>(acc[mi][ni], a[mi], b[ni]);
    }
  }
}

template <class TOut>
__device__ __forceinline__ void store_pair(TOut* dst, float v0, float v1) {
  if constexpr (std::is_same_v<TOut, float>) {
    *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
  } else if constexpr (std::is_same_v<TOut, __nv_bfloat16>) {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(v0, v1);
  } else {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(v0, v1);
  }
}

// Accumulator element (mi, ni, j) of lane (g, t) in warp (warp_m, warp_n) sits at tile row
// warp_m * 32 + mi * 16 + (j / 2) * 8 + g and tile column warp_n * 64 + ni * 8 + 2 t + j % 2.
__device__ __forceinline__ int acc_row(int warp_m, int mi, int j, int g) {
  return warp_m * 32 + mi * 16 + (j >> 1) * 8 + g;
}
__device__ __forceinline__ int acc_col(int warp_n, int ni, int j, int t) {
  return warp_n * 64 + ni * 8 + 2 * t + (j & 1);
}

// Words of one pipeline stage: x's and W's tile rows, or (out) the staged out tile if larger.
template <Pass kPass, class TOut>
__host__ __device__ inline int stage_words(int S) {
  const int operands = 2 * kTM * S;
  const int staged = kPass == Pass::kWriteOut ? kTM * (kTN + kStageRowPad) * static_cast<int>(sizeof(TOut)) / 4 : 0;
  return operands > staged ? operands : staged;
}

// Persistent CTAs walk the tiles (tile_m fastest: neighbouring CTAs share W's tile) with `stages`
// operand buffers: with two, the next tile's copies are in flight while this tile is multiplied and
// its epilogue runs.
template <class TIn, Pass kPass, class TOut>
__global__ void __launch_bounds__(kThreads, 2) recompute_pass_kernel(PassParams p, int tiles_m, int num_tiles,
                                                                     int stages) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(16) uint32_t smem[];
  // Per tile: the columns' bias and folded coefficients, the rows' max and 1 / sum ([R4]; [R1]: the
  // columns' means), and the cross-warp reductions.
  __shared__ __align__(8) float bias_s[kTN], shift_s[kTN], a_s[kTN], c_s[kTN];
  __shared__ float red[4][kTN];
  __shared__ float row_m[kTM], row_inv[kTM];
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp >> 1, warp_n = warp & 1, g = lane >> 2, t = lane & 3;
  const int S = row_words(p.K, sizeof(TIn));
  const int words = stage_words<kPass, TOut>(S);
  auto issue = [&](int tile, int stage) {
    const int64_t m0 = static_cast<int64_t>(tile % tiles_m) * kTM, n0 = static_cast<int64_t>(tile / tiles_m) * kTN;
    uint32_t* As = smem + stage * words;
    copy_tile_rows(As, static_cast<const TIn*>(p.x) + m0 * p.ldx, p.ldx, p.M - m0, p.K, S);
    copy_tile_rows(As + kTM * S, static_cast<const TIn*>(p.w) + n0 * p.ldw, p.ldw, p.N - n0, p.K, S);
    commit_copies();
  };
  // The per-tile vectors (threads < 128: one column and one row each) are read one tile ahead into
  // registers, so their global loads never wait at the top of a tile.
  struct TileVectors {
    float bias = 0.f, shift = 0.f, a = 0.f, c = 0.f, row_max = 0.f, row_inv = 0.f;
  };
  auto read_vectors = [&](int tile) {
    TileVectors v;
    if (tid >= kTN || tile >= num_tiles) return v;
    const int64_t m0 = static_cast<int64_t>(tile % tiles_m) * kTM, n0 = static_cast<int64_t>(tile / tiles_m) * kTN;
    const int64_t col = n0 + tid, row = m0 + tid;
    if (col < p.N) {
      if (p.bias != nullptr) v.bias = to_float(static_cast<const TIn*>(p.bias)[col]);
      if constexpr (kPass != Pass::kColumnPartials) {
        v.shift = p.affine.shift[col];
        v.a = p.affine.a[col];
        v.c = p.affine.c[col];
      }
    }
    if constexpr (kPass == Pass::kWriteOut) {
      if (row < p.M) {
        v.row_max = p.row_stats[2 * row];
        v.row_inv = p.row_stats[2 * row + 1];
      }
    }
    return v;
  };
  TileVectors vectors = read_vectors(blockIdx.x);
  if (static_cast<int>(blockIdx.x) < num_tiles) issue(blockIdx.x, 0);
  for (int tile = blockIdx.x, it = 0; tile < num_tiles; tile += gridDim.x, ++it) {
    const int stage = stages == 2 ? (it & 1) : 0;
    const int next = tile + static_cast<int>(gridDim.x);
    const bool prefetch = stages == 2 && next < num_tiles;
    if (prefetch) issue(next, stage ^ 1);
    const int64_t m0 = static_cast<int64_t>(tile % tiles_m) * kTM, n0 = static_cast<int64_t>(tile / tiles_m) * kTN;
    const int64_t rows_here = std::min<int64_t>(kTM, p.M - m0);
    if (tid < kTN) {
      bias_s[tid] = vectors.bias;
      shift_s[tid] = vectors.shift;
      a_s[tid] = vectors.a;
      c_s[tid] = vectors.c;
      row_m[tid] = vectors.row_max;
      row_inv[tid] = vectors.row_inv;
    }
    vectors = read_vectors(next);
    if (prefetch) {
      asm volatile("cp.async.wait_group 1;" ::: "memory");  // this tile's copies; the next tile's may fly
    } else {
      wait_copies();
    }
    __syncthreads();

    float acc[2][8][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
      for (int ni = 0; ni < 8; ++ni)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[mi][ni][j] = 0.f;
    uint32_t* As = smem + stage * words;
    tile_product<TIn>(acc, As, As + kTM * S, S, warp_m, warp_n, lane);

    // y, then (R2, R4) the logits, one column pair's vectors at a time (columns past N: -inf).
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) {
      const int col = acc_col(warp_n, ni, 0, t);  // even: the pair (col, col + 1)
      const float2 bias = *reinterpret_cast<const float2*>(bias_s + col);
      float2 shift = make_float2(0.f, 0.f), a = shift, c = shift;
      if constexpr (kPass != Pass::kColumnPartials) {
        shift = *reinterpret_cast<const float2*>(shift_s + col);
        a = *reinterpret_cast<const float2*>(a_s + col);
        c = *reinterpret_cast<const float2*>(c_s + col);
      }
      const bool in0 = n0 + col < p.N, in1 = n0 + col + 1 < p.N;
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& v0 = acc[mi][ni][2 * h];
          float& v1 = acc[mi][ni][2 * h + 1];
          v0 += bias.x;
          v1 += bias.y;
          if constexpr (kPass != Pass::kColumnPartials) {
            v0 = in0 ? detail::bn_logit(v0, shift.x, a.x, c.x) : -INFINITY;
            v1 = in1 ? detail::bn_logit(v1, shift.y, a.y, c.y) : -INFINITY;
          }
        }
    }

    if constexpr (kPass == Pass::kColumnPartials) {
      // The tile's column means, then sums of squared deviations from them (two passes over the
      // registers); rows past M count nothing. Fixed reduction order: deterministic.
      float* col_mean = row_m;
#pragma unroll
      for (int step = 0; step < 2; ++step) {
#pragma unroll
        for (int ni = 0; ni < 8; ++ni)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int col = acc_col(warp_n, ni, e, t);
            const float mean = step == 0 ? 0.f : col_mean[col];
            float s = 0.f;
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                if (acc_row(warp_m, mi, 2 * h, g) < rows_here) {
                  const float v = acc[mi][ni][2 * h + e];
                  s += step == 0 ? v : (v - mean) * (v - mean);
                }
              }
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            s += __shfl_xor_sync(0xffffffffu, s, 8);
            s += __shfl_xor_sync(0xffffffffu, s, 16);
            if (g == 0) red[warp_m][col] = s;
          }
        __syncthreads();
        if (tid < kTN) {
          const float total = ((red[0][tid] + red[1][tid]) + red[2][tid]) + red[3][tid];
          if (step == 0) {
            col_mean[tid] = total / static_cast<float>(rows_here);
          } else if (n0 + tid < p.N) {
            const int64_t slot = (m0 / kTM) * p.partials.ld + n0 + tid;
            p.partials.mean[slot] = col_mean[tid];
            p.partials.m2[slot] = total;
          }
        }
        __syncthreads();
      }
    } else if constexpr (kPass == Pass::kRowPartials) {
      // Each row's max over the tile's columns (red rows 0-1: one per warp column half), then its
      // sum of exp(z - max) (red rows 2-3). The max keeps NaN: a tile row of NaN only would
      // otherwise leave max -inf and add 0, and the row would come out NaN at those columns only.
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = -INFINITY;
#pragma unroll
          for (int ni = 0; ni < 8; ++ni)
            mx = util::max_nan(mx, util::max_nan(acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]));
          mx = util::max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = util::max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          if (t == 0) red[warp_n][acc_row(warp_m, mi, 2 * h, g)] = mx;
        }
      __syncthreads();
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = acc_row(warp_m, mi, 2 * h, g);
          const float mx = util::max_nan(red[0][row], red[1][row]);
          float s = 0.f;
          if (mx != -INFINITY) {  // a row of -inf logits adds 0, not exp(nan)
#pragma unroll
            for (int ni = 0; ni < 8; ++ni) s += expf(acc[mi][ni][2 * h] - mx) + expf(acc[mi][ni][2 * h + 1] - mx);
          }
          s += __shfl_xor_sync(0xffffffffu, s, 1);
          s += __shfl_xor_sync(0xffffffffu, s, 2);
          if (t == 0) red[2 + warp_n][row] = s;
        }
      __syncthreads();
      if (tid < rows_here) {
        float* pair = p.row_parts + 2 * ((n0 / kTN) * p.M + m0 + tid);
        pair[0] = util::max_nan(red[0][tid], red[1][tid]);
        pair[1] = red[2][tid] + red[3][tid];
      }
    } else {
      // out = exp(z - max) / sum, staged through this stage's buffer (free once every warp is past
      // its product) for 16-byte stores along out's rows.
      constexpr int kRowStride = kTN + kStageRowPad;
      __syncthreads();
      TOut* staged = reinterpret_cast<TOut*>(As);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = acc_row(warp_m, mi, 2 * h, g);
          const float mx = row_m[row], inv = row_inv[row];
#pragma unroll
          for (int ni = 0; ni < 8; ++ni)
            store_pair(staged + row * kRowStride + acc_col(warp_n, ni, 0, t), expf(acc[mi][ni][2 * h] - mx) * inv,
                       expf(acc[mi][ni][2 * h + 1] - mx) * inv);
        }
      __syncthreads();
      constexpr int kPerVec = 16 / static_cast<int>(sizeof(TOut));
      constexpr int kVecsPerRow = kTN / kPerVec;
      TOut* out = static_cast<TOut*>(p.out);
      const bool vec =
          (reinterpret_cast<uintptr_t>(out) & 15u) == 0 && (p.ldo * static_cast<int64_t>(sizeof(TOut))) % 16 == 0;
      for (int v = tid; v < kTM * kVecsPerRow; v += kThreads) {
        const int r = v / kVecsPerRow, cv = v % kVecsPerRow;
        const int64_t col = n0 + static_cast<int64_t>(cv) * kPerVec;
        if (r >= rows_here || col >= p.N) continue;
        const TOut* src = staged + r * kRowStride + cv * kPerVec;
        TOut* dst = out + (m0 + r) * p.ldo + col;
        if (vec && col + kPerVec <= p.N) {
          *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
          for (int e = 0; e < kPerVec && col + e < p.N; ++e) dst[e] = src[e];
        }
      }
    }
    __syncthreads();  // the per-tile vectors and this stage are free for the next tiles
    if (stages == 1 && next < num_tiles) issue(next, 0);
  }
#else
  __trap();  // never launched below sm80 (choose_path)
#endif
}

// The most dynamic shared memory a pass launches with: two stages of the largest K's operands or of
// the staged fp32 out tile.
constexpr int kMaxDynamicSharedBytes = 2 * kMaxStageBytes;

template <class TIn, Pass kPass, class TOut>
Status launch(const PassParams& p, cudaStream_t stream) {
  auto* kernel = recompute_pass_kernel<TIn, kPass, TOut>;
  const int device = util::detail::current_device();
  if (device < 0 || device >= util::kMaxCachedDevices) return {StatusCode::kCudaError, "recompute pass: no device"};
  int sms = 0;
  FUSED_RETURN_IF_ERROR(util::sm_count(device, sms));
  // Above 48 KiB of dynamic shared memory a kernel must opt in: once per device, for the most it uses.
  const int opted_in = util::detail::cached_per_device(device, [kernel](int) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxDynamicSharedBytes) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return 1;
  });
  if (opted_in <= 0) return {StatusCode::kCudaError, "recompute pass: cudaFuncSetAttribute(shared memory) failed"};
  // Resident CTAs per SM for each (stages, row stride) this kernel can take, cached per device.
  const int S = row_words(p.K, sizeof(TIn));
  const int stage_bytes = stage_words<kPass, TOut>(S) * 4;
  static std::atomic<int> resident[util::kMaxCachedDevices][2][kMaxStageBytes / (2 * kTM * 4 * 8) + 2] = {};
  auto ctas_per_sm = [&](int stages) {
    std::atomic<int>& slot = resident[device][stages - 1][(S - 4) / 8];
    int ctas = slot.load(std::memory_order_relaxed);
    if (ctas > 0) return ctas;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, kThreads, stages * stage_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    slot.store(ctas, std::memory_order_relaxed);
    return ctas;
  };
  // Two stages (the next tile's copies in flight) where two CTAs still fit on an SM; else one stage.
  int stages = 2, per_sm = ctas_per_sm(2);
  if (per_sm < 2) stages = 1, per_sm = ctas_per_sm(1);
  if (per_sm <= 0) return {StatusCode::kCudaError, "recompute pass: occupancy query failed"};
  const int64_t tiles_m = util::ceil_div(p.M, kTileM);
  const int64_t tiles = num_tiles(p.M, p.N);  // <= kMaxTiles (run_pass)
  const int64_t grid = std::min<int64_t>(tiles, int64_t{sms} * per_sm);
  return util::launch_dependent(kernel, dim3(static_cast<unsigned>(grid)), dim3(kThreads),
                                static_cast<size_t>(stages * stage_bytes), stream, "recompute pass kernel launch", p,
                                static_cast<int>(tiles_m), static_cast<int>(tiles), stages);
}

template <class TIn>
Status run_pass_typed(Pass pass, const PassParams& p, cudaStream_t stream) {
  switch (pass) {
    case Pass::kColumnPartials:
      return launch<TIn, Pass::kColumnPartials, float>(p, stream);
    case Pass::kRowPartials:
      return launch<TIn, Pass::kRowPartials, float>(p, stream);
    case Pass::kWriteOut:
      switch (p.out_dtype) {
        case ElementType::kFloat32: return launch<TIn, Pass::kWriteOut, float>(p, stream);
        case ElementType::kBFloat16: return launch<TIn, Pass::kWriteOut, __nv_bfloat16>(p, stream);
        case ElementType::kFloat16: return launch<TIn, Pass::kWriteOut, __half>(p, stream);
        default: break;
      }
      return {StatusCode::kInvalidArgument, "recompute pass: unsupported out dtype"};
  }
  return {StatusCode::kInvalidArgument, "recompute pass: unknown pass"};
}

}  // namespace tile
}  // namespace fused::cuda::recompute
