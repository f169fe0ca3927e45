// The contract on host memory: column partials -> finalize -> row softmax. Shares its
// per-element and per-column math with the CUDA kernels (fused/detail/bn_math.h).
#include <algorithm>
#include <functional>
#include <cmath>
#include <limits>
#include <vector>

#include "fused/detail/half_bits.h"
#include "fused/detail/bn_math.h"
#include "api/forward_steps.h"
#include "fused/gemm_bn_softmax.h"

namespace fused::cpu {

// The row softmax's logit is fmaf(a, y - shift, c), the kernels' rounding. Built for baseline x86-64
// (no FMA instruction), fmaf is a call into libm per element: about half of row_softmax's time, and
// row_softmax was 14 % of a CPU forward's samples (256 x 1024 x 1024 fp32; the GEMM 53 %). A second
// copy for CPUs with FMA, chosen when the library loads, computes the same bits inline: row_softmax
// 7.8 %, the call 4.95 -> 4.36 ms on this 2-core machine (`python -m gemm_bn_softmax --dtype fp32`).
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#define FUSED_CPU_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define FUSED_CPU_FMA_CLONES
#endif

void column_partials(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnStatsPartials& out) {
  // Two passes per row tile (mean, then squared deviations): exact for any |mean| / std.
  std::vector<double> sum(static_cast<size_t>(N));
  for (int64_t t = 0; t < out.num_row_tiles; ++t) {
    const int64_t r0 = t * out.row_tile;
    const int64_t rows = detail::row_tile_count(M, out.row_tile, t);
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t i = r0; i < r0 + rows; ++i) {
      const float* row = y + i * ldy;
      for (int64_t n = 0; n < N; ++n) sum[n] += row[n];
    }
    float* mean = out.mean + t * out.ld;
    for (int64_t n = 0; n < N; ++n) mean[n] = static_cast<float>(sum[n] / static_cast<double>(rows));
    std::fill(sum.begin(), sum.end(), 0.0);
    for (int64_t i = r0; i < r0 + rows; ++i) {
      const float* row = y + i * ldy;
      for (int64_t n = 0; n < N; ++n) {
        const double d = static_cast<double>(row[n]) - mean[n];
        sum[n] += d * d;
      }
    }
    float* m2 = out.m2 + t * out.ld;
    for (int64_t n = 0; n < N; ++n) m2[n] = static_cast<float>(sum[n]);
  }
}

void finalize(const ColumnStatsPartials& partials, int64_t M, int64_t N, const BatchNormArgs& bn,
              float* save_invstd, const ColumnAffine& affine) {
  const bool batch = bn.uses_batch_stats();
  for (int64_t n = 0; n < N; ++n) {
    const detail::MeanM2 s = batch ? detail::batch_moments(partials, M, N, bn, n) : detail::MeanM2{};
    detail::finalize_column(n, s, bn, save_invstd, affine);
  }
}

namespace {
// Inlined into row_softmax, so that each of its copies compiles this loop for its own target.
#if defined(__GNUC__)
#define FUSED_CPU_INLINE __attribute__((always_inline)) inline
#else
#define FUSED_CPU_INLINE inline
#endif
template <class Store>
FUSED_CPU_INLINE void softmax_rows(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& f, float* row_lse,
                  Store store) {
  std::vector<float> z(static_cast<size_t>(N));
  for (int64_t i = 0; i < M; ++i) {
    const float* row = y + i * ldy;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t n = 0; n < N; ++n) {
      z[n] = detail::bn_logit(row[n], f.shift[n], f.a[n], f.c[n]);
      mx = std::max(mx, z[n]);  // NaN never wins std::max: handled by the sum below
    }
    // All -inf row: PyTorch yields NaN (exp(-inf - -inf)); keep that by not special-casing.
    float sum = 0.f;
    for (int64_t n = 0; n < N; ++n) {
      z[n] = std::exp(z[n] - mx);
      sum += z[n];
    }
    const float inv = 1.f / sum;
    for (int64_t n = 0; n < N; ++n) store(i, n, z[n] * inv);
    if (row_lse != nullptr) row_lse[i] = detail::log_normaliser(mx, sum);
  }
}
}  // namespace

