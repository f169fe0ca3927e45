// Tests of the sm90 GEMM + per-tile column statistics kernels (fused::sm90), without torch.
// Each test skips unless a CUDA device of compute capability 9.x is present.
#include <gtest/gtest.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fused/detail/half_bits.h"
#include "kernels/sm90/gemm_stats_sm90.h"
#include "kernels/sm90/one_kernel_forward_sm90.h"
#include "test_util.h"

namespace {

using fused::ElementType;
using fused::MatmulPrecision;
using fused::Status;
using fused::StatusCode;
namespace sm90 = fused::sm90;

bool have_sm90() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return false;
  }
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  return major == 9;
}

#define SKIP_UNLESS_SM90()                                                   \
  do {                                                                       \
    if (!have_sm90()) GTEST_SKIP() << "needs a CUDA device of compute capability 9.x"; \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

const char* name_of(ElementType t) {
  return t == ElementType::kBFloat16 ? "bf16" : t == ElementType::kFloat16 ? "fp16" : "tf32";
}

// Host element storage: bf16/fp16 as raw 16-bit, fp32 as float. `round` returns the value the kernel
// sees (the input rounded to the element type), `pack` writes it into the byte buffer.
struct HostTensor {
  ElementType type;
  std::vector<uint8_t> bytes;
  std::vector<double> values;  // the exact values the device sees
  HostTensor(ElementType t, size_t n) : type(t), bytes(n * fused::element_size(t)), values(n) {}
  void set(size_t i, float v) {
    if (type == ElementType::kBFloat16) {
      __nv_bfloat16 h = __float2bfloat16_rn(v);
      std::memcpy(&bytes[i * 2], &h, 2);
      values[i] = double(__bfloat162float(h));
    } else if (type == ElementType::kFloat16) {
      __half h = __float2half_rn(v);
      std::memcpy(&bytes[i * 2], &h, 2);
      values[i] = double(__half2float(h));
    } else {
      std::memcpy(&bytes[i * 4], &v, 4);
      values[i] = double(v);
    }
  }
};

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (count && cudaMalloc(&ptr, count * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// fp32 runs the TF32 kernel.
Status launch(ElementType t, const sm90::GemmStatsArgs& a, void* ws, cudaStream_t s) {
  return sm90::run_gemm_stats(t, MatmulPrecision::kTF32, a, ws, s);
}

struct Case {
  ElementType type = ElementType::kBFloat16;
  int64_t M = 0, N = 0, K = 0;
  bool bias = true;
  bool stats = true;               // false: eval mode (partials.mean == nullptr)
  int64_t ldy_pad = 0;             // ldy = N + ldy_pad
  double bias_scale = 1.0;         // bias ~ U(-1,1) * bias_scale
  bool large_acc_mean = false;     // x[:, 0] = 2048, W[:, 0] = 1  ->  |acc mean| / std ~ 1e3
  bool check_determinism = false;
  sm90::Sm90Tile tile = sm90::Sm90Tile::k256x128;
  int k_splits = 0;                // k128x128SplitK: CTAs per tile's K loop (0: split_k_count's)
};

const char* name_of(sm90::Sm90Tile tile) {
  switch (tile) {
    case sm90::Sm90Tile::k256x128: return "256x128";
    case sm90::Sm90Tile::k128x128: return "128x128";
    case sm90::Sm90Tile::k128x128SplitK: return "128x128 split-K";
  }
  return "?";
}

struct Result {
  double y_rel_norm = 0, y_worst_ratio = 0;     // ||y - ref|| / ||ref||, max |err| / allowed
  double mean_worst_ratio = 0, m2_worst_ratio = 0, m2_max_rel = 0;
};

void run_case(const Case& c, Result* out = nullptr) {
  SCOPED_TRACE(std::string(name_of(c.type)) + " " + name_of(c.tile) + " k_splits=" + std::to_string(c.k_splits) +
               " M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) +
               " K=" + std::to_string(c.K) + (c.bias ? " bias" : " nobias") + (c.stats ? " train" : " eval"));
  const int64_t M = c.M, N = c.N, K = c.K, ldy = N + c.ldy_pad;
  std::mt19937 rng(1234u + unsigned(M * 7 + N * 13 + K * 17) + unsigned(c.type) * 101u);
  std::uniform_real_distribution<float> U(-1.0f, 1.0f);

  HostTensor x(c.type, size_t(M * K)), w(c.type, size_t(N * K)), b(c.type, size_t(N));
  for (int64_t i = 0; i < M * K; ++i) x.set(size_t(i), U(rng));
  for (int64_t i = 0; i < N * K; ++i) w.set(size_t(i), U(rng));
  if (c.large_acc_mean) {
    for (int64_t i = 0; i < M; ++i) x.set(size_t(i * K), 2048.0f);
    for (int64_t n = 0; n < N; ++n) w.set(size_t(n * K), 1.0f);
  }
  for (int64_t n = 0; n < N; ++n) b.set(size_t(n), U(rng) * float(c.bias_scale));

  // Double reference of the same (rounded) inputs, and the magnitude sum for error bounds.
  std::vector<double> ref(size_t(M * N)), mag(size_t(M * N));
  for (int64_t i = 0; i < M; ++i) {
    const double* xi = &x.values[size_t(i * K)];
    for (int64_t n = 0; n < N; ++n) {
      const double* wn = &w.values[size_t(n * K)];
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; ++k) { double p = xi[k] * wn[k]; s += p; a += std::fabs(p); }
      ref[size_t(i * N + n)] = s + (c.bias ? b.values[size_t(n)] : 0.0);
      mag[size_t(i * N + n)] = a + (c.bias ? std::fabs(b.values[size_t(n)]) : 0.0);
    }
  }

  const int64_t row_tile = sm90::partials_row_tile(c.tile);
  const int64_t tiles = (M + row_tile - 1) / row_tile;
  const int64_t ld = sm90::partials_ld(N);
  ASSERT_GE(ld, N);
  DeviceBuffer<uint8_t> dx(x.bytes.size()), dw(w.bytes.size()), db(b.bytes.size());
  DeviceBuffer<float> dy(size_t(M * ldy)), dmean(size_t(tiles * ld)), dm2(size_t(tiles * ld));
  ASSERT_TRUE(dx.ptr && dw.ptr && db.ptr && dy.ptr && dmean.ptr && dm2.ptr);
  CUDA_OK(cudaMemcpy(dx.ptr, x.bytes.data(), x.bytes.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw.ptr, w.bytes.data(), w.bytes.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db.ptr, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice));

  sm90::GemmStatsArgs a;
  a.M = M; a.N = N; a.K = K;
  a.x = dx.ptr; a.ldx = K;
  a.w = dw.ptr; a.ldw = K;
  a.bias = c.bias ? db.ptr : nullptr;
  a.y = dy.ptr; a.ldy = ldy;
  a.tile = c.tile;
  a.k_splits = c.k_splits;
  if (c.stats) {
    a.partials.mean = dmean.ptr;
    a.partials.m2 = dm2.ptr;
    a.partials.num_row_tiles = tiles;
    a.partials.row_tile = row_tile;
    a.partials.ld = ld;
  }
  const size_t ws_bytes = sm90::gemm_workspace_bytes(c.type, MatmulPrecision::kTF32, a);
  DeviceBuffer<uint8_t> ws(std::max<size_t>(ws_bytes, 1));

  auto run_once = [&](std::vector<float>& y, std::vector<float>& mean, std::vector<float>& m2) {
    // Poison: 0xFF bytes are NaN in fp32, so any element the kernel fails to write shows up.
    CUDA_OK(cudaMemset(dy.ptr, 0xFF, size_t(M * ldy) * sizeof(float)));
    CUDA_OK(cudaMemset(dmean.ptr, 0xFF, size_t(tiles * ld) * sizeof(float)));
    CUDA_OK(cudaMemset(dm2.ptr, 0xFF, size_t(tiles * ld) * sizeof(float)));
    // The GEMM's own workspace too (split-K's partial accumulators and counters): the kernel must
    // not rely on what a previous call left there.
    CUDA_OK(cudaMemset(ws.ptr, 0xFF, std::max<size_t>(ws_bytes, 1)));
    Status st = launch(c.type, a, ws.ptr, nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    CUDA_OK(cudaDeviceSynchronize());
    y.resize(size_t(M * ldy));
    mean.resize(size_t(tiles * ld));
    m2.resize(size_t(tiles * ld));
    CUDA_OK(cudaMemcpy(y.data(), dy.ptr, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(mean.data(), dmean.ptr, mean.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(m2.data(), dm2.ptr, m2.size() * sizeof(float), cudaMemcpyDeviceToHost));
  };
  std::vector<float> y, mean, m2;
  run_once(y, mean, m2);
  if (::testing::Test::HasFatalFailure()) return;

  // y vs the double GEMM. bf16/fp16 products are exact in fp32; tf32 truncates/rounds both operands
  // to 10 mantissa bits (product error <= ~2^-9 relative).
  const double tol_y = c.type == ElementType::kFloat32 ? 4e-3 : 1e-4;
  Result r;
  double err2 = 0, ref2 = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t n = 0; n < N; ++n) {
      double yv = y[size_t(i * ldy + n)], rv = ref[size_t(i * N + n)];
      double err = std::fabs(yv - rv), allowed = tol_y * mag[size_t(i * N + n)] + 1e-30;
      err2 += err * err; ref2 += rv * rv;
      double ratio = std::isfinite(yv) ? err / allowed : 1e30;
      r.y_worst_ratio = std::max(r.y_worst_ratio, ratio);
      if (!(ratio <= 1.0) && bad++ < 5)
        ADD_FAILURE() << "y[" << i << "," << n << "] = " << yv << " ref " << rv << " allowed " << allowed;
    }
  }
  r.y_rel_norm = std::sqrt(err2 / std::max(ref2, 1e-300));
  EXPECT_EQ(bad, 0) << "y mismatches";

  if (c.stats) {
    // Partials vs double statistics of the kernel's own y. The kernel reduces acc = y - bias before
    // the fp32 bias add, so allow the rounding of that add: |y - (acc + b)| <= u.
    int64_t bad_mean = 0, bad_m2 = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t r0 = t * row_tile;
      const int64_t cnt = std::min<int64_t>(row_tile, M - r0);
      for (int64_t n = 0; n < N; ++n) {
        double s = 0, ymax = 0;
        for (int64_t i = r0; i < r0 + cnt; ++i) { s += y[size_t(i * ldy + n)]; ymax = std::max(ymax, std::fabs(double(y[size_t(i * ldy + n)]))); }
        const double mu = s / double(cnt);
        double q = 0;
        for (int64_t i = r0; i < r0 + cnt; ++i) { double d = y[size_t(i * ldy + n)] - mu; q += d * d; }
        const double u = c.bias ? std::ldexp(ymax, -23) : 0.0;  // >= one ulp of |y|
        const double km = mean[size_t(t * ld + n)], kq = m2[size_t(t * ld + n)];
        const double sd = std::sqrt(q / double(cnt));
        const double tol_mean = 2e-7 * std::fabs(mu) + 1e-6 * sd + u + 1e-30;
        const double tol_m2 = 1e-5 * q + 4.0 * std::sqrt(q * double(cnt)) * u + 4.0 * double(cnt) * u * u + 1e-30;
        const double rm = std::isfinite(km) ? std::fabs(km - mu) / tol_mean : 1e30;
        const double rq = std::isfinite(kq) ? std::fabs(kq - q) / tol_m2 : 1e30;
        r.mean_worst_ratio = std::max(r.mean_worst_ratio, rm);
        r.m2_worst_ratio = std::max(r.m2_worst_ratio, rq);
        if (q > 0) r.m2_max_rel = std::max(r.m2_max_rel, std::fabs(kq - q) / q);
        if (!(rm <= 1.0) && bad_mean++ < 5)
          ADD_FAILURE() << "mean[tile " << t << ", col " << n << "] = " << km << " ref " << mu << " tol " << tol_mean;
        if (!(rq <= 1.0) && bad_m2++ < 5)
          ADD_FAILURE() << "m2[tile " << t << ", col " << n << "] = " << kq << " ref " << q << " tol " << tol_m2
                        << " (count " << cnt << ")";
      }
    }
    EXPECT_EQ(bad_mean, 0);
    EXPECT_EQ(bad_m2, 0);
  }

  if (c.check_determinism) {
    std::vector<float> y2, mean2, m22;
    run_once(y2, mean2, m22);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float))) << "y not bitwise reproducible";
    if (c.stats) {
      for (int64_t t = 0; t < tiles; ++t) {
        EXPECT_EQ(0, std::memcmp(&mean[size_t(t * ld)], &mean2[size_t(t * ld)], size_t(N) * sizeof(float)))
            << "mean not bitwise reproducible";
        EXPECT_EQ(0, std::memcmp(&m2[size_t(t * ld)], &m22[size_t(t * ld)], size_t(N) * sizeof(float)))
            << "m2 not bitwise reproducible";
      }
    }
  }
  std::printf("[ %s M=%lld N=%lld K=%lld ] y rel %.2e (worst %.2f of tol) | mean worst %.2f, m2 worst %.2f of tol, "
              "m2 max rel %.2e\n",
              name_of(c.type), (long long)M, (long long)N, (long long)K, r.y_rel_norm, r.y_worst_ratio,
              r.mean_worst_ratio, r.m2_worst_ratio, r.m2_max_rel);
  if (out) *out = r;
}

