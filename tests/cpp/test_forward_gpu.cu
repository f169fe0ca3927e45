// GPU group: the whole torch-free forward (fused::cuda::forward) on both paths, y included: the
// generic path computes y itself (cuBLASLt with its bias epilogue). Fresh random data, every output
// poisoned first, checked against float64 computed from the same (rounded) inputs; and the
// data-parallel steps (gemm_column_moments, forward_from_y) with one rank: bit for bit the same where
// forward() runs the same steps, within the same bounds where it runs as one kernel (sm90, small
// grids). Skips without a CUDA device; sm90 cases skip without a Hopper GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fused/detail/half_bits.h"
#include "fused/gemm_bn_softmax.h"
#include "api/forward_steps.h"

namespace fused {
namespace {

bool device_properties_of_current(cuda::DeviceProperties* props) {
  int n = 0, device = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return cuda::device_properties(device, props).ok();
}

// Device bytes, poisoned with 0xff (NaN in every float type) unless given contents.
struct Device {
  char* base = nullptr;
  std::size_t bytes = 0, offset = 0;
  Device(std::size_t n, std::size_t offset_bytes = 0) : bytes(n), offset(offset_bytes) {
    EXPECT_EQ(cudaMalloc(&base, std::max<std::size_t>(n + offset, 1)), cudaSuccess);
    EXPECT_EQ(cudaMemset(base, 0xff, n + offset), cudaSuccess);
  }
  template <class T>
  Device(const std::vector<T>& h, std::size_t offset_bytes = 0) : Device(h.size() * sizeof(T), offset_bytes) {
    EXPECT_EQ(cudaMemcpy(ptr(), h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  ~Device() { cudaFree(base); }
  void* ptr() const { return base + offset; }
  template <class T>
  std::vector<T> get() const {
    std::vector<T> h(bytes / sizeof(T));
    EXPECT_EQ(cudaMemcpy(h.data(), ptr(), bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

// Host values in `dtype`: the bits the device reads and the exact values they hold.
struct Typed {
  std::vector<uint16_t> bits16;
  std::vector<float> f32;
  std::vector<double> value;
  Typed(const std::vector<float>& v, ElementType t) : value(v.size()) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (t == ElementType::kFloat32) {
        f32.push_back(v[i]);
        value[i] = v[i];
      } else {
        const uint16_t b = t == ElementType::kBFloat16 ? half_bits::float_to_bf16_bits(v[i])
                                                       : half_bits::float_to_fp16_bits(v[i]);
        bits16.push_back(b);
        value[i] = t == ElementType::kBFloat16 ? half_bits::bf16_bits_to_float(b) : half_bits::fp16_bits_to_float(b);
      }
    }
  }
  Device upload(std::size_t offset_bytes = 0) const {
    return f32.empty() ? Device(bits16, offset_bytes) : Device(f32, offset_bytes);
  }
};

struct Case {
  int64_t M, N, K;
  ElementType dtype;
  MatmulPrecision precision;
  cuda::PathRequest request;
  bool bias;
  bool offset_operands;  // x, W and the bias start one element into their allocation (unaligned views)
  bool training;
  bool keep_y = true;  // false: y is null, and small K runs the recompute path (y never written)
};

std::string dtype_name(ElementType t) {
  return t == ElementType::kBFloat16 ? "bf16" : t == ElementType::kFloat16 ? "fp16" : "fp32";
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  const std::string mode = c.dtype == ElementType::kFloat32
                               ? (c.precision == MatmulPrecision::kTF32 ? "tf32" : "fp32")
                               : dtype_name(c.dtype);
  const std::string path = c.request == cuda::PathRequest::kAuto        ? "auto"
                           : c.request == cuda::PathRequest::kSm90      ? "sm90"
                           : c.request == cuda::PathRequest::kRecompute ? "recompute"
                                                                        : "generic";
  return path + "_" + mode + "_M" + std::to_string(c.M) + "_N" + std::to_string(c.N) + "_K" + std::to_string(c.K) +
         (c.bias ? "" : "_nobias") + (c.offset_operands ? "_offset" : "") + (c.training ? "" : "_eval") +
         (c.keep_y ? "" : "_noy");
}

double rel_norm(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0, r = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    e += (got[i] - want[i]) * (got[i] - want[i]);
    r += want[i] * want[i];
  }
  return std::sqrt(e / std::max(r, 1e-300));
}

class ForwardGpu : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardGpu, MatchesFloat64) {
  cuda::DeviceProperties props;
  if (!device_properties_of_current(&props)) GTEST_SKIP() << "no CUDA device";
  const Case c = GetParam();
  if (c.request == cuda::PathRequest::kSm90 && (props.compute_capability_major != 9 || !cuda::sm90_compiled()))
    GTEST_SKIP() << "needs a Hopper GPU and the sm90 kernels";
  if (c.request == cuda::PathRequest::kRecompute && props.compute_capability_major < 8)
    GTEST_SKIP() << "the recompute path needs compute capability 8.0";
  const int64_t M = c.M, N = c.N, K = c.K;
  std::mt19937_64 rng(std::random_device{}());  // fresh data every run
  std::uniform_real_distribution<float> unit(0.f, 1.f), sym(-1.f, 1.f);
  std::vector<float> x(M * K), w(N * K), b(N), gamma(N), beta(N), rm(N), rv(N);
  for (auto& v : x) v = unit(rng);
  const float wscale = 1.f / std::sqrt(static_cast<float>(std::max<int64_t>(K, 1)));
  for (auto& v : w) v = wscale * sym(rng);
  for (int64_t n = 0; n < N; ++n) {
    b[n] = sym(rng);
    gamma[n] = 0.5f + unit(rng);
    beta[n] = 0.1f * sym(rng);
    rm[n] = 0.1f * sym(rng);
    rv[n] = 0.5f + unit(rng);
  }
  const Typed tx(x, c.dtype), tw(w, c.dtype), tb(b, c.dtype);
  const float scale = 1.7f;

  // float64 reference from the values the device reads.
  std::vector<double> y64(M * N), out64(M * N), mean64(N), invstd64(N), rm64(N), rv64(N), lse64(M);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double acc = c.bias ? tb.value[n] : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += tx.value[i * K + k] * tw.value[n * K + k];
      y64[i * N + n] = acc;
    }
  const double eps = 1e-5, momentum = 0.1;
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < M; ++i) mean += y64[i * N + n];
    mean /= M;
    for (int64_t i = 0; i < M; ++i) var += (y64[i * N + n] - mean) * (y64[i * N + n] - mean);
    const double biased = var / M, unbiased = var / (M - 1);
    mean64[n] = c.training ? mean : rm[n];
    invstd64[n] = 1.0 / std::sqrt((c.training ? biased : rv[n]) + eps);
    rm64[n] = c.training ? (1 - momentum) * rm[n] + momentum * mean : rm[n];
    rv64[n] = c.training ? (1 - momentum) * rv[n] + momentum * unbiased : rv[n];
  }
  for (int64_t i = 0; i < M; ++i) {
    std::vector<double> z(N);
    double mx = -INFINITY, sum = 0;
    for (int64_t n = 0; n < N; ++n) {
      z[n] = scale * (gamma[n] * (y64[i * N + n] - mean64[n]) * invstd64[n] + beta[n]);
      mx = std::max(mx, z[n]);
    }
    for (int64_t n = 0; n < N; ++n) sum += std::exp(z[n] - mx);
    for (int64_t n = 0; n < N; ++n) out64[i * N + n] = std::exp(z[n] - mx) / sum;
    lse64[i] = mx + std::log(sum);  // log sum_n exp(z[i, n])
  }

