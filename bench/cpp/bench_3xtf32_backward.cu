// Micro-benchmark of the backward's 3xTF32 GEMMs (not a test): median of device-event timings of
// dx = dy W (a = dy as stored) and dW = dy^T x (dy given as the transposed a), both ways the kernel
// can get a's small parts: a pass first (its time included; for dW it also writes dy^T), or split
// (and for dW transposed) by the consumers in the loop, in one process on the same data. The forward's
// 3xTF32 GEMM is timed by bench_sm90_gemm_stats (SM90_BENCH_MODES=3xtf32).
// Usage: bench_3xtf32_backward [M N K] [iters]    (the layer: x (M, K), W (N, K), dy (M, N))
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "bench_util.cuh"
#include "kernels/sm90/gemm_3xtf32_row_major.h"

int main(int argc, char** argv) {
  int64_t M = 1024, N = 8192, K = 8192;
  int iters = 20;
  if (argc >= 4) { M = atoll(argv[1]); N = atoll(argv[2]); K = atoll(argv[3]); }
  if (argc >= 5) iters = atoi(argv[4]);
  float *x, *w, *dy, *dx, *dw, *bias;
  void* ws = nullptr;
  cudaMalloc(&x, M * K * 4);
  cudaMalloc(&w, N * K * 4);
  cudaMalloc(&dy, M * N * 4);
  cudaMalloc(&dx, M * K * 4);
  cudaMalloc(&dw, N * K * 4);
  cudaMalloc(&bias, N * 4);
  fused::bench::fill_operands(x, w, bias, M, N, K, /*bf16=*/false);
  fused::bench::fill_random<<<unsigned((M * N + 255) / 256), 256>>>(reinterpret_cast<uint32_t*>(dy), size_t(M * N),
                                                                    37u, /*bf16=*/0, /*centred=*/1);
  using fused::sm90::SmallParts;
  size_t ws_bytes = 0;
  for (SmallParts p : {SmallParts::kPresplit, SmallParts::kInLoop})  // dx
    ws_bytes = std::max(ws_bytes, fused::sm90::gemm_3xtf32_row_major_workspace_bytes(M, K, N, false, p));
  for (SmallParts p : {SmallParts::kPresplit, SmallParts::kInLoop})  // dW
    ws_bytes = std::max(ws_bytes, fused::sm90::gemm_3xtf32_row_major_workspace_bytes(N, K, M, true, p));
  if (ws_bytes) cudaMalloc(&ws, ws_bytes);
  auto check = [](fused::Status s) {
    if (!s.ok()) { std::printf("error: %s\n", s.message); std::exit(1); }
  };
  auto dx_ms = [&](SmallParts p) {
    return fused::bench::median_ms(
        [&] { check(fused::sm90::gemm_3xtf32_row_major(M, K, N, dy, N, false, w, K, dx, K, ws, nullptr, p)); }, iters);
  };
  auto dw_ms = [&](SmallParts p) {
    return fused::bench::median_ms(
        [&] { check(fused::sm90::gemm_3xtf32_row_major(N, K, M, dy, N, true, x, K, dw, K, ws, nullptr, p)); }, iters);
  };
  // Alternating, twice each, the faster kept: the clocks of a power-limited GPU drift between timings.
  float t_dx = 1e30f, t_dx_loop = 1e30f, t_dw = 1e30f, t_dw_loop = 1e30f;
  for (int round = 0; round < 2; ++round) {
    t_dx = std::min(t_dx, dx_ms(SmallParts::kPresplit));
    t_dx_loop = std::min(t_dx_loop, dx_ms(SmallParts::kInLoop));
    t_dw = std::min(t_dw, dw_ms(SmallParts::kPresplit));
    t_dw_loop = std::min(t_dw_loop, dw_ms(SmallParts::kInLoop));
  }
  const cudaError_t e = cudaDeviceSynchronize();
  const double flop = 2.0 * M * N * K;
  std::printf("3xtf32 backward M=%lld N=%lld K=%lld: dx presplit %.4f ms (%.0f TFLOP/s) | dx in-loop split %.4f ms "
              "(%.0f) | dW presplit (dy^T written by the pass) %.4f ms (%.0f) | dW in-loop transpose and split %.4f ms "
              "(%.0f) | %s\n",
              (long long)M, (long long)N, (long long)K, t_dx, flop / t_dx / 1e9, t_dx_loop, flop / t_dx_loop / 1e9, t_dw,
              flop / t_dw / 1e9, t_dw_loop, flop / t_dw_loop / 1e9, cudaGetErrorString(e));
  return 0;
}