FUSED_CPU_FMA_CLONES void row_softmax(const float* y, int64_t ldy, int64_t M, int64_t N, const ColumnAffine& affine,
                                      void* out, int64_t ldo, ElementType dtype, float* row_lse) {
  switch (dtype) {
    case ElementType::kFloat32: {
      auto* o = static_cast<float*>(out);
      softmax_rows(y, ldy, M, N, affine, row_lse, [&](int64_t i, int64_t n, float v) { o[i * ldo + n] = v; });
      break;
    }
    case ElementType::kBFloat16: {
      auto* o = static_cast<uint16_t*>(out);
      softmax_rows(y, ldy, M, N, affine, row_lse,
                   [&](int64_t i, int64_t n, float v) { o[i * ldo + n] = half_bits::float_to_bf16_bits(v); });
      break;
    }
    case ElementType::kFloat16: {
      auto* o = static_cast<uint16_t*>(out);
      softmax_rows(y, ldy, M, N, affine, row_lse,
                   [&](int64_t i, int64_t n, float v) { o[i * ldo + n] = half_bits::float_to_fp16_bits(v); });
      break;
    }
    case ElementType::kFloat64:  // not an output type of the forward: validate() rejects it
      break;
  }
}

void serial_for(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& body) {
  if (n > 0) body(0, n);
}

namespace {

// The column partials of y in row tiles of 128 rows, in `storage`.
ColumnStatsPartials partials_of(const float* y, int64_t ldy, int64_t M, int64_t N, std::vector<float>& storage,
                                const ParallelFor& parallel_for) {
  constexpr int64_t kRowTile = 128;
  ColumnStatsPartials partials;
  partials.row_tile = kRowTile;
  partials.num_row_tiles = (M + kRowTile - 1) / kRowTile;
  partials.ld = N;
  storage.resize(static_cast<size_t>(2 * partials.num_row_tiles * N));
  partials.mean = storage.data();
  partials.m2 = storage.data() + partials.num_row_tiles * N;
  // Each column's statistics depend on that column alone: any column split gives the same bits.
  parallel_for(N, 256, [&](int64_t n0, int64_t n1) {
    ColumnStatsPartials slice = partials;
    slice.mean += n0;
    slice.m2 += n0;
    column_partials(y + n0, ldy, M, n1 - n0, slice);
  });
  return partials;
}

}  // namespace

Status column_moments(const ForwardProblem& p, const float* y, int64_t ldy, double* record,
                      const ParallelFor& parallel_for) {
  ForwardBuffers b;
  b.y = const_cast<float*>(y);
  b.ldy = ldy;
  const ForwardProblem no_gemm = problem_from_y(p);
  if (Status s = validate_linear(no_gemm, b); !s.ok()) return s;
  if (record == nullptr) return {StatusCode::kInvalidArgument, "column_moments: record is null"};
  const int64_t M = p.M, N = p.N;
  record[0] = static_cast<double>(M);
  std::vector<float> storage;
  const ColumnStatsPartials partials = M > 0 && N > 0 ? partials_of(y, ldy, M, N, storage, parallel_for)
                                                      : ColumnStatsPartials{};
  for (int64_t n = 0; n < N; ++n) {
    const detail::MeanM2 s = detail::merge_column_partials(partials, M, n);
    record[1 + n] = s.mean;
    record[1 + N + n] = s.m2;
  }
  return Status::Ok();
}

Status forward_from_y(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn,
                      const ParallelFor& parallel_for) {
  const ForwardProblem no_gemm = problem_from_y(p);
  if (Status s = validate(no_gemm, b, bn); !s.ok()) return s;
  const int64_t M = p.M, N = p.N;
  // nn.BatchNorm1d counts the batch (after finalize has read the count, for momentum=None).
  auto count_batch = [&] {
    if (int64_t* counter = bn.batch_counter()) ++*counter;
  };
  if (N == 0) {
    count_batch();
    return Status::Ok();
  }
  ColumnStatsPartials partials;
  std::vector<float> storage;
  if (bn.uses_batch_stats() && bn.rank_moments == nullptr && M > 0)
    partials = partials_of(b.y, b.ldy, M, N, storage, parallel_for);
  std::vector<float> ac(static_cast<size_t>(2 * N));
  const ColumnAffine affine{b.save_mean, ac.data(), ac.data() + N};
  finalize(partials, M, N, bn, b.save_invstd, affine);
  count_batch();
  const int64_t elt = static_cast<int64_t>(element_size(p.out_dtype));
  parallel_for(M, std::max<int64_t>(1, 65536 / N), [&](int64_t r0, int64_t r1) {
    row_softmax(b.y + r0 * b.ldy, b.ldy, r1 - r0, N, affine, static_cast<char*>(b.out) + r0 * b.ldo * elt, b.ldo,
                p.out_dtype, b.row_lse != nullptr ? b.row_lse + r0 : nullptr);
  });
  return Status::Ok();
}

}  // namespace fused::cpu
