// A random backward problem on the host (fused/backward.h), for the CPU and GPU backward tests:
// y with chosen column statistics, out = the forward's softmax of y and its row log-normalisers, a
// random grad_out, the BN parameters and scale, in double and in float.
#pragma once

#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <vector>

#include "fused/backward.h"
#include "test_util.h"

namespace fused::test {

struct BackwardCase {
  int64_t M = 0, N = 0;
  bool batch_stats = true;
  bool affine = true;
  bool column_scale = false;
};

// Readable (and stable) in gtest's messages, instead of a byte dump.
inline void PrintTo(const BackwardCase& c, std::ostream* os) {
  *os << "{M=" << c.M << ", N=" << c.N << (c.batch_stats ? ", batch" : ", running") << (c.affine ? ", affine" : "")
      << (c.column_scale ? ", column scale" : "") << "}";
}

struct BackwardData {
  BackwardCase c;
  std::vector<double> y, out, lse, g, mean, invstd, gamma, beta, scale;  // float64 originals
  std::vector<float> yf, lsef, gf, meanf, invstdf, gammaf, betaf, scalef;

  // z = s (gamma xhat + beta), out = softmax(z) per row and lse = log sum exp(z), from the double data.
  static void forward(const BackwardCase& c, const std::vector<double>& y, const std::vector<double>& mean,
                      const std::vector<double>& invstd, const std::vector<double>& gamma,
                      const std::vector<double>& beta, const std::vector<double>& scale, std::vector<double>& out,
                      std::vector<double>* lse = nullptr) {
    out.assign(static_cast<size_t>(c.M * c.N), 0.0);
    if (lse != nullptr) lse->assign(static_cast<size_t>(c.M), 0.0);
    for (int64_t i = 0; i < c.M; ++i) {
      double mx = -INFINITY, sum = 0.0;
      for (int64_t n = 0; n < c.N; ++n) {
        const double s = scale[c.column_scale ? n : 0];
        const double xhat = (y[i * c.N + n] - mean[n]) * invstd[n];
        out[i * c.N + n] = s * (gamma[n] * xhat + beta[n]);
        mx = std::max(mx, out[i * c.N + n]);
      }
      for (int64_t n = 0; n < c.N; ++n) sum += (out[i * c.N + n] = std::exp(out[i * c.N + n] - mx));
      for (int64_t n = 0; n < c.N; ++n) out[i * c.N + n] /= sum;
      if (lse != nullptr) (*lse)[i] = mx + std::log(sum);
    }
  }

  // Batch statistics (biased variance, eps 1e-5) of y's columns.
  static void batch_stats(const BackwardCase& c, const std::vector<double>& y, std::vector<double>& mean,
                          std::vector<double>& invstd) {
    mean.assign(c.N, 0.0);
    invstd.assign(c.N, 0.0);
    for (int64_t n = 0; n < c.N; ++n) {
      double s = 0.0, ss = 0.0;
      for (int64_t i = 0; i < c.M; ++i) s += y[i * c.N + n];
      mean[n] = s / c.M;
      for (int64_t i = 0; i < c.M; ++i) ss += (y[i * c.N + n] - mean[n]) * (y[i * c.N + n] - mean[n]);
      invstd[n] = 1.0 / std::sqrt(ss / c.M + 1e-5);
    }
  }

  BackwardData(const BackwardCase& cs, uint64_t seed) : c(cs) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    std::uniform_real_distribution<double> uni(0.5, 1.5);
    const auto yc = random_columns(c.M, c.N, 2.0, seed + 1);
    y.assign(yc.begin(), yc.end());
    gamma.assign(c.N, 1.0);
    beta.assign(c.N, 0.0);
    if (c.affine) {
      for (auto& v : gamma) v = uni(rng);
      for (auto& v : beta) v = 0.3 * normal(rng);
    }
    scale.assign(c.column_scale ? c.N : 1, 0.0);
    for (auto& v : scale) v = 2.0 * uni(rng);
    if (c.batch_stats) {
      batch_stats(c, y, mean, invstd);
    } else {  // running statistics, unrelated to this batch
      for (int64_t n = 0; n < c.N; ++n) {
        mean.push_back(0.5 * normal(rng));
        invstd.push_back(1.0 / std::sqrt(uni(rng) * 4.0));
      }
    }
    forward(c, y, mean, invstd, gamma, beta, scale, out, &lse);
    g.resize(out.size());
    for (auto& v : g) v = normal(rng);
    auto to_float = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
    yf = to_float(y); lsef = to_float(lse); gf = to_float(g); meanf = to_float(mean); invstdf = to_float(invstd);
    gammaf = to_float(gamma); betaf = to_float(beta); scalef = to_float(scale);
  }

  // Problem and input buffers over the double (host) or float data; outputs left to the caller.
  BackwardProblem problem(ElementType t) const {
    BackwardProblem p;
    p.M = c.M; p.N = c.N; p.grad_dtype = t; p.stats_dtype = t; p.batch_stats = c.batch_stats;
    return p;
  }
};

// Norm-wise relative error of got against want.
template <class A, class B>
double rel_norm(const std::vector<A>& got, const std::vector<B>& want) {
  double d = 0.0, w = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    d += e * e;
    w += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(d) / std::max(std::sqrt(w), 1e-300);
}

}  // namespace fused::test
