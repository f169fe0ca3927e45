// Where the one-kernel forward's time goes (src/kernels/sm90/one_kernel_forward_sm90.h), phase by phase:
// the kernel built with FUSED_ONE_KERNEL_PHASE_TIMES records, in each CTA, the SM clock and the global
// timer at its phase boundaries; this program launches it on synthetic data (a CUDA graph of 20 calls,
// replayed 10 times), then prints each phase's cycles (min / median / max over the CTAs) and when the
// CTAs entered and left it on the global timer, with fingerprints of y's and out's bits (x and w are
// random with a fixed seed: equal fingerprints, equal results across two builds). OKP_ONCE=1 launches each
// problem once instead, without timing (for compute-sanitizer). Not built by CMake (a diagnostic build of the kernel);
// on a Hopper machine, from the repository root, with the CUTLASS headers of the pinned wheel in $C:
//   nvcc -DCUTLASS_ENABLE_GDC_FOR_SM90=1 -DNDEBUG -Iinclude -Isrc -isystem $C/include -O3 -std=c++17 \
//        -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr bench/cpp/one_kernel_phases.cu \
//        -o /tmp/one_kernel_phases && /tmp/one_kernel_phases
// (-DNDEBUG matters: without it CUTLASS's asserts make ptxas serialise the wgmma pipeline.)
#define FUSED_ONE_KERNEL_PHASE_TIMES 1
#include "kernels/sm90/one_kernel_forward_sm90.cuh"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace fused;

