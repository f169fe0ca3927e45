// The experimental 3xTF32 GEMM with an MN-major A (src/kernels/sm90/gemm_3xtf32_mn_major_a.h):
// dx = dy W without a transposed copy of W, against float64 and exact fp32 on the host. Built with
// -DFUSED_3XTF32_MN_A_EXPERIMENT=ON; each case skips without a Hopper GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/sm90/gemm_3xtf32_mn_major_a.h"

namespace {

bool have_sm90() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major == 9;
}

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// dx (M, K) = dy (M, N) W (N, K), all row-major: m = K, n = M, k = N for the kernel. N(0,1) entries
// times 10^U(-3, 3). Asserted: every element written and finite; no less accurate than exact fp32 from
// a 1024-term sum up, within 3x of it below (the split keeps about 22 of fp32's 24 bits).
TEST(Sm90Gemm3xTf32MnMajorA, DxWithoutTransposedW) {
  if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x";
  struct Shape { int64_t M, N, K; };
  for (const Shape s : {Shape{256, 1024, 512}, Shape{200, 64, 132}, Shape{128, 8192, 256}}) {
    const int64_t M = s.M, N = s.N, K = s.K;
    SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
    std::mt19937 rng(unsigned(M * 7 + N * 3 + K));
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> exponent(-3.f, 3.f);
    std::vector<float> dy(M * N), w(N * K);
    for (auto& v : dy) v = normal(rng) * std::pow(10.f, exponent(rng));
    for (auto& v : w) v = normal(rng) * std::pow(10.f, exponent(rng));
    std::vector<double> ref(M * K);
    std::vector<float> exact32(M * K);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < K; ++j) {
        double r = 0;
        float f = 0.f;
        for (int64_t n = 0; n < N; ++n) {
          r += double(dy[i * N + n]) * double(w[n * K + j]);
          f = std::fma(dy[i * N + n], w[n * K + j], f);
        }
        ref[i * K + j] = r;
        exact32[i * K + j] = f;
      }
    float *d_dy = nullptr, *d_w = nullptr, *d_dx = nullptr;
    void* ws = nullptr;
    CUDA_OK(cudaMalloc(&d_dy, dy.size() * 4));
    CUDA_OK(cudaMalloc(&d_w, w.size() * 4));
    CUDA_OK(cudaMalloc(&d_dx, M * K * 4));
    const size_t ws_bytes = fused::sm90::gemm_3xtf32_mn_major_a_workspace_bytes(K, M, N);
    CUDA_OK(cudaMalloc(&ws, ws_bytes > 0 ? ws_bytes : 1));
    CUDA_OK(cudaMemcpy(d_dy, dy.data(), dy.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_dx, 0xFF, M * K * 4));  // NaN: unwritten elements show
    const fused::Status st = fused::sm90::gemm_3xtf32_mn_major_a(K, M, N, d_w, K, d_dy, N, d_dx, K, ws, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> dx(M * K);
    CUDA_OK(cudaMemcpy(dx.data(), d_dx, dx.size() * 4, cudaMemcpyDeviceToHost));
    cudaFree(d_dy), cudaFree(d_w), cudaFree(d_dx), cudaFree(ws);
    double e3 = 0, e32 = 0, r2 = 0;
    for (int64_t i = 0; i < M * K; ++i) {
      ASSERT_TRUE(std::isfinite(dx[i])) << "dx[" << i << "] unwritten or not finite";
      e3 += (dx[i] - ref[i]) * (dx[i] - ref[i]);
      e32 += (exact32[i] - ref[i]) * (exact32[i] - ref[i]);
      r2 += ref[i] * ref[i];
    }
    e3 = std::sqrt(e3 / r2);
    e32 = std::sqrt(e32 / r2);
    std::printf("3xTF32, MN-major A: dx %lldx%lld over %lld terms: rel err %.3g (exact fp32 %.3g)\n", (long long)M,
                (long long)K, (long long)N, e3, e32);
    EXPECT_LE(e3, N >= 1024 ? e32 : 3 * e32);
  }
}

}  // namespace
