// Shared by the C++ benchmarks (bench_sm90_gemm_stats, sweep/gemm_sweep): device-event timing,
// deterministic U[0,1) operands (W optionally U[-1,1)) and comma-separated environment settings.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace fused::bench {

// Comma-separated items of an environment variable, empty items dropped (unset or empty: none).
inline std::vector<std::string> env_list(const char* name) {
  std::vector<std::string> items;
  const char* v = std::getenv(name);
  std::string cur;
  for (const char* c = v ? v : ""; ; ++c) {
    if (*c == ',' || *c == '\0') {
      if (!cur.empty()) items.push_back(cur);
      cur.clear();
      if (*c == '\0') break;
    } else {
      cur += *c;
    }
  }
  return items;
}

// Median of `iters` device-event timings of f(), after `warmup` untimed calls; before() runs ahead
// of every call, outside the timing (e.g. to flush or fill L2).
template <class Before, class F>
float median_ms_after(Before&& before, F&& f, int iters, int warmup = 5) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < warmup; ++i) {
    before();
    f();
  }
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    before();
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

template <class F>
float median_ms(F&& f, int iters, int warmup = 5) {
  return median_ms_after([] {}, f, iters, warmup);
}

// Median ms of each of fs, timed in `rounds` rounds of median_ms(fs[i], iters[i]), the order
// reversed every other round (f0 f1 f2, f2 f1 f0, ...): the median of its rounds' medians. A
// power-limited GPU runs the first timings of a process at other clocks than the later ones, so
// timing a fixed sequence once credits that drift to whichever comes first (on the H200, a kernel
// timed right after cuBLAS came out up to 11 % faster than the same kernel timed next with its
// statistics off, less work).
inline std::vector<float> alternating_median_ms(const std::vector<std::function<void()>>& fs,
                                                const std::vector<int>& iters, int rounds) {
  std::vector<std::vector<float>> per_f(fs.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t j = 0; j < fs.size(); ++j) {
      const size_t i = r % 2 == 0 ? j : fs.size() - 1 - j;
      per_f[i].push_back(median_ms(fs[i], iters[i]));
    }
  }
  std::vector<float> out;
  for (auto& t : per_f) {
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    out.push_back(n == 0 ? 0.f : n % 2 ? t[n / 2] : 0.5f * (t[n / 2 - 1] + t[n / 2]));
  }
  return out;
}

// GPU time per call of f(), which launches on `stream` (not the legacy default stream): `calls` calls
// captured into one CUDA graph, the median of `reps` replays divided by `calls`, so no host launch
// cost sits between the calls. Returns 0 if the capture or the graph fails.
template <class F>
float graph_ms(cudaStream_t stream, F&& f, int calls = 20, int reps = 10) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return 0.f;
  for (int i = 0; i < calls; ++i) f();
  const bool captured = cudaStreamEndCapture(stream, &graph) == cudaSuccess;
  if (!captured || cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    return 0.f;
  }
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaGraphLaunch(exec, stream);  // warm-up
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms / calls);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// n 32-bit words of U[0,1) values from a hash of the index: two bf16 per word, or one fp32.
static __global__ void fill_random(uint32_t* p, size_t n, uint32_t seed, int bf16, int centred) {
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  uint32_t h = uint32_t(i) * 2654435761u ^ seed;
  h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
  float v = (h & 0xFFFFFF) / float(1 << 24);  // U[0,1)
  if (centred) v = 2.0f * v - 1.0f;            // U[-1,1): sign bits vary, as trained weights' do
  if (bf16) {
    uint32_t u = __float_as_uint(v) >> 16;
    // centred == 2: the word's second bf16 its own value (the first fill gave both halves one value)
    uint32_t u2 = u;
    if (centred == 2) {
      uint32_t g = h * 2654435761u;
      g ^= g >> 16;
      u2 = __float_as_uint(2.0f * ((g & 0xFFFFFF) / float(1 << 24)) - 1.0f) >> 16;
    }
    p[i] = u | (u2 << 16);
  } else {
    p[i] = __float_as_uint(v);
  }
}

// x (M,K), W (N,K) and bias (N), bf16 or fp32, with fixed seeds.
// FUSED_BENCH_CENTRED=2: x and W both in U[-1,1), every bf16 its own value (the closest to the module's
// data: activations and weights of both signs).
// FUSED_BENCH_CENTRED=1: W in U[-1,1) instead of U[0,1) (signs that vary, as trained weights'). At
// large M the clocks are power-limited and the data changes the power: on the H200, bf16 4096x8192x8192,
// our kernel 0.752 vs 0.710 ms and cuBLAS 0.723 vs 0.678 ms with U[-1,1) vs U[0,1) weights.
inline void fill_operands(void* x, void* w, void* bias, int64_t M, int64_t N, int64_t K, bool bf16) {
  const size_t bytes = bf16 ? 2 : 4;
  const char* env = std::getenv("FUSED_BENCH_CENTRED");
  int centred = 0;
  auto fill = [&](void* p, size_t elements, uint32_t seed) {
    const size_t words = elements * bytes / 4;
    fill_random<<<unsigned((words + 255) / 256), 256>>>(static_cast<uint32_t*>(p), words, seed, bf16 ? 1 : 0,
                                                         centred);
  };
  const int mode = env != nullptr ? std::atoi(env) : 0;
  centred = mode == 2 ? 2 : 0;  // 2: x centred too, as activations are
  fill(x, size_t(M * K), 17u);
  centred = mode;
  fill(w, size_t(N * K), 29u);
  centred = 0;
  fill(bias, size_t(N), 31u);
}

}  // namespace fused::bench