  const std::size_t elt = element_size(c.dtype), off = c.offset_operands ? elt : 0;
  Device dx = tx.upload(off), dw = tw.upload(off), dbias = tb.upload(off);
  Device dy(sizeof(float) * M * N), dout(elt * M * N), dmean(sizeof(float) * N), dinv(sizeof(float) * N),
      dlse(sizeof(float) * M);
  Device dgamma(gamma), dbeta(beta), drm(rm), drv(rv), dscale(std::vector<float>{scale});
  ForwardProblem p;
  p.M = M; p.N = N; p.K = K;
  p.dtype = c.dtype;
  p.out_dtype = c.dtype;
  p.precision = c.precision;
  p.keep_y = c.keep_y;
  ForwardBuffers buf;
  buf.x = dx.ptr(); buf.ldx = K;
  buf.weight = dw.ptr(); buf.ldw = K;
  buf.bias = c.bias ? dbias.ptr() : nullptr;
  buf.y = static_cast<float*>(dy.ptr()); buf.ldy = N;
  buf.out = dout.ptr(); buf.ldo = N;
  buf.save_mean = static_cast<float*>(dmean.ptr()); buf.save_invstd = static_cast<float*>(dinv.ptr());
  buf.row_lse = static_cast<float*>(dlse.ptr());
  BatchNormArgs bn;
  bn.gamma = dgamma.ptr(); bn.beta = dbeta.ptr();
  bn.running_mean = drm.ptr(); bn.running_var = drv.ptr();
  bn.momentum = momentum; bn.eps = eps; bn.training = c.training;
  bn.scale = dscale.ptr();
  Device dnbt(std::vector<int64_t>{7});  // num_batches_tracked: a training batch counts once
  bn.num_batches_tracked = static_cast<int64_t*>(dnbt.ptr());

