// fused::cuda::choose_path, the one place that decides the path, on described GPUs: it reads no
// device memory, so these tests run without a GPU. Built with the CUDA kernels only.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "fused/gemm_bn_softmax.h"

namespace fused::cuda {
namespace {

constexpr DeviceProperties kH200{9, 132};
constexpr DeviceProperties kA100{8, 108};

ForwardProblem problem(int64_t M, int64_t N, int64_t K, ElementType dtype,
                       MatmulPrecision precision = MatmulPrecision::kHighest) {
  ForwardProblem p;
  p.M = M; p.N = N; p.K = K;
  p.dtype = dtype;
  p.out_dtype = dtype;
  p.precision = precision;
  return p;
}

// Buffers at 256-byte aligned stand-in addresses (choose_path never dereferences them).
ForwardBuffers aligned(const ForwardProblem& p) {
  ForwardBuffers b;
  b.x = reinterpret_cast<const void*>(std::uintptr_t{1} << 20); b.ldx = p.K;
  b.weight = reinterpret_cast<const void*>(std::uintptr_t{2} << 20); b.ldw = p.K;
  b.y = reinterpret_cast<float*>(std::uintptr_t{3} << 20); b.ldy = p.N;
  return b;
}

// Runs choose_path with GEMM_BN_SOFTMAX_PATH unset (restored after).
class ChoosePath : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* env = std::getenv("GEMM_BN_SOFTMAX_PATH")) saved_ = env, had_ = true;
    unsetenv("GEMM_BN_SOFTMAX_PATH");
  }
  void TearDown() override {
    if (had_) {
      setenv("GEMM_BN_SOFTMAX_PATH", saved_.c_str(), 1);
    } else {
      unsetenv("GEMM_BN_SOFTMAX_PATH");
    }
  }
  static GemmPath choose(const ForwardProblem& p, const ForwardBuffers& b, const DeviceProperties& d,
                         PathRequest r = PathRequest::kAuto) {
    GemmPath path = GemmPath::kSm90;
    const Status s = choose_path(p, b, d, r, &path);
    EXPECT_TRUE(s.ok()) << s.message;
    return path;
  }
  static Status refusal(const ForwardProblem& p, const ForwardBuffers& b, const DeviceProperties& d,
                        PathRequest r = PathRequest::kSm90) {
    GemmPath path = GemmPath::kGeneric;
    return choose_path(p, b, d, r, &path);
  }
  std::string saved_;
  bool had_ = false;
};

#define SKIP_WITHOUT_SM90_KERNELS() \
  if (!sm90_compiled()) GTEST_SKIP() << "this build holds no sm90 kernels"

TEST_F(ChoosePath, Sm90ForHopperSixteenBitAndTf32) {
  SKIP_WITHOUT_SM90_KERNELS();
  for (ElementType t : {ElementType::kBFloat16, ElementType::kFloat16}) {
    const ForwardProblem p = problem(1024, 8192, 8192, t);
    EXPECT_EQ(choose(p, aligned(p), kH200), GemmPath::kSm90);
  }
  const ForwardProblem tf32 = problem(1024, 8192, 8192, ElementType::kFloat32, MatmulPrecision::kTF32);
  EXPECT_EQ(choose(tf32, aligned(tf32), kH200), GemmPath::kSm90);
}

TEST_F(ChoosePath, ExactFp32AndOtherGpusRunGeneric) {
  const ForwardProblem exact = problem(1024, 8192, 8192, ElementType::kFloat32);
  EXPECT_EQ(choose(exact, aligned(exact), kH200), GemmPath::kGeneric);
  const ForwardProblem bf16 = problem(1024, 8192, 8192, ElementType::kBFloat16);
  EXPECT_EQ(choose(bf16, aligned(bf16), kA100), GemmPath::kGeneric);
}

