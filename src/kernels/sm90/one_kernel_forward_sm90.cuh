// Launch template of the one-kernel forward (one_kernel_forward_sm90.h for what it computes). Included
// by one TU per input element type: one_kernel_forward_sm90_{bf16,fp16,tf32}.cu.
//
// The kernel layer is the library's; the K loop is CUTLASS's sm90 collective (TMA loads into a ring of
// shared-memory stages, wgmma from shared memory), driven as CUTLASS's non-persistent warp-specialised
// kernel drives it: warp 0 of the producer warpgroup loads, the consumer warpgroup multiplies. After
// the K loop the tile goes to shared memory (the stages are free by then) and stays there until out
// is written. The grid-wide barriers are cooperative groups' grid sync, which needs a cooperative
// launch: the launch fails rather than deadlocks if the grid does not fit on the GPU at once.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/pipeline/pipeline.hpp"

#include "fused/detail/bn_math.h"
#include "kernels/common/nan_max.cuh"
#include "kernels/common/out_convert.cuh"
#include "kernels/sm90/one_kernel_forward_sm90.h"
#include "util/cuda_check.h"
#include "util/device_info.h"

namespace fused::sm90::detail {

using namespace cute;

// ElementIn: cutlass::bfloat16_t, cutlass::half_t, or float (TF32 tensor cores).
template <class ElementIn>
struct OneKernelForward {
  static constexpr int kTile = int(kOneKernelTile);
  // 6 stages of 16 KiB (a 64x64 tile of each operand, 128 bytes of K) leave room for two CTAs per SM.
  static constexpr int kStages = 6;
  static constexpr int kConsumerThreads = 128;
  static constexpr int kThreads = 256;  // the producer warpgroup, then the consumer warpgroup
  using TileShape = Shape<Int<kTile>, Int<kTile>, Int<128 / int(sizeof(ElementIn))>>;
  using ClusterShape = Shape<_1, _1, _1>;
  static constexpr int kAlignment = 128 / cutlass::sizeof_bits<ElementIn>::value;  // 16-byte TMA rows
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,
      ElementIn, cutlass::layout::RowMajor, kAlignment,     // x (M, K): K-major
      ElementIn, cutlass::layout::ColumnMajor, kAlignment,  // W (N, K) row-major: K-major
      float, TileShape, ClusterShape, cutlass::gemm::collective::StageCount<kStages>,
      cutlass::gemm::KernelTmaWarpSpecialized>::CollectiveOp;
  using TiledMma = typename Mainloop::TiledMma;
  using Pipeline = typename Mainloop::MainloopPipeline;
  using PipelineState = typename Mainloop::PipelineState;
  using StrideA = typename Mainloop::StrideA;
  using StrideB = typename Mainloop::StrideB;
  static_assert(cute::size(TiledMma{}) == kConsumerThreads, "one consumer warpgroup");

  struct SharedStorage {
    union Tensors {
      typename Mainloop::TensorStorage mainloop;  // first: the TMA stages want the base's alignment
      float tile[kTile][kTile + 1];               // after the K loop: y, then out (odd stride: fewer bank conflicts)
    } tensors;
    alignas(16) typename Mainloop::PipelineStorage pipeline;
    // After the K loop every thread works on the tile, four to a column or a row ("quarters").
    float quarter_sum[4][kTile], quarter_m2[4][kTile];  // the tile's columns: sum, then M2, per 16 rows
    double quarter_n[4][kTile], quarter_weighted[4][kTile], quarter_m2_all[4][kTile];  // the batch's, per row tiles
    float bias[kTile], shift[kTile], a[kTile], c[kTile];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));

  struct Params {
    typename Mainloop::Params mainloop;
    int M = 0, N = 0, K = 0;
    const ElementIn* bias = nullptr;
    float* y = nullptr;
    int64_t ldy = 0;
    ColumnStatsPartials partials;
    BatchNormArgs bn;
    float* save_mean = nullptr;
    float* save_invstd = nullptr;
    void* out = nullptr;
    int64_t ldo = 0;
    ElementType out_dtype = ElementType::kFloat32;
    bool out_vectors = false;  // out 16-byte aligned and ldo % 4 == 0: 4 columns per store
    float* row_lse = nullptr;
    float* row_max = nullptr;  // [column tile][M]
    float* row_sum = nullptr;  // [column tile][M]
  };
};

