// The backward's 3xTF32 GEMM at the kernel level (src/kernels/sm90/gemm_3xtf32_row_major.h):
// c = a b with row-major operands read as stored, a as stored or given transposed, in the backward's
// two shapes (dx = dy W; dW = dy^T x, which passes dy as the transposed a), against float64 and exact
// fp32 on the host, and inf / NaN against fp32's; with a as stored, both ways the kernel gets a's small
// parts (split by a pass first, or in the loop). Each case skips without a Hopper GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fused/detail/tf32_split.h"
#include "kernels/sm90/gemm_3xtf32_row_major.h"
#include "kernels/sm90/split_small_parts_3xtf32.h"

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
  fused::sm90::SmallParts small_parts = fused::sm90::SmallParts::kPresplit;
};

using fused::sm90::SmallParts;
const char* form(const Case& s) {
  const bool presplit = s.small_parts == SmallParts::kPresplit;
  if (s.small_parts == SmallParts::kDefault) return s.a_transposed ? " (a transposed, default form)" : " (default form)";
  return s.a_transposed   ? (presplit ? " (a transposed, presplit)" : " (a transposed, in-loop transpose and split)")
         : presplit       ? " (presplit)"
                          : " (in-loop split)";
}

// Bytes after the workspace that the kernel must leave as they were: more than a split-K reduction's
// slots at the test shapes (the thin dx case: 60 of 64 KiB), so that a workspace query short of
// what the kernel uses shows as a changed guard, not as a race with whatever lies there.
constexpr size_t kWorkspaceGuardBytes = size_t(8) << 20;
constexpr unsigned char kGuardByte = 0x5A;