const ElementType kTypes[] = {ElementType::kBFloat16, ElementType::kFloat16, ElementType::kFloat32};
const sm90::Sm90Tile kTiles[] = {sm90::Sm90Tile::k256x128, sm90::Sm90Tile::k128x128,
                                 sm90::Sm90Tile::k128x128SplitK};

// Every case runs on every kernel shape (each has its own partials geometry); split-K with its own
// count and with 3 (uneven shares of the K loop where K allows).
void run_each_tile(Case c) {
  for (sm90::Sm90Tile tile : kTiles) {
    c.tile = tile;
    c.k_splits = 0;
    run_case(c);
    if (tile == sm90::Sm90Tile::k128x128SplitK) {
      c.k_splits = 3;
      run_case(c);
    }
  }
}

TEST(Sm90GemmStats, HeadlineShapeDeterministic) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes) {
    Case c; c.type = t; c.M = 512; c.N = 1024; c.K = 2048; c.check_determinism = true;
    run_each_tile(c);
  }
}

TEST(Sm90GemmStats, OddM) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes)
    for (int64_t M : {1, 3, 255, 257, 513}) {
      Case c; c.type = t; c.M = M; c.N = 136; c.K = 64;
      run_each_tile(c);
    }
}

TEST(Sm90GemmStats, NNotMultipleOfTile) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes)
    for (int64_t N : {4, 200, 260}) {
      Case c; c.type = t; c.M = 300; c.N = N; c.K = 72; c.ldy_pad = 4;
      run_each_tile(c);
    }
}

