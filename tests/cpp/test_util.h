// Shared helpers for the C++ tests: random data and float64 references of the contract.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace fused::test {

// The dot product of two k-element rows in float64 and as exact fp32 computes it (one fma after
// another): the references of the 3xTF32 GEMM tests.
struct DotReferences {
  double float64 = 0.0;
  float fp32 = 0.f;
};
inline DotReferences dot_references(const float* a, const float* b, int64_t k) {
  DotReferences r;
  for (int64_t i = 0; i < k; ++i) {
    r.float64 += double(a[i]) * double(b[i]);
    r.fp32 = std::fma(a[i], b[i], r.fp32);
  }
  return r;
}

// y[i, n] = offset[n] + std[n] * N(0, 1): columns with chosen |mean| / std.
inline std::vector<float> random_columns(int64_t M, int64_t N, double mean_over_std, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uni(0.5, 2.0);
  std::vector<double> stdv(N), offset(N);
  for (int64_t n = 0; n < N; ++n) {
    stdv[n] = uni(rng);
    offset[n] = (n % 2 ? -1.0 : 1.0) * mean_over_std * stdv[n];
  }
  std::vector<float> y(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) y[i * N + n] = static_cast<float>(offset[n] + stdv[n] * normal(rng));
  return y;
}

// Two-pass float64 mean and biased variance of column n over rows [r0, r1).
inline void column_moments(const std::vector<float>& y, int64_t N, int64_t n, int64_t r0, int64_t r1, double& mean,
                           double& m2) {
  double s = 0.0;
  for (int64_t i = r0; i < r1; ++i) s += y[i * N + n];
  mean = s / static_cast<double>(r1 - r0);
  m2 = 0.0;
  for (int64_t i = r0; i < r1; ++i) {
    const double d = y[i * N + n] - mean;
    m2 += d * d;
  }
}

inline double rel_diff(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-30); }

}  // namespace fused::test