// Rule 2: tf32 at M <= 16 runs the generic path (which computes in exact fp32); from M = 17 on, sm90.
TEST_F(ChoosePath, TinyTf32BatchesRunGeneric) {
  SKIP_WITHOUT_SM90_KERNELS();
  for (int64_t M : {2, 8, 16}) {
    const ForwardProblem p = problem(M, 1024, 1024, ElementType::kFloat32, MatmulPrecision::kTF32);
    EXPECT_EQ(choose(p, aligned(p), kH200), GemmPath::kGeneric) << "M=" << M;
  }
  const ForwardProblem p17 = problem(17, 1024, 1024, ElementType::kFloat32, MatmulPrecision::kTF32);
  EXPECT_EQ(choose(p17, aligned(p17), kH200), GemmPath::kSm90);
  // bf16 has no such rule: its tiny batches stay on sm90.
  const ForwardProblem bf16 = problem(8, 1024, 1024, ElementType::kBFloat16);
  EXPECT_EQ(choose(bf16, aligned(bf16), kH200), GemmPath::kSm90);
  // A forced sm90 is honoured.
  const ForwardProblem p8 = problem(8, 1024, 1024, ElementType::kFloat32, MatmulPrecision::kTF32);
  EXPECT_EQ(choose(p8, aligned(p8), kH200, PathRequest::kSm90), GemmPath::kSm90);
}

// Rule 3: underfilled grids run the 128x128 sm90 kernel, except where that grid fills at most half
// the SMs with K >= 8192, in every dtype (cuBLASLt's split-K is faster there).
TEST_F(ChoosePath, UnderfilledGridsRunSm90ExceptHalfEmptyLongK) {
  SKIP_WITHOUT_SM90_KERNELS();
  for (ElementType t : {ElementType::kBFloat16, ElementType::kFloat16, ElementType::kFloat32}) {
    const MatmulPrecision tf32 = MatmulPrecision::kTF32;  // ignored by 16-bit inputs
    const ForwardProblem half_empty = problem(128, 8192, 8192, t, tf32);  // 64 128x128 tiles on 132 SMs
    EXPECT_EQ(choose(half_empty, aligned(half_empty), kH200), GemmPath::kGeneric) << "dtype " << static_cast<int>(t);
    EXPECT_EQ(choose(half_empty, aligned(half_empty), kH200, PathRequest::kSm90), GemmPath::kSm90);
    const ForwardProblem narrow = problem(2048, 512, 8192, t, tf32);  // 16 x 4 = 64 tiles
    EXPECT_EQ(choose(narrow, aligned(narrow), kH200), GemmPath::kGeneric) << "dtype " << static_cast<int>(t);
    const ForwardProblem more_tiles = problem(128 + 1, 8192, 8192, t, tf32);  // 128 tiles: more than half
    EXPECT_EQ(choose(more_tiles, aligned(more_tiles), kH200), GemmPath::kSm90) << "dtype " << static_cast<int>(t);
    const ForwardProblem shorter_k = problem(128, 8192, 4096, t, tf32);
    EXPECT_EQ(choose(shorter_k, aligned(shorter_k), kH200), GemmPath::kSm90) << "dtype " << static_cast<int>(t);
    const ForwardProblem under_a_wave = problem(256, 8192, 8192, t, tf32);  // 128 tiles
    EXPECT_EQ(choose(under_a_wave, aligned(under_a_wave), kH200), GemmPath::kSm90) << "dtype " << static_cast<int>(t);
  }
  // Exact fp32 is the generic path's anyway (rule 1).
  const ForwardProblem exact = problem(256, 8192, 8192, ElementType::kFloat32);
  EXPECT_EQ(choose(exact, aligned(exact), kH200), GemmPath::kGeneric);
}

