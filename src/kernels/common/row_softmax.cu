// [3] Row softmax of the BatchNorm logits: out[i, :] = softmax(a * (y[i, :] - shift) + c).
//
// Rows up to 1024 * 4 * 8 elements stay in registers: one read of y, one write of out, 16-byte
// accesses. Two kernels hold them:
//  - staged (sm90, 16-byte aligned rows of N % 4 == 0, N <= 8192): persistent CTAs; one bulk copy
//    (TMA) brings a CTA's next row of y into shared memory while the CTA reduces, exponentiates and
//    stores the row it holds in registers, so every SM keeps y's loads in flight between rows; each
//    column's coefficients come from registers, L1, or shared memory (CoefSource);
//  - in registers (everything else): one CTA per row, its loads issued at once.
// Rows of 16385 to 131072 columns (sm90, aligned rows) are split over a thread-block cluster of 3 to
// 16 CTAs of the staged kernel (its kClustered form), each holding its part as it holds a row, the
// row's max and sum exchanged through distributed shared memory: still one read of y. Wider rows, and
// wide rows the clusters cannot take, go to one CTA per row in registers up to 32768 columns, then to
// the streaming kernel: an online max/sum pass, then a pass that re-reads y and writes out. Every kernel also writes the
// row's log-normaliser for the backward, and is launched as a programmatic dependent of finalize
// (kernels/common/pdl.cuh).
// y alone is read before the kernel's wait for finalize: finalize lets the softmax launch only after
// its own wait, so whatever wrote y (the GEMM, or any kernel before finalize) has completed by the
// time a softmax CTA runs. Reading the first rows during finalize's few microseconds took 2-4 us
// off the op on the H200 (1-2 %, every shape measured); the coefficients, finalize's output, are
// read after the wait as the PDL contract says.
// A layout (threads, float4 per thread) fixes the order of a row's reductions; staged or not, it
// gives the same bits, so the choice between the two (by M) never changes results; nor does M change
// the clustered kernel's bits. Each row's two block reductions use a barrier each (no leading one:
// RowReduceBuffers): 1-2 % off the one-CTA-per-row kernels on the H200, the op level or up to 1 %
// faster, the same bits.
// (Measured slower on the H200 and removed: a persistent CTA of 1024 threads keeping the folded
// coefficients in registers, 23.7 vs 18.8 us at 1024x8192; CTAs of 2 or 4 rows sharing one load of
// the coefficients, 28 vs 21 us: the coefficients come from L1, and fewer CTAs hide less latency;
// 1024 threads x 2 float4 at N = 8192, 13-60 % slower than 512 x 4.)
// The row max is subtracted; NaN and +-inf propagate as in torch.softmax. Exponentials: row_exp.
#include <algorithm>
#include <atomic>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "api/forward_steps.h"
#include "fused/detail/bn_math.h"
#include "fused/gemm_bn_softmax.h"
#include "kernels/common/block_reduce.cuh"
#include "kernels/common/bulk_copy.cuh"
#include "kernels/common/cluster.cuh"
#include "kernels/common/nan_max.cuh"
#include "kernels/common/out_convert.cuh"
#include "kernels/common/pdl.cuh"
#include "util/cuda_check.h"
#include "util/device_info.h"

