// The backward's 3xTF32 GEMM at the kernel level (src/kernels/sm90/gemm_3xtf32_row_major.h):
// c = a b with row-major operands read as stored, a as stored or given transposed, in the backward's
// two shapes (dx = dy W; dW = dy^T x, which passes dy as the transposed a), against float64 and exact
// fp32 on the host, and inf / NaN against fp32's. Each case skips without a Hopper GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/sm90/gemm_3xtf32_row_major.h"

namespace {

bool have_sm90() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9;
}


struct Case {
  const char* what;
  int64_t m, n, k;  // c (m, n) = a (m, k) b (k, n)
  bool a_transposed = false;  // a handed to the kernel as a^T (k, m), row-major
};

// c = a b on the GPU; a and b row-major on the host (m, k) and (k, n); c poisoned with NaN first.
std::vector<float> device_product(const Case& s, const std::vector<float>& a, const std::vector<float>& b) {
  const int64_t m = s.m, n = s.n, k = s.k;
  std::vector<float> a_given = a;  // as the kernel reads it
  if (s.a_transposed)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t p = 0; p < k; ++p) a_given[p * m + i] = a[i * k + p];
  float *d_a = nullptr, *d_b = nullptr, *d_c = nullptr;
  void* ws = nullptr;
  std::vector<float> c(m * n);
  EXPECT_EQ(cudaMalloc(&d_a, a.size() * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_b, b.size() * 4), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&d_c, m * n * 4), cudaSuccess);
  const size_t ws_bytes = fused::sm90::gemm_3xtf32_row_major_workspace_bytes(m, n, k, s.a_transposed);
  EXPECT_EQ(cudaMalloc(&ws, ws_bytes > 0 ? ws_bytes : 1), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d_a, a_given.data(), a.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d_b, b.data(), b.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_c, 0xFF, m * n * 4), cudaSuccess);  // NaN: unwritten elements show
  const fused::Status st = fused::sm90::gemm_3xtf32_row_major(m, n, k, d_a, s.a_transposed ? m : k, s.a_transposed,
                                                              d_b, n, d_c, n, ws, nullptr);
  EXPECT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(c.data(), d_c, c.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_a), cudaFree(d_b), cudaFree(d_c), cudaFree(ws);
  return c;
}

// N(0,1) entries times 10^U(-3, 3). Asserted: every element written and finite; no less accurate than
// exact fp32 from a 1024-term sum up, within 3x of it below (the split keeps about 22 of fp32's 24 bits).
void expect_as_accurate_as_exact_fp32(const Case& s) {
  const int64_t m = s.m, n = s.n, k = s.k;
  SCOPED_TRACE(std::string(s.what) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
               (s.a_transposed ? " (a transposed)" : ""));
  std::mt19937 rng(unsigned(m * 7 + n * 3 + k));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> exponent(-3.f, 3.f);
  std::vector<float> a(m * k), b(k * n);
  for (auto& v : a) v = normal(rng) * std::pow(10.f, exponent(rng));
  for (auto& v : b) v = normal(rng) * std::pow(10.f, exponent(rng));
  std::vector<double> ref(m * n);
  std::vector<float> exact32(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double r = 0;
      float f = 0.f;
      for (int64_t p = 0; p < k; ++p) {
        r += double(a[i * k + p]) * double(b[p * n + j]);
        f = std::fma(a[i * k + p], b[p * n + j], f);
      }
      ref[i * n + j] = r;
      exact32[i * n + j] = f;
    }
  const std::vector<float> c = device_product(s, a, b);
  ASSERT_FALSE(::testing::Test::HasFailure());
  double e3 = 0, e32 = 0, r2 = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    ASSERT_TRUE(std::isfinite(c[i])) << "c[" << i << "] unwritten or not finite";
    e3 += (c[i] - ref[i]) * (c[i] - ref[i]);
    e32 += (exact32[i] - ref[i]) * (exact32[i] - ref[i]);
    r2 += ref[i] * ref[i];
  }
  e3 = std::sqrt(e3 / r2);
  e32 = std::sqrt(e32 / r2);
  std::printf("3xTF32 row-major GEMM, %s %lldx%lld over %lld terms: rel err %.3g (exact fp32 %.3g)\n", s.what,
              (long long)m, (long long)n, (long long)k, e3, e32);
  EXPECT_LE(e3, k >= 1024 ? e32 : 3 * e32);
}

// dx (M, K) = dy (M, N) W (N, K): m = M, n = K, k = N.
TEST(Sm90Gemm3xTf32RowMajor, DxShapes) {
  if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x";
  for (const Case s : {Case{"dx", 256, 512, 1024}, Case{"dx", 200, 132, 64}, Case{"dx", 128, 256, 4096},
                       Case{"dx", 128, 256, 8192}})
    expect_as_accurate_as_exact_fp32(s);
}

// dW (N, K) = dy^T (N, M) x (M, K): m = N, n = K, k = M (a short reduction over the batch), with dy
// as stored (the transposed a), batches that are not a multiple of 4 or of the 32-row k-tile included.
TEST(Sm90Gemm3xTf32RowMajor, DwShapes) {
  if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x";
  for (const Case s : {Case{"dW", 1000, 260, 1024, true}, Case{"dW", 136, 4100, 68, true}, Case{"dW", 64, 128, 12, true},
                       Case{"dW", 132, 200, 1027, true}, Case{"dW", 260, 68, 3, true}, Case{"dW", 1000, 260, 1024}})
    expect_as_accurate_as_exact_fp32(s);
}

// inf and NaN in either operand reach c as in fp32 (the tile holding them is redone with the exact
// split): the same elements infinite with the same sign, the same ones NaN, the rest finite.
TEST(Sm90Gemm3xTf32RowMajor, InfAndNanPropagateAsInFp32) {
  if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x";
  for (const bool a_transposed : {false, true}) {
    const Case s{"special", 136, 132, 100, a_transposed};
    SCOPED_TRACE(a_transposed ? "a transposed" : "a as stored");
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::vector<float> a(s.m * s.k), b(s.k * s.n);
    for (auto& v : a) v = normal(rng);
    for (auto& v : b) v = normal(rng);
    a[3 * s.k + 70] = INFINITY;    // row 3 of c: +-inf
    a[40 * s.k + 5] = NAN;         // row 40: NaN
    b[33 * s.n + 17] = -INFINITY;  // column 17: +-inf, NaN in rows 3 and 40
    b[90 * s.n + 120] = NAN;       // column 120: NaN
    const std::vector<float> c = device_product(s, a, b);
    ASSERT_FALSE(::testing::Test::HasFailure());
    int specials = 0;
    for (int64_t i = 0; i < s.m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        float f = 0.f;
        for (int64_t p = 0; p < s.k; ++p) f = std::fma(a[i * s.k + p], b[p * s.n + j], f);
        const float g = c[i * s.n + j];
        ASSERT_EQ(std::isnan(g), std::isnan(f)) << "c(" << i << ", " << j << ") = " << g << ", fp32 " << f;
        ASSERT_EQ(std::isinf(g), std::isinf(f)) << "c(" << i << ", " << j << ") = " << g << ", fp32 " << f;
        if (std::isinf(f)) ASSERT_EQ(std::signbit(g), std::signbit(f)) << "c(" << i << ", " << j << ")";
        specials += !std::isfinite(f);
      }
    EXPECT_GT(specials, s.m + s.n);  // the rows and columns above, not a lucky few
  }
}

}  // namespace
