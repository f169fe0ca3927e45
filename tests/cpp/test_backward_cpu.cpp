// The CPU backward (fused::cpu::backward) in float64 against central finite differences of the
// forward, for batch and running statistics, affine on and off, scalar and per-column scale.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backward_problem.h"
#include "fused/backward.h"

namespace fused {
namespace {

using test::BackwardCase;
using test::BackwardData;

// L = sum g * out, with the statistics recomputed from y when the forward uses batch statistics.
double loss(const BackwardData& d, const std::vector<double>& y, const std::vector<double>& gamma,
            const std::vector<double>& beta, const std::vector<double>& scale) {
  std::vector<double> mean = d.mean, invstd = d.invstd, out;
  if (d.c.batch_stats) BackwardData::batch_stats(d.c, y, mean, invstd);
  BackwardData::forward(d.c, y, mean, invstd, gamma, beta, scale, out);
  double l = 0.0;
  for (size_t i = 0; i < out.size(); ++i) l += d.g[i] * out[i];
  return l;
}

// Central difference of the loss in one coordinate of v (a copy is perturbed).
template <class F>
double numeric(std::vector<double> v, size_t i, F&& f) {
  const double h = 1e-6 * std::max(1.0, std::fabs(v[i]));
  const double v0 = v[i];
  v[i] = v0 + h;
  const double up = f(v);
  v[i] = v0 - h;
  return (up - f(v)) / (2 * h);
}

class BackwardCpu : public ::testing::TestWithParam<BackwardCase> {};

TEST_P(BackwardCpu, MatchesFiniteDifferences) {
  const BackwardData d(GetParam(), 7);
  const BackwardCase& c = d.c;
  std::vector<double> dy(c.M * c.N, NAN), ggamma(c.N, NAN), gbeta(c.N, NAN), gbias(c.N, NAN),
      gscale(d.scale.size(), NAN);
  BackwardBuffers b;
  b.grad_out = d.g.data(); b.ldg = c.N;
  b.y = d.y.data(); b.ldy = c.N;
  b.save_mean = d.mean.data(); b.save_invstd = d.invstd.data(); b.row_lse = d.lse.data();
  if (c.affine) {
    b.gamma = d.gamma.data(); b.beta = d.beta.data();
    b.grad_gamma = ggamma.data(); b.grad_beta = gbeta.data();
  }
  b.param_dtype = ElementType::kFloat64;
  b.scale = d.scale.data(); b.scale_numel = static_cast<int64_t>(d.scale.size()); b.scale_dtype = ElementType::kFloat64;
  b.dy = dy.data(); b.lddy = c.N; b.dy_dtype = ElementType::kFloat64;
  b.grad_bias = gbias.data(); b.bias_dtype = ElementType::kFloat64;
  b.grad_scale = gscale.data();
  ASSERT_TRUE(cpu::backward(d.problem(ElementType::kFloat64), b).ok());

  auto close = [](double got, double want, double scale) { return std::fabs(got - want) <= 1e-6 * (scale + 1.0); };
  double dy_scale = 0.0;
  for (double v : dy) dy_scale = std::max(dy_scale, std::fabs(v));
  for (size_t i = 0; i < dy.size(); ++i) {
    const double want = numeric(d.y, i, [&](const std::vector<double>& y) { return loss(d, y, d.gamma, d.beta, d.scale); });
    EXPECT_TRUE(close(dy[i], want, dy_scale)) << "dy[" << i << "] " << dy[i] << " vs " << want;
  }
  for (int64_t n = 0; n < c.N; ++n) {
    // y = x W^T + b: dL/db = sum_i dL/dy (0 with batch statistics, which remove any bias)
    double col = 0.0;
    for (int64_t i = 0; i < c.M; ++i) col += dy[i * c.N + n];
    EXPECT_TRUE(close(gbias[n], col, dy_scale * c.M)) << "d_bias[" << n << "]";
    if (c.batch_stats) EXPECT_EQ(gbias[n], 0.0);
    if (!c.affine) continue;
    EXPECT_TRUE(close(ggamma[n], numeric(d.gamma, n, [&](const std::vector<double>& v) {
                        return loss(d, d.y, v, d.beta, d.scale); }), 1.0)) << "d_gamma[" << n << "]";
    EXPECT_TRUE(close(gbeta[n], numeric(d.beta, n, [&](const std::vector<double>& v) {
                        return loss(d, d.y, d.gamma, v, d.scale); }), 1.0)) << "d_beta[" << n << "]";
  }
  for (size_t n = 0; n < d.scale.size(); ++n) {
    EXPECT_TRUE(close(gscale[n], numeric(d.scale, n, [&](const std::vector<double>& v) {
                        return loss(d, d.y, d.gamma, d.beta, v); }), 1.0)) << "d_scale[" << n << "]";
  }
}

std::string case_name(const ::testing::TestParamInfo<BackwardCase>& info) {
  const BackwardCase& c = info.param;
  return "M" + std::to_string(c.M) + "N" + std::to_string(c.N) + (c.batch_stats ? "_batch" : "_running") +
         (c.affine ? "_affine" : "_noaffine") + (c.column_scale ? "_columnscale" : "_scalarscale");
}

INSTANTIATE_TEST_SUITE_P(Cases, BackwardCpu,
                         ::testing::Values(BackwardCase{5, 4, true, true, false}, BackwardCase{6, 7, true, true, true},
                                           BackwardCase{4, 3, false, true, true},
                                           BackwardCase{7, 5, true, false, false},
                                           BackwardCase{3, 6, false, false, false}, BackwardCase{2, 2, true, true, true}),
                         case_name);

TEST(BackwardCpu, TransposedDyIsDyTransposed) {
  const BackwardData d({9, 6, true, true, false}, 3);
  std::vector<float> dy(9 * 6), dy_t(6 * 9);
  BackwardBuffers b;
  b.grad_out = d.gf.data(); b.ldg = 6; b.y = d.yf.data(); b.ldy = 6;
  b.save_mean = d.meanf.data(); b.save_invstd = d.invstdf.data(); b.row_lse = d.lsef.data();
  b.gamma = d.gammaf.data(); b.beta = d.betaf.data(); b.scale = d.scalef.data();
  b.dy = dy.data(); b.lddy = 6; b.dy_t = dy_t.data(); b.lddy_t = 9;
  ASSERT_TRUE(cpu::backward(d.problem(ElementType::kFloat32), b).ok());
  for (int i = 0; i < 9; ++i)
    for (int n = 0; n < 6; ++n) EXPECT_EQ(dy[i * 6 + n], dy_t[n * 9 + i]);
}

TEST(BackwardCpu, RejectsBadArguments) {
  BackwardProblem p;
  p.M = 3; p.N = 4;
  BackwardBuffers b;  // no data at all
  EXPECT_EQ(cpu::backward(p, b).code, StatusCode::kInvalidArgument);
  std::vector<float> v(12), s(1, 1.f);
  b.grad_out = v.data(); b.ldg = 4; b.y = v.data(); b.ldy = 4;
  b.save_mean = v.data(); b.save_invstd = v.data(); b.row_lse = v.data(); b.scale = s.data();
  EXPECT_TRUE(cpu::backward(p, b).ok());
  b.scale_numel = 3;  // neither 1 nor N
  EXPECT_EQ(cpu::backward(p, b).code, StatusCode::kInvalidArgument);
  b.scale_numel = 1;
  b.grad_gamma = v.data();  // gamma gradient without gamma
  EXPECT_EQ(cpu::backward(p, b).code, StatusCode::kInvalidArgument);
}

// The data-parallel steps, torch-free: the rows split over ranks (one empty), each rank's
// backward_column_sums gathered by hand in rank order, then each rank's backward with them. In
// float64, dy's rows and the per-rank parameter gradients summed over ranks equal the whole
// batch's backward to rounding.
TEST(BackwardCpu, DataParallelStepsMatchTheWholeBatch) {
  const BackwardData d({41, 13, true, true, true}, 3);
  const BackwardCase& c = d.c;
  auto buffers = [&](int64_t r0, std::vector<double>& dy, std::vector<double>& ggamma, std::vector<double>& gbeta,
                     std::vector<double>& gbias, std::vector<double>& gscale) {
    BackwardBuffers b;
    b.grad_out = d.g.data() + r0 * c.N; b.ldg = c.N;
    b.y = d.y.data() + r0 * c.N; b.ldy = c.N;
    b.save_mean = d.mean.data(); b.save_invstd = d.invstd.data(); b.row_lse = d.lse.data() + r0;
    b.gamma = d.gamma.data(); b.beta = d.beta.data(); b.grad_gamma = ggamma.data(); b.grad_beta = gbeta.data();
    b.param_dtype = b.scale_dtype = b.dy_dtype = b.bias_dtype = ElementType::kFloat64;
    b.scale = d.scale.data(); b.scale_numel = static_cast<int64_t>(d.scale.size());
    b.dy = dy.data() + r0 * c.N; b.lddy = c.N;
    b.grad_bias = gbias.data(); b.grad_scale = gscale.data();
    return b;
  };
  const size_t n = static_cast<size_t>(c.N);
  std::vector<double> dy(c.M * c.N, NAN), ggamma(n, NAN), gbeta(n, NAN), gbias(n, NAN), gscale(n, NAN);
  ASSERT_TRUE(cpu::backward(d.problem(ElementType::kFloat64), buffers(0, dy, ggamma, gbeta, gbias, gscale)).ok());

  const std::vector<int64_t> rows = {17, 0, 24};
  const size_t record = static_cast<size_t>(rank_record_size(c.N));
  std::vector<double> rank_sums(rows.size() * record, NAN), row_sums(kRowSumsRows * c.M, NAN), dy_split(c.M * c.N, NAN);
  std::vector<std::vector<double>> rg(rows.size(), std::vector<double>(n, NAN)), rb = rg, rbias = rg, rs = rg;
  for (int step = 0; step < 2; ++step) {
    int64_t r0 = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
      BackwardProblem p = d.problem(ElementType::kFloat64);
      p.M = rows[r];
      BackwardBuffers b = buffers(r0, dy_split, rg[r], rb[r], rbias[r], rs[r]);
      if (step == 0) {
        ASSERT_TRUE(cpu::backward_column_sums(p, b, rank_sums.data() + r * record, row_sums.data() + kRowSumsRows * r0).ok());
        EXPECT_EQ(rank_sums[r * record], static_cast<double>(rows[r])) << "count";
      } else {
        b.local_sums = rank_sums.data() + r * record;
        b.rank_sums = rank_sums.data();
        b.num_ranks = static_cast<int64_t>(rows.size());
        b.row_sums = row_sums.data() + kRowSumsRows * r0;  // this rank's (2, M_r)
        ASSERT_TRUE(cpu::backward(p, b).ok());
      }
      r0 += rows[r];
    }
  }
  EXPECT_LE(test::rel_norm(dy_split, dy), 1e-13);
  auto summed = [&](const std::vector<std::vector<double>>& per_rank) {
    std::vector<double> total(n, 0.0);
    for (const auto& v : per_rank)
      for (size_t j = 0; j < n; ++j) total[j] += v[j];
    return total;
  };
  EXPECT_LE(test::rel_norm(summed(rg), ggamma), 1e-13);
  EXPECT_LE(test::rel_norm(summed(rb), gbeta), 1e-13);
  EXPECT_LE(test::rel_norm(summed(rs), gscale), 1e-13);
  for (double v : summed(rbias)) EXPECT_EQ(v, 0.0);
}

}  // namespace
}  // namespace fused