namespace fused::cuda {
namespace {

using util::block_reduce;

// The folded coefficients of 4 columns starting at col (col % 4 == 0); columns >= N give 0.
struct Coefs4 {
  float4 shift, a, c;
};
// 4 entries of a per-column vector from col; columns >= N give 0.
template <bool kVec>
__device__ __forceinline__ float4 load_column4(const float* __restrict__ v, int64_t col, int64_t N) {
  if (kVec && col + 4 <= N) return *reinterpret_cast<const float4*>(v + col);
  float e[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) e[j] = col + j < N ? v[col + j] : 0.f;
  return make_float4(e[0], e[1], e[2], e[3]);
}

// With f.shift_folded (the map is z = a y + c, shift 0), two loads instead of three: the softmax
// kernels issue on most of their cycles, and the coefficients' loads, re-read every row, were a fifth
// of the 512 x 4 staged kernel's time (H200, 1024x8192 bf16 out: 19.6 us with three, 17.3 with two,
// 15.7 with none; probes). The flag is the call's, the same for every thread: no load waits on a test.
// (Folding per column, with the exact map for the groups holding a column the fold cannot keep, made
// each group's loads wait for the previous group's test: 10 % slower at 1024x4096.)
template <bool kVec>
__device__ __forceinline__ Coefs4 load_coefs(const ColumnAffine& f, int64_t col, int64_t N) {
  const float4 shift = f.shift_folded ? make_float4(0.f, 0.f, 0.f, 0.f) : load_column4<kVec>(f.shift, col, N);
  return {shift, load_column4<kVec>(f.a, col, N), load_column4<kVec>(f.c, col, N)};
}

__device__ __forceinline__ float4 logits4(float4 y4, const Coefs4& k) {
  return make_float4(detail::bn_logit(y4.x, k.shift.x, k.a.x, k.c.x), detail::bn_logit(y4.y, k.shift.y, k.a.y, k.c.y),
                     detail::bn_logit(y4.z, k.shift.z, k.a.z, k.c.z), detail::bn_logit(y4.w, k.shift.w, k.a.w, k.c.w));
}

// The 4 values of y at column col of a row; columns >= N give 0 (logits_of() makes them -inf).
template <bool kVec>
__device__ __forceinline__ float4 load_y4(const float* __restrict__ yrow, int64_t col, int64_t N) {
  if (kVec && col + 4 <= N) return *reinterpret_cast<const float4*>(yrow + col);
  float v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = col + j < N ? yrow[col + j] : 0.f;
  return make_float4(v[0], v[1], v[2], v[3]);
}

// The logits of the 4 values of y at column col (< N); columns >= N give -inf.
__device__ __forceinline__ float4 logits_of(float4 y4, int64_t col, int64_t N, const Coefs4& k) {
  float4 z = logits4(y4, k);
  if (col + 4 > N) {
    if (col + 1 >= N) z.y = -INFINITY;
    if (col + 2 >= N) z.z = -INFINITY;
    if (col + 3 >= N) z.w = -INFINITY;
  }
  return z;
}

// The 4 logits of one row at column col (< N), read from y and the coefficients; columns >= N give -inf.
template <bool kVec>
__device__ __forceinline__ float4 load_logits(const float* __restrict__ yrow, int64_t col, int64_t N,
                                              const ColumnAffine& f) {
  return logits_of(load_y4<kVec>(yrow, col, N), col, N, load_coefs<kVec>(f, col, N));
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

// nn.BatchNorm1d's num_batches_tracked (or null) counts this batch: one thread of the grid, after
// wait_for_prerequisites (finalize, which reads the count, has completed).
__device__ __forceinline__ void count_batch_once(int64_t* counter) {
  if (counter != nullptr && blockIdx.x == 0 && threadIdx.x == 0) *counter += 1;
}

// The exponential of a row's logit less its max (x <= 0). For 16-bit outputs __expf (ex2.approx:
// about 2 ulp plus 1.2 ulp per unit of |x|, far below the output's rounding) takes the instructions of
// expf's range reduction off a kernel that issues on 60 % of its cycles (ncu, 4096x8192 bf16); fp32
// outputs (tf32, exact fp32, 3xtf32) keep expf, the op's error bounds there being 1e-5 and below.
template <class TOut>
__device__ __forceinline__ float row_exp(float x) {
  if constexpr (sizeof(TOut) == 2)
    return __expf(x);
  else
    return expf(x);
}

// A row held by one CTA: the CTA's max and sum are the row's.
struct WithinCta {
  template <bool kMax>
  __device__ float reduce(float cta_value) const { return cta_value; }
};

// Shared memory of a row's two block reductions, a buffer each, so that neither needs a leading
// barrier (block_reduce's kGuarded): the max's buffer is written again only after the sum's barrier,
// which every thread reaches after reading it, and the sum's only after the next row's max barrier.
struct RowReduceBuffers {
  float max[32], sum[32];
};

// Where a staged CTA's per-column coefficients come from, row after row:
//  - kReloaded: global memory (L1) for every row, 8-12 B a column;
//  - kResident: registers, loaded once per CTA;
//  - kShared: shared memory, the folded map's a and c (ColumnAffine::shift_folded) brought in by two bulk
//    copies once per CTA, beside the row buffer. For 512 x 4 (rows of 4097-8192 columns), whose
//    coefficients do not fit in registers (82 registers, one CTA per SM), where the CTAs walk enough
//    rows (shares_coefficients).
enum class CoefSource { kReloaded, kResident, kShared };

// FUSED_SOFTMAX_SHARED_COEFS=0 keeps kReloaded for the folded map too, for A/B runs (bench/cpp/variants.sh).
#ifndef FUSED_SOFTMAX_SHARED_COEFS
#define FUSED_SOFTMAX_SHARED_COEFS 1
#endif

// Whether a staged layout that can take its folded coefficients from shared memory does so for M rows on
// `sms` SMs: each CTA's 64 KiB copy of them pays once it walks about six rows or more (two CTAs per SM). H200,
// 512 x 4, bf16 out, folded, kShared against kReloaded (bench_row_softmax, us): 1024x8192 21.0 against
// 18.8, 1024x6000 17.9 against 14.7, 2048x8192 level (35.3), 4096x8192 59.7 against 61.2, 16384x8192
// 202.6 against 212.6.
constexpr bool shares_coefficients(int64_t M, int sms) { return FUSED_SOFTMAX_SHARED_COEFS && M >= 12 * int64_t{sms}; }

// Dynamic shared memory of a staged kernel: kShared's a and c.
constexpr int shared_coef_bytes(int threads, int vecs, CoefSource coefs) {
  return coefs == CoefSource::kShared ? 2 * threads * vecs * 16 : 0;
}

// The second half of a row held in registers (kVecs float4 per thread from column col0, this thread's
// max so far): the row max and sum over the CTA (and `across` the CTAs sharing the row), the
// log-normaliser, and out. Columns >= N hold -inf.
template <int kThreads, int kVecs, bool kVec, class TOut, class Across = WithinCta>
__device__ __forceinline__ void finish_row(float4 (&z)[kVecs], float mx, int64_t row, int64_t N, TOut* __restrict__ out,
                                           int64_t ldo, float* __restrict__ row_lse, RowReduceBuffers& smem,
                                           const Across& across = {}, int64_t col0 = 0) {
  mx = across.template reduce<true>(block_reduce<kThreads, true, false>(mx, smem.max));
  float sum = 0.f;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    z[v].x = row_exp<TOut>(z[v].x - mx);
    z[v].y = row_exp<TOut>(z[v].y - mx);
    z[v].z = row_exp<TOut>(z[v].z - mx);
    z[v].w = row_exp<TOut>(z[v].w - mx);
    sum += (z[v].x + z[v].y) + (z[v].z + z[v].w);
  }
  sum = across.template reduce<false>(block_reduce<kThreads, false, false>(sum, smem.sum));
  if (row_lse != nullptr && threadIdx.x == 0) row_lse[row] = detail::log_normaliser(mx, sum);
  const float inv = 1.f / sum;
  TOut* orow = out + row * ldo;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t col = col0 + (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
    if (col < N)
      store4<kVec>(orow, col, N, make_float4(z[v].x * inv, z[v].y * inv, z[v].z * inv, z[v].w * inv));
  }
}

// One CTA per row, held in registers: kVecs float4 per thread.
template <int kThreads, int kVecs, bool kVec, class TOut>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_in_registers(const float* __restrict__ y, int64_t ldy, int64_t N, ColumnAffine f,
                              TOut* __restrict__ out, int64_t ldo, float* __restrict__ row_lse,
                              int64_t* batch_counter) {
  __shared__ RowReduceBuffers smem;
  const int64_t row = blockIdx.x;
  const float* yrow = y + row * ldy;
  float4 z[kVecs];
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {  // y before the wait (row_softmax's contract)
    const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
    if (col < N) z[v] = load_y4<kVec>(yrow, col, N);
  }
  util::wait_for_prerequisites();  // finalize's coefficients
  util::allow_dependents_to_launch();
  count_batch_once(batch_counter);
  float mx = -INFINITY;
#pragma unroll
  for (int v = 0; v < kVecs; ++v) {
    const int64_t col = (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
    z[v] = col < N ? logits_of(z[v], col, N, load_coefs<kVec>(f, col, N))
                   : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    mx = fmaxf(mx, max4(z[v]));
  }
  finish_row<kThreads, kVecs, kVec>(z, mx, row, N, out, ldo, row_lse, smem);
}

// The CTAs of a thread-block cluster sharing each row. Each CTA sends its max (then its sum) into
// its own slot of every CTA's shared memory by st.async, which completes 4 bytes of a transaction on
// the receiving CTA's mbarrier; each CTA waits on its own mbarrier for all `ctas` values, then lane r
// of every warp takes slot r and a fixed shuffle tree combines them, so every thread of every CTA gets
// the same bits. No cluster-wide barrier: a release barrier would wait for the CTA's earlier global
// stores (the previous row's out), which made a first version with barriers 1.6x slower (H200).
// Slots and mbarriers alternate by row parity: a CTA sends row r + 2's max only after it has every
// CTA's row r + 1 sum, each sent after that CTA's block barrier that follows all its threads' reading
// of row r's max; the sums likewise.
struct AcrossCluster {
  float* slots;    // [max, sum][row parity][kMaxSoftmaxClusterCtas]
  uint64_t* bars;  // [max, sum][row parity]
  unsigned ctas, rank;
  uint32_t rows_done;  // by this CTA

  template <bool kMax>
  __device__ float reduce(float cta_value) const {
    // A cluster of one (row_softmax_with_layout at N <= 8192) has nobody to exchange with; st.async
    // needs a cluster of two or more.
    if (ctas == 1) return cta_value;
    const int k = (kMax ? 0 : 2) + int(rows_done & 1u);
    float* slot = slots + k * kMaxSoftmaxClusterCtas;
    uint64_t* bar = bars + k;
    if (threadIdx.x < ctas)
      util::store_async_to_cta(util::cluster_address(slot + rank, threadIdx.x), cta_value,
                               util::cluster_address(bar, threadIdx.x));
    if (threadIdx.x == 0) util::mbarrier_arrive_expect_tx(bar, ctas * 4u);
    util::mbarrier_wait(bar, (rows_done >> 1) & 1u);  // this mbarrier's use count, mod 2
    const unsigned lane = threadIdx.x % 32;
    float v = kMax ? -INFINITY : 0.f;
    if (lane < ctas) v = slot[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float other = __shfl_xor_sync(0xffffffffu, v, o);
      v = kMax ? fmaxf(v, other) : v + other;
    }
    return v;
  }
};

// Persistent CTAs walking rows; each row of y arrives in shared memory by one bulk copy, issued as soon
// as the previous row has moved into registers. sm90 only; rows 16-byte aligned, N % 4 == 0 (whole
// float4, bulk-copy sizes).
// kCoefs: where the per-column coefficients come from, row after row (CoefSource).
// kClustered: rows wider than one CTA holds are split over a thread-block cluster of
// ceil(N / (kThreads * 4 * kVecs)) CTAs, CTA r holding columns [r * kThreads * 4 * kVecs, ...) of each
// row; persistent clusters walk rows cluster, + clusters, ...; the row's max and sum cross the cluster
// (AcrossCluster). y is read once and the coefficients once per CTA, where the streaming kernel reads y
// twice and every column's coefficients twice per row (H200, 1024x131072, bf16 out: 330 us against the
// streaming kernel's 464 and an fp32 copy of y's 256). With one CTA a cluster it gives the unclustered
// kernel's bits. Otherwise (one CTA a row) N <= kThreads * kVecs * 4, and CTAs walk rows blockIdx.x,
// + gridDim.x, ...
// Two CTAs per SM where the coefficients are not resident: the compiler otherwise took 78 registers
// for 512 x 4 with fp32 out (the row loop specialised for ColumnAffine::shift_folded), one CTA per SM.
// (0: no minimum, which the resident layouts keep; a minimum of 1 raised theirs.)
template <int kThreads, int kVecs, CoefSource kCoefs, class TOut, bool kClustered = false>
__global__ void __launch_bounds__(kThreads, kCoefs == CoefSource::kResident ? 0 : 2)
    softmax_rows_staged(const float* __restrict__ y, int64_t ldy, int64_t M, int64_t N, ColumnAffine f,
                        TOut* __restrict__ out, int64_t ldo, float* __restrict__ row_lse, int64_t* batch_counter) {
  constexpr bool kResident = kCoefs == CoefSource::kResident;
  constexpr bool kShared = kCoefs == CoefSource::kShared;
  static_assert(kResident || !kClustered, "a cluster's CTAs keep their columns' coefficients");
  constexpr int64_t kColumns = int64_t{kThreads} * 4 * kVecs;
  __shared__ alignas(16) float4 row_buffer[kThreads * kVecs];
  __shared__ alignas(8) uint64_t row_landed;
  // kShared: the folded map's a, then c, kThreads * kVecs float4 each (shared_coef_bytes)
  extern __shared__ float4 shared_coefs[];
  __shared__ RowReduceBuffers smem;
  uint64_t* coefs_landed = nullptr;  // kShared: the two bulk copies of the coefficients
  if constexpr (kShared) {
    __shared__ alignas(8) uint64_t bar;
    coefs_landed = &bar;
  }
  float* exchange_slots = nullptr;
  uint64_t* exchange_bars = nullptr;
  unsigned ctas = 1, rank = 0;
  if constexpr (kClustered) {
    __shared__ alignas(8) uint64_t bars[4];
    __shared__ float slots[4 * kMaxSoftmaxClusterCtas];
    exchange_bars = bars;
    exchange_slots = slots;
    const auto place = util::cluster_place();
    ctas = place.ctas;
    rank = place.rank;
  }
  const int64_t col0 = int64_t{rank} * kColumns;  // this CTA's first column
  // > 0: the cluster's CTAs fit N
  const uint32_t part_bytes = static_cast<uint32_t>(kClustered ? std::min(kColumns, N - col0) : N) * 4u;
  if (threadIdx.x == 0) {
    util::mbarrier_init(&row_landed, 1);
    if constexpr (kShared) util::mbarrier_init(coefs_landed, 2);
    if constexpr (kClustered) {
#pragma unroll
      for (int b = 0; b < 4; ++b) util::mbarrier_init(&exchange_bars[b], 1);
    }
  }
  if constexpr (kClustered)
    util::cluster_sync();  // every CTA's exchange barriers exist before anyone sends
  else
    __syncthreads();
  const int64_t row_step = kClustered ? gridDim.x / ctas : gridDim.x;  // rows walked by one CTA (cluster)
  int64_t row = kClustered ? blockIdx.x / ctas : blockIdx.x;
  // The first row's copy starts before the wait (row_softmax's contract), the coefficients after it.
  if (threadIdx.x == 0 && row < M) util::bulk_load(row_buffer, y + row * ldy + col0, part_bytes, &row_landed);
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
  count_batch_once(batch_counter);
  Coefs4 resident[kResident ? kVecs : 1];
  if constexpr (kResident) {
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int64_t col = col0 + (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
      if (col < N) resident[v] = load_coefs<true>(f, col, N);
    }
  }
  if constexpr (kShared) {
    if (threadIdx.x == 0) {
      util::bulk_load(shared_coefs, f.a, part_bytes, coefs_landed);
      util::bulk_load(shared_coefs + kThreads * kVecs, f.c, part_bytes, coefs_landed);
    }
    util::mbarrier_wait(coefs_landed, 0);
  }
  uint32_t rows_done = 0;  // by this CTA (the cluster exchange's slot parity)
  for (uint32_t phase = 0; row < M; row += row_step, phase ^= 1u, ++rows_done) {
    util::mbarrier_wait(&row_landed, phase);
    float4 z[kVecs];
    float mx = -INFINITY;
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int64_t col = col0 + (static_cast<int64_t>(v) * kThreads + threadIdx.x) * 4;
      if (col >= N) {
        z[v] = make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      } else if constexpr (kResident) {
        z[v] = logits4(row_buffer[v * kThreads + threadIdx.x], resident[v]);
      } else if constexpr (kShared) {
        const int i = v * kThreads + threadIdx.x;
        z[v] = logits4(row_buffer[i], Coefs4{make_float4(0.f, 0.f, 0.f, 0.f), shared_coefs[i],
                                             shared_coefs[kThreads * kVecs + i]});
      } else {
        z[v] = logits4(row_buffer[v * kThreads + threadIdx.x], load_coefs<true>(f, col, N));
      }
      mx = fmaxf(mx, max4(z[v]));
    }
    __syncthreads();  // every thread has its part of the row: the buffer takes the next one
    const int64_t next = row + row_step;
    if (threadIdx.x == 0 && next < M) util::bulk_load(row_buffer, y + next * ldy + col0, part_bytes, &row_landed);
    if constexpr (kClustered)
      finish_row<kThreads, kVecs, true>(z, mx, row, N, out, ldo, rank == 0 ? row_lse : nullptr, smem,
                                        AcrossCluster{exchange_slots, exchange_bars, ctas, rank, rows_done}, col0);
    else
      finish_row<kThreads, kVecs, true>(z, mx, row, N, out, ldo, row_lse, smem);
  }
  if constexpr (kClustered) util::cluster_sync();  // no CTA exits while another may still read or write its shared memory
}

// Any N: online (max, sum) over the row, then a second pass that writes.
template <int kThreads, bool kVec, class TOut>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_streaming(const float* __restrict__ y, int64_t ldy, int64_t N, ColumnAffine f, TOut* __restrict__ out,
                           int64_t ldo, float* __restrict__ row_lse, int64_t* batch_counter) {
  __shared__ RowReduceBuffers smem;
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
  count_batch_once(batch_counter);
  const int64_t row = blockIdx.x;
  const float* yrow = y + row * ldy;
  float mx = -INFINITY, sum = 0.f;
  for (int64_t col = static_cast<int64_t>(threadIdx.x) * 4; col < N; col += kThreads * 4) {
    const float4 z = load_logits<kVec>(yrow, col, N, f);
    // The NaN-keeping max: a chunk holding a NaN makes m4, and so sum, NaN even when it is the
    // thread's first chunk with values (fmaxf would leave m4 at -inf there and skip the chunk).
    const float m4 = util::max_nan(mx, util::max_nan4(z));
    // m4 == -inf only if everything so far is -inf: keep sum at 0 instead of exp(nan).
    if (m4 != -INFINITY) {
      sum = sum * expf(mx - m4) + ((expf(z.x - m4) + expf(z.y - m4)) + (expf(z.z - m4) + expf(z.w - m4)));
    }
    mx = m4;
  }
  const float row_max = block_reduce<kThreads, true, false>(mx, smem.max);
  sum = mx == -INFINITY ? 0.f : sum * expf(mx - row_max);
  sum = block_reduce<kThreads, false, false>(sum, smem.sum);
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

// The layouts built: (threads, float4 per thread), and for the staged kernel where the coefficients
// come from with the exact map and with the folded one (given enough rows: shares_coefficients).
// row_softmax_layout() picks among them. Resident coefficients measured on the H200 (bench_row_softmax,
// bf16 out, y as the GEMM leaves it): 256x4 at N = 4096, 8-9 % faster (1024 rows 11.6 -> 10.6 us, 4096
// rows 34.8 -> 31.5); 256x2 at N = 2048, 3-9 %; 128x1 level; 512x4 slower from 2048 rows (82 registers:
// one CTA per SM), so there the coefficients come from L1, or shared memory.
#define FUSED_SOFTMAX_LAYOUTS(X) X(128, 1) X(256, 2) X(256, 4) X(512, 4) X(512, 8) X(1024, 8)
#define FUSED_SOFTMAX_STAGED_LAYOUTS(X)                                                  \
  X(128, 1, CoefSource::kReloaded, CoefSource::kReloaded)                                \
  X(256, 2, CoefSource::kResident, CoefSource::kResident)                                \
  X(256, 4, CoefSource::kResident, CoefSource::kResident)                                \
  X(512, 4, CoefSource::kReloaded, CoefSource::kShared)
#define FUSED_SOFTMAX_CLUSTERED_LAYOUTS(X) X(512, 4)

// CTAs of a staged kernel resident per SM (for its persistent grid), cached per device; 0 on failure.
// The first call per device also sets the kernel's shared-memory carveout where one is chosen (below),
// so the occupancy it answers is the one the launches get.
template <int kThreads, int kVecs, CoefSource kCoefs, class TOut>
int staged_ctas_per_sm(int device) {
  return util::detail::cached_per_device(device, [](int) {
    int ctas = 0;
    auto kernel = softmax_rows_staged<kThreads, kVecs, kCoefs, TOut>;
    constexpr int kDynamicBytes = shared_coef_bytes(kThreads, kVecs, kCoefs);
    // 512 x 4 with 16-bit out: a small shared-memory carveout (40 % of 228 KiB asks for 91 KiB, which
    // the H200 rounds up to its 100 KiB configuration: two CTAs' 33 KiB row buffers, the register
    // limit) leaves 156 KiB of L1 to the coefficients every row re-reads (96 KiB at N = 8192). ncu at
    // 4096x8192: L1 hit rate 73 -> 80 %; with row_exp's __expf the op 1.5 % faster at the bf16
    // headline. fp32 out was slower with it (4096x8192: 79.7 against 78.5 us) and keeps the default.
    // kShared: two CTAs' 97 KiB need the largest shared-memory configuration.
    if constexpr (kCoefs == CoefSource::kShared) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDynamicBytes) != cudaSuccess ||
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
      }
    } else if constexpr (kThreads == 512 && kCoefs == CoefSource::kReloaded && sizeof(TOut) == 2) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 40) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
      }
    }
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, kThreads, kDynamicBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return ctas;
  });
}