template <class E>
void run(int M, int N, int K, const char* name, bool training) {
  auto alloc = [](size_t bytes, int fill) { void* p; cudaMalloc(&p, bytes); cudaMemset(p, fill, bytes); return p; };
  const int64_t ld = (N + 127) / 128 * 128, rt = (M + 63) / 64;
  // x, w uniform in [-1, 1) (a fixed seed): the fingerprints of y and out below then tell whether two
  // builds of the kernel compute the same bits
  auto random_operand = [&](int64_t n, unsigned seed) {
    std::vector<E> h(n);
    for (int64_t i = 0; i < n; ++i) {
      seed = seed * 1664525u + 1013904223u;
      h[i] = E(float(int(seed >> 9) - (1 << 22)) / float(1 << 22));
    }
    void* d = alloc(n * sizeof(E), 0);
    cudaMemcpy(d, h.data(), n * sizeof(E), cudaMemcpyHostToDevice);
    return d;
  };
  void* x = random_operand(int64_t(M) * K, 1u);
  void* w = random_operand(int64_t(N) * K, 2u);
  float* y = (float*)alloc(size_t(M) * N * 4, 0);
  void* out = alloc(size_t(M) * N * 2, 0);
  float* sm = (float*)alloc(N * 4, 0); float* si = (float*)alloc(N * 4, 0);
  float* lse = (float*)alloc(M * 4, 0);
  float* pm = (float*)alloc(rt * ld * 4, 0); float* pv = (float*)alloc(rt * ld * 4, 0);
  float* parts = (float*)alloc(2 * ((N + 63) / 64) * size_t(M) * 4, 0);
  float* rm = (float*)alloc(N * 4, 0); float* rv = (float*)alloc(N * 4, 0);
  float one = 1.f; float* scale = (float*)alloc(4, 0); cudaMemcpy(scale, &one, 4, cudaMemcpyHostToDevice);
  sm90::OneKernelForwardArgs a;
  a.gemm.M = M; a.gemm.N = N; a.gemm.K = K; a.gemm.x = x; a.gemm.ldx = K; a.gemm.w = w; a.gemm.ldw = K;
  a.gemm.y = y; a.gemm.ldy = N;
  a.gemm.partials.mean = pm; a.gemm.partials.m2 = pv; a.gemm.partials.row_tile = 64; a.gemm.partials.ld = ld;
  a.gemm.partials.num_row_tiles = rt;
  a.bn.running_mean = rm; a.bn.running_var = rv; a.bn.scale = scale; a.bn.training = training;
  a.save_mean = sm; a.save_invstd = si; a.out = out; a.ldo = N; a.out_dtype = ElementType::kBFloat16;
  a.row_lse = lse; a.row_parts = parts;
  cudaStream_t s; cudaStreamCreate(&s);
  if (getenv("OKP_ONCE") != nullptr) {  // one launch (for compute-sanitizer)
    Status st = sm90::detail::run_one_kernel<E>(a, s);
    cudaStreamSynchronize(s);
    printf("%s %dx%dx%d %s once: %s, %s\n", name, M, N, K, training ? "train" : "eval", st.ok() ? "ok" : st.message,
           cudaGetErrorString(cudaGetLastError()));
    return;
  }
  for (int i = 0; i < 3; ++i) {
    Status st = sm90::detail::run_one_kernel<E>(a, s);
    if (!st.ok()) { printf("%s: %s\n", name, st.message); return; }
  }
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaGraph_t g; cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < 20; ++i) sm90::detail::run_one_kernel<E>(a, s);
  cudaStreamEndCapture(s, &g); cudaGraphInstantiate(&ge, g, 0);
  cudaGraphLaunch(ge, s);
  cudaEventRecord(e0, s);
  for (int r = 0; r < 10; ++r) cudaGraphLaunch(ge, s);
  cudaEventRecord(e1, s); cudaStreamSynchronize(s);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  std::vector<unsigned long long> c(1024 * 8), gl(1024 * 8);
  sm90::detail::one_kernel_phase_times(c.data(), gl.data());
  const int ctas = ((M + 63) / 64) * ((N + 63) / 64);
  auto fingerprint = [](const void* d, size_t bytes) {
    std::vector<unsigned char> h(bytes);
    cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost);
    unsigned long long f = 1469598103934665603ull;
    for (unsigned char b : h) f = (f ^ b) * 1099511628211ull;
    return f;
  };
  printf("%s %dx%dx%d %s: %.2f us per call (graph), %d CTAs, err %s, y bits %016llx, out bits %016llx\n", name, M, N,
         K, training ? "train" : "eval", ms * 1e3 / 200, ctas, cudaGetErrorString(cudaGetLastError()),
         fingerprint(y, size_t(M) * N * 4), fingerprint(out, size_t(M) * N * 2));
  unsigned long long g0 = ~0ull, gend = 0;
  for (int i = 0; i < ctas; ++i) { g0 = std::min(g0, gl[i * 8]); gend = std::max(gend, gl[i * 8 + 7]); }
  printf("  global span first start -> last end: %.2f us\n", (gend - g0) / 1e3);
  const char* names[7] = {"K loop", "tile, statistics", "grid sync 1", "y, column map", "row parts",
                          "grid sync 2", "rows merge, out"};
  for (int ph = 0; ph < 7; ++ph) {
    std::vector<double> d, gs, ge2;
    for (int i = 0; i < ctas; ++i) {
      d.push_back(double(c[i * 8 + ph + 1] - c[i * 8 + ph]));
      gs.push_back((gl[i * 8 + ph] - g0) / 1e3);
      ge2.push_back((gl[i * 8 + ph + 1] - g0) / 1e3);
    }
    std::sort(d.begin(), d.end()); std::sort(gs.begin(), gs.end()); std::sort(ge2.begin(), ge2.end());
    printf("  %-22s cycles min %8.0f med %8.0f max %8.0f | global start %6.2f..%6.2f end %6.2f..%6.2f us\n", names[ph],
           d.front(), d[d.size() / 2], d.back(), gs.front(), gs.back(), ge2.front(), ge2.back());
  }
}

int main() {
  run<cutlass::bfloat16_t>(1024, 512, 4096, "bf16", true);
  run<cutlass::bfloat16_t>(1024, 512, 1024, "bf16", true);
  run<cutlass::bfloat16_t>(1024, 512, 1024, "bf16", false);
  run<float>(1024, 512, 4096, "tf32", true);
  run<cutlass::bfloat16_t>(2048, 512, 4096, "bf16", true);
  run<cutlass::bfloat16_t>(512, 512, 4096, "bf16", true);
  run<cutlass::bfloat16_t>(1024, 256, 4096, "bf16", true);
  run<cutlass::bfloat16_t>(1024, 512, 8192, "bf16", true);
  run<float>(512, 512, 2048, "tf32", true);
  return 0;
}