TEST(Sm90GemmStats, NoBias) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes) {
    Case c; c.type = t; c.M = 700; c.N = 384; c.K = 256; c.bias = false;
    run_each_tile(c);
  }
}

TEST(Sm90GemmStats, EvalModeNoStatistics) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes) {
    Case c; c.type = t; c.M = 333; c.N = 264; c.K = 128; c.stats = false;
    run_each_tile(c);
  }
}

TEST(Sm90GemmStats, PersistentManyTiles) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes) {
    Case c; c.type = t; c.M = 4096 + 77; c.N = 2048 + 8; c.K = 64;
    run_each_tile(c);
  }
}

// A grid of at least 32 256x128 tiles each way: the 256x128 kernel's swizzled raster order
// (gemm_stats_sm90.cuh, large_tile_scheduler) covers every tile once, the ragged edges included.
TEST(Sm90GemmStats, LargeGridSwizzledRaster) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes) {
    Case c; c.type = t; c.M = 8192 + 77; c.N = 4096 + 8; c.K = 32; c.tile = sm90::Sm90Tile::k256x128;
    run_case(c);
  }
}

// |column mean| / std ~ 1e3 through the bias: the mean must carry the bias, M2 must not see it.
TEST(Sm90GemmStats, LargeMeanThroughBias) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes) {
    // acc std ~ sqrt(K / 9) = 4 for K = 144: bias ~ U(-1,1) * 4000 gives |mean|/std up to 1e3.
    Case c; c.type = t; c.M = 600; c.N = 136; c.K = 144; c.bias_scale = 4000.0;
    run_each_tile(c);
  }
}