// The staged kernel's persistent launch (coefficients from kCoefs) on `device`, of `sms` SMs; with
// `only_if_worth_it`, the one-CTA-per-row kernel instead when the rows do not fill the resident CTAs
// once: staging pays once a CTA walks several rows (H200, 512x4 at N = 8192, bf16 out, against the same
// layout unstaged: 18 % faster at M = 1024, 29-32 % from M = 4096, 29 % slower at M = 256, under one
// row per CTA, where only the mbarrier round trip is added).
template <int kThreads, int kVecs, CoefSource kCoefs, class TOut>
Status launch_staged_from(bool only_if_worth_it, int device, int sms, const float* y, int64_t ldy, int64_t M, int64_t N,
                          const ColumnAffine& f, TOut* out, int64_t ldo, float* row_lse, int64_t* counter,
                          cudaStream_t stream) {
  const int per_sm = staged_ctas_per_sm<kThreads, kVecs, kCoefs, TOut>(device);
  if (per_sm <= 0) return {StatusCode::kCudaError, "row_softmax: occupancy query or carveout failed"};
  const int64_t resident = int64_t{sms} * per_sm;
  if (only_if_worth_it && M < resident)
    return util::launch_dependent(softmax_rows_in_registers<kThreads, kVecs, true, TOut>,
                                  dim3(static_cast<unsigned>(M)), kThreads, 0, stream, "row_softmax kernel launch", y,
                                  ldy, N, f, out, ldo, row_lse, counter);
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(M, resident)));
  return util::launch_dependent(softmax_rows_staged<kThreads, kVecs, kCoefs, TOut>, grid, kThreads,
                                shared_coef_bytes(kThreads, kVecs, kCoefs), stream, "row_softmax kernel launch", y,
                                ldy, M, N, f, out, ldo, row_lse, counter);
}