// FUSED_ONE_KERNEL_PHASE_TIMES (a diagnostic build, never the library's): each CTA's consumer thread 0
// records the SM clock and the global timer at the phase boundaries, for one_kernel_phase_times().
#if defined(FUSED_ONE_KERNEL_PHASE_TIMES)
constexpr int kPhaseStamps = 8;
static __device__ unsigned long long g_phase_clock[1024][kPhaseStamps];
static __device__ unsigned long long g_phase_global[1024][kPhaseStamps];
#define FUSED_PHASE_STAMP(i)                                                                      \
  do {                                                                                            \
    if (threadIdx.x == 128 && blockIdx.x + blockIdx.y * gridDim.x < 1024) {                       \
      unsigned long long g;                                                                       \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));                                      \
      g_phase_clock[blockIdx.x + blockIdx.y * gridDim.x][i] = clock64();                          \
      g_phase_global[blockIdx.x + blockIdx.y * gridDim.x][i] = g;                                 \
    }                                                                                             \
  } while (0)
inline void one_kernel_phase_times(unsigned long long* clock, unsigned long long* global) {
  cudaMemcpyFromSymbol(clock, g_phase_clock, sizeof(g_phase_clock));
  cudaMemcpyFromSymbol(global, g_phase_global, sizeof(g_phase_global));
}
#else
#define FUSED_PHASE_STAMP(i) \
  do {                       \
  } while (0)
#endif

// The consumer warpgroup's own barrier (ids 0-7 are CUTLASS's).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 8, 128;" ::: "memory"); }

// The CTA's barrier after the K loop, in its non-aligned form (barrier.sync, as cooperative groups' grid
// sync uses): each thread arrives on its own, so a warp need not arrive converged, as the loader warp may
// not after CUTLASS's elect-one producer code (the aligned bar.sync of __syncthreads() is undefined then).
// compute-sanitizer's racecheck reports accesses to the tile on the two sides of these barriers as
// hazards (the loader warp's reads against the consumer warps' writes), whichever barrier form is used
// (this one, __syncthreads(), named barriers of 256 threads, aligned or not, or this one not inlined),
// while the results are bitwise repeatable and within the float64 bounds in every test (bench/NOTES.md,
// twenty-first session).
__device__ __forceinline__ void cta_sync() { asm volatile("barrier.sync 0;" ::: "memory"); }

// The row max keeps NaN (util::max_nan): a row with a NaN logit is all NaN, as in torch.softmax, even
// where a whole tile's part of the row is NaN.
using cuda::util::max_nan;

template <class TOut>
__device__ __forceinline__ void store_out4(void* out, int64_t offset, const float (&v)[4], bool vectors) {
  TOut* o = static_cast<TOut*>(out) + offset;
  if (vectors) {
    if constexpr (sizeof(TOut) == 4) {
      *reinterpret_cast<float4*>(o) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
      union { TOut h[4]; uint2 u; } pack;
#pragma unroll
      for (int j = 0; j < 4; ++j) pack.h[j] = cuda::OutConvert<TOut>::cvt(v[j]);
      *reinterpret_cast<uint2*>(o) = pack.u;
    }
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = cuda::OutConvert<TOut>::cvt(v[j]);
  }
}