  cuda::GemmPath path = cuda::GemmPath::kSm90;
  const Status chosen = cuda::choose_path(p, buf, props, c.request, &path);
  ASSERT_TRUE(chosen.ok()) << chosen.message;
  if (c.request == cuda::PathRequest::kGeneric) EXPECT_EQ(path, cuda::GemmPath::kGeneric);
  if (c.request == cuda::PathRequest::kRecompute) EXPECT_EQ(path, cuda::GemmPath::kRecompute);
  // Rule 4: the recompute path only when asked for. It runs without y (null); the others write one.
  if (c.request != cuda::PathRequest::kRecompute) EXPECT_NE(path, cuda::GemmPath::kRecompute);
  // The one kernel writes y only when it is kept.
  const bool y_written = path != cuda::GemmPath::kRecompute && (c.keep_y || !cuda::forward_runs_one_kernel(p, path));
  if (path == cuda::GemmPath::kRecompute) buf.y = nullptr, buf.ldy = 0;
  // Rule 2: tf32 at M <= 16 runs the generic path, in exact fp32 (checked below through y's error).
  const bool exact_tiny_tf32 = c.dtype == ElementType::kFloat32 && c.precision == MatmulPrecision::kTF32 &&
                               M <= cuda::kExactFp32MaxBatch && c.request != cuda::PathRequest::kSm90;
  if (exact_tiny_tf32) EXPECT_EQ(path, cuda::GemmPath::kGeneric);
  const std::size_t ws = cuda::workspace_bytes(p, path);
  Device workspace(ws);
  const Status s = cuda::forward(p, buf, bn, path, workspace.ptr(), ws, nullptr);
  ASSERT_TRUE(s.ok()) << s.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto as_double = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  // y: fp32 accumulation of exact products (exact fp32 and 16-bit inputs) stays near 1e-6; TF32
  // rounds the inputs to 10 mantissa bits (about 5e-4 relative on y at these K).
  const bool tf32_gemm = c.dtype == ElementType::kFloat32 && c.precision == MatmulPrecision::kTF32 &&
                         !exact_tiny_tf32;
  double y_err = 0;
  if (y_written) {
    const std::vector<double> y = as_double(dy.get<float>());
    for (double v : y) ASSERT_FALSE(std::isnan(v)) << "unwritten y";
    y_err = rel_norm(y, y64);
    EXPECT_LE(y_err, tf32_gemm ? 3e-3 : 2e-5) << "y";
  } else {
    for (uint8_t byte : dy.get<uint8_t>()) ASSERT_EQ(byte, 0xff) << "y is not kept: it may not be written";
  }
  // BatchNorm amplifies y's error by |y| / std, more at tiny batches.
  const double amplify = M <= cuda::kExactFp32MaxBatch ? 5.0 : 1.0;
  const double out_tol = c.dtype == ElementType::kBFloat16 ? 8e-3
                         : c.dtype == ElementType::kFloat16 ? 1e-3
                         : tf32_gemm                         ? 3e-2
                                                             : 2e-5 * amplify;
  // Every output against float64 (the forward's, or the data-parallel steps' below).
  auto check = [&](const Device& dout_, const Device& dmean_, const Device& dinv_, const Device& drm_,
                   const Device& drv_, const Device& dlse_, const char* who) {
    std::vector<double> out(M * N);
    if (c.dtype == ElementType::kFloat32) {
      out = as_double(dout_.get<float>());
    } else {
      const auto bits = dout_.get<uint16_t>();
      for (std::size_t i = 0; i < bits.size(); ++i)
        out[i] = c.dtype == ElementType::kBFloat16 ? half_bits::bf16_bits_to_float(bits[i])
                                                   : half_bits::fp16_bits_to_float(bits[i]);
    }
    for (double v : out) ASSERT_FALSE(std::isnan(v)) << who << ": unwritten out";
    EXPECT_LE(rel_norm(out, out64), out_tol) << who << ": out (y rel err " << y_err << ")";
    EXPECT_LE(rel_norm(as_double(dmean_.get<float>()), mean64), tf32_gemm ? 3e-3 : 2e-5) << who << ": save_mean";
    EXPECT_LE(rel_norm(as_double(dinv_.get<float>()), invstd64), tf32_gemm ? 2e-2 : 2e-5 * amplify)
        << who << ": save_invstd";
    EXPECT_LE(rel_norm(as_double(drm_.get<float>()), rm64), tf32_gemm ? 3e-3 : 2e-5) << who << ": running_mean";
    EXPECT_LE(rel_norm(as_double(drv_.get<float>()), rv64), tf32_gemm ? 2e-2 : 2e-5 * amplify)
        << who << ": running_var";
    EXPECT_LE(rel_norm(as_double(dlse_.get<float>()), lse64), tf32_gemm ? 3e-2 : 2e-5 * amplify) << who << ": row_lse";
  };
  check(dout, dmean, dinv, drm, drv, dlse, "forward");
  EXPECT_EQ(dnbt.get<int64_t>()[0], c.training ? 8 : 7) << "num_batches_tracked";
  if (!c.training || !y_written) return;

