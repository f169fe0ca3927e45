// Micro-benchmark of the sm90 GEMM + column statistics kernels (not a test): median of device-event
// timings, statistics on (training) vs off (eval), and cuBLAS GEMM (fp32 out) of the same precision.
// Usage: sm90_bench_gemm_stats [M N K] [iters]
#include <cuda_runtime.h>
#if __has_include(<cublas_v2.h>) && !defined(SM90_BENCH_NO_CUBLAS)
#include <cublas_v2.h>
#define SM90_BENCH_CUBLAS 1
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/sm90/gemm_stats_sm90.h"

namespace {

template <class F>
float median_ms(F&& f, int iters) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 5; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

__global__ void fill_random(uint32_t* p, size_t n, uint32_t seed, int bits16) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint32_t h = uint32_t(i) * 2654435761u ^ seed;
  h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
  float v = (h & 0xFFFFFF) / float(1 << 24);  // U[0,1)
  if (bits16 == 1) {        // two bf16
    uint32_t u = __float_as_uint(v) >> 16;
    p[i] = u | (u << 16);
  } else {                  // fp32
    p[i] = __float_as_uint(v);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int64_t M = 1024, N = 8192, K = 8192;
  int iters = 50;
  if (argc >= 4) { M = atoll(argv[1]); N = atoll(argv[2]); K = atoll(argv[3]); }
  if (argc >= 5) iters = atoi(argv[4]);
  const int64_t tiles = (M + fused::sm90::partials_row_tile() - 1) / fused::sm90::partials_row_tile();
  const int64_t ld = fused::sm90::partials_ld(N);

  void *x, *w, *bias, *ws = nullptr;
  float *y, *mean, *m2;
  cudaMalloc(&x, M * K * 4);
  cudaMalloc(&w, N * K * 4);
  cudaMalloc(&bias, N * 4);
  cudaMalloc(&y, M * N * 4);
  cudaMalloc(&mean, tiles * ld * 4);
  cudaMalloc(&m2, tiles * ld * 4);
#ifdef SM90_BENCH_CUBLAS
  cublasHandle_t h;
  cublasCreate(&h);
#endif

  for (int mode = 0; mode < 2; ++mode) {  // 0: bf16, 1: tf32
    const bool bf16 = mode == 0;
    const size_t xw = bf16 ? 2 : 4;
    fill_random<<<unsigned((M * K * xw / 4 + 255) / 256), 256>>>((uint32_t*)x, M * K * xw / 4, 17u, bf16);
    fill_random<<<unsigned((N * K * xw / 4 + 255) / 256), 256>>>((uint32_t*)w, N * K * xw / 4, 29u, bf16);
    fill_random<<<unsigned((N * xw / 4 + 255) / 256), 256>>>((uint32_t*)bias, N * xw / 4, 31u, bf16);
    fused::sm90::GemmStatsArgs a;
    a.M = M; a.N = N; a.K = K; a.x = x; a.ldx = K; a.w = w; a.ldw = K; a.bias = bias; a.y = y; a.ldy = N;
    a.partials = {mean, m2, tiles, fused::sm90::partials_row_tile(), ld};
    const fused::ElementType et = bf16 ? fused::ElementType::kBFloat16 : fused::ElementType::kFloat32;
    size_t wsb = fused::sm90::gemm_workspace_bytes(et, a);
    if (wsb) { cudaFree(ws); cudaMalloc(&ws, wsb); }
    auto run = [&](const fused::sm90::GemmStatsArgs& args) {
      fused::Status s = bf16 ? fused::sm90::run_gemm_stats_bf16(args, ws, nullptr)
                             : fused::sm90::run_gemm_stats_tf32(args, ws, nullptr);
      if (!s.ok()) { std::printf("error: %s\n", s.message); std::exit(1); }
    };
    fused::sm90::GemmStatsArgs eval = a;
    eval.partials = {};
    float t_stats = median_ms([&] { run(a); }, iters);
    float t_eval = median_ms([&] { run(eval); }, iters);
    float t_cublas = 0.f;
#ifdef SM90_BENCH_CUBLAS
    float alpha = 1.f, beta = 0.f;
    cublasSetMathMode(h, bf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_TF32_TENSOR_OP_MATH);
    t_cublas = median_ms([&] {
      // y^T (N,M) col-major = W (N,K) . x^T : op(A) = W^T-as-colmajor
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha,
                   w, bf16 ? CUDA_R_16BF : CUDA_R_32F, int(K),
                   x, bf16 ? CUDA_R_16BF : CUDA_R_32F, int(K), &beta, y, CUDA_R_32F, int(N),
                   bf16 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
    }, iters);
#endif
    cudaError_t e = cudaDeviceSynchronize();
    double flop = 2.0 * M * N * K;
    std::printf("%s M=%lld N=%lld K=%lld: gemm+stats %.4f ms (%.0f TFLOP/s) | gemm+bias, no stats %.4f ms (%.0f) | "
                "cuBLAS fp32-out %.4f ms (%.0f) | stats overhead %+.1f%% | %s\n",
                bf16 ? "bf16" : "tf32", (long long)M, (long long)N, (long long)K, t_stats, flop / t_stats / 1e9,
                t_eval, flop / t_eval / 1e9, t_cublas, flop / t_cublas / 1e9, 100.0 * (t_stats / t_eval - 1.0),
                cudaGetErrorString(e));
  }
  return 0;
}