template <class Op>
__global__ void __launch_bounds__(Op::kThreads, kOneKernelCtasPerSm)
    one_kernel_forward_kernel(const __grid_constant__ typename Op::Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Mainloop = typename Op::Mainloop;
  using Pipeline = typename Op::Pipeline;
  constexpr int kTile = Op::kTile;
  extern __shared__ char smem_raw[];
  auto& s = *reinterpret_cast<typename Op::SharedStorage*>(smem_raw);
  auto grid = cooperative_groups::this_grid();

  const int thread = int(threadIdx.x);
  const bool consumer = thread >= Op::kConsumerThreads;
  const int t = thread % Op::kConsumerThreads;  // index within the warpgroup
  const bool loader = !consumer && thread < 32;  // warp 0 of the producer warpgroup
  const int m_tile = int(blockIdx.x), n_tile = int(blockIdx.y);
  const int row0 = m_tile * kTile, col0 = n_tile * kTile;
  const int rows = min(kTile, p.M - row0);  // valid rows and columns of this tile (>= 1)
  const int cols = min(kTile, p.N - col0);
  const bool batch_stats = p.bn.uses_batch_stats();
  FUSED_PHASE_STAMP(0);

  // [1] The tile's product, as CUTLASS's KernelTmaWarpSpecialized kernel runs its collective.
  if (thread == 0) Mainloop::prefetch_tma_descriptors(p.mainloop);
  typename Pipeline::Params pipeline_params;
  if (loader) pipeline_params.role = Pipeline::ThreadCategory::Producer;
  if (consumer) pipeline_params.role = Pipeline::ThreadCategory::Consumer;
  pipeline_params.is_leader = t == 0;
  pipeline_params.num_consumers = Op::kConsumerThreads;
  pipeline_params.transaction_bytes = p.mainloop.tma_transaction_bytes;
  Pipeline pipeline(s.pipeline, pipeline_params, typename Op::ClusterShape{});
  if (consumer && t < kTile)  // its latency hides behind the first stage's
    s.bias[t] = p.bias != nullptr && t < cols ? static_cast<float>(p.bias[col0 + t]) : 0.f;
  __syncthreads();  // the pipeline's barriers are initialised before anyone uses them

  Mainloop mainloop;
  auto problem = make_shape(p.M, p.N, p.K, 1);
  auto load_inputs = mainloop.load_init(problem, p.mainloop);
  Tensor gA_mkl = get<0>(load_inputs);
  const int k_tiles = int(size<3>(gA_mkl));
  typename Op::TiledMma tiled_mma;
  Tensor acc = partition_fragment_C(tiled_mma, take<0, 2>(typename Op::TileShape{}));  // (MMA, MMA_M, MMA_N)

  if (loader) {
    auto write_state = cutlass::make_producer_start_state<Pipeline>();
    mainloop.load(p.mainloop, pipeline, write_state, load_inputs, make_coord(m_tile, n_tile, _, 0),
                  cute::make_coord_iterator(shape<3>(gA_mkl)), k_tiles, thread, 0u, s.tensors.mainloop);
    write_state.advance(k_tiles);
    mainloop.load_tail(pipeline, write_state);
    __syncwarp();  // converged again after the elected lane's waits
  } else if (consumer) {
    typename Op::PipelineState read_state;
    mainloop.mma(pipeline, read_state, acc, k_tiles, t, s.tensors.mainloop, p.mainloop);
    mainloop.mma_tail(pipeline, read_state, k_tiles);
    FUSED_PHASE_STAMP(1);
    // Every stage was waited for and read, so no TMA write is in flight: the stages' memory is free.
    consumer_sync();
    Tensor coord = tiled_mma.get_thread_slice(t).partition_C(make_identity_tensor(take<0, 2>(typename Op::TileShape{})));
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < int(size(acc)); ++i) {
      const int r = get<0>(coord(i)), c = get<1>(coord(i));
      s.tensors.tile[r][c] = acc(i) + s.bias[c];
    }
  }
  // From here on all 256 threads share the work (the producer warps are idle after the K loop): more
  // warps hide more of each step's latency. (The first barrier after the K loop: the tile is written.)
  cta_sync();
  constexpr int kQuarter = kTile / 4;
  const int lane_c = thread % kTile, quarter = thread / kTile;  // column lane_c, rows (or row tiles) by quarter
  if (batch_stats) {  // the tile's column partials: mean, then M2 about it (16 rows per thread, in registers)
    float v[kQuarter];
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kQuarter; ++j) {
      v[j] = s.tensors.tile[quarter * kQuarter + j][lane_c];
      if (quarter * kQuarter + j < rows) sum += v[j];
    }
    s.quarter_sum[quarter][lane_c] = sum;
    cta_sync();
    const float mean = ((s.quarter_sum[0][lane_c] + s.quarter_sum[1][lane_c]) +
                        (s.quarter_sum[2][lane_c] + s.quarter_sum[3][lane_c])) / float(rows);
    float m2 = 0.f;
