// The CPU pieces of the library (partials in Chan form, fixed-order merge, finalize, softmax,
// output conversions) against float64 computations.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "fused/detail/half_bits.h"
#include "fused/detail/bn_math.h"
#include "api/forward_steps.h"
#include "test_util.h"

namespace fused {
namespace {

using test::column_moments;
using test::random_columns;
using test::rel_diff;

struct PartialsBuf {
  std::vector<float> storage;
  ColumnStatsPartials p;
  PartialsBuf(int64_t M, int64_t N, int64_t row_tile) {
    p.row_tile = row_tile;
    p.num_row_tiles = (M + row_tile - 1) / row_tile;
    p.ld = N;
    storage.assign(static_cast<size_t>(2 * p.num_row_tiles * N), std::numeric_limits<float>::quiet_NaN());
    p.mean = storage.data();
    p.m2 = storage.data() + p.num_row_tiles * N;
  }
};

class PartialsTest : public ::testing::TestWithParam<double> {};

// Per-tile (mean, M2) equal the float64 two-pass moments of each tile, for |mean|/std up to 1e3.
TEST_P(PartialsTest, TilesMatchFloat64) {
  const int64_t M = 300, N = 37, T = 128;  // last tile partial (44 rows)
  const auto y = random_columns(M, N, GetParam(), 1);
  PartialsBuf buf(M, N, T);
  cpu::column_partials(y.data(), N, M, N, buf.p);
  for (int64_t t = 0; t < buf.p.num_row_tiles; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      double mean, m2;
      column_moments(y, N, n, t * T, std::min(M, (t + 1) * T), mean, m2);
      const double rms = std::sqrt(mean * mean + m2 / (std::min(M, (t + 1) * T) - t * T));
      EXPECT_LE(std::fabs(buf.p.mean[t * N + n] - mean), 1e-7 * rms) << "tile " << t << " col " << n;
      EXPECT_LE(rel_diff(buf.p.m2[t * N + n], m2), 1e-6) << "tile " << t << " col " << n;
    }
  }
}

// Merging the tiles (fixed order) gives the column's mean and variance. The partial means
// are stored in fp32, so the merged variance carries ~|mean|/std * 2^-24 relative error per
// tile mean; at |mean|/std = 1e3 that bounds it near 1e-5 (eager's fp32 Welford is no better).
TEST_P(PartialsTest, MergedVarianceMatchesFloat64) {
  const double ratio = GetParam();
  const int64_t M = 1000, N = 16, T = 128;
  const auto y = random_columns(M, N, ratio, 2);
  PartialsBuf buf(M, N, T);
  cpu::column_partials(y.data(), N, M, N, buf.p);
  const double var_tol = ratio >= 1e3 ? 2e-5 : 1e-6;
  for (int64_t n = 0; n < N; ++n) {
    double mean, m2;
    column_moments(y, N, n, 0, M, mean, m2);
    const detail::MeanM2 s = detail::merge_column_partials(buf.p, M, n);
    EXPECT_EQ(s.n, static_cast<double>(M));
    // fp32 tile means: absolute error relative to the column's rms, not to a mean near zero.
    EXPECT_LE(std::fabs(s.mean - mean), 1e-7 * std::sqrt(mean * mean + m2 / M));
    EXPECT_LE(rel_diff(s.m2 / s.n, m2 / M), var_tol) << "col " << n;
  }
}

// Names: MeanOverStd/PartialsTest.*/ratio0, ratio3, ratio1000 (stable, readable in filters).
INSTANTIATE_TEST_SUITE_P(MeanOverStd, PartialsTest, ::testing::Values(0.0, 3.0, 1e3),
                         [](const ::testing::TestParamInfo<double>& info) {
                           return "ratio" + std::to_string(static_cast<int64_t>(info.param));
                         });

// The merge is order-fixed: merging the same partials twice gives identical bits, and a naive
// sum-of-squares would fail at |mean|/std = 1e3 where the merge does not.
TEST(Merge, DeterministicAndBetterThanSumOfSquares) {
  const int64_t M = 512, N = 4;
  const auto y = random_columns(M, N, 1e3, 3);
  PartialsBuf buf(M, N, 64);
  cpu::column_partials(y.data(), N, M, N, buf.p);
  const detail::MeanM2 a = detail::merge_column_partials(buf.p, M, 1);
  const detail::MeanM2 b = detail::merge_column_partials(buf.p, M, 1);
  EXPECT_EQ(a.mean, b.mean);
  EXPECT_EQ(a.m2, b.m2);
  double mean, m2;
  column_moments(y, N, 1, 0, M, mean, m2);
  float s = 0.f, s2 = 0.f;  // the formula we must not use, in fp32
  for (int64_t i = 0; i < M; ++i) {
    s += y[i * N + 1];
    s2 += y[i * N + 1] * y[i * N + 1];
  }
  const double naive_var = (s2 - s * s / M) / M;
  EXPECT_GT(rel_diff(naive_var, m2 / M), 1e-2);  // the naive form is visibly wrong here
  EXPECT_LE(rel_diff(a.m2 / M, m2 / M), 2e-5);
}

TEST(Merge, ChanMatchesDirectOnTwoGroups) {
  detail::MeanM2 acc;
  detail::chan_merge(acc, 3.0, 2.0, 8.0);  // {0, 2, 4}: mean 2, M2 8
  detail::chan_merge(acc, 2.0, 11.0, 2.0);  // {10, 12}: mean 11, M2 2
  // {0, 2, 4, 10, 12}: mean 5.6, M2 = 31.36 + 12.96 + 2.56 + 19.36 + 40.96 = 107.2
  EXPECT_DOUBLE_EQ(acc.n, 5.0);
  EXPECT_NEAR(acc.mean, 5.6, 1e-12);
  EXPECT_NEAR(acc.m2, 107.2, 1e-12);
}

struct FinalizeCase {
  bool training, running, affine, per_column_scale;
  double momentum;  // < 0: None
};

class FinalizeTest : public ::testing::TestWithParam<FinalizeCase> {};

TEST_P(FinalizeTest, MatchesFloat64Formulas) {
  const FinalizeCase c = GetParam();
  const int64_t M = 77, N = 9;
  const auto y = random_columns(M, N, 2.0, 4);
  PartialsBuf buf(M, N, 32);
  cpu::column_partials(y.data(), N, M, N, buf.p);
  std::vector<float> gamma(N), beta(N), rm(N), rv(N), scale(c.per_column_scale ? N : 1);
  for (int64_t n = 0; n < N; ++n) {
    gamma[n] = 0.5f + 0.1f * n;
    beta[n] = -0.3f + 0.05f * n;
    rm[n] = 0.2f * n;
    rv[n] = 1.0f + 0.3f * n;
  }
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = 1.5f - 0.25f * i;
  const std::vector<float> rm0 = rm, rv0 = rv;
  int64_t nbt = 4;  // before this batch: momentum=None averages over nbt + 1 batches
  BatchNormArgs bn;
  bn.training = c.training;
  if (c.affine) { bn.gamma = gamma.data(); bn.beta = beta.data(); }
  if (c.running) { bn.running_mean = rm.data(); bn.running_var = rv.data(); }
  bn.num_batches_tracked = &nbt;
  bn.momentum = c.momentum;
  bn.eps = 1e-3;
  bn.scale = scale.data();
  bn.scale_numel = static_cast<int64_t>(scale.size());
  std::vector<float> shift(N), a(N), cc(N), invstd(N);
  cpu::finalize(buf.p, M, N, bn, invstd.data(), ColumnAffine{shift.data(), a.data(), cc.data()});

  const bool batch = c.training || !c.running;
  const double f = c.momentum < 0 ? 1.0 / (nbt + 1) : c.momentum;
  for (int64_t n = 0; n < N; ++n) {
    double mean, m2;
    column_moments(y, N, n, 0, M, mean, m2);
    const double var = batch ? m2 / M : rv0[n];
    if (!batch) mean = rm0[n];
    const double inv = 1.0 / std::sqrt(var + 1e-3);
    const double s = scale[c.per_column_scale ? n : 0];
    const double g = c.affine ? gamma[n] : 1.0, b = c.affine ? beta[n] : 0.0;
    EXPECT_LE(rel_diff(shift[n], mean), 1e-6);
    EXPECT_LE(rel_diff(invstd[n], inv), 1e-6);
    EXPECT_LE(rel_diff(a[n], s * g * inv), 1e-6);
    EXPECT_LE(std::fabs(cc[n] - s * b), 1e-6);
    if (batch && c.running) {
      EXPECT_LE(rel_diff(rm[n], (1 - f) * rm0[n] + f * mean), 1e-6);
      EXPECT_LE(rel_diff(rv[n], (1 - f) * rv0[n] + f * m2 / (M - 1)), 1e-6);  // unbiased
    } else if (c.running) {
      EXPECT_EQ(rm[n], rm0[n]);
      EXPECT_EQ(rv[n], rv0[n]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, FinalizeTest,
                         ::testing::Values(FinalizeCase{true, true, true, false, 0.1},
                                           FinalizeCase{true, true, true, true, -1.0},  // momentum None
                                           FinalizeCase{true, true, false, false, 0.3},  // affine off
                                           FinalizeCase{true, false, true, false, 0.1},  // no running stats
                                           FinalizeCase{false, true, true, true, 0.1},   // eval
                                           FinalizeCase{false, false, true, false, 0.1}),  // eval, batch stats
                         [](const ::testing::TestParamInfo<FinalizeCase>& info) {
                           const FinalizeCase& c = info.param;
                           return std::string(c.training ? "train" : "eval") + (c.running ? "_running" : "_norunning") +
                                  (c.affine ? "_affine" : "_noaffine") +
                                  (c.per_column_scale ? "_columnscale" : "_scalarscale") +
                                  (c.momentum < 0 ? std::string("_momentumNone")
                                                  : "_momentum" + std::to_string(static_cast<int>(c.momentum * 100)) +
                                                        "pct");
                         });

TEST(Finalize, EmptyBatchLeavesRunningStats) {
  std::vector<float> rm{1.f, 2.f}, rv{3.f, 4.f}, scale{1.f}, shift(2), a(2), c(2), inv(2);
  BatchNormArgs bn;
  bn.running_mean = rm.data();
  bn.running_var = rv.data();
  bn.scale = scale.data();
  cpu::finalize(ColumnStatsPartials{}, 0, 2, bn, inv.data(), ColumnAffine{shift.data(), a.data(), c.data()});
  EXPECT_EQ(rm, (std::vector<float>{1.f, 2.f}));
  EXPECT_EQ(rv, (std::vector<float>{3.f, 4.f}));
}

// Row softmax of a * (y - shift) + c against float64.
TEST(RowSoftmax, MatchesFloat64) {
  for (int64_t N : {1, 3, 17, 1000}) {
    const int64_t M = 5;
    const auto y = random_columns(M, N, 1e3, 5);
    std::vector<float> shift(N), a(N), c(N);
    for (int64_t n = 0; n < N; ++n) {
      double mean, m2;
      column_moments(y, N, n, 0, M, mean, m2);
      shift[n] = static_cast<float>(mean);
      a[n] = static_cast<float>(2.0 / std::sqrt(m2 / M + 1e-5));
      c[n] = 0.1f * (n % 7);
    }
    std::vector<float> out(M * N, std::numeric_limits<float>::quiet_NaN()), lse(M, std::nanf(""));
    cpu::row_softmax(y.data(), N, M, N, ColumnAffine{shift.data(), a.data(), c.data()}, out.data(), N,
                     ElementType::kFloat32, lse.data());
    for (int64_t i = 0; i < M; ++i) {
      std::vector<double> z(N);
      double mx = -INFINITY, sum = 0.0;
      for (int64_t n = 0; n < N; ++n) {
        z[n] = a[n] * (static_cast<double>(y[i * N + n]) - shift[n]) + c[n];
        mx = std::max(mx, z[n]);
      }
      for (int64_t n = 0; n < N; ++n) sum += std::exp(z[n] - mx);
      for (int64_t n = 0; n < N; ++n) EXPECT_NEAR(out[i * N + n], std::exp(z[n] - mx) / sum, 2e-6) << N;
      EXPECT_NEAR(lse[i], mx + std::log(sum), 4e-7 * (std::fabs(mx) + std::log(sum) + 1.0)) << N;
    }
  }
}

TEST(RowSoftmax, NonFiniteRowsBehaveLikeTorch) {
  const int64_t N = 3;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // rows: a NaN, a +inf, all -inf, all equal
  const std::vector<float> y{0.f, nan, 1.f, 0.f, inf, 1.f, -inf, -inf, -inf, 2.f, 2.f, 2.f};
  std::vector<float> shift(N, 0.f), a(N, 1.f), c(N, 0.f), out(12, 0.f);
  cpu::row_softmax(y.data(), N, 4, N, ColumnAffine{shift.data(), a.data(), c.data()}, out.data(), N,
                   ElementType::kFloat32);
  for (int j = 0; j < 9; ++j) EXPECT_TRUE(std::isnan(out[j])) << j;  // torch.softmax gives NaN rows
  for (int j = 9; j < 12; ++j) EXPECT_FLOAT_EQ(out[j], 1.f / 3.f);
}

TEST(Convert, HalfAndBFloat16RoundToNearestEven) {
  using half_bits::float_to_bf16_bits;
  using half_bits::float_to_fp16_bits;
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-2.5f), 0xc020);
  EXPECT_EQ(float_to_bf16_bits(1.00390625f), 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16_bits(1.01171875f), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()) & 0x7f80, 0x7f80);
  EXPECT_EQ(float_to_fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16_bits(65504.f), 0x7bff);
  EXPECT_EQ(float_to_fp16_bits(65519.f), 0x7bff);
  EXPECT_EQ(float_to_fp16_bits(65520.f), 0x7c00);                 // rounds to inf
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.f, -24)), 0x0001);    // smallest subnormal
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.f, -25)), 0x0000);    // tie -> even (zero)
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(3.f, -26)), 0x0001);    // 0.75 ulp -> 1
  EXPECT_EQ(float_to_fp16_bits(std::ldexp(1.f, -14)), 0x0400);    // smallest normal
  EXPECT_EQ(float_to_fp16_bits(1.0f + std::ldexp(1.f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(float_to_fp16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_fp16_bits(std::numeric_limits<float>::quiet_NaN()) & 0x7c00, 0x7c00);
}

TEST(Validate, RejectsBadArguments) {
  ForwardProblem p;
  p.M = 1; p.N = 4; p.K = 2;
  std::vector<float> x(8), w(8), y(8), out(8), sm(4), si(4), scale(1, 1.f);
  ForwardBuffers b;
  b.x = x.data(); b.ldx = 2; b.weight = w.data(); b.ldw = 2; b.y = y.data(); b.ldy = 4;
  b.out = out.data(); b.ldo = 4; b.save_mean = sm.data(); b.save_invstd = si.data();
  BatchNormArgs bn;
  bn.scale = scale.data();
  EXPECT_EQ(validate(p, b, bn).code, StatusCode::kInvalidArgument);  // training with M == 1
  p.M = 2;
  EXPECT_TRUE(validate(p, b, bn).ok());
  bn.eps = -1.0;
  EXPECT_FALSE(validate(p, b, bn).ok());
  bn.eps = 0.0;  // refused with batch statistics (torch's rule), allowed with running statistics in eval
  EXPECT_FALSE(validate(p, b, bn).ok());
  std::vector<float> rm(4, 0.f), rv(4, 1.f);
  bn.running_mean = rm.data();
  bn.running_var = rv.data();
  bn.training = false;
  EXPECT_TRUE(validate(p, b, bn).ok());
  bn.training = true;
  bn.running_mean = bn.running_var = nullptr;
  bn.eps = 1e-5;
  bn.scale_numel = 3;
  EXPECT_FALSE(validate(p, b, bn).ok());
  bn.scale_numel = 1;
  // forward_from_y reads y, kept or not: a null y is refused there (it was read).
  p.keep_y = false;
  b.y = nullptr;
  EXPECT_TRUE(validate(p, b, bn).ok());  // a forward that never writes y may go without it
  EXPECT_EQ(cpu::forward_from_y(p, b, bn).code, StatusCode::kInvalidArgument);
  std::vector<double> record(2 * 4 + 1);
  EXPECT_EQ(cpu::column_moments(p, nullptr, 4, record.data()).code, StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace fused

namespace fused {
namespace {

// BN vectors in bf16 / fp16 (a module converted with .to(dtype)): read and written in their dtype.
TEST(Finalize, HalfPrecisionParametersReadAndWrittenInTheirDtype) {
  const int64_t M = 64, N = 5;
  const auto y = test::random_columns(M, N, 1.0, 21);
  std::vector<float> part(2 * N);
  ColumnStatsPartials p;
  p.row_tile = 64; p.num_row_tiles = 1; p.ld = N; p.mean = part.data(); p.m2 = part.data() + N;
  cpu::column_partials(y.data(), N, M, N, p);
  for (ElementType t : {ElementType::kBFloat16, ElementType::kFloat16}) {
    auto enc = [&](float v) { return t == ElementType::kBFloat16 ? half_bits::float_to_bf16_bits(v) : half_bits::float_to_fp16_bits(v); };
    std::vector<uint16_t> gamma(N), beta(N), rm(N), rv(N), scale{enc(2.0f)};
    for (int64_t n = 0; n < N; ++n) {
      gamma[n] = enc(1.0f + 0.25f * n); beta[n] = enc(-0.5f); rm[n] = enc(0.5f); rv[n] = enc(2.0f);
    }
    BatchNormArgs bn;
    bn.gamma = gamma.data(); bn.beta = beta.data(); bn.running_mean = rm.data(); bn.running_var = rv.data();
    bn.param_dtype = t; bn.scale = scale.data(); bn.scale_dtype = t; bn.momentum = 0.5;
    std::vector<float> shift(N), a(N), c(N), inv(N);
    cpu::finalize(p, M, N, bn, inv.data(), ColumnAffine{shift.data(), a.data(), c.data()});
    for (int64_t n = 0; n < N; ++n) {
      double mean, m2;
      test::column_moments(y, N, n, 0, M, mean, m2);
      EXPECT_LE(test::rel_diff(a[n], 2.0 * (1.0 + 0.25 * n) / std::sqrt(m2 / M + 1e-5)), 1e-6);
      EXPECT_FLOAT_EQ(c[n], -1.0f);
      const float want_rm = 0.5f * 0.5f + 0.5f * static_cast<float>(mean);
      EXPECT_EQ(rm[n], enc(want_rm)) << "running_mean stored in its dtype, rounded once";
      const float got_rv = half_bits::load(rv.data(), t, n);
      EXPECT_LE(test::rel_diff(got_rv, 0.5 * 2.0 + 0.5 * m2 / (M - 1)), t == ElementType::kBFloat16 ? 4e-3 : 5e-4);
    }
  }
}

TEST(Convert, HalfBitsRoundTrip) {
  for (float v : {0.0f, -0.0f, 1.0f, -3.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.0009765625f}) {
    EXPECT_EQ(half_bits::fp16_bits_to_float(half_bits::float_to_fp16_bits(v)), v) << v;
    const float b = half_bits::bf16_bits_to_float(half_bits::float_to_bf16_bits(v));
    EXPECT_LE(std::fabs(b - v), std::fabs(v) * (1.0f / 256)) << v;
  }
  EXPECT_TRUE(std::isinf(half_bits::fp16_bits_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(half_bits::fp16_bits_to_float(0x7e00)));
}

}  // namespace
}  // namespace fused

namespace fused {
namespace {
TEST(Convert, NonRepresentableValuesRoundToNearest) {
  // 1e-3 lies between fp16 0x1418 (0.00099945) and 0x1419 (0.0010004); nearest is 0x1419
  EXPECT_EQ(half_bits::float_to_fp16_bits(1e-3f), 0x1419);
  EXPECT_NEAR(half_bits::fp16_bits_to_float(0x1419), 1e-3f, 1e-6f);
}
}  // namespace
}  // namespace fused