// The staged launch for a layout whose coefficients come from kCoefs, or from kFoldedCoefs for a folded
// map (ColumnAffine::shift_folded) where the two differ and the CTAs walk enough rows for it
// (shares_coefficients).
template <int kThreads, int kVecs, CoefSource kCoefs, CoefSource kFoldedCoefs, class TOut>
Status launch_staged(bool only_if_worth_it, const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f,
                     TOut* out, int64_t ldo, float* row_lse, int64_t* counter, cudaStream_t stream) {
  const int device = util::detail::current_device();
  int sms = 0;
  FUSED_RETURN_IF_ERROR(util::sm_count(device, sms));
  if constexpr (kFoldedCoefs != kCoefs) {
    if (f.shift_folded && shares_coefficients(M, sms))
      return launch_staged_from<kThreads, kVecs, kFoldedCoefs, TOut>(only_if_worth_it, device, sms, y, ldy, M, N, f,
                                                                     out, ldo, row_lse, counter, stream);
  }
  return launch_staged_from<kThreads, kVecs, kCoefs, TOut>(only_if_worth_it, device, sms, y, ldy, M, N, f, out, ldo,
                                                           row_lse, counter, stream);
}

// Clusters of `ctas` CTAs of the clustered staged kernel resident at once on `device`
// (cudaOccupancyMaxActiveClusters), cached per device and cluster size; 0 when none fits (remembered:
// the device's answer) or a call fails (asked again next time). Clusters above 8 CTAs (a non-portable
// size) are allowed on the kernel here, before its first launch of that size.
template <int kThreads, int kVecs, class TOut>
int resident_clusters(int device, unsigned ctas) {
  static std::atomic<int> cache[util::kMaxCachedDevices][kMaxSoftmaxClusterCtas + 1] = {};
  if (device < 0 || device >= util::kMaxCachedDevices || ctas == 0 || ctas > kMaxSoftmaxClusterCtas) return 0;
  std::atomic<int>& cached = cache[device][ctas];  // 0: not asked yet, -1: none
  if (const int v = cached.load(std::memory_order_relaxed); v != 0) return v > 0 ? v : 0;
  auto kernel = softmax_rows_staged<kThreads, kVecs, CoefSource::kResident, TOut, /*kClustered=*/true>;
  if (ctas > 8 && cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(ctas);
  config.blockDim = dim3(kThreads);
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = ctas;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  cached.store(clusters > 0 ? clusters : -1, std::memory_order_relaxed);
  return clusters > 0 ? clusters : 0;
}

// The clustered staged kernel's persistent launch: ceil(N / columns a CTA holds) CTAs a cluster, as many
// clusters as are resident at once (at most M). kNotSupported where no such cluster fits the device.
// launch_typed has checked that N fits the layout (at most kMaxSoftmaxClusterCtas CTAs).
template <int kThreads, int kVecs, class TOut>
Status launch_clustered(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f, TOut* out,
                        int64_t ldo, float* row_lse, int64_t* counter, cudaStream_t stream) {
  constexpr int64_t kColumns = int64_t{kThreads} * 4 * kVecs;
  const int64_t ctas = (N + kColumns - 1) / kColumns;
  const int clusters =
      resident_clusters<kThreads, kVecs, TOut>(util::detail::current_device(), static_cast<unsigned>(ctas));
  if (clusters <= 0)
    return {StatusCode::kNotSupported, "row_softmax: no thread-block cluster of the CTAs a row needs fits the device"};
  const dim3 grid(static_cast<unsigned>(ctas * std::min<int64_t>(M, clusters)));
  return util::launch_dependent_in_clusters(softmax_rows_staged<kThreads, kVecs, CoefSource::kResident, TOut,
                                                                /*kClustered=*/true>,
                                            grid, kThreads, static_cast<unsigned>(ctas), 0, stream,
                                            "row_softmax kernel launch", y, ldy, M, N, f, out, ldo, row_lse, counter);
}

template <bool kVec, class TOut>
Status launch_typed(const SoftmaxLayout& l, bool fit_layout, const float* y, int64_t ldy, int64_t M, int64_t N,
                    const ColumnAffine& f, TOut* out, int64_t ldo, float* row_lse, int64_t* counter, cudaStream_t stream) {
  const dim3 rows(static_cast<unsigned>(M));
  if (l.threads == 0)
    return util::launch_dependent(softmax_rows_streaming<1024, kVec, TOut>, rows, 1024, 0, stream,
                                  "row_softmax kernel launch", y, ldy, N, f, out, ldo, row_lse, counter);
  if (l.max_columns() < N) return {StatusCode::kInvalidArgument, "row_softmax: the layout holds fewer columns than N"};
  if (l.clustered) {
    if constexpr (kVec) {
#define FUSED_SOFTMAX_CLUSTERED_CASE(T, V) \
  if (l.threads == T && l.vecs == V) return launch_clustered<T, V>(y, ldy, M, N, f, out, ldo, row_lse, counter, stream);
      FUSED_SOFTMAX_CLUSTERED_LAYOUTS(FUSED_SOFTMAX_CLUSTERED_CASE)
#undef FUSED_SOFTMAX_CLUSTERED_CASE
    }
    return {StatusCode::kNotSupported, "row_softmax: clustered layout not built"};
  }
  if (l.staged) {
    if constexpr (kVec) {
/* only 16-bit outputs fold (folds_logit_shift): other outputs take R for a folded map too */
#define FUSED_SOFTMAX_STAGED_CASE(T, V, R, RF)                                                          \
  if (l.threads == T && l.vecs == V)                                                                    \
    return launch_staged<T, V, R, sizeof(TOut) == 2 ? RF : R>(fit_layout, y, ldy, M, N, f, out, ldo, row_lse, \
                                                              counter, stream);
      FUSED_SOFTMAX_STAGED_LAYOUTS(FUSED_SOFTMAX_STAGED_CASE)
#undef FUSED_SOFTMAX_STAGED_CASE
    }
    return {StatusCode::kNotSupported, "row_softmax: staged layout not built"};
  }
#define FUSED_SOFTMAX_CASE(T, V)                                                                              \
  if (l.threads == T && l.vecs == V)                                                                        \
    return util::launch_dependent(softmax_rows_in_registers<T, V, kVec, TOut>, rows, T, 0, stream,           \
                                  "row_softmax kernel launch", y, ldy, N, f, out, ldo, row_lse, counter);
  FUSED_SOFTMAX_LAYOUTS(FUSED_SOFTMAX_CASE)
#undef FUSED_SOFTMAX_CASE
  return {StatusCode::kNotSupported, "row_softmax: layout not built"};
}

// 16-byte loads need every row of y and the column vectors 16-byte aligned; 4-wide stores need out
// rows aligned to 4 elements.
template <class TOut>
bool vector_aligned(const float* y, int64_t ldy, const ColumnAffine& f, const void* out, int64_t ldo) {
  return ldy % 4 == 0 && ldo % 4 == 0 && util::aligned16(y) && util::aligned16(f.shift) && util::aligned16(f.a) &&
         util::aligned16(f.c) && (reinterpret_cast<uintptr_t>(out) % (4 * sizeof(TOut))) == 0;
}

// Where the clustered layout cannot run (no sm90, unaligned rows, no such cluster fits): one CTA per
// row holding it in registers up to 32768 columns, the streaming kernel beyond. Their reductions
// run in another order, so such rows may differ from aligned ones in the last bits.
SoftmaxLayout unclustered_layout(int64_t N) {
  if (N <= 512 * 4 * 8) return {512, 8, false};
  if (N <= 1024 * 4 * 8) return {1024, 8, false};
  return {0, 0, false};
}

template <class TOut>
Status launch(SoftmaxLayout l, bool fit_layout, const float* y, int64_t ldy, int64_t M, int64_t N,
              const ColumnAffine& f, void* out, int64_t ldo, float* row_lse, int64_t* counter, cudaStream_t stream) {
  const bool vec = vector_aligned<TOut>(y, ldy, f, out, ldo);
  if (l.staged) {
    int major = 0;
    const bool sm90 = util::compute_capability_major(util::detail::current_device(), major).ok() && major >= 9;
    if (!(sm90 && vec && N % 4 == 0)) {  // what the bulk copies need
      if (!fit_layout) return {StatusCode::kNotSupported, "row_softmax: staged layout needs sm90 and aligned rows"};
      l = l.clustered ? unclustered_layout(N) : SoftmaxLayout{l.threads, l.vecs, false};
    }
  }
  auto* o = static_cast<TOut*>(out);
  if (l.clustered) {
    const Status st = launch_typed<true>(l, fit_layout, y, ldy, M, N, f, o, ldo, row_lse, counter, stream);
    if (!fit_layout || st.code != StatusCode::kNotSupported) return st;
    l = unclustered_layout(N);  // no such cluster fits this device (e.g. a partitioned GPU)
  }
  return vec ? launch_typed<true>(l, fit_layout, y, ldy, M, N, f, o, ldo, row_lse, counter, stream)
             : launch_typed<false>(l, fit_layout, y, ldy, M, N, f, o, ldo, row_lse, counter, stream);
}

Status dispatch(const SoftmaxLayout& layout, bool fit_layout, const float* y, int64_t ldy, int64_t M, int64_t N,
                const ColumnAffine& affine, void* out, int64_t ldo, ElementType dtype, float* row_lse,
                int64_t* counter, cudaStream_t stream) {
  if (M == 0 || N == 0) return count_batch(counter, stream);  // no kernel here: the counter's own
  if (M > 0x7fffffff) return {StatusCode::kNotSupported, "row_softmax: more than 2^31-1 rows"};
  switch (dtype) {
    case ElementType::kFloat32:
      return launch<float>(layout, fit_layout, y, ldy, M, N, affine, out, ldo, row_lse, counter, stream);
    case ElementType::kBFloat16:
      return launch<__nv_bfloat16>(layout, fit_layout, y, ldy, M, N, affine, out, ldo, row_lse, counter, stream);
    case ElementType::kFloat16:
      return launch<__half>(layout, fit_layout, y, ldy, M, N, affine, out, ldo, row_lse, counter, stream);
  }
  return {StatusCode::kInvalidArgument, "row_softmax: unknown dtype"};
}

}  // namespace