#pragma unroll
    for (int j = 0; j < kQuarter; ++j) {
      const float d = v[j] - mean;
      if (quarter * kQuarter + j < rows) m2 = fmaf(d, d, m2);
    }
    s.quarter_m2[quarter][lane_c] = m2;
    cta_sync();
    if (quarter == 0) {
      const int64_t slot = int64_t(m_tile) * p.partials.ld + col0 + lane_c;
      p.partials.mean[slot] = mean;
      p.partials.m2[slot] = (s.quarter_m2[0][lane_c] + s.quarter_m2[1][lane_c]) +
                            (s.quarter_m2[2][lane_c] + s.quarter_m2[3][lane_c]);
    }
  }

  FUSED_PHASE_STAMP(2);
  if (batch_stats) grid.sync();  // every tile's partials are written
  FUSED_PHASE_STAMP(3);

  // [2] y, kept for the backward (its stores drain while the rest runs); this CTA's columns' statistics,
  // four threads to a column, each over a quarter of the row tiles, added in quarter order; the folded
  // map; then the rows' max and sum of exp over this CTA's columns, four threads to a row.
  if (p.y != nullptr) {  // coalesced, 4 columns a store (N % 4 == 0: a group is all in or all out)
    for (int v = thread; v < kTile * kTile / 4; v += Op::kThreads) {
      const int rr = v / (kTile / 4), c = (v % (kTile / 4)) * 4;
      if (rr < rows && c < cols) {
        const float* y4 = &s.tensors.tile[rr][c];
        *reinterpret_cast<float4*>(p.y + int64_t(row0 + rr) * p.ldy + col0 + c) = make_float4(y4[0], y4[1], y4[2], y4[3]);
      }
    }
  }
  const int64_t col = int64_t(col0) + lane_c;
  fused::detail::MeanM2 stats;
  if (batch_stats) {  // uniform over the CTA, so every thread meets both barriers
    const bool valid = lane_c < cols;
    const int64_t tiles = p.partials.num_row_tiles, per = (tiles + 3) / 4;
    const int64_t t_begin = min(tiles, quarter * per), t_end = min(tiles, (quarter + 1) * per);
    const fused::detail::PartialsSum part =
        valid ? fused::detail::partials_weighted_sum(p.partials, p.M, col, t_begin, t_end) : fused::detail::PartialsSum{};
    s.quarter_n[quarter][lane_c] = part.n;
    s.quarter_weighted[quarter][lane_c] = part.weighted;
    cta_sync();
    stats.n = (s.quarter_n[0][lane_c] + s.quarter_n[1][lane_c]) + (s.quarter_n[2][lane_c] + s.quarter_n[3][lane_c]);
    const double weighted = (s.quarter_weighted[0][lane_c] + s.quarter_weighted[1][lane_c]) +
                            (s.quarter_weighted[2][lane_c] + s.quarter_weighted[3][lane_c]);
    stats.mean = stats.n > 0.0 ? weighted / stats.n : 0.0;
    s.quarter_m2_all[quarter][lane_c] =
        valid ? fused::detail::partials_m2_about(p.partials, p.M, col, stats.mean, t_begin, t_end) : 0.0;
    cta_sync();
    stats.m2 = (s.quarter_m2_all[0][lane_c] + s.quarter_m2_all[1][lane_c]) +
               (s.quarter_m2_all[2][lane_c] + s.quarter_m2_all[3][lane_c]);
  }
  if (quarter == 0) {
    fused::detail::ColumnMap map;
    if (lane_c < cols) {
      map = fused::detail::column_map(col, stats, p.bn);
      if (m_tile == 0) {  // once per column
        fused::detail::update_running_stats(col, stats, p.bn);
        p.save_mean[col] = map.shift;
        p.save_invstd[col] = map.invstd;
      }
    }
    s.shift[lane_c] = map.shift;
    s.a[lane_c] = map.a;
    s.c[lane_c] = map.c;
  }
  cta_sync();
  FUSED_PHASE_STAMP(4);

  const int r = thread / 4, part = thread % 4;  // row r, columns part * 16 ..
  float e[kQuarter];  // row r's logits, then exp(logit - tile_max)
  float tile_max = -INFINITY;