TEST_F(ChoosePath, TmaRulesAndForcedRefusals) {
  SKIP_WITHOUT_SM90_KERNELS();
  const ForwardProblem odd_k = problem(64, 32, 63, ElementType::kBFloat16);
  EXPECT_EQ(choose(odd_k, aligned(odd_k), kH200), GemmPath::kGeneric);
  Status s = refusal(odd_k, aligned(odd_k), kH200);
  EXPECT_EQ(s.code, StatusCode::kNotSupported);
  EXPECT_NE(std::string(s.message).find("sm90 kernel cannot run this problem: K and the row strides"),
            std::string::npos) << s.message;

  const ForwardProblem p = problem(64, 32, 64, ElementType::kBFloat16);
  ForwardBuffers offset = aligned(p);
  offset.x = static_cast<const char*>(offset.x) + 2;  // a view starting one element in
  EXPECT_EQ(choose(p, offset, kH200), GemmPath::kGeneric);
  EXPECT_NE(std::string(refusal(p, offset, kH200).message).find("16-byte aligned"), std::string::npos);

  ForwardBuffers padded_y = aligned(p);
  padded_y.ldy = p.N + 2;
  EXPECT_EQ(choose(p, padded_y, kH200), GemmPath::kGeneric);

  s = refusal(p, aligned(p), kA100);
  EXPECT_EQ(s.code, StatusCode::kNotSupported);
  EXPECT_NE(std::string(s.message).find("compute capability 9.x"), std::string::npos) << s.message;

  // M or N within a tile of 2^31 (2^31 - 128: a multiple of 4): the kernels round them up to whole
  // tiles in int.
  for (const ForwardProblem& big : {problem(0x7fffffff - 127, 32, 64, ElementType::kBFloat16),
                                    problem(64, 0x7fffffff - 127, 64, ElementType::kBFloat16)}) {
    s = refusal(big, aligned(big), kH200);
    EXPECT_EQ(s.code, StatusCode::kNotSupported);
    EXPECT_NE(std::string(s.message).find("below 2^31 - 256"), std::string::npos) << s.message;
  }

  const ForwardProblem exact = problem(64, 32, 64, ElementType::kFloat32);
  EXPECT_NE(std::string(refusal(exact, aligned(exact), kH200).message).find("exact fp32"), std::string::npos);
  EXPECT_EQ(choose(p, aligned(p), kH200, PathRequest::kGeneric), GemmPath::kGeneric);
}

// Null buffers (not allocated yet) count as fresh allocations: aligned, dense rows.
TEST_F(ChoosePath, UnallocatedBuffersCountAsFreshAllocations) {
  SKIP_WITHOUT_SM90_KERNELS();
  const ForwardProblem p = problem(1024, 4096, 4096, ElementType::kBFloat16);
  EXPECT_EQ(choose(p, ForwardBuffers{}, kH200), GemmPath::kSm90);
  EXPECT_EQ(choose(p, ForwardBuffers{}, kH200, PathRequest::kSm90), GemmPath::kSm90);
}

TEST_F(ChoosePath, EnvironmentOverride) {
  SKIP_WITHOUT_SM90_KERNELS();
  const ForwardProblem p = problem(1024, 4096, 4096, ElementType::kBFloat16);
  setenv("GEMM_BN_SOFTMAX_PATH", "generic", 1);
  EXPECT_EQ(choose(p, aligned(p), kH200), GemmPath::kGeneric);
  EXPECT_EQ(choose(p, aligned(p), kH200, PathRequest::kSm90), GemmPath::kSm90);  // the argument wins
  setenv("GEMM_BN_SOFTMAX_PATH", "auto", 1);
  EXPECT_EQ(choose(p, aligned(p), kH200), GemmPath::kSm90);
  setenv("GEMM_BN_SOFTMAX_PATH", "sm90", 1);
  const Status s = refusal(p, aligned(p), kA100, PathRequest::kAuto);
  EXPECT_EQ(s.code, StatusCode::kNotSupported);
  setenv("GEMM_BN_SOFTMAX_PATH", "fastest", 1);
  const Status bad = refusal(p, aligned(p), kH200, PathRequest::kAuto);
  EXPECT_EQ(bad.code, StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.message).find("GEMM_BN_SOFTMAX_PATH must be"), std::string::npos);
}

