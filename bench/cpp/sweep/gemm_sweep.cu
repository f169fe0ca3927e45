// Sweep of the sm90 GEMM + column-statistics configurations (tile, cluster, schedule, raster order,
// swizzle) against cuBLAS on the same shapes: median device time of each, statistics on (training)
// and off (eval). Not a test; built with -DFUSED_BUILD_GEMM_SWEEP=ON (CUTLASS instantiations are
// expensive to compile). Usage: gemm_sweep [iters] [MxNxK ...]; prints one JSON line per record.
// GEMM_SWEEP_VARIANTS=a,b,... keeps the variants whose name contains one of the substrings;
// GEMM_SWEEP_CHOICES=r:s,... replaces the (raster order, max swizzle) list.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../bench_util.cuh"
#include "gemm_sweep.h"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e)); std::exit(1); }
}

bool selected(const std::string& variant, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  for (const auto& f : filters)
    if (variant.find(f) != std::string::npos) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 30;
  std::vector<std::array<int64_t, 3>> shapes;
  for (int i = 2; i < argc; ++i) {
    long long m, n, k;
    if (std::sscanf(argv[i], "%lldx%lldx%lld", &m, &n, &k) == 3) shapes.push_back({m, n, k});
  }
  if (shapes.empty()) shapes.push_back({1024, 8192, 8192});
  cublasHandle_t h;
  cublasCreate(&h);
  std::vector<fused::sweep::SchedulerChoice> choices = {{0, 1}, {1, 1}, {2, 1}, {1, 2}, {2, 2}, {1, 4}, {2, 4}, {2, 8}};
  if (!fused::bench::env_list("GEMM_SWEEP_CHOICES").empty()) {
    choices.clear();
    for (const auto& c : fused::bench::env_list("GEMM_SWEEP_CHOICES")) {
      int r = 0, sw = 1;
      if (std::sscanf(c.c_str(), "%d:%d", &r, &sw) == 2) choices.push_back({r, sw});
    }
  }
  const std::vector<std::string> filters = fused::bench::env_list("GEMM_SWEEP_VARIANTS");
  for (const auto& shape : shapes) {
    const int64_t M = shape[0], N = shape[1], K = shape[2];  // named copies: lambdas capture them
    void *x, *w, *bias, *ws = nullptr;
    float *y, *mean, *m2;
    check(cudaMalloc(&x, M * K * 4), "malloc x");
    check(cudaMalloc(&w, N * K * 4), "malloc w");
    check(cudaMalloc(&bias, N * 4), "malloc bias");
    check(cudaMalloc(&y, M * N * 4), "malloc y");
    const int64_t max_partials = (M + 63) / 64 * ((N + 127) / 128 * 128 + 256);
    check(cudaMalloc(&mean, max_partials * 4), "malloc mean");
    check(cudaMalloc(&m2, max_partials * 4), "malloc m2");
    size_t ws_bytes = 0;
    for (int bf16 = 1; bf16 >= 0; --bf16) {
        fused::bench::fill_operands(x, w, bias, M, N, K, bf16);
      const char* dt = bf16 ? "bf16" : "tf32";
      const double flop = 2.0 * M * N * K;
      // cuBLAS peers: fp32 y (what the generic path computes) and, for bf16, a bf16 y (F.linear's GEMM).
      float alpha = 1.f, beta = 0.f;
      cublasSetMathMode(h, bf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_TF32_TENSOR_OP_MATH);
      const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
      const cublasComputeType_t ct = bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
      float t = fused::bench::median_ms([&] {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w, in, int(K), x, in, int(K), &beta, y,
                     CUDA_R_32F, int(N), ct, CUBLAS_GEMM_DEFAULT);
      }, iters, 3);
      std::printf("{\"M\":%lld,\"N\":%lld,\"K\":%lld,\"dtype\":\"%s\",\"kernel\":\"cublas_fp32_out\",\"ms\":%.5f,\"tflops\":%.1f}\n",
                  (long long)M, (long long)N, (long long)K, dt, t, flop / t / 1e9);
      if (bf16) {
        t = fused::bench::median_ms([&] {
          cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, w, in, int(K), x, in, int(K), &beta,
                       y, CUDA_R_16BF, int(N), ct, CUBLAS_GEMM_DEFAULT);
        }, iters, 3);
        std::printf("{\"M\":%lld,\"N\":%lld,\"K\":%lld,\"dtype\":\"%s\",\"kernel\":\"cublas_bf16_out\",\"ms\":%.5f,\"tflops\":%.1f}\n",
                    (long long)M, (long long)N, (long long)K, dt, t, flop / t / 1e9);
      }
      for (const auto& v : fused::sweep::variants()) {
        if (v.bf16 != bool(bf16) || !selected(v.name, filters)) continue;
        fused::sm90::GemmStatsArgs a;
        a.M = M; a.N = N; a.K = K; a.x = x; a.ldx = K; a.w = w; a.ldw = K; a.bias = bias; a.y = y; a.ldy = N;
        const int64_t ld = (N + v.tile_n - 1) / v.tile_n * v.tile_n;
        a.partials = {mean, m2, (M + v.tile_m - 1) / v.tile_m, v.tile_m, ld};
        a.tile = v.tile_m == 128 ? fused::sm90::Sm90Tile::k128x128 : fused::sm90::Sm90Tile::k256x128;
        for (auto c : choices) {
          const size_t need = v.workspace(a, c);
          if (need > ws_bytes) { cudaFree(ws); check(cudaMalloc(&ws, need), "malloc ws"); ws_bytes = need; }
          bool failed = false;
          auto run = [&](const fused::sm90::GemmStatsArgs& args) {
            fused::Status s = v.run(args, ws, nullptr, c);
            if (!s.ok() && !failed) { std::fprintf(stderr, "%s: %s\n", v.name.c_str(), s.message); failed = true; }
          };
          fused::sm90::GemmStatsArgs eval = a;
          eval.partials = {};
          const float t_stats = fused::bench::median_ms([&] { run(a); }, iters, 3);
          const float t_eval = fused::bench::median_ms([&] { run(eval); }, iters, 3);
          check(cudaDeviceSynchronize(), v.name.c_str());
          if (failed) continue;
          std::printf("{\"M\":%lld,\"N\":%lld,\"K\":%lld,\"dtype\":\"%s\",\"kernel\":\"%s\",\"raster\":%d,\"swizzle\":%d,"
                      "\"ms\":%.5f,\"tflops\":%.1f,\"eval_ms\":%.5f}\n",
                      (long long)M, (long long)N, (long long)K, dt, v.name.c_str(), c.raster_order, c.max_swizzle,
                      t_stats, flop / t_stats / 1e9, t_eval);
          std::fflush(stdout);
        }
      }
    }
    cudaFree(x); cudaFree(w); cudaFree(bias); cudaFree(y); cudaFree(mean); cudaFree(m2);
  }
  return 0;
}