SoftmaxLayout row_softmax_layout(int64_t N) {
  // The row in registers while threads * 4 * vecs >= N; staged where the bulk copies can bring it
  // (row_softmax runs the same layout unstaged where they cannot, and where M does not fill the
  // resident CTAs once: launch_staged); wider rows stream.
  if (N <= 128 * 4 * 1) return {128, 1, true};
  if (N <= 256 * 4 * 2) return {256, 2, true};
  if (N <= 256 * 4 * 4) return {256, 4, true};
  // 512 threads x 4 float4 rather than 256 x 8 (the previous kernel): staged, level with it at
  // M = 1024 and 18-19 % faster from M = 4096; unstaged at M = 256, 6 % faster
  // (bench/cpp/bench_row_softmax.cu on the H200).
  if (N <= 512 * 4 * 4) return {512, 4, true};
  // Up to 16384: one CTA of 512 x 8 a row (unclustered_layout). A cluster of two 512 x 4 CTAs was 4 %
  // faster at 16384 columns but 8 % slower at 12000, where its second CTA holds under half a part
  // (H200, bf16 out).
  if (N <= 512 * 4 * 8) return unclustered_layout(N);
  // Wider: 512 x 4 per CTA, a cluster of CTAs per row (row_softmax runs unclustered_layout() where
  // the cluster cannot run), up to 16 CTAs; then the streaming kernel. Against what ran before
  // (1024 x 8 one CTA a row up to 32768 columns, then streaming), bf16 out, H200, us: 1024x32768
  // 82 vs 94; 4096x32768 288 vs 345; 1024x65536 156 vs 223; 1024x131072 330 vs 464; 64x131072 29 vs
  // 48 (an fp32 copy of y: 67, 256, 143, 256, 20).
  if (N <= 512 * 4 * 4 * kMaxSoftmaxClusterCtas) return {512, 4, true, true};
  return {0, 0, false};
}