// |column mean| / std ~ 1.6e3 inside the accumulator itself (no bias: y == acc bitwise), so the
// partials are compared with the exact double statistics of the very values the kernel reduced.
// Raw sum / sum-of-squares in fp32 would be off by ~1e-1 relative here.
TEST(Sm90GemmStats, LargeMeanInAccumulator) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes) {
    Case c; c.type = t; c.M = 777; c.N = 264; c.K = 16; c.bias = false; c.large_acc_mean = true;
    for (sm90::Sm90Tile tile : kTiles) {
      c.tile = tile;
      Result r;
      run_case(c, &r);
      EXPECT_LT(r.m2_max_rel, 1e-5);
    }
  }
}

// What the existing tf32 kernel makes of the 13 mantissa bits an fp32 operand has beyond TF32:
// ignored (truncation toward zero) or rounded away. Measured on the H200: rounded to nearest, ties
// to even (1 + 0.75 * 2^-10 counts as 1 + 2^-10). The tensor cores themselves truncate raw bits
// with mma.sync (Tf32TensorCores.RawFp32OperandBitsFollowOneRoundingRule), so the rounding is most
// likely the TMA copy's, whose descriptors have the TFLOAT32 type (CUTLASS stores fp32 operands as
// tfloat32_t). A 3xTF32 split
// must load raw bits with a FLOAT32 descriptor (docs/design-3xtf32-sm90.md, trap 1).
// Printed, not asserted: how ties round, and whether a TF32 subnormal operand (2^-130) is flushed.
TEST(Sm90GemmStats, Tf32TensorCoresRoundRawFp32OperandsToNearest) {
  SKIP_UNLESS_SM90();
  const int64_t M = 8, N = 8, K = 32;
  std::vector<float> x(M * K, 0.0f), w(N * K, 0.0f), y(M * N, 0.0f);
  const float ulp = std::ldexp(1.0f, -10);  // TF32's at 1
  x[0 * K] = 1.0f + 0.75f * ulp;
  x[1 * K] = -(1.0f + 0.75f * ulp);
  x[2 * K] = std::ldexp(1.0f, -130);  // subnormal, TF32-representable (bit 19 of the mantissa)
  x[3 * K] = 1.0f + 0.25f * ulp;
  x[4 * K] = 1.0f + 0.5f * ulp;   // tie: even is 1
  x[5 * K] = 1.0f + 1.5f * ulp;   // tie: even is 1 + 2 ulp
  w[0 * K] = 1.0f;
  w[1 * K] = std::ldexp(1.0f, 100);
  DeviceBuffer<float> dx(x.size()), dw(w.size()), dy(y.size());
  ASSERT_TRUE(dx.ptr && dw.ptr && dy.ptr);
  CUDA_OK(cudaMemcpy(dx.ptr, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw.ptr, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dy.ptr, 0xFF, y.size() * sizeof(float)));
  sm90::GemmStatsArgs a;
  a.M = M; a.N = N; a.K = K;
  a.x = dx.ptr; a.ldx = K;
  a.w = dw.ptr; a.ldw = K;
  a.y = dy.ptr; a.ldy = N;
  DeviceBuffer<uint8_t> ws(
      std::max<size_t>(sm90::gemm_workspace_bytes(ElementType::kFloat32, MatmulPrecision::kTF32, a), 1));
  const Status st = launch(ElementType::kFloat32, a, ws.ptr, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(cudaMemcpy(y.data(), dy.ptr, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  EXPECT_EQ(y[0 * N + 0], 1.0f + ulp) << "not rounded to nearest: " << y[0 * N + 0];
  EXPECT_EQ(y[1 * N + 0], -(1.0f + ulp)) << "not rounded to nearest: " << y[1 * N + 0];
  EXPECT_EQ(y[3 * N + 0], 1.0f) << "not rounded to nearest: " << y[3 * N + 0];
  std::printf("TF32 operand ties: 1 + 0.5 ulp -> 1 + %g ulp, 1 + 1.5 ulp -> 1 + %g ulp (%s)\n",
              (y[4 * N + 0] - 1.0f) / ulp, (y[5 * N + 0] - 1.0f) / ulp,
              y[4 * N + 0] == 1.0f && y[5 * N + 0] == 1.0f + 2 * ulp ? "to even"
              : y[4 * N + 0] == 1.0f + ulp && y[5 * N + 0] == 1.0f + 2 * ulp ? "away from zero" : "other");
  const float subnormal_product = y[2 * N + 1];
  std::printf("TF32 subnormal operand 2^-130 * 2^100 = %g (%s)\n", subnormal_product,
              subnormal_product == 0.0f ? "flushed to zero" : "kept");
  EXPECT_TRUE(subnormal_product == 0.0f || subnormal_product == std::ldexp(1.0f, -30)) << subnormal_product;
}

// Both 3xTF32 forward kernels: the presplit one (run_gemm_stats's default: x's small parts from a pass,
// y^T = W x^T with row partials) and the one that splits W's tiles in the loop (its form under
// FUSED_3XTF32_IN_LOOP_SPLIT=1), each through its own entry point.
struct Forward3xTf32Kernel {
  const char* name;
  std::size_t (*workspace)(const sm90::GemmStatsArgs&);
  Status (*run)(const sm90::GemmStatsArgs&, void*, cudaStream_t);
};
const Forward3xTf32Kernel kForward3xTf32Kernels[] = {
    {"presplit", sm90::instances::workspace_3xtf32_presplit_128x128, sm90::instances::run_3xtf32_presplit_128x128},
    {"in-loop split", sm90::instances::workspace_3xtf32_128x128, sm90::instances::run_3xtf32_128x128}};

// The 3xTF32 kernel: y against float64, next to the same problem's exact-fp32 error (a sequential
// fp32 dot product per element, on the host) and the 1xTF32 kernel's. N(0,1) operands times
// 10^U(-d, d) (magnitudes spread over 2d decades, mixed signs), d = 3 and 8. Asserted:
//   - K >= 1024: no less accurate than exact fp32;
//   - K = 64: within 3x of exact fp32. A two-part TF32 split keeps about 22 of fp32's 24 bits, so
//     over short sums exact fp32 can be the more accurate, most where a few large products dominate
//     the sum (H200: 1.1x exact fp32's error at d = 3, 2.0x at d = 8);
//   - far better than 1xTF32; the same bits in two runs; the column-mean partials against float64.
// Prints the three errors.
TEST(Sm90Gemm3xTf32, AsAccurateAsExactFp32) {
  SKIP_UNLESS_SM90();
  for (const Forward3xTf32Kernel& kernel : kForward3xTf32Kernels)
  for (const int decades : {3, 8})
  for (const int64_t K : {int64_t{64}, int64_t{1024}, int64_t{4096}, int64_t{8192}, int64_t{65536}}) {
    SCOPED_TRACE(std::string(kernel.name) + " K=" + std::to_string(K) + " decades=" + std::to_string(decades));
    if (decades == 8 && K == 65536) continue;  // the host references' time; d = 3 covers this K
    const int64_t M = K > 8192 ? 128 : 256, N = M;
    std::mt19937 rng(77u + unsigned(K) + unsigned(decades));
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> exponent(-float(decades), float(decades));
    auto draw = [&] { return normal(rng) * std::pow(10.f, exponent(rng)); };
    std::vector<float> x(M * K), w(N * K), bias(N);
    for (auto& v : x) v = draw();
    for (auto& v : w) v = draw();
    for (auto& v : bias) v = normal(rng);
    // float64 and exact-fp32 references
    std::vector<double> ref(M * N);
    std::vector<float> exact32(M * N);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const fused::test::DotReferences dot = fused::test::dot_references(&x[i * K], &w[j * K], K);
        ref[i * N + j] = dot.float64 + bias[j];
        exact32[i * N + j] = dot.fp32 + bias[j];
      }
    DeviceBuffer<float> dx(x.size()), dw(w.size()), db(N), dy(M * N);
    const int64_t row_tiles = (M + 127) / 128, ld = sm90::partials_ld(N);
    DeviceBuffer<float> dmean(row_tiles * ld), dm2(row_tiles * ld);
    CUDA_OK(cudaMemcpy(dx.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dw.ptr, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(db.ptr, bias.data(), N * 4, cudaMemcpyHostToDevice));
    sm90::GemmStatsArgs a;
    a.M = M; a.N = N; a.K = K;
    a.x = dx.ptr; a.ldx = K;
    a.w = dw.ptr; a.ldw = K;
    a.bias = db.ptr;
    a.y = dy.ptr; a.ldy = N;
    a.tile = sm90::k3xTf32Tile;
    a.partials = {dmean.ptr, dm2.ptr, row_tiles, 128, ld};
    auto run = [&](bool three, std::vector<float>& y) {
      CUDA_OK(cudaMemset(dy.ptr, 0xFF, M * N * 4));  // NaN: unwritten elements show
      DeviceBuffer<uint8_t> ws(std::max<size_t>(
          three ? kernel.workspace(a) : sm90::gemm_workspace_bytes(ElementType::kFloat32, MatmulPrecision::kTF32, a), 1));
      const Status st = three ? kernel.run(a, ws.ptr, nullptr)
                              : sm90::run_gemm_stats(ElementType::kFloat32, MatmulPrecision::kTF32, a, ws.ptr, nullptr);
      ASSERT_TRUE(st.ok()) << st.message;
      CUDA_OK(cudaDeviceSynchronize());
      y.resize(M * N);
      CUDA_OK(cudaMemcpy(y.data(), dy.ptr, M * N * 4, cudaMemcpyDeviceToHost));
    };
    auto rel = [&](auto const& got) {
      double e = 0, r = 0;
      for (int64_t i = 0; i < M * N; ++i) {
        e += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]);
        r += ref[i] * ref[i];
      }
      return std::sqrt(e / r);
    };
    std::vector<float> y1, y3, y3_again;
    run(false, y1);
    run(true, y3);
    std::vector<float> mean(row_tiles * ld);
    CUDA_OK(cudaMemcpy(mean.data(), dmean.ptr, mean.size() * 4, cudaMemcpyDeviceToHost));
    run(true, y3_again);
    const double e3 = rel(y3), e32 = rel(exact32), e1 = rel(y1);
    std::printf("3xTF32 (%s) K=%lld, 10^+-%d: rel err %.3g (exact fp32 %.3g, 1xTF32 %.3g)\n", kernel.name, (long long)K,
                decades, e3, e32, e1);
    for (int64_t i = 0; i < M * N; ++i) ASSERT_TRUE(std::isfinite(y3[i])) << "y[" << i << "] unwritten or not finite";
    EXPECT_EQ(std::memcmp(y3.data(), y3_again.data(), y3.size() * 4), 0) << "two runs differ";
    EXPECT_LE(e3, K >= 1024 ? e32 : 3 * e32);
    EXPECT_LT(e3, e1 / 50);
    for (int64_t t = 0; t < row_tiles; ++t)
      for (int64_t j = 0; j < N; ++j) {
        double m = 0, scale = 0;
        for (int64_t i = t * 128; i < std::min(M, (t + 1) * 128); ++i) {
          m += ref[i * N + j];  // the mean partial is y's (the node adds the bias to the accumulator's)
          scale += std::fabs(ref[i * N + j]);
        }
        m /= 128;
        scale /= 128;
        ASSERT_NEAR(mean[t * ld + j], m, 1e-5 * scale + 1e-30) << "tile " << t << " column " << j;
      }
  }
}

// 3xTF32 keeps fp32's special values: rows of x and W holding inf, -inf, NaN (one with payload bits
// only below TF32's, which TF32 alone reads as inf), subnormals and TF32-exact values give inf, NaN,
// or a finite value where a float64 sum of the same products does (inf * 0 = NaN, inf - inf = NaN),
// and the finite ones stay accurate. `spread`: one special every 37th row of x and every 41st of W,
// at columns that reach every k-tile, so that a grid of more tiles than SMs meets them in every tile
// of a CTA, at every position of the mainloop's ring of B's parts (K = 160: 5 k-tiles a tile).
void check_3xtf32_special_values(const Forward3xTf32Kernel& kernel, int64_t M, int64_t N, int64_t K, bool spread) {
  SCOPED_TRACE(::testing::Message() << kernel.name << " " << M << "x" << N << "x" << K);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(M * K), w(N * K);
  for (auto& v : x) v = normal(rng);
  for (auto& v : w) v = normal(rng);
  const float inf = std::numeric_limits<float>::infinity();
  const float low_payload_nan = fused::half_bits::bits_float(0x7f800001u);
  const float specials[] = {inf, -inf, std::numeric_limits<float>::quiet_NaN(), low_payload_nan, 0.0f, -0.0f,
                            1e-40f, -3e-42f, 1.5f, 3.0f};
  if (spread) {
    for (int64_t i = 0; i < M; i += 37) x[i * K + (i * 13) % K] = specials[(i / 37) % 10];
    for (int64_t j = 0; j < N; j += 41) w[j * K + (j * 7) % K] = specials[(j / 41 + 3) % 10];
  } else {
    for (int64_t i = 0; i < 40; ++i) x[i * K + (i % K)] = specials[i % 10];           // rows 0..39 of x
    for (int64_t j = 0; j < 40; ++j) w[j * K + ((j * 7) % K)] = specials[(j + 3) % 10];  // rows 0..39 of W
  }
  for (int64_t k = 0; k < K; ++k) x[50 * K + k] = std::ldexp(1.0f, -int(k % 64));  // a TF32-exact row
  DeviceBuffer<float> dx(x.size()), dw(w.size()), dy(M * N);
  CUDA_OK(cudaMemcpy(dx.ptr, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dw.ptr, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(dy.ptr, 0xFF, M * N * 4));
  sm90::GemmStatsArgs a;
  a.M = M; a.N = N; a.K = K;
  a.x = dx.ptr; a.ldx = K;
  a.w = dw.ptr; a.ldw = K;
  a.y = dy.ptr; a.ldy = N;
  a.tile = sm90::k3xTf32Tile;
  DeviceBuffer<uint8_t> ws(std::max<size_t>(kernel.workspace(a), 1));
  const Status st = kernel.run(a, ws.ptr, nullptr);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<float> y(M * N);
  CUDA_OK(cudaMemcpy(y.data(), dy.ptr, y.size() * 4, cudaMemcpyDeviceToHost));
  int64_t non_finite = 0, failures = 0;
  for (int64_t i = 0; i < M && failures < 10; ++i)
    for (int64_t j = 0; j < N && failures < 10; ++j) {
      double acc = 0, scale = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(x[i * K + k]) * double(w[j * K + k]);
        acc += p;
        if (std::isfinite(p)) scale += std::fabs(p);
      }
      const float got = y[i * N + j];
      bool ok;
      if (std::isnan(acc)) {
        ++non_finite;
        ok = std::isnan(got);
      } else if (std::isinf(acc)) {
        ++non_finite;
        ok = got == float(acc);
      } else {
        ok = std::fabs(double(got) - acc) <= 1e-6 * scale + 1e-37;
      }
      if (!ok) {
        ++failures;
        ADD_FAILURE() << "y[" << i << ", " << j << "] = " << got << ", float64 " << acc;
      }
    }
  EXPECT_GT(non_finite, spread ? M * N / 100 : 100);  // the specials did reach many outputs
}

TEST(Sm90Gemm3xTf32, SpecialValuesAsInFp32) {
  SKIP_UNLESS_SM90();
  for (const Forward3xTf32Kernel& kernel : kForward3xTf32Kernels) {
    check_3xtf32_special_values(kernel, 128, 128, 64, false);
    check_3xtf32_special_values(kernel, 2048, 2048, 160, true);  // 256 tiles: two per CTA on most SMs
  }
}

// The tile rule (no GPU needed): split K where the 128x128 grid fills at most half the SMs and K has
// at least kMinKTilesToSplit k-tiles of 128 bytes; else 128x128 ping-pong when the 256x128 grid is
// under one wave. Element sizes: 2 (bf16, fp16), 4 (tf32).
TEST(Sm90GemmStats, ChooseTile) {
  for (int bytes : {2, 4}) {
    EXPECT_EQ(sm90::choose_tile(1024, 8192, 8192, bytes, 132), sm90::Sm90Tile::k256x128);  // 256 tiles
    EXPECT_EQ(sm90::choose_tile(512, 8192, 8192, bytes, 132), sm90::Sm90Tile::k128x128);   // 128 tiles < 132 SMs
    EXPECT_EQ(sm90::choose_tile(512, 8192 + 512, 8192, bytes, 132), sm90::Sm90Tile::k256x128);  // 136 tiles
    EXPECT_EQ(sm90::choose_tile(256, 8192, 8192, bytes, 132), sm90::Sm90Tile::k128x128);   // 128 tiles of 128x128
    EXPECT_EQ(sm90::choose_tile(1024, 2048, 4096, bytes, 132), sm90::Sm90Tile::k128x128);  // 128 tiles of 128x128
    EXPECT_EQ(sm90::choose_tile(1024, 512, 4096, bytes, 132), sm90::Sm90Tile::k128x128SplitK);  // 32 tiles
    EXPECT_EQ(sm90::choose_tile(128, 8192, 8192, bytes, 132), sm90::Sm90Tile::k128x128SplitK);  // 64 tiles
    EXPECT_EQ(sm90::choose_tile(1024, 512, 1024, bytes, 132), sm90::Sm90Tile::k128x128);   // K too short to split
    EXPECT_EQ(sm90::choose_tile(1, 16, 64, bytes, 132), sm90::Sm90Tile::k128x128);
    EXPECT_EQ(sm90::choose_tile(1, 16, 8192, bytes, 132), sm90::Sm90Tile::k128x128SplitK);
    EXPECT_EQ(sm90::choose_tile(65536, 8192, 8192, bytes, 132), sm90::Sm90Tile::k256x128);
  }
  // 2048 of K: 32 k-tiles of bf16 (too few), 64 of fp32
  EXPECT_EQ(sm90::choose_tile(1024, 512, 2048, 2, 132), sm90::Sm90Tile::k128x128);
  EXPECT_EQ(sm90::choose_tile(1024, 512, 2048, 4, 132), sm90::Sm90Tile::k128x128SplitK);
}

TEST(Sm90GemmStats, SplitKCount) {
  EXPECT_EQ(sm90::split_k_count(1024, 512, 4096, 2, 132), 4);    // 32 tiles: 4 x 32 = 128 CTAs
  EXPECT_EQ(sm90::split_k_count(1024, 512, 4096, 4, 132), 4);
  EXPECT_EQ(sm90::split_k_count(128, 8192, 8192, 2, 132), 2);    // 64 tiles
  EXPECT_EQ(sm90::split_k_count(128, 8192, 8192, 2, 128), 2);    // exactly half the SMs
  EXPECT_EQ(sm90::split_k_count(128, 8192, 8192, 2, 127), 1);    // more than half
  EXPECT_EQ(sm90::split_k_count(512, 512, 8192, 2, 132), 8);     // 16 tiles: 8 x 16 = 128 CTAs
  EXPECT_EQ(sm90::split_k_count(1, 16, 1 << 20, 2, 132), 8);     // at most kMaxSplitK
  EXPECT_EQ(sm90::split_k_count(1, 16, 4096, 2, 132), 4);        // 64 k-tiles: at least 16 each
  EXPECT_EQ(sm90::split_k_count(1, 16, 6144, 2, 132), 6);        // 96 k-tiles
  EXPECT_EQ(sm90::split_k_count(1, 16, 4000, 2, 132), 1);        // 63 k-tiles (the last one ragged): too few
  EXPECT_EQ(sm90::split_k_count(1, 16, 2048, 4, 132), 4);        // 64 k-tiles of fp32
  EXPECT_EQ(sm90::split_k_count(1024, 512, 2047, 4, 132), 4);    // a ragged last k-tile counts (as CUTLASS's)
  EXPECT_EQ(sm90::split_k_count(1024, 512, 2015, 4, 132), 1);    // 63 k-tiles
  EXPECT_EQ(sm90::split_k_count(1024, 512, 4096, 0, 132), 1);    // no element size: no split
}

// The one-kernel rule (no GPU needed): every 64x64 tile resident (at most 2 per SM), at least a quarter
// of the SMs busy, at most 128 k-tiles of 128 bytes of K loop per SM.
TEST(Sm90GemmStats, OneKernelForwardFits) {
  EXPECT_TRUE(sm90::one_kernel_forward_fits(1024, 512, 4096, 2, 132));    // 128 tiles x 64 k-tiles
  EXPECT_TRUE(sm90::one_kernel_forward_fits(1024, 512, 8192, 2, 132));    // 128 x 128
  EXPECT_FALSE(sm90::one_kernel_forward_fits(1024, 512, 8192, 4, 132));   // 128 x 256: tf32's K loop too long
  EXPECT_TRUE(sm90::one_kernel_forward_fits(1024, 512, 4096, 4, 132));    // 128 x 128
  EXPECT_TRUE(sm90::one_kernel_forward_fits(2048, 512, 4096, 2, 132));    // 256 tiles, two per SM, 64 k-tiles
  EXPECT_FALSE(sm90::one_kernel_forward_fits(2048, 512, 8192, 2, 132));   // two per SM, 128 k-tiles each
  EXPECT_TRUE(sm90::one_kernel_forward_fits(2112, 512, 64, 2, 132));      // 33 x 8 = 264 tiles: all resident
  EXPECT_FALSE(sm90::one_kernel_forward_fits(2113, 512, 64, 2, 132));     // 272 tiles
  EXPECT_TRUE(sm90::one_kernel_forward_fits(384, 512, 4096, 2, 132));     // 48 tiles
  EXPECT_FALSE(sm90::one_kernel_forward_fits(256, 512, 4096, 2, 132));    // 32 tiles: under a quarter of the SMs
  EXPECT_TRUE(sm90::one_kernel_forward_fits(256, 528, 4096, 2, 132));     // 33 tiles
  EXPECT_FALSE(sm90::one_kernel_forward_fits(1024, 8192, 64, 2, 132));    // 2048 tiles
  EXPECT_FALSE(sm90::one_kernel_forward_fits(1024, 512, 0, 2, 132));      // no K loop: not this kernel's
  EXPECT_EQ(sm90::one_kernel_tiles(1000, 508), 16 * 8);
  EXPECT_EQ(sm90::one_kernel_row_parts_floats(1000, 508), 2 * 8 * 1000);
}

// Split K over 2..8 CTAs, ragged M, N and the last k-tile, against float64; bitwise reproducible.
TEST(Sm90GemmStats, SplitK) {
  SKIP_UNLESS_SM90();
  for (ElementType t : kTypes)
    for (int k_splits : {1, 2, 5, 8}) {
      Case c; c.type = t; c.M = 300; c.N = 260; c.K = 1000; c.ldy_pad = 4; c.check_determinism = true;
      c.tile = sm90::Sm90Tile::k128x128SplitK; c.k_splits = k_splits;
      run_case(c);
      c.stats = false;
      run_case(c);
    }
}

TEST(Sm90GemmStats, RejectsUnsupportedArguments) {
  SKIP_UNLESS_SM90();
  DeviceBuffer<float> buf(1 << 16);
  ASSERT_NE(buf.ptr, nullptr);
  sm90::GemmStatsArgs a;
  a.M = 64; a.N = 64; a.K = 64;
  a.x = buf.ptr; a.ldx = 64; a.w = buf.ptr; a.ldw = 64; a.y = buf.ptr; a.ldy = 64;
  sm90::GemmStatsArgs bad = a;
  bad.K = 12; bad.ldx = 12; bad.ldw = 12;  // not a multiple of 8 bf16 elements
  EXPECT_EQ(launch(ElementType::kBFloat16, bad, nullptr, nullptr).code, StatusCode::kNotSupported);
  bad = a; bad.N = 62; bad.ldy = 62;       // TMA store of y needs N % 4 == 0
  EXPECT_EQ(launch(ElementType::kFloat32, bad, nullptr, nullptr).code, StatusCode::kNotSupported);
  bad = a; bad.partials.mean = buf.ptr;    // m2 missing
  EXPECT_EQ(launch(ElementType::kFloat16, bad, nullptr, nullptr).code, StatusCode::kInvalidArgument);
  bad = a; bad.partials.mean = buf.ptr; bad.partials.m2 = buf.ptr; bad.partials.num_row_tiles = 1;
  bad.partials.row_tile = sm90::partials_row_tile(); bad.partials.ld = 64;  // ld must be round_up(N, 128)
  EXPECT_EQ(launch(ElementType::kBFloat16, bad, nullptr, nullptr).code, StatusCode::kInvalidArgument);
  bad.tile = sm90::Sm90Tile::k128x128;     // 256-row partials for the 128-row kernel
  bad.partials.ld = 128;
  EXPECT_EQ(launch(ElementType::kBFloat16, bad, nullptr, nullptr).code, StatusCode::kInvalidArgument);
  bad = a; bad.k_splits = -1;
  bad.tile = sm90::Sm90Tile::k128x128SplitK;
  EXPECT_EQ(launch(ElementType::kBFloat16, bad, nullptr, nullptr).code, StatusCode::kInvalidArgument);
  bad.k_splits = 2; bad.tile = sm90::Sm90Tile::k128x128;  // a split count for a tile that does not split
  EXPECT_EQ(launch(ElementType::kBFloat16, bad, nullptr, nullptr).code, StatusCode::kInvalidArgument);
  bad = a; bad.x = reinterpret_cast<const char*>(buf.ptr) + 4;  // misaligned
  EXPECT_EQ(launch(ElementType::kFloat32, bad, nullptr, nullptr).code, StatusCode::kNotSupported);
  // 3xTF32 has one tile; exact fp32 has no sm90 kernel.
  bad = a; bad.tile = sm90::Sm90Tile::k256x128;
  EXPECT_EQ(sm90::run_gemm_stats(ElementType::kFloat32, MatmulPrecision::k3xTF32, bad, nullptr, nullptr).code,
            StatusCode::kInvalidArgument);
  EXPECT_EQ(sm90::run_gemm_stats(ElementType::kFloat32, MatmulPrecision::kHighest, a, nullptr, nullptr).code,
            StatusCode::kNotSupported);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
