// GPU group: the architecture-neutral kernels (generic column partials, finalize, row softmax)
// against the CPU implementation / float64. Every test skips without a CUDA device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fused/detail/bn_math.h"
#include "fused/detail/half_bits.h"
#include "api/forward_steps.h"
#include "test_util.h"

namespace fused {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

template <class T>
struct DeviceBuf {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuf(size_t count) : n(count) {
    if (cudaMalloc(&ptr, std::max<size_t>(1, count) * sizeof(T)) != cudaSuccess) ptr = nullptr;
    poison();
  }
  DeviceBuf(const std::vector<T>& h) : DeviceBuf(h.size()) { upload(h); }
  ~DeviceBuf() { cudaFree(ptr); }
  void poison() { cudaMemset(ptr, 0xff, n * sizeof(T)); }  // NaN for floats: unwritten elements show
  void upload(const std::vector<T>& h) { cudaMemcpy(ptr, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

// One TF32 tensor-core MMA (m16n8k8, mma.sync) over raw fp32 register bits: row r of A holds
// a_in[r] at k = 0 and zeros, B is the unit vector e_0, so D[r][0] is what the tensor core made of
// a_in[r]. Fragment layout as in the PTX ISA (groupID = lane / 4, threadID_in_group = lane % 4).
__global__ void tf32_mma_of_raw_operands(const float* a_in, float* d_out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int lane = threadIdx.x, group = lane / 4, tig = lane % 4;
  const float a0 = tig == 0 ? a_in[group] : 0.f, a1 = tig == 0 ? a_in[group + 8] : 0.f;
  const float b0 = lane == 0 ? 1.f : 0.f;
  float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
      : "r"(__float_as_uint(a0)), "r"(__float_as_uint(a1)), "r"(0u), "r"(0u), "r"(__float_as_uint(b0)), "r"(0u));
  if (tig == 0) {
    d_out[group] = d0;
    d_out[group + 8] = d2;
  }
#endif
}

// What the TF32 tensor cores do with the 13 mantissa bits of a raw fp32 operand that TF32 lacks
// (the 3xTF32 design needs to know: docs/design-3xtf32-sm90.md, trap 1). Asserted: the result is
// one consistent rule (truncation, or rounding to nearest with ties to even or away from zero) on
// every probe; printed: which one.
TEST(Tf32TensorCores, RawFp32OperandBitsFollowOneRoundingRule) {
  REQUIRE_GPU();
  int major = 0;
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 8) GTEST_SKIP() << "TF32 tensor cores need sm80+";
  const float u = std::ldexp(1.0f, -10);  // TF32's ulp at 1
  // probe: value, truncated, nearest-even, nearest-away
  struct Probe { float in, rz, rne, rna; };
  const std::vector<Probe> probes = {
      {1 + 0.75f * u, 1, 1 + u, 1 + u},          {-(1 + 0.75f * u), -1, -(1 + u), -(1 + u)},
      {1 + 0.25f * u, 1, 1, 1},                  {1 + 0.5f * u, 1, 1, 1 + u},
      {1 + 1.5f * u, 1 + u, 1 + 2 * u, 1 + 2 * u}, {1 + 0.999f * u, 1, 1 + u, 1 + u}};
  std::vector<float> a(16, 0.f);
  for (size_t i = 0; i < probes.size(); ++i) a[i] = probes[i].in;
  DeviceBuf<float> da(a), dd(16);
  tf32_mma_of_raw_operands<<<1, 32>>>(da.ptr, dd.ptr);
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  const auto d = dd.download();
  bool rz = true, rne = true, rna = true;
  for (size_t i = 0; i < probes.size(); ++i) {
    rz = rz && d[i] == probes[i].rz;
    rne = rne && d[i] == probes[i].rne;
    rna = rna && d[i] == probes[i].rna;
    std::printf("TF32 mma.sync operand %.10g -> %.10g\n", probes[i].in, d[i]);
  }
  for (size_t i = probes.size(); i < 16; ++i) EXPECT_EQ(d[i], 0.f) << "row " << i;
  std::printf("TF32 tensor cores on raw fp32 operand bits: %s\n",
              rz ? "truncate (toward zero)" : rne ? "round to nearest, ties to even"
                                                 : rna ? "round to nearest, ties away from zero" : "no single rule");
  EXPECT_TRUE(rz || rne || rna) << "the probes follow none of the three rules";
}

class ColumnPartialsGpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, double>> {};

TEST_P(ColumnPartialsGpu, MatchesCpu) {
  REQUIRE_GPU();
  const auto [M, N, ratio] = GetParam();
  const auto y = test::random_columns(M, N, ratio, 11);
  ColumnStatsPartials p;
  p.row_tile = 128;
  p.num_row_tiles = (M + 127) / 128;
  p.ld = N + 3;  // ld > N must be honoured
  DeviceBuf<float> dy(y), dmean(p.num_row_tiles * p.ld), dm2(p.num_row_tiles * p.ld);
  ColumnStatsPartials dp = p;
  dp.mean = dmean.ptr;
  dp.m2 = dm2.ptr;
  ASSERT_TRUE(cuda::column_partials(dy.ptr, N, M, N, dp, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  const auto mean = dmean.download(), m2 = dm2.download();
  for (int64_t t = 0; t < p.num_row_tiles; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      double rm, rm2;
      test::column_moments(y, N, n, t * 128, std::min(M, (t + 1) * 128), rm, rm2);
      const double rms = std::sqrt(rm * rm + rm2 / (std::min(M, (t + 1) * 128) - t * 128));
      EXPECT_LE(std::fabs(mean[t * p.ld + n] - rm), 2e-7 * rms) << t << "," << n;
      EXPECT_LE(std::fabs(m2[t * p.ld + n] - rm2), 1e-5 * rm2 + 1e-6) << t << "," << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ColumnPartialsGpu,
                         ::testing::Values(std::make_tuple(int64_t{2}, int64_t{1}, 0.0),
                                           std::make_tuple(int64_t{129}, int64_t{33}, 3.0),
                                           std::make_tuple(int64_t{1000}, int64_t{70}, 1e3),
                                           std::make_tuple(int64_t{4096}, int64_t{256}, 1.0)),
                         [](const ::testing::TestParamInfo<std::tuple<int64_t, int64_t, double>>& info) {
                           return "M" + std::to_string(std::get<0>(info.param)) + "_N" +
                                  std::to_string(std::get<1>(info.param)) + "_ratio" +
                                  std::to_string(static_cast<int64_t>(std::get<2>(info.param)));
                         });

// (M, N, ldy): vector stores (N % 4 == 0), scalar stores (odd N), padded rows (ldy > N).
class BiasRowsGpu : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t>> {};

TEST_P(BiasRowsGpu, EveryRowIsTheBiasAndPaddingIsUntouched) {
  REQUIRE_GPU();
  const auto [M, N, ldy] = GetParam();
  std::vector<uint16_t> bias_bits(N);
  std::vector<float> want(N);
  for (int64_t n = 0; n < N; ++n) {
    bias_bits[n] = half_bits::float_to_bf16_bits(0.37f * static_cast<float>(n % 97) - 11.0f);
    want[n] = half_bits::bf16_bits_to_float(bias_bits[n]);
  }
  DeviceBuf<uint16_t> dbias(bias_bits);
  DeviceBuf<float> dy(M * ldy);  // poisoned with NaN
  ASSERT_TRUE(cuda::bias_rows(dbias.ptr, ElementType::kBFloat16, dy.ptr, ldy, M, N, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  const auto y = dy.download();
  for (int64_t r = 0; r < M; ++r) {
    for (int64_t n = 0; n < ldy; ++n) {
      if (n < N) {
        ASSERT_EQ(y[r * ldy + n], want[n]) << r << "," << n;
      } else {
        ASSERT_TRUE(std::isnan(y[r * ldy + n])) << "padding written at " << r << "," << n;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BiasRowsGpu,
                         ::testing::Values(std::make_tuple(int64_t{1}, int64_t{4}, int64_t{4}),
                                           std::make_tuple(int64_t{777}, int64_t{8192}, int64_t{8192}),
                                           std::make_tuple(int64_t{300}, int64_t{1001}, int64_t{1001}),
                                           std::make_tuple(int64_t{65}, int64_t{40}, int64_t{52}),
                                           std::make_tuple(int64_t{3}, int64_t{70000}, int64_t{70000})),
                         [](const ::testing::TestParamInfo<std::tuple<int64_t, int64_t, int64_t>>& info) {
                           return "M" + std::to_string(std::get<0>(info.param)) + "_N" +
                                  std::to_string(std::get<1>(info.param)) + "_ldy" +
                                  std::to_string(std::get<2>(info.param));
                         });

// The CPU's column partials of y (M x N) in row tiles of 128, held in `storage`.
ColumnStatsPartials host_partials(const std::vector<float>& y, int64_t M, int64_t N, std::vector<float>& storage) {
  ColumnStatsPartials p;
  p.row_tile = 128;
  p.num_row_tiles = (M + 127) / 128;
  p.ld = N;
  storage.assign(2 * p.num_row_tiles * N, 0.f);
  p.mean = storage.data();
  p.m2 = storage.data() + p.num_row_tiles * N;
  cpu::column_partials(y.data(), N, M, N, p);
  return p;
}

TEST(FinalizeGpu, MatchesCpuBitForBit) {
  REQUIRE_GPU();
  const int64_t M = 1000, N = 300;
  const auto y = test::random_columns(M, N, 10.0, 12);
  std::vector<float> hpart;
  const ColumnStatsPartials p = host_partials(y, M, N, hpart);
  std::vector<float> gamma(N), beta(N), rm(N), rv(N), scale(N);
  for (int64_t n = 0; n < N; ++n) {
    gamma[n] = 1.f + 0.01f * n; beta[n] = 0.02f * n; rm[n] = 0.1f * n; rv[n] = 2.f; scale[n] = 0.5f + 0.001f * n;
  }
  std::vector<int64_t> nbt{3};
  for (double momentum : {0.1, -1.0}) {
    std::vector<float> hrm = rm, hrv = rv, hs(N), ha(N), hc(N), hinv(N);
    BatchNormArgs hbn;
    hbn.gamma = gamma.data(); hbn.beta = beta.data(); hbn.running_mean = hrm.data(); hbn.running_var = hrv.data();
    hbn.num_batches_tracked = nbt.data(); hbn.momentum = momentum; hbn.scale = scale.data(); hbn.scale_numel = N;
    cpu::finalize(p, M, N, hbn, hinv.data(), ColumnAffine{hs.data(), ha.data(), hc.data()});

    DeviceBuf<float> dpart(hpart), dg(gamma), db(beta), drm(rm), drv(rv), dsc(scale), ds(N), da(N), dc(N), dinv(N);
    DeviceBuf<int64_t> dnbt(nbt);
    ColumnStatsPartials dp = p;
    dp.mean = dpart.ptr;
    dp.m2 = dpart.ptr + p.num_row_tiles * N;
    BatchNormArgs dbn = hbn;
    dbn.gamma = dg.ptr; dbn.beta = db.ptr; dbn.running_mean = drm.ptr; dbn.running_var = drv.ptr;
    dbn.num_batches_tracked = dnbt.ptr; dbn.scale = dsc.ptr;
    ASSERT_TRUE(cuda::finalize(dp, M, N, dbn, dinv.ptr, ColumnAffine{ds.ptr, da.ptr, dc.ptr}, nullptr).ok());
    CUDA_OK(cudaDeviceSynchronize());
    // Same double-precision merge in the same order on both: identical up to libm's sqrt.
    const auto gs = ds.download(), ga = da.download(), gc = dc.download(), grm = drm.download(), grv = drv.download();
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_EQ(gs[n], hs[n]);
      EXPECT_NEAR(ga[n], ha[n], 1e-6f * std::fabs(ha[n]));
      EXPECT_EQ(gc[n], hc[n]);
      EXPECT_EQ(grm[n], hrm[n]);
      EXPECT_EQ(grv[n], hrv[n]);
    }
  }
}

// ColumnAffine::shift_folded: finalize writes z = a y + c with c = c - a shift from the exact map's
// floats (rounded once), a zero-batch-variance column as a = 0, c unchanged (exact there); a zero
// running variance in eval is no such column. The same on the CPU.
TEST(FinalizeGpu, FoldedMapIsTheExactMapWithItsShiftFoldedIn) {
  REQUIRE_GPU();
  const int64_t M = 1000, N = 300;
  auto y = test::random_columns(M, N, 10.0, 12);
  for (int64_t i = 0; i < M; ++i) y[i * N + 7] = 3.25f;  // zero batch variance
  std::vector<float> hpart;
  const ColumnStatsPartials p = host_partials(y, M, N, hpart);
  std::vector<float> gamma(N), beta(N), rm(N), rv(N, 2.f);
  for (int64_t n = 0; n < N; ++n) {
    gamma[n] = 1.f + 0.01f * n; beta[n] = 0.02f * n - 1.f; rm[n] = 0.1f * n;
  }
  rv[9] = 0.f;  // eval: a zero running variance
  const std::vector<float> scale{1.5f};
  for (const bool training : {true, false}) {
    DeviceBuf<float> dpart(hpart), dg(gamma), db(beta), dsc(scale);
    ColumnStatsPartials dp = p;
    dp.mean = dpart.ptr;
    dp.m2 = dpart.ptr + p.num_row_tiles * N;
    std::vector<float> s[2], a[2], c[2];
    for (const bool folded : {false, true}) {
      DeviceBuf<float> drm(rm), drv(rv), ds(N), da(N), dc(N), dinv(N);
      BatchNormArgs bn;
      bn.gamma = dg.ptr; bn.beta = db.ptr; bn.running_mean = drm.ptr; bn.running_var = drv.ptr;
      bn.momentum = 0.1; bn.scale = dsc.ptr; bn.scale_numel = 1; bn.training = training;
      ColumnAffine affine{ds.ptr, da.ptr, dc.ptr};
      affine.shift_folded = folded;
      ASSERT_TRUE(cuda::finalize(dp, M, N, bn, dinv.ptr, affine, nullptr).ok());
      CUDA_OK(cudaDeviceSynchronize());
      s[folded] = ds.download(); a[folded] = da.download(); c[folded] = dc.download();
    }
    std::vector<float> hrm = rm, hrv = rv, hs(N), ha(N), hc(N), hinv(N);
    BatchNormArgs hbn;
    hbn.gamma = gamma.data(); hbn.beta = beta.data(); hbn.running_mean = hrm.data(); hbn.running_var = hrv.data();
    hbn.momentum = 0.1; hbn.scale = scale.data(); hbn.scale_numel = 1; hbn.training = training;
    ColumnAffine host{hs.data(), ha.data(), hc.data()};
    host.shift_folded = true;
    cpu::finalize(p, M, N, hbn, hinv.data(), host);
    for (int64_t n = 0; n < N; ++n) {
      ASSERT_EQ(s[1][n], s[0][n]) << n;  // the saved mean either way
      if (training && n == 7) {
        EXPECT_EQ(a[1][n], 0.f);
        EXPECT_EQ(c[1][n], c[0][n]);
      } else {
        EXPECT_EQ(a[1][n], a[0][n]) << n;
        EXPECT_EQ(c[1][n], static_cast<float>(double(c[0][n]) - double(a[0][n]) * double(s[0][n]))) << n;
      }
      EXPECT_EQ(hs[n], s[1][n]) << n;
      EXPECT_NEAR(ha[n], a[1][n], 1e-6f * std::fabs(a[1][n])) << n;  // libm's sqrt
      EXPECT_NEAR(hc[n], c[1][n], 1e-6 * (std::fabs(a[1][n] * s[1][n]) + std::fabs(c[0][n]))) << n;
    }
  }
}

template <class T>
float to_float(T v);
template <>
float to_float(float v) { return v; }
template <>
float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
float to_float(__half v) { return __half2float(v); }

// folded: the map given with its shift folded in (ColumnAffine::shift_folded): a, c - a shift (rounded
// once), and a NaN shift, which the kernels must not read; the reference stays the exact map in double.
template <class T>
void check_softmax(int64_t M, int64_t N, int64_t ldo_pad, ElementType dt, double tol, int64_t ldy_pad = 0,
                   bool folded = false) {
  const auto y = test::random_columns(M, N, 5.0, 13 + N);
  const int64_t ldy = N + ldy_pad;
  std::vector<float> y_strided(M * ldy, std::numeric_limits<float>::quiet_NaN());  // padding never read
  for (int64_t i = 0; i < M; ++i) std::copy(y.begin() + i * N, y.begin() + (i + 1) * N, y_strided.begin() + i * ldy);
  std::vector<float> shift(N), a(N), c(N), c_folded(N);
  double max_folded = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    double mean, m2;
    test::column_moments(y, N, n, 0, M, mean, m2);
    shift[n] = static_cast<float>(mean);
    a[n] = static_cast<float>(1.7 / std::sqrt(m2 / M + 1e-5));
    c[n] = 0.01f * (n % 13);
    c_folded[n] = static_cast<float>(static_cast<double>(c[n]) - static_cast<double>(a[n]) * shift[n]);
    max_folded = std::max(max_folded, std::fabs(static_cast<double>(c_folded[n])));
  }
  // The fold's own error: half an ulp of |c - a shift| per logit, so up to twice that in each output's
  // relative error (its logit and the normaliser).
  const double fold_err = folded ? std::ldexp(max_folded, -24) : 0.0;
  tol += 2.0 * fold_err;
  const int64_t ldo = N + ldo_pad;
  DeviceBuf<float> dy(y_strided), ds(shift), da(a), dc(folded ? c_folded : c), nan_shift(N);  // NaN-poisoned
  DeviceBuf<T> dout(M * ldo);
  DeviceBuf<float> dlse(M);
  ColumnAffine affine{folded ? nan_shift.ptr : ds.ptr, da.ptr, dc.ptr};
  affine.shift_folded = folded;
  ASSERT_TRUE(cuda::row_softmax(dy.ptr, ldy, M, N, affine, dout.ptr, ldo, dt, dlse.ptr, nullptr).ok());
  CUDA_OK(cudaDeviceSynchronize());
  const auto out = dout.download();
  const auto lse = dlse.download();
  double err2 = 0.0, ref2 = 0.0;
  for (int64_t i = 0; i < M; ++i) {
    std::vector<double> z(N);
    double mx = -INFINITY, sum = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      z[n] = a[n] * (static_cast<double>(y[i * N + n]) - shift[n]) + c[n];
      mx = std::max(mx, z[n]);
    }
    for (int64_t n = 0; n < N; ++n) sum += std::exp(z[n] - mx);
    // The log-normaliser: fp32 rounding of a value of size |max z|.
    ASSERT_NEAR(lse[i], mx + std::log(sum), 4e-7 * (std::fabs(mx) + std::log(sum) + 1.0) + fold_err) << i;
    for (int64_t n = 0; n < N; ++n) {
      const double ref = std::exp(z[n] - mx) / sum, got = to_float(out[i * ldo + n]);
      ASSERT_FALSE(std::isnan(got)) << "unwritten or NaN at " << i << "," << n;
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
  }
  EXPECT_LE(std::sqrt(err2 / ref2), tol) << "M=" << M << " N=" << N;
}

TEST(RowSoftmaxGpu, Float32AllWidths) {
  REQUIRE_GPU();
  // tiny, odd, every register-path width class; clusters of 3 (the last CTA holding 4 columns), 4, 13
  // and 16 CTAs a row (sm90); one column past the widest cluster, and odd widths the clusters cannot
  // take (one CTA a row in registers, streaming); 2^20-wide rows
  for (int64_t N : std::vector<int64_t>{1, 3, 4, 7, 100, 513, 2048, 4097, 8192, 12000, 16385, 16388, 32768, 40001,
                                        100004, 131072, 131076, 1 << 20})
    check_softmax<float>(N > 100000 ? 3 : 9, N, 0, ElementType::kFloat32, 2e-6);
}

// The map with its shift folded in (ColumnAffine::shift_folded), at every width class (staged with the
// coefficients reloaded per row or kept in registers, clustered, one CTA a row, streaming, scalar
// loads and stores): the shift is not read, and the fold costs at most its rounding.
TEST(RowSoftmaxGpu, FoldedShiftAllWidths) {
  REQUIRE_GPU();
  for (int64_t N : std::vector<int64_t>{1, 4, 7, 100, 513, 2048, 4097, 8192, 12000, 16388, 40001, 131072, 1 << 20})
    check_softmax<float>(N > 100000 ? 3 : 9, N, 0, ElementType::kFloat32, 2e-6, 0, true);
  check_softmax<__nv_bfloat16>(3000, 8192, 0, ElementType::kBFloat16, 4e-3, 0, true);
  // Rows enough for the 512 x 4 CTAs to keep a and c in shared memory (CoefSource::kShared), a row
  // narrower than the layout: the copies bring N columns, the columns beyond are never read.
  int device = 0, sms = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  check_softmax<__half>(12 * int64_t{sms} + 5, 6004, 0, ElementType::kFloat16, 5e-4, 0, true);
  check_softmax<__half>(700, 4096, 0, ElementType::kFloat16, 5e-4, 0, true);
  check_softmax<__half>(5, 1001, 1, ElementType::kFloat16, 1e-3, 0, true);       // scalar loads and stores
  check_softmax<float>(37, 8190, 2, ElementType::kFloat32, 2e-6, 2, true);       // ragged row ends
  check_softmax<__nv_bfloat16>(300, 24000, 0, ElementType::kBFloat16, 4e-3, 0, true);  // clusters, many rows
}

TEST(RowSoftmaxGpu, ManyRows) {
  REQUIRE_GPU();
  check_softmax<float>(5000, 100, 0, ElementType::kFloat32, 2e-6);
  check_softmax<__nv_bfloat16>(3000, 8192, 0, ElementType::kBFloat16, 4e-3);
  check_softmax<float>(700, 2001, 0, ElementType::kFloat32, 2e-6);
  // Rows split over a cluster (sm90): many rows per cluster of 3, 16 and 9 CTAs, a ragged last CTA.
  check_softmax<__nv_bfloat16>(700, 20000, 0, ElementType::kBFloat16, 4e-3);
  check_softmax<float>(300, 131072, 0, ElementType::kFloat32, 2e-6);
  check_softmax<float>(150, 70004, 0, ElementType::kFloat32, 2e-6);
}

// Rows whose width is not a multiple of 4 but whose stride is: the blocked kernel's ragged end.
TEST(RowSoftmaxGpu, RaggedRowEndsWithAlignedStrides) {
  REQUIRE_GPU();
  for (int64_t N : std::vector<int64_t>{5, 1023, 4094, 8190, 16382, 40002})
    check_softmax<float>(37, N, 4 - N % 4, ElementType::kFloat32, 2e-6, 4 - N % 4);
  check_softmax<__nv_bfloat16>(301, 8189, 3, ElementType::kBFloat16, 4e-3, 3);
}

TEST(RowSoftmaxGpu, UnalignedOutputFallsBackToScalarStores) {
  REQUIRE_GPU();
  check_softmax<float>(5, 1001, 1, ElementType::kFloat32, 2e-6);
  check_softmax<__half>(5, 66, 3, ElementType::kFloat16, 1e-3);
}

TEST(RowSoftmaxGpu, HalfAndBFloat16Outputs) {
  REQUIRE_GPU();
  check_softmax<__nv_bfloat16>(7, 8192, 0, ElementType::kBFloat16, 4e-3);
  check_softmax<__half>(7, 8192, 0, ElementType::kFloat16, 5e-4);
  check_softmax<__nv_bfloat16>(2, 50000, 0, ElementType::kBFloat16, 4e-3);
  check_softmax<__half>(5, 9000, 0, ElementType::kFloat16, 5e-4);
}

// Fixed, varied folded coefficients of N columns on the device, for tests that compare kernels' bits.
struct DeviceAffine {
  DeviceBuf<float> shift, a, c;
  explicit DeviceAffine(int64_t N)
      : shift(pattern(N, 0.f, 0.1f, 7)), a(pattern(N, 0.5f, 0.01f, 11)), c(pattern(N, 0.f, 0.01f, 13)) {}
  ColumnAffine affine() const { return {shift.ptr, a.ptr, c.ptr}; }
  static std::vector<float> pattern(int64_t N, float base, float step, int period) {
    std::vector<float> v(N);
    for (int64_t n = 0; n < N; ++n) v[n] = base + step * (n % period);
    return v;
  }
};

// The staged kernel (persistent CTAs, rows brought in by bulk copies), the one-CTA-per-row kernel and
// the clustered kernel with a cluster of one reduce a row over the same threads in the same order: the
// same bits, on ragged shapes (rows not a multiple of the grid; odd N and unaligned strides, where
// the staged layouts fall back).
TEST(RowSoftmaxGpu, StagedAndUnstagedGiveTheSameBits) {
  REQUIRE_GPU();
  struct Shape { int64_t M, N, pad; };
  for (const Shape s : {Shape{37, 8188, 4}, Shape{5, 1001, 1}, Shape{1023, 4096, 0}, Shape{3, 2000, 0},
                        Shape{2001, 8192, 0}, Shape{300, 512, 0}, Shape{9, 8190, 2}}) {
    const auto y = test::random_columns(s.M, s.N, 5.0, 7 + s.N);
    const int64_t ld = s.N + s.pad;
    std::vector<float> y_strided(s.M * ld, 0.f);
    for (int64_t i = 0; i < s.M; ++i) std::copy(y.begin() + i * s.N, y.begin() + (i + 1) * s.N, y_strided.begin() + i * ld);
    const DeviceAffine coefs(s.N);
    DeviceBuf<float> dy(y_strided);
    const ColumnAffine affine = coefs.affine();
    auto run = [&](const cuda::SoftmaxLayout* layout, std::vector<__nv_bfloat16>& out, std::vector<float>& lse) {
      DeviceBuf<__nv_bfloat16> dout(s.M * ld);
      DeviceBuf<float> dlse(s.M);
      CUDA_OK(cudaMemset(dout.ptr, 0xff, s.M * ld * sizeof(__nv_bfloat16)));  // NaN: unwritten shows
      CUDA_OK(cudaMemset(dlse.ptr, 0xff, s.M * sizeof(float)));
      const Status st = layout == nullptr
          ? cuda::row_softmax(dy.ptr, ld, s.M, s.N, affine, dout.ptr, ld, ElementType::kBFloat16, dlse.ptr, nullptr)
          : cuda::row_softmax_with_layout(*layout, dy.ptr, ld, s.M, s.N, affine, dout.ptr, ld, ElementType::kBFloat16,
                                          dlse.ptr, nullptr);
      ASSERT_TRUE(st.ok()) << st.message;
      CUDA_OK(cudaDeviceSynchronize());
      out = dout.download();
      lse = dlse.download();
    };
    std::vector<__nv_bfloat16> want, got;
    std::vector<float> want_lse, got_lse;
    run(nullptr, want, want_lse);
    int compared = 0;
    const cuda::SoftmaxLayout chosen = cuda::row_softmax_layout(s.N);
    int major = 0;
    CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    const bool can_stage = major >= 9 && s.N % 4 == 0 && ld % 4 == 0;
    for (const cuda::SoftmaxLayout& l : cuda::row_softmax_built_layouts()) {
      if (l.threads != chosen.threads || l.vecs != chosen.vecs) continue;
      if (l.staged && !can_stage) {  // refused, not run unstaged
        DeviceBuf<__nv_bfloat16> dout(s.M * ld);
        EXPECT_EQ(cuda::row_softmax_with_layout(l, dy.ptr, ld, s.M, s.N, affine, dout.ptr, ld, ElementType::kBFloat16,
                                                nullptr, nullptr).code,
                  StatusCode::kNotSupported);
        continue;
      }
      run(&l, got, got_lse);
      ++compared;
      for (int64_t i = 0; i < s.M; ++i) {
        ASSERT_EQ(0, std::memcmp(&got_lse[i], &want_lse[i], sizeof(float))) << "row " << i << " layout " << l.threads
                                                                            << "x" << l.vecs << " staged " << l.staged;
        ASSERT_EQ(0, std::memcmp(&got[i * ld], &want[i * ld], s.N * sizeof(__nv_bfloat16)))
            << "row " << i << " layout " << l.threads << "x" << l.vecs << " staged " << l.staged << " clustered "
            << l.clustered;
      }
    }
    EXPECT_GE(compared, 1) << "N=" << s.N;  // the default layout itself, and the other one where it can run
  }
}

// Wide rows (clusters of 3 and 16 CTAs on sm90): a row's bits do not depend on M (how many rows each
// persistent cluster walks), and the batch counter is incremented once per call.
TEST(RowSoftmaxGpu, WideRowsGiveTheSameBitsWhateverM) {
  REQUIRE_GPU();
  for (const int64_t N : {int64_t{24000}, int64_t{131072}}) {
    const int64_t M = N > 100000 ? 400 : 1500, few = 3;
    const auto y = test::random_columns(M, N, 5.0, 11 + N);
    const DeviceAffine coefs(N);
    DeviceBuf<float> dy(y);
    DeviceBuf<int64_t> counter(std::vector<int64_t>{41});
    const ColumnAffine affine = coefs.affine();
    auto run = [&](int64_t rows, std::vector<float>& out, std::vector<float>& lse) {
      DeviceBuf<float> dout(rows * N), dlse(rows);  // NaN-poisoned: unwritten shows
      const Status st = cuda::row_softmax(dy.ptr, N, rows, N, affine, dout.ptr, N, ElementType::kFloat32, dlse.ptr,
                                          nullptr, counter.ptr);
      ASSERT_TRUE(st.ok()) << st.message;
      CUDA_OK(cudaDeviceSynchronize());
      out = dout.download();
      lse = dlse.download();
    };
    std::vector<float> all, all_lse, first, first_lse;
    run(M, all, all_lse);
    run(few, first, first_lse);
    ASSERT_EQ(counter.download()[0], 43) << "N=" << N;
    for (int64_t i = 0; i < M; ++i) ASSERT_FALSE(std::isnan(all_lse[i])) << "row " << i;
    for (int64_t i = 0; i < M * N; ++i) ASSERT_FALSE(std::isnan(all[i])) << "unwritten at " << i / N << "," << i % N;
    ASSERT_EQ(0, std::memcmp(first_lse.data(), all_lse.data(), few * sizeof(float))) << "N=" << N;
    ASSERT_EQ(0, std::memcmp(first.data(), all.data(), few * N * sizeof(float))) << "N=" << N;
  }
}

// A row holding a NaN logit is NaN everywhere (out and log-normaliser), as torch.softmax gives, at
// every width class (staged or in registers, clustered, one CTA a row, streaming). The NaN sits where
// a max that drops NaN would skip it: in the first float4 a thread reads (columns 0..3 and 20..23: the
// first chunks of threads 0 and 5), alone or beside -inf, which such a max reads as "no values yet".
TEST(RowSoftmaxGpu, NaNInARowMakesTheWholeRowNaN) {
  REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const int64_t N : {int64_t{8192}, int64_t{24000}, int64_t{40001}, int64_t{131076}, int64_t{1} << 20}) {
    const int64_t M = 5;
    auto y = test::random_columns(M, N, 5.0, 17 + N);
    for (int j = 0; j < 4; ++j) y[1 * N + j] = nan;                 // row 1: thread 0's first chunk all NaN
    for (int j = 20; j < 24; ++j) y[2 * N + j] = nan;               // row 2: thread 5's first chunk all NaN
    y[3 * N + 0] = nan;                                             // row 3: NaN beside -inf in one chunk
    for (int j = 1; j < 4; ++j) y[3 * N + j] = -inf;
    y[4 * N + N - 1] = nan;                                         // row 4: NaN in the last column
    const DeviceAffine coefs(N);
    DeviceBuf<float> dy(y), dout(M * N), dlse(M);  // outputs NaN-poisoned: row 0 shows unwritten elements
    const Status st = cuda::row_softmax(dy.ptr, N, M, N, coefs.affine(), dout.ptr, N, ElementType::kFloat32, dlse.ptr,
                                        nullptr);
    ASSERT_TRUE(st.ok()) << st.message;
    CUDA_OK(cudaDeviceSynchronize());
    const auto out = dout.download();
    const auto lse = dlse.download();
    ASSERT_TRUE(std::isfinite(lse[0])) << "N=" << N;
    for (int64_t n = 0; n < N; ++n) ASSERT_TRUE(std::isfinite(out[n])) << "N=" << N << " row 0 column " << n;
    for (int64_t i = 1; i < M; ++i) {
      EXPECT_TRUE(std::isnan(lse[i])) << "N=" << N << " row " << i;
      int64_t not_nan = 0;
      for (int64_t n = 0; n < N; ++n) not_nan += !std::isnan(out[i * N + n]);
      EXPECT_EQ(not_nan, 0) << "N=" << N << " row " << i << ": elements that are not NaN";
    }
  }
}

}  // namespace
}  // namespace fused