std::vector<SoftmaxLayout> row_softmax_built_layouts() {
  std::vector<SoftmaxLayout> layouts;
#define FUSED_SOFTMAX_LIST(T, V) layouts.push_back({T, V, false});
  FUSED_SOFTMAX_LAYOUTS(FUSED_SOFTMAX_LIST)
#undef FUSED_SOFTMAX_LIST
#define FUSED_SOFTMAX_LIST(T, V, R, RF) layouts.push_back({T, V, true});
  FUSED_SOFTMAX_STAGED_LAYOUTS(FUSED_SOFTMAX_LIST)
#undef FUSED_SOFTMAX_LIST
#define FUSED_SOFTMAX_LIST(T, V) layouts.push_back({T, V, true, true});
  FUSED_SOFTMAX_CLUSTERED_LAYOUTS(FUSED_SOFTMAX_LIST)
#undef FUSED_SOFTMAX_LIST
  return layouts;
}

Status row_softmax_with_layout(const SoftmaxLayout& layout, const float* y, int64_t ldy, int64_t M, int64_t N,
                               const ColumnAffine& affine, void* out, int64_t ldo, ElementType dtype, float* row_lse,
                               cudaStream_t stream) {
  return dispatch(layout, /*fit_layout=*/false, y, ldy, M, N, affine, out, ldo, dtype, row_lse, nullptr, stream);
}

Status row_softmax(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& affine, void* out,
                   int64_t ldo, ElementType dtype, float* row_lse, cudaStream_t stream, int64_t* batch_counter) {
  return dispatch(row_softmax_layout(N), /*fit_layout=*/true, y, ldy, M, N, affine, out, ldo, dtype, row_lse,
                  batch_counter, stream);
}

namespace {
__global__ void count_batch_kernel(int64_t* counter) {
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
  count_batch_once(counter);
}
}  // namespace

Status count_batch(int64_t* counter, cudaStream_t stream) {
  if (counter == nullptr) return Status::Ok();
  return util::launch_dependent(count_batch_kernel, dim3(1), dim3(1), 0, stream, "count_batch_kernel launch", counter);
}

}  // namespace fused::cuda