// Rule 4: the recompute path runs when asked for, on small K with y not kept (any GPU from compute
// capability 8.0); never automatically; and it refuses, with the reason, y kept, larger K, exact
// fp32, 3xTF32, unaligned operands or an older GPU.
TEST_F(ChoosePath, RecomputeOnlyWhenAskedFor) {
  ForwardProblem bf16 = problem(4096, 8192, 64, ElementType::kBFloat16);
  bf16.keep_y = false;
  EXPECT_EQ(choose(bf16, ForwardBuffers{}, kH200, PathRequest::kRecompute), GemmPath::kRecompute);
  EXPECT_EQ(choose(bf16, aligned(bf16), kA100, PathRequest::kRecompute), GemmPath::kRecompute);
  if (sm90_compiled()) EXPECT_EQ(choose(bf16, ForwardBuffers{}, kH200), GemmPath::kSm90);
  EXPECT_EQ(choose(bf16, ForwardBuffers{}, kA100), GemmPath::kGeneric);
  ForwardProblem widest = problem(1024, 1000, 128, ElementType::kFloat16);
  widest.keep_y = false;
  EXPECT_EQ(choose(widest, ForwardBuffers{}, kH200, PathRequest::kRecompute), GemmPath::kRecompute);
  ForwardProblem tf32 = problem(4096, 8192, 64, ElementType::kFloat32, MatmulPrecision::kTF32);
  tf32.keep_y = false;
  EXPECT_EQ(choose(tf32, ForwardBuffers{}, kH200, PathRequest::kRecompute), GemmPath::kRecompute);

  auto refused = [&](ForwardProblem p, const ForwardBuffers& b, const DeviceProperties& d, const char* why) {
    const Status s = refusal(p, b, d, PathRequest::kRecompute);
    EXPECT_EQ(s.code, StatusCode::kNotSupported) << why;
    EXPECT_NE(std::string(s.message).find("the recompute path cannot run this problem"), std::string::npos)
        << s.message;
  };
  ForwardProblem kept = bf16;
  kept.keep_y = true;
  refused(kept, ForwardBuffers{}, kH200, "y kept");
  ForwardProblem long_k = bf16;
  long_k.K = 136;
  refused(long_k, ForwardBuffers{}, kH200, "K > 128 in bf16");
  ForwardProblem long_k_tf32 = tf32;
  long_k_tf32.K = 68;
  refused(long_k_tf32, ForwardBuffers{}, kH200, "K > 64 in tf32");
  ForwardProblem exact = problem(4096, 8192, 64, ElementType::kFloat32);
  exact.keep_y = false;
  refused(exact, ForwardBuffers{}, kH200, "exact fp32");
  ForwardProblem three = exact;
  three.precision = MatmulPrecision::k3xTF32;
  refused(three, ForwardBuffers{}, kH200, "3xTF32");
  ForwardBuffers unaligned = aligned(bf16);
  unaligned.x = static_cast<const char*>(unaligned.x) + 2;
  refused(bf16, unaligned, kH200, "x not 16-byte aligned");
  ForwardBuffers odd_stride = aligned(bf16);
  odd_stride.ldw = 68;
  refused(bf16, odd_stride, kH200, "W's row stride not a multiple of 16 bytes");
  ForwardProblem odd_k = bf16;
  odd_k.K = 60;
  refused(odd_k, ForwardBuffers{}, kH200, "K not a multiple of 16 bytes");
  refused(bf16, ForwardBuffers{}, DeviceProperties{7, 80}, "compute capability 7.x");
}

TEST_F(ChoosePath, RecomputeFromTheEnvironment) {
  ForwardProblem p = problem(1024, 4096, 64, ElementType::kBFloat16);
  p.keep_y = false;
  setenv("GEMM_BN_SOFTMAX_PATH", "recompute", 1);
  EXPECT_EQ(choose(p, ForwardBuffers{}, kA100), GemmPath::kRecompute);
  EXPECT_EQ(choose(p, ForwardBuffers{}, kA100, PathRequest::kGeneric), GemmPath::kGeneric);  // the argument wins
  p.keep_y = true;
  EXPECT_EQ(refusal(p, ForwardBuffers{}, kA100, PathRequest::kAuto).code, StatusCode::kNotSupported);
}

TEST(WorkspaceBytes, RecomputeHoldsPartialsAndRowPairs) {
  ForwardProblem p = problem(4096, 8192, 64, ElementType::kBFloat16);
  p.keep_y = false;
  // partials 2 x 32 x 8192 floats, a and c 2 x 8192, row pairs 2 x 64 x 4096, row stats 2 x 4096
  const std::size_t floats = 2 * 32 * 8192 + 2 * 8192 + 2 * 64 * 4096 + 2 * 4096;
  EXPECT_EQ(workspace_bytes(p, GemmPath::kRecompute), sizeof(float) * floats);
}

TEST(WorkspaceBytes, GenericHoldsCublasLtWorkspaceWithinBounds) {
  const ForwardProblem tiny = problem(8, 64, 64, ElementType::kFloat32);
  const ForwardProblem big = problem(1024, 8192, 8192, ElementType::kBFloat16);
  EXPECT_GE(workspace_bytes(tiny, GemmPath::kGeneric), std::size_t{1} << 20);
  EXPECT_LE(workspace_bytes(tiny, GemmPath::kGeneric), std::size_t{2} << 20);
  EXPECT_LE(workspace_bytes(big, GemmPath::kGeneric), std::size_t{33} << 20);
  EXPECT_GE(workspace_bytes(big, GemmPath::kGeneric), std::size_t{32} << 20);
}

}  // namespace
}  // namespace fused::cuda
