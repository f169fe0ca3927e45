// Micro-benchmark of the backward's 3xTF32 GEMMs (not a test): median of device-event timings of
// dx = dy W (a = dy as stored) and dW = dy^T x, the latter both ways the kernel can read it: dy as
// stored, given as the transposed a (what the backward runs), and a materialized dy^T as stored (what
// it ran before: the dy pass wrote dy^T), in one process on the same data.
// Usage: bench_3xtf32_backward [M N K] [iters]    (the layer: x (M, K), W (N, K), dy (M, N))
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "bench_util.cuh"
#include "kernels/sm90/gemm_3xtf32_row_major.h"

namespace {

__global__ void transpose(const float* in, float* out, int64_t rows, int64_t cols) {  // out (cols, rows)
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * cols) out[(i % cols) * rows + i / cols] = in[i];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t M = 1024, N = 8192, K = 8192;
  int iters = 20;
  if (argc >= 4) { M = atoll(argv[1]); N = atoll(argv[2]); K = atoll(argv[3]); }
  if (argc >= 5) iters = atoi(argv[4]);
  float *x, *w, *dy, *dy_t, *dx, *dw, *bias;
  void* ws = nullptr;
  cudaMalloc(&x, M * K * 4);
  cudaMalloc(&w, N * K * 4);
  cudaMalloc(&dy, M * N * 4);
  cudaMalloc(&dy_t, M * N * 4);
  cudaMalloc(&dx, M * K * 4);
  cudaMalloc(&dw, N * K * 4);
  cudaMalloc(&bias, N * 4);
  fused::bench::fill_operands(x, w, bias, M, N, K, /*bf16=*/false);
  fused::bench::fill_random<<<unsigned((M * N + 255) / 256), 256>>>(reinterpret_cast<uint32_t*>(dy), size_t(M * N),
                                                                    37u, /*bf16=*/0, /*centred=*/1);
  transpose<<<unsigned((M * N + 255) / 256), 256>>>(dy, dy_t, M, N);
  size_t ws_bytes = fused::sm90::gemm_3xtf32_row_major_workspace_bytes(M, K, N, false);  // dx
  for (bool t : {false, true})  // dW, both ways
    ws_bytes = std::max(ws_bytes, fused::sm90::gemm_3xtf32_row_major_workspace_bytes(N, K, M, t));
  if (ws_bytes) cudaMalloc(&ws, ws_bytes);
  auto check = [](fused::Status s) {
    if (!s.ok()) { std::printf("error: %s\n", s.message); std::exit(1); }
  };
  const float t_dx = fused::bench::median_ms(
      [&] { check(fused::sm90::gemm_3xtf32_row_major(M, K, N, dy, N, false, w, K, dx, K, ws, nullptr)); }, iters);
  const float t_dw = fused::bench::median_ms(
      [&] { check(fused::sm90::gemm_3xtf32_row_major(N, K, M, dy, N, true, x, K, dw, K, ws, nullptr)); }, iters);
  const float t_dw_copy = fused::bench::median_ms(
      [&] { check(fused::sm90::gemm_3xtf32_row_major(N, K, M, dy_t, M, false, x, K, dw, K, ws, nullptr)); }, iters);
  const cudaError_t e = cudaDeviceSynchronize();
  const double flop = 2.0 * M * N * K;
  std::printf("3xtf32 backward M=%lld N=%lld K=%lld: dx %.4f ms (%.0f TFLOP/s) | dW from dy %.4f ms (%.0f) | "
              "dW from a dy^T copy %.4f ms (%.0f) | %s\n",
              (long long)M, (long long)N, (long long)K, t_dx, flop / t_dx / 1e9, t_dw, flop / t_dw / 1e9, t_dw_copy,
              flop / t_dw_copy / 1e9, cudaGetErrorString(e));
  return 0;
}