#pragma unroll
  for (int j = 0; j < kQuarter; ++j) {
    const int c = part * kQuarter + j;
    e[j] = c < cols ? fused::detail::bn_logit(s.tensors.tile[r][c], s.shift[c], s.a[c], s.c[c]) : -INFINITY;
    tile_max = max_nan(tile_max, e[j]);
  }
  // Butterflies over the row's four lanes: IEEE max and + commute, so all four get the same bits.
  tile_max = max_nan(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
  tile_max = max_nan(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kQuarter; ++j) {
    e[j] = tile_max == -INFINITY ? 0.f : expf(e[j] - tile_max);  // all -inf: 0, not exp(nan)
    sum += e[j];
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  sum += __shfl_xor_sync(0xffffffffu, sum, 2);
  if (part == 0 && r < rows) {
    p.row_max[int64_t(n_tile) * p.M + row0 + r] = tile_max;
    p.row_sum[int64_t(n_tile) * p.M + row0 + r] = sum;
  }

  FUSED_PHASE_STAMP(5);
  grid.sync();  // every tile's row parts are written; every read of num_batches_tracked is done
  FUSED_PHASE_STAMP(6);

  // [3] Each row's max and sum over all column tiles (in order, 8 tiles' loads in flight at a time:
  // every CTA of the row gets the same bits), then out = exp(z - tile max) * exp(tile max - row max) / sum.
  {
    const int n_tiles = int(gridDim.y);
    float row_max = -INFINITY, row_sum = 0.f;
    if (r < rows) {
      const int64_t row = row0 + r;
      constexpr int kBatch = 8;
      for (int k0 = 0; k0 < n_tiles; k0 += kBatch) {
        float m[kBatch], sv[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
          const bool in = k0 + j < n_tiles;
          m[j] = in ? p.row_max[int64_t(k0 + j) * p.M + row] : -INFINITY;
          sv[j] = in ? p.row_sum[int64_t(k0 + j) * p.M + row] : 0.f;
        }
        float batch_max = row_max;
#pragma unroll
        for (int j = 0; j < kBatch; ++j) batch_max = max_nan(batch_max, m[j]);
        if (batch_max != -INFINITY) {
          float acc_sum = row_max == -INFINITY ? 0.f : row_sum * expf(row_max - batch_max);
#pragma unroll
          for (int j = 0; j < kBatch; ++j)
            if (m[j] != -INFINITY) acc_sum += sv[j] * expf(m[j] - batch_max);
          row_sum = acc_sum;
        }
        row_max = batch_max;
      }
      if (n_tile == 0 && part == 0 && p.row_lse != nullptr)
        p.row_lse[row] = fused::detail::log_normaliser(row_max, row_sum);
    }
    // A tile whose part of the row is all -inf contributes 0, or NaN where the row is NaN.
    const float factor = tile_max == -INFINITY ? 0.f * row_sum : expf(tile_max - row_max) / row_sum;
#pragma unroll
    for (int j = 0; j < kQuarter; ++j) s.tensors.tile[r][part * kQuarter + j] = e[j] * factor;
    cta_sync();
    for (int v = thread; v < kTile * kTile / 4; v += Op::kThreads) {
      const int rr = v / (kTile / 4), c = (v % (kTile / 4)) * 4;
      if (rr < rows && c < cols) {
        const float* o4 = &s.tensors.tile[rr][c];
        const float four[4] = {o4[0], o4[1], o4[2], o4[3]};
        const int64_t offset = int64_t(row0 + rr) * p.ldo + col0 + c;
        switch (p.out_dtype) {
          case ElementType::kBFloat16: store_out4<__nv_bfloat16>(p.out, offset, four, p.out_vectors); break;
          case ElementType::kFloat16: store_out4<__half>(p.out, offset, four, p.out_vectors); break;
          default: store_out4<float>(p.out, offset, four, p.out_vectors); break;
        }
      }
    }
    int64_t* counter = p.bn.batch_counter();
    if (counter != nullptr && m_tile == 0 && n_tile == 0 && thread == 0) *counter += 1;
  }
  FUSED_PHASE_STAMP(7);
#endif
}

// The largest grid the device holds at once (CTAs per SM from the occupancy calculator, times the
// SMs), cached per device; 0 on failure. Also sets the kernel's shared-memory size, once per device.
template <class Op>
int one_kernel_resident_ctas(int device) {
  return cuda::util::detail::cached_per_device(device, [](int d) {
    auto* kernel = one_kernel_forward_kernel<Op>;
    int sms = 0, per_sm = 0;
    if (!cuda::util::sm_count(d, sms).ok() ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Op::kSmemBytes) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, Op::kThreads, Op::kSmemBytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return sms * per_sm;
  });
}

template <class ElementIn>
Status run_one_kernel(const OneKernelForwardArgs& a, cudaStream_t stream) {
  using Op = OneKernelForward<ElementIn>;
  const GemmStatsArgs& g = a.gemm;
  constexpr int64_t kIntMax = 0x7fffffff;
  if (g.M <= 0 || g.N <= 0 || g.K <= 0) return {StatusCode::kInvalidArgument, "one-kernel forward: M, N, K must be positive"};
  if (g.M > kIntMax || g.N > kIntMax || g.K > kIntMax)
    return {StatusCode::kNotSupported, "one-kernel forward: M, N, K must fit in int32"};
  if (g.x == nullptr || g.w == nullptr || a.out == nullptr || a.save_mean == nullptr || a.save_invstd == nullptr ||
      a.row_parts == nullptr)
    return {StatusCode::kInvalidArgument, "one-kernel forward: x, w, out, save_mean, save_invstd, row_parts must be non-null"};
  if (g.ldx < g.K || g.ldw < g.K || (g.y != nullptr && g.ldy < g.N) || a.ldo < g.N)
    return {StatusCode::kInvalidArgument, "one-kernel forward: leading dimension smaller than the row"};
  if (g.K % Op::kAlignment != 0 || g.ldx % Op::kAlignment != 0 || g.ldw % Op::kAlignment != 0 ||
      !cuda::util::aligned16(g.x) || !cuda::util::aligned16(g.w))
    return {StatusCode::kNotSupported, "one-kernel forward: x and w 16-byte aligned, K, ldx, ldw multiples of 16 bytes (TMA)"};
  if (g.N % 4 != 0 || (g.y != nullptr && (g.ldy % 4 != 0 || !cuda::util::aligned16(g.y))))
    return {StatusCode::kNotSupported, "one-kernel forward: N a multiple of 4, y 16-byte aligned with ldy a multiple of 4"};
  if (a.bn.rank_moments != nullptr)
    return {StatusCode::kInvalidArgument, "one-kernel forward: data-parallel statistics are not taken here"};
  const ColumnStatsPartials& pt = g.partials;
  if (a.bn.uses_batch_stats() &&
      (pt.mean == nullptr || pt.m2 == nullptr || pt.row_tile != kOneKernelTile ||
       pt.ld < (g.N + kOneKernelTile - 1) / kOneKernelTile * kOneKernelTile ||
       pt.num_row_tiles < (g.M + kOneKernelTile - 1) / kOneKernelTile))
    return {StatusCode::kInvalidArgument, "one-kernel forward: partials must be [ceil(M / 64), >= round_up(N, 64)] with row_tile 64"};

  int device = 0;
  FUSED_RETURN_IF_ERROR(cuda::util::cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  const dim3 grid_dim(unsigned((g.M + kOneKernelTile - 1) / kOneKernelTile),
                      unsigned((g.N + kOneKernelTile - 1) / kOneKernelTile));
  const int resident = one_kernel_resident_ctas<Op>(device);
  if (resident <= 0) return {StatusCode::kCudaError, "one-kernel forward: occupancy query failed"};
  if (int64_t(grid_dim.x) * grid_dim.y > resident)
    return {StatusCode::kNotSupported, "one-kernel forward: the grid does not fit on the GPU at once"};

  typename Op::Params p;
  const auto* x = static_cast<const ElementIn*>(g.x);
  const auto* w = static_cast<const ElementIn*>(g.w);
  typename Op::StrideA stride_a = make_stride(g.ldx, _1{}, g.ldx * g.M);
  typename Op::StrideB stride_b = make_stride(g.ldw, _1{}, g.ldw * g.N);
  p.mainloop = Op::Mainloop::to_underlying_arguments(make_shape(int(g.M), int(g.N), int(g.K), 1),
                                                    typename Op::Mainloop::Arguments{x, stride_a, w, stride_b}, nullptr);
  p.M = int(g.M);
  p.N = int(g.N);
  p.K = int(g.K);
  p.bias = static_cast<const ElementIn*>(g.bias);
  p.y = g.y;
  p.ldy = g.ldy;
  p.partials = pt;
  p.bn = a.bn;
  p.save_mean = a.save_mean;
  p.save_invstd = a.save_invstd;
  p.out = a.out;
  p.ldo = a.ldo;
  p.out_dtype = a.out_dtype;
  p.out_vectors = cuda::util::aligned16(a.out) && a.ldo % 4 == 0;
  p.row_lse = a.row_lse;
  p.row_max = a.row_parts;
  p.row_sum = a.row_parts + int64_t(grid_dim.y) * g.M;

  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid_dim;
  config.blockDim = dim3(Op::kThreads);
  config.dynamicSmemBytes = Op::kSmemBytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cuda::util::cuda_status(cudaLaunchKernelEx(&config, one_kernel_forward_kernel<Op>, p),
                                 "one-kernel forward: cooperative launch failed");
}

}  // namespace fused::sm90::detail
