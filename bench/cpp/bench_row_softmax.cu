// Micro-benchmark of the row softmax [3] (not a test): every built row layout (threads, float4 per
// thread; staged, clustered or neither) and, for rows over 8192, the streaming kernel ("softmax_0x0")
// on a set of shapes, against a device-to-device copy of y.
// Two states of y before each timed call: "l2" (y just rewritten, as the GEMM leaves it: partly in
// L2) and "cold" (L2 flushed by a 256 MiB write). Prints one JSON line per record; "same_bits" says
// whether the layout's output equals the default layout's bit for bit. The default layout runs twice:
// with the exact map ("folded": false) and with its shift folded in (ColumnAffine::shift_folded,
// "folded": true), which the op takes for 16-bit outputs.
// Usage: bench_row_softmax [iters] [MxN ...]
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "api/forward_steps.h"
#include "fused/detail/bn_math.h"
#include "bench_util.cuh"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e)); std::exit(1); }
}

// The map's offset with the shift folded in, as finalize writes it (detail::folded_map; the bench's columns
// have variance, so a stays as it is).
__global__ void fold_offsets(const float* shift, const float* a, const float* c, float* c_folded, int64_t N) {
  const int64_t n = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  fused::detail::ColumnMap m;
  if (n >= N) return;
  m.shift = shift[n];
  m.a = a[n];
  m.c = c[n];
  m.var = 1.0;
  c_folded[n] = fused::detail::folded_map(m, /*batch_statistics=*/true).c;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 30;
  std::vector<std::array<int64_t, 2>> shapes;
  for (int i = 2; i < argc; ++i) {
    long long m, n;
    if (std::sscanf(argv[i], "%lldx%lld", &m, &n) == 2) shapes.push_back({m, n});
  }
  if (shapes.empty()) shapes = {{1024, 8192}, {4096, 8192}, {16384, 8192}, {256, 8192}, {1024, 4096}, {1024, 2048}};
  std::vector<fused::cuda::SoftmaxLayout> layouts = fused::cuda::row_softmax_built_layouts();
  layouts.push_back({});  // threads == 0: the streaming kernel
  const size_t flush_bytes = size_t(256) << 20;
  void* flush;
  check(cudaMalloc(&flush, flush_bytes), "malloc flush");
  for (const auto& shape : shapes) {
    const int64_t M = shape[0], N = shape[1];
    const size_t y_bytes = size_t(M * N) * 4;
    float *y, *y_src, *shift, *a, *c, *c_folded, *lse;
    void *out, *want;
    check(cudaMalloc(&y, y_bytes), "malloc y");
    check(cudaMalloc(&y_src, y_bytes), "malloc y_src");
    check(cudaMalloc(&out, y_bytes), "malloc out");
    check(cudaMalloc(&want, y_bytes), "malloc want");
    check(cudaMalloc(&shift, N * 4), "malloc shift");
    check(cudaMalloc(&a, N * 4), "malloc a");
    check(cudaMalloc(&c, N * 4), "malloc c");
    check(cudaMalloc(&c_folded, N * 4), "malloc c_folded");
    check(cudaMalloc(&lse, M * 4), "malloc lse");
    // y and the coefficients ~ U[0,1), fixed seeds.
    auto fill = [](float* p, int64_t n, uint32_t seed) {
      fused::bench::fill_random<<<unsigned((n + 255) / 256), 256>>>(reinterpret_cast<uint32_t*>(p), size_t(n), seed, 0, 0);
    };
    fill(y_src, M * N, 17u);
    fill(shift, N, 29u);
    fill(a, N, 31u);
    fill(c, N, 37u);
    fold_offsets<<<unsigned((N + 255) / 256), 256>>>(shift, a, c, c_folded, N);
    check(cudaMemcpy(y, y_src, y_bytes, cudaMemcpyDeviceToDevice), "copy y");
    const fused::ColumnAffine exact{shift, a, c};
    fused::ColumnAffine folded{shift, a, c_folded};
    folded.shift_folded = true;
    auto rewrite_y = [&] { cudaMemcpyAsync(y, y_src, y_bytes, cudaMemcpyDeviceToDevice); };
    auto flush_l2 = [&] { cudaMemsetAsync(flush, 0, flush_bytes); };
    const float copy_ms = fused::bench::median_ms_after(
        flush_l2, [&] { cudaMemcpyAsync(out, y_src, y_bytes, cudaMemcpyDeviceToDevice); }, iters, 3);
    std::printf("{\"M\":%lld,\"N\":%lld,\"kernel\":\"copy_y\",\"ms\":%.5f,\"gbps\":%.1f}\n", (long long)M,
                (long long)N, copy_ms, 2.0 * y_bytes / copy_ms / 1e6);
    for (int out_bf16 = 1; out_bf16 >= 0; --out_bf16) {
      const fused::ElementType dt = out_bf16 ? fused::ElementType::kBFloat16 : fused::ElementType::kFloat32;
      const size_t out_bytes = size_t(M * N) * (out_bf16 ? 2 : 4);
      const fused::cuda::SoftmaxLayout chosen = fused::cuda::row_softmax_layout(N);
      check(cudaMemset(want, 0xff, out_bytes), "poison");
      if (!fused::cuda::row_softmax(y, N, M, N, exact, want, N, dt, lse, nullptr).ok()) return 1;
      check(cudaDeviceSynchronize(), "default layout");
      std::vector<char> h_want(out_bytes), h_got(out_bytes);
      check(cudaMemcpy(h_want.data(), want, out_bytes, cudaMemcpyDeviceToHost), "copy want");
      for (int fold = 0; fold < 2; ++fold)
      for (const auto& l : layouts) {
        if (l.threads != 0 && l.max_columns() < N) continue;
        if (!l.clustered && int64_t{l.threads} * 4 * l.vecs >= 2 * N && l.threads > 128) continue;  // too wide
        if (l.threads == 0 && N <= 8192) continue;  // the streaming kernel: only where rows are wide
        const bool is_default = l.threads == chosen.threads && l.vecs == chosen.vecs && l.staged == chosen.staged &&
                                l.clustered == chosen.clustered;
        if (fold && !is_default) continue;
        const fused::ColumnAffine& affine = fold ? folded : exact;
        auto run = [&] {
          fused::Status s = fused::cuda::row_softmax_with_layout(l, y, N, M, N, affine, out, N, dt, lse, nullptr);
          if (!s.ok()) { std::fprintf(stderr, "layout: %s\n", s.message); std::exit(1); }
        };
        check(cudaMemset(out, 0xff, out_bytes), "poison");
        run();
        check(cudaDeviceSynchronize(), "layout run");
        check(cudaMemcpy(h_got.data(), out, out_bytes, cudaMemcpyDeviceToHost), "copy got");
        const bool same = std::memcmp(h_got.data(), h_want.data(), out_bytes) == 0;
        const float l2_ms = fused::bench::median_ms_after(rewrite_y, run, iters, 3);
        const float cold_ms = fused::bench::median_ms_after(flush_l2, run, iters, 3);
        const double bytes = double(y_bytes + out_bytes);
        std::printf("{\"M\":%lld,\"N\":%lld,\"out\":\"%s\",\"kernel\":\"softmax_%dx%d%s\",\"default\":%s,"
                    "\"folded\":%s,\"same_bits\":%s,\"ms_l2\":%.5f,\"ms_cold\":%.5f,\"gbps_cold\":%.1f,"
                    "\"of_copy_cold\":%.3f}\n",
                    (long long)M, (long long)N, out_bf16 ? "bf16" : "fp32", l.threads, l.vecs,
                    l.clustered ? "_clustered" : l.staged ? "_staged" : "", is_default ? "true" : "false",
                    fold ? "true" : "false", same ? "true" : "false", l2_ms, cold_ms, bytes / cold_ms / 1e6,
                    (bytes / cold_ms) / (2.0 * y_bytes / copy_ms));
        std::fflush(stdout);
      }
    }
    cudaFree(y); cudaFree(y_src); cudaFree(out); cudaFree(want); cudaFree(shift); cudaFree(a); cudaFree(c); cudaFree(c_folded); cudaFree(lse);
  }
  cudaFree(flush);
  return 0;
}