  // The data-parallel steps with one rank (gemm_column_moments, then forward_from_y with its record)
  // are the same computation: the same bits in every output, fresh buffers poisoned first.
  Device dy1(sizeof(float) * M * N), dout1(elt * M * N), dmean1(sizeof(float) * N), dinv1(sizeof(float) * N),
      dlse1(sizeof(float) * M), drm1(rm), drv1(rv), record(sizeof(double) * rank_record_size(N));
  ForwardBuffers buf1 = buf;
  buf1.y = static_cast<float*>(dy1.ptr()); buf1.out = dout1.ptr();
  buf1.save_mean = static_cast<float*>(dmean1.ptr()); buf1.save_invstd = static_cast<float*>(dinv1.ptr());
  buf1.row_lse = static_cast<float*>(dlse1.ptr());
  BatchNormArgs bn1 = bn;
  bn1.running_mean = drm1.ptr(); bn1.running_var = drv1.ptr();
  Device dnbt1(std::vector<int64_t>{7});
  bn1.num_batches_tracked = static_cast<int64_t*>(dnbt1.ptr());
  bn1.rank_moments = static_cast<const double*>(record.ptr()); bn1.num_ranks = 1;
  Device workspace1(ws);
  Status step = cuda::gemm_column_moments(p, buf1, path, static_cast<double*>(record.ptr()), workspace1.ptr(), ws,
                                          nullptr);
  ASSERT_TRUE(step.ok()) << step.message;
  const std::size_t ws_from_y = cuda::forward_from_y_workspace_bytes(p);
  Device workspace2(ws_from_y);
  step = cuda::forward_from_y(p, buf1, bn1, workspace2.ptr(), ws_from_y, nullptr);
  ASSERT_TRUE(step.ok()) << step.message;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(record.get<double>()[0], static_cast<double>(M)) << "the record's count";
  auto same_bits = [](const Device& a, const Device& b, const char* what) {
    EXPECT_EQ(a.get<uint8_t>(), b.get<uint8_t>()) << what;
  };
  if (cuda::forward_runs_one_kernel(p, path)) {  // other kernels, other rounding: the same bounds
    EXPECT_LE(rel_norm(as_double(dy1.get<float>()), y64), tf32_gemm ? 3e-3 : 2e-5) << "data-parallel steps: y";
    check(dout1, dmean1, dinv1, drm1, drv1, dlse1, "data-parallel steps");
  } else {
    same_bits(dy1, dy, "y");
    same_bits(dout1, dout, "out");
    same_bits(dmean1, dmean, "save_mean");
    same_bits(dinv1, dinv, "save_invstd");
    same_bits(dlse1, dlse, "row_lse");
    same_bits(drm1, drm, "running_mean");
    same_bits(drv1, drv, "running_var");
  }
  EXPECT_EQ(dnbt1.get<int64_t>()[0], 8) << "num_batches_tracked (forward_from_y)";
}

constexpr ElementType kF32 = ElementType::kFloat32, kBF16 = ElementType::kBFloat16, kF16 = ElementType::kFloat16;
constexpr MatmulPrecision kExact = MatmulPrecision::kHighest, kTF32 = MatmulPrecision::kTF32;
constexpr cuda::PathRequest kAuto = cuda::PathRequest::kAuto, kGeneric = cuda::PathRequest::kGeneric,
                            kSm90 = cuda::PathRequest::kSm90, kRecompute = cuda::PathRequest::kRecompute;

INSTANTIATE_TEST_SUITE_P(
    Cases, ForwardGpu,
    ::testing::Values(
        Case{64, 96, 80, kF32, kExact, kGeneric, true, false, true},
        Case{300, 200, 264, kF32, kExact, kGeneric, true, false, true},
        Case{257, 136, 64, kBF16, kExact, kGeneric, true, false, true},    // 16-bit bias through the fp32 row
        Case{130, 72, 96, kF16, kExact, kGeneric, false, false, true},
        Case{200, 100, 72, kBF16, kExact, kGeneric, true, true, true},     // unaligned views of x and W
        Case{77, 33, 45, kF32, kExact, kGeneric, true, true, false},       // odd sizes, eval
        Case{9, 40, 0, kF32, kExact, kGeneric, true, false, true},         // K = 0: y = b
        Case{9, 40, 0, kBF16, kExact, kGeneric, false, false, true},       // K = 0, no bias: y = 0
        Case{300, 512, 1024, kF32, kTF32, kGeneric, true, false, true},    // TF32 cuBLASLt
        // The tiny-batch rule: tf32 asked, exact fp32 accuracy delivered (y within 2e-6, not TF32's 1e-3).
        Case{2, 1024, 4096, kF32, kTF32, kAuto, true, false, true},
        Case{10, 2048, 2048, kF32, kTF32, kAuto, true, false, true},
        Case{16, 512, 8192, kF32, kTF32, kAuto, false, false, true},
        Case{1024, 1024, 512, kBF16, kExact, kAuto, true, false, true},
        Case{1000, 1028, 512, kBF16, kExact, kSm90, true, false, true},
        Case{300, 200, 264, kF32, kTF32, kSm90, true, false, true},
        // The recompute path (y not kept): tails in M and N, K from one k-step (8) to the most (128),
        // every input type and out type, eval, a tiny batch; and y not kept on the automatic path.
        Case{300, 200, 64, kBF16, kExact, kRecompute, true, false, true, false},
        Case{257, 136, 128, kF16, kExact, kRecompute, false, false, true, false},
        Case{300, 200, 64, kF32, kTF32, kRecompute, true, false, true, false},
        Case{129, 1000, 32, kF32, kTF32, kRecompute, false, false, false, false},
        Case{130, 72, 16, kBF16, kExact, kRecompute, true, false, false, false},
        Case{64, 96, 8, kBF16, kExact, kRecompute, true, false, true, false},
        Case{3, 300, 64, kF16, kExact, kRecompute, true, false, true, false},
        Case{1024, 1024, 64, kBF16, kExact, kAuto, true, false, true, false},
        // The one-kernel forward (sm90 grids of 64x64 tiles that all fit on the GPU at once, with a short
        // K loop: sm90::one_kernel_forward_fits; on 132 SMs all of these): every input type, ragged M, N
        // and K, a last row tile of one row, two tiles per SM, eval, no bias, y not kept (not written).
        Case{1024, 512, 4096, kBF16, kExact, kAuto, true, false, true},
        Case{1000, 508, 1000, kF16, kExact, kSm90, true, false, true},
        Case{1000, 508, 520, kF32, kTF32, kSm90, true, false, false},
        Case{129, 2816, 264, kBF16, kExact, kSm90, false, false, true},
        Case{300, 1800, 264, kBF16, kExact, kSm90, true, false, true, false},
        Case{64, 8192, 512, kF32, kTF32, kSm90, true, false, true}),
    case_name);

// A forced sm90 path on a GPU that cannot run it is refused with the reason, nothing launched.
TEST(ForwardGpuErrors, ForcedSm90RefusedOffHopper) {
  cuda::DeviceProperties props;
  if (!device_properties_of_current(&props)) GTEST_SKIP() << "no CUDA device";
  if (props.compute_capability_major == 9 && cuda::sm90_compiled()) GTEST_SKIP() << "checks non-Hopper behaviour";
  ForwardProblem p;
  p.M = 4; p.N = 8; p.K = 8; p.dtype = ElementType::kBFloat16; p.out_dtype = p.dtype;
  cuda::GemmPath path = cuda::GemmPath::kGeneric;
  const Status s = cuda::choose_path(p, ForwardBuffers{}, props, cuda::PathRequest::kSm90, &path);
  EXPECT_EQ(s.code, StatusCode::kNotSupported);
  EXPECT_NE(std::string(s.message).find("sm90 kernel cannot run this problem"), std::string::npos) << s.message;
}

}  // namespace
}  // namespace fused