// c = a b on the GPU; a and b row-major on the host (m, k) and (k, n); c poisoned with NaN first; the
// bytes after the workspace checked untouched.
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
  const size_t ws_bytes = fused::sm90::gemm_3xtf32_row_major_workspace_bytes(m, n, k, s.a_transposed, s.small_parts);
  EXPECT_EQ(cudaMalloc(&ws, ws_bytes + kWorkspaceGuardBytes), cudaSuccess);
  EXPECT_EQ(cudaMemset(static_cast<unsigned char*>(ws) + ws_bytes, kGuardByte, kWorkspaceGuardBytes), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d_a, a_given.data(), a.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d_b, b.data(), b.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_c, 0xFF, m * n * 4), cudaSuccess);  // NaN: unwritten elements show
  const fused::Status st = fused::sm90::gemm_3xtf32_row_major(m, n, k, d_a, s.a_transposed ? m : k, s.a_transposed, d_b,
                                                              n, d_c, n, ws, nullptr, s.small_parts);
  EXPECT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(c.data(), d_c, c.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<unsigned char> guard(kWorkspaceGuardBytes);
  EXPECT_EQ(cudaMemcpy(guard.data(), static_cast<unsigned char*>(ws) + ws_bytes, guard.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  size_t changed = 0;
  for (unsigned char g : guard) changed += g != kGuardByte;
  EXPECT_EQ(changed, 0u) << "the kernel wrote past the workspace that gemm_3xtf32_row_major_workspace_bytes gave ("
                         << ws_bytes << " bytes)";
  cudaFree(d_a), cudaFree(d_b), cudaFree(d_c), cudaFree(ws);
  return c;
}

// N(0,1) entries times 10^U(-3, 3). Asserted: every element written and finite; no less accurate than
// exact fp32 from a 1024-term sum up, within 3x of it below (the split keeps about 22 of fp32's 24 bits).
void expect_as_accurate_as_exact_fp32(const Case& s) {
  const int64_t m = s.m, n = s.n, k = s.k;
  SCOPED_TRACE(std::string(s.what) + " m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
               form(s));
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
  std::printf("3xTF32 row-major GEMM, %s%s %lldx%lld over %lld terms: rel err %.3g (exact fp32 %.3g)\n", s.what,
              form(s), (long long)m, (long long)n, (long long)k, e3, e32);
  EXPECT_LE(e3, k >= 1024 ? e32 : 3 * e32);
}

// dx (M, K) = dy (M, N) W (N, K): m = M, n = K, k = N. Under CUTLASS's stream-K heuristic (the default,
// FUSED_3XTF32_STREAM_K=1), the presplit form spreads the K loops of grids of a few tiles over the GPU:
// 128 x 256 x 8192 is two tiles split 32 ways, 4 x 256 x 8192 too, with partial tiles that need more
// than the thin a's workspace; 4 x 1024 x 8192 is 8 tiles in stream-K units over 132 CTAs.
TEST(Sm90Gemm3xTf32RowMajor, DxShapes) {
  if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x";
  for (const SmallParts parts : {SmallParts::kPresplit, SmallParts::kInLoop})
    for (Case s : {Case{"dx", 256, 512, 1024}, Case{"dx", 200, 132, 64}, Case{"dx", 128, 256, 4096},
                   Case{"dx", 128, 256, 8192}, Case{"dx", 130, 260, 36}, Case{"dx", 4, 256, 8192},
                   Case{"dx", 4, 1024, 8192}}) {
      s.small_parts = parts;
      expect_as_accurate_as_exact_fp32(s);
    }
}

// dW (N, K) = dy^T (N, M) x (M, K): m = N, n = K, k = M (a short reduction over the batch), with dy
// as stored (the transposed a), batches that are not a multiple of 4 or of the 32-row k-tile included.
TEST(Sm90Gemm3xTf32RowMajor, DwShapes) {
  if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x";
  for (const SmallParts parts : {SmallParts::kDefault, SmallParts::kPresplit, SmallParts::kInLoop})
    for (Case s : {Case{"dW", 1000, 260, 1024, true}, Case{"dW", 136, 4100, 68, true}, Case{"dW", 64, 128, 12, true},
                   Case{"dW", 132, 200, 1027, true}, Case{"dW", 260, 68, 3, true}, Case{"dW", 1000, 260, 1024}}) {
      // Below 1024 terms the library runs a given transposed in the in-loop form, the more accurate
      // over short sums (gemm_3xtf32_row_major.cu); the presplit form is held to the bounds where it runs.
      if (parts == SmallParts::kPresplit && s.a_transposed && s.k < 1024) continue;
      s.small_parts = parts;
      expect_as_accurate_as_exact_fp32(s);
    }
}

// inf and NaN in either operand reach c as in fp32 (the tile holding them is redone with the exact
// split): the same elements infinite with the same sign, the same ones NaN, the rest finite.
TEST(Sm90Gemm3xTf32RowMajor, InfAndNanPropagateAsInFp32) {
  if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x";
  for (const Case s : {Case{"special", 136, 132, 100, false, SmallParts::kPresplit},
                       Case{"special", 136, 132, 100, false, SmallParts::kInLoop},
                       Case{"special", 136, 132, 100, true, SmallParts::kPresplit},
                       Case{"special", 136, 132, 100, true, SmallParts::kInLoop}}) {
    SCOPED_TRACE(form(s));
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

// The presplit form's passes: small_toward_zero of every element, bit for bit against the host's, into a
// dense buffer from a strided one (and, transposing, the words themselves too), and the flag set
// exactly when a holds inf or NaN.
TEST(Sm90Gemm3xTf32RowMajor, SplitPassMatchesTheHostSplit) {
  if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x";
  const int64_t rows = 37, cols = 44, lda = 52;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> exponent(-30.f, 30.f);
  std::vector<float> a(rows * lda);
  for (auto& v : a) v = normal(rng) * std::pow(2.f, exponent(rng));
  a[5] = 0.f, a[6] = -0.f, a[7] = 1.0f, a[8] = 1e-40f, a[9] = -3.0f;  // zeros, exact TF32 values, a subnormal
  for (const bool special : {false, true}) {
    SCOPED_TRACE(special ? "with inf and NaN" : "finite");
    if (special) a[3 * lda + 40] = -INFINITY, a[20 * lda + 1] = NAN;
    float *d_a = nullptr, *d_small = nullptr;
    uint32_t* d_flag = nullptr;
    ASSERT_EQ(cudaMalloc(&d_a, a.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_small, rows * cols * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_flag, 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_a, a.data(), a.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_small, 0xFF, rows * cols * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_flag, 0x5A, 4), cudaSuccess);  // neither 0 nor 1: the pass must write it
    const fused::Status st = fused::sm90::split_small_parts_3xtf32(d_a, rows, cols, lda, d_small, d_flag, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    std::vector<float> small(rows * cols);
    uint32_t flag = 7;
    ASSERT_EQ(cudaMemcpy(small.data(), d_small, small.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&flag, d_flag, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(flag, special ? 1u : 0u);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        uint32_t got, want;
        const float expected = fused::tf32::small_toward_zero(a[r * lda + c]);
        std::memcpy(&got, &small[r * cols + c], 4);
        std::memcpy(&want, &expected, 4);
        ASSERT_EQ(got, want) << "element (" << r << ", " << c << ") of " << a[r * lda + c];
      }
    // The transposing pass over the same words, read as a^T: t (cols, rows) = a^T and its small parts,
    // row stride 40 (rows = 37 rounded up to a multiple of 4, plus one more group).
    const int64_t ldt = 40;
    float *d_t = nullptr, *d_t_small = nullptr;
    ASSERT_EQ(cudaMalloc(&d_t, cols * ldt * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_t_small, cols * ldt * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_flag, 0x5A, 4), cudaSuccess);
    const fused::Status st_t =
        fused::sm90::transpose_split_small_parts_3xtf32(d_a, cols, rows, lda, d_t, d_t_small, ldt, d_flag, nullptr);
    ASSERT_TRUE(st_t.ok()) << st_t.message;
    std::vector<float> t(cols * ldt), t_small(cols * ldt);
    ASSERT_EQ(cudaMemcpy(t.data(), d_t, t.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(t_small.data(), d_t_small, t_small.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&flag, d_flag, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d_a), cudaFree(d_small), cudaFree(d_flag), cudaFree(d_t), cudaFree(d_t_small);
    EXPECT_EQ(flag, special ? 1u : 0u);
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) {
        uint32_t got, want, got_small, want_small;
        const float expected = fused::tf32::small_toward_zero(a[r * lda + c]);
        std::memcpy(&got, &t[c * ldt + r], 4);
        std::memcpy(&want, &a[r * lda + c], 4);
        std::memcpy(&got_small, &t_small[c * ldt + r], 4);
        std::memcpy(&want_small, &expected, 4);
        ASSERT_EQ(got, want) << "transposed element (" << c << ", " << r << ")";
        ASSERT_EQ(got_small, want_small) << "transposed small part (" << c << ", " << r << ")";
      }
  }
}

}  // namespace
