// Micro-benchmark of the sm90 GEMM + column statistics kernels (not a test): median of device-event
// timings, statistics on (training) vs off (eval), and cuBLAS GEMM (fp32 out) of the same precision
// (for 3xtf32: cuBLAS's exact fp32 GEMM, the one it replaces), the three in alternating rounds
// (SM90_BENCH_ROUNDS, default 3). Each event-timed call includes its
// launch (for small problems the host's launch cost shows); "GPU only" is the same call with
// statistics replayed from a CUDA graph.
// Usage: [SM90_BENCH_TILES=auto,256x128,128x128,splitk,splitk4] [SM90_BENCH_MODES=bf16,tf32,3xtf32]
//        [SM90_BENCH_ROUNDS=3]
//        bench_sm90_gemm_stats [M N K] [iters]
#include <cuda_runtime.h>
#if __has_include(<cublas_v2.h>) && !defined(SM90_BENCH_NO_CUBLAS)
#include <cublas_v2.h>
#define SM90_BENCH_CUBLAS 1
#endif

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "kernels/sm90/gemm_stats_sm90.h"

namespace {

struct TileSpec {
  fused::sm90::Sm90Tile tile;
  int k_splits;  // split-K tile only
  std::string name;
};

// SM90_BENCH_TILES: a comma-separated list of 256x128, 128x128, splitk (split_k_count's count) and
// splitkN (N CTAs per tile), or "auto" (choose_tile's pick, the default). 3xtf32 runs its own tile.
std::vector<TileSpec> tiles_from_environment(int64_t M, int64_t N, int64_t K, int element_bytes, int sms) {
  std::vector<std::string> items = fused::bench::env_list("SM90_BENCH_TILES");
  if (items.empty()) items = {"auto"};
  std::vector<TileSpec> out;
  for (std::string item : items) {
    TileSpec t{fused::sm90::Sm90Tile::k256x128, 0, ""};
    if (item == "auto") {
      t.tile = fused::sm90::choose_tile(M, N, K, element_bytes, sms);
      item = t.tile == fused::sm90::Sm90Tile::k256x128   ? "auto=256x128"
             : t.tile == fused::sm90::Sm90Tile::k128x128 ? "auto=128x128"
                                                         : "auto=splitk" +
                                                               std::to_string(fused::sm90::split_k_count(M, N, K, element_bytes, sms));
    } else if (item == "256x128") {
      t.tile = fused::sm90::Sm90Tile::k256x128;
    } else if (item == "128x128") {
      t.tile = fused::sm90::Sm90Tile::k128x128;
    } else if (item.rfind("splitk", 0) == 0) {
      t.tile = fused::sm90::Sm90Tile::k128x128SplitK;
      t.k_splits = item.size() > 6 ? std::atoi(item.c_str() + 6) : 0;
    } else {
      std::fprintf(stderr, "SM90_BENCH_TILES: unknown tile '%s'\n", item.c_str());
      std::exit(2);
    }
    t.name = item;
    out.push_back(t);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t M = 1024, N = 8192, K = 8192;
  int iters = 50;
  if (argc >= 4) { M = atoll(argv[1]); N = atoll(argv[2]); K = atoll(argv[3]); }
  if (argc >= 5) iters = atoi(argv[4]);
  // SM90_BENCH_ROUNDS: rounds of alternating timings (default 3; fused::bench::alternating_median_ms).
  const char* rounds_env = std::getenv("SM90_BENCH_ROUNDS");
  const int rounds = rounds_env && std::atoi(rounds_env) > 0 ? std::atoi(rounds_env) : 3;
  // partials for the smaller (128-row) tile: room for every kernel shape
  const int64_t tiles = (M + 127) / 128;
  const int64_t ld = fused::sm90::partials_ld(N);
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  // SM90_BENCH_MODES: a comma-separated subset of bf16,tf32,3xtf32 (default all three).
  std::vector<std::string> modes = fused::bench::env_list("SM90_BENCH_MODES");
  if (modes.empty()) modes = {"bf16", "tf32", "3xtf32"};

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
  cudaStream_t stream;  // blocking: ordered with the legacy stream, where the events are recorded
  cudaStreamCreate(&stream);

  const char* const names[] = {"bf16", "tf32", "3xtf32"};
  for (int mode = 0; mode < 3; ++mode) {  // bf16, tf32, 3xtf32 (its peer: cuBLAS's exact fp32 GEMM)
    if (std::find(modes.begin(), modes.end(), names[mode]) == modes.end()) continue;
    const bool bf16 = mode == 0, three = mode == 2;
    const std::vector<TileSpec> tile_specs = tiles_from_environment(M, N, K, bf16 ? 2 : 4, sms);
    fused::bench::fill_operands(x, w, bias, M, N, K, bf16);
    const fused::ElementType et = bf16 ? fused::ElementType::kBFloat16 : fused::ElementType::kFloat32;
    const fused::MatmulPrecision precision = three ? fused::MatmulPrecision::k3xTF32 : fused::MatmulPrecision::kTF32;
    std::function<void()> cublas = [] {};  // no cuBLAS in this build: times an empty call
#ifdef SM90_BENCH_CUBLAS
    cublas = [&, mode, bf16] {
      float alpha = 1.f, beta = 0.f;
      cublasSetMathMode(h, mode == 1 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
      // y^T (N,M) col-major = W (N,K) . x^T : op(A) = W^T-as-colmajor
      cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(M), int(K), &alpha,
                   w, bf16 ? CUDA_R_16BF : CUDA_R_32F, int(K),
                   x, bf16 ? CUDA_R_16BF : CUDA_R_32F, int(K), &beta, y, CUDA_R_32F, int(N),
                   mode == 1 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
#endif
    const std::vector<TileSpec> three_tile = {{fused::sm90::k3xTf32Tile, 0, "128x128"}};
    for (const TileSpec& spec : three ? three_tile : tile_specs) {
      fused::sm90::GemmStatsArgs a;
      a.M = M; a.N = N; a.K = K; a.x = x; a.ldx = K; a.w = w; a.ldw = K; a.bias = bias; a.y = y; a.ldy = N;
      a.tile = spec.tile;
      a.k_splits = spec.k_splits;
      const int64_t row_tile = fused::sm90::partials_row_tile(a.tile);
      a.partials = {mean, m2, (M + row_tile - 1) / row_tile, row_tile, ld};
      size_t wsb = fused::sm90::gemm_workspace_bytes(et, precision, a);
      if (wsb) { cudaFree(ws); cudaMalloc(&ws, wsb); }
      auto run = [&](const fused::sm90::GemmStatsArgs& args) {
        fused::Status s = fused::sm90::run_gemm_stats(et, precision, args, ws, stream);
        if (!s.ok()) { std::printf("error: %s\n", s.message); std::exit(1); }
      };
      fused::sm90::GemmStatsArgs eval = a;
      eval.partials = {};
      // Statistics on, off, and cuBLAS in alternating rounds (exact fp32 cuBLAS, 3xtf32's peer, takes
      // 2-3 ms a call at the headline: 5 calls a round).
      const std::vector<float> t = fused::bench::alternating_median_ms(
          {[&] { run(a); }, [&] { run(eval); }, cublas}, {iters, iters, three ? 5 : iters}, rounds);
      const float t_stats = t[0], t_eval = t[1], t_cublas = t[2];
      float t_graph = fused::bench::graph_ms(stream, [&] { run(a); });
      cudaError_t e = cudaDeviceSynchronize();
      // A fingerprint of y's bits from our kernel: variants of a kernel that must compute the same
      // bits (bench/cpp/variants.sh) can be compared by it.
      run(a);
      std::vector<uint32_t> y_host(static_cast<size_t>(M * N));
      cudaMemcpy(y_host.data(), y, M * N * 4, cudaMemcpyDeviceToHost);
      uint64_t y_bits = 1469598103934665603ull;  // FNV-1a
      for (uint32_t v : y_host) y_bits = (y_bits ^ v) * 1099511628211ull;
      double flop = 2.0 * M * N * K;
      std::printf("%s M=%lld N=%lld K=%lld tile %s: gemm+stats %.4f ms (%.0f TFLOP/s), GPU only %.4f | gemm+bias, no stats %.4f ms "
                  "(%.0f) | cuBLAS %s, fp32 out %.4f ms (%.0f) | stats overhead %+.1f%% | y bits %016llx | %s\n",
                  names[mode], (long long)M, (long long)N, (long long)K, spec.name.c_str(), t_stats, flop / t_stats / 1e9, t_graph,
                  t_eval, flop / t_eval / 1e9, three ? "exact fp32" : names[mode], t_cublas, flop / t_cublas / 1e9,
                  100.0 * (t_stats / t_eval - 1.0), (unsigned long long)y_bits, cudaGetErrorString(e));
    }
  }
  return 0;
}
