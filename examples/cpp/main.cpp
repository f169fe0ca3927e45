// The torch-free C++ library on the CPU, linked from an installed package:
//   forward   out = softmax(scale * BatchNorm1d(y), dim=1) with y = x W^T + b, in training mode
//             (batch statistics; the running statistics are updated)
//   backward  dy and the gradients of gamma, beta and scale for the cross-entropy loss
//             L = -mean_i log out[i, label_i]
// Every result is checked against a plain double-precision computation written out below; the
// program exits 1 on a mismatch. Built with CUDA and run on a machine with a GPU, it also runs
// fused::cuda::forward on the same problem.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "fused/backward.h"
#include "fused/gemm_bn_softmax.h"

#if defined(FUSED_WITH_CUDA)  // set by the package when the library holds the CUDA kernels
#include <cuda_runtime.h>
#endif

namespace {

constexpr int64_t M = 8;  // batch
constexpr int64_t K = 6;  // in_features
constexpr int64_t N = 4;  // out_features (classes)
constexpr double kEps = 1e-5;
constexpr double kMomentum = 0.1;

using Floats = std::vector<float>;
using Doubles = std::vector<double>;

struct Inputs {
  Floats x, weight, bias;  // (M, K), (N, K) as nn.Linear, (N)
  Floats gamma, beta;      // BatchNorm1d weight and bias, (N)
  float scale = 1.5f;
  std::vector<int64_t> labels;  // (M) class of each row, for the loss
};

Inputs make_inputs() {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  auto random = [&](int64_t n) {
    Floats v(static_cast<size_t>(n));
    for (float& e : v) e = uniform(rng);
    return v;
  };
  Inputs in;
  in.x = random(M * K);
  in.weight = random(N * K);
  in.bias = random(N);
  in.gamma = random(N);
  for (float& g : in.gamma) g += 1.5f;  // BatchNorm weights in [0.5, 2.5]
  in.beta = random(N);
  for (int64_t i = 0; i < M; ++i) in.labels.push_back(i % N);
  return in;
}

// Everything the example checks, computed the textbook way in double precision.
struct Expected {
  Doubles out, running_mean, running_var, dy, grad_gamma, grad_beta;
  double grad_scale = 0.0;
};

Expected reference(const Inputs& in) {
  Expected e;
  Doubles y(M * N), xhat(M * N), dz(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      double acc = in.bias[n];
      for (int64_t k = 0; k < K; ++k) acc += double(in.x[i * K + k]) * in.weight[n * K + k];
      y[i * N + n] = acc;
    }
  Doubles invstd(N);
  for (int64_t n = 0; n < N; ++n) {  // batch statistics: biased variance for normalising
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < M; ++i) mean += y[i * N + n] / M;
    for (int64_t i = 0; i < M; ++i) var += (y[i * N + n] - mean) * (y[i * N + n] - mean) / M;
    invstd[n] = 1.0 / std::sqrt(var + kEps);
    for (int64_t i = 0; i < M; ++i) xhat[i * N + n] = (y[i * N + n] - mean) * invstd[n];
    // running statistics start at mean 0, variance 1; their update uses the unbiased variance
    e.running_mean.push_back(kMomentum * mean);
    e.running_var.push_back((1.0 - kMomentum) + kMomentum * var * M / (M - 1));
  }
  e.out.resize(M * N);
  for (int64_t i = 0; i < M; ++i) {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) {
      e.out[i * N + n] = std::exp(in.scale * (in.gamma[n] * xhat[i * N + n] + in.beta[n]));
      sum += e.out[i * N + n];
    }
    for (int64_t n = 0; n < N; ++n) {
      e.out[i * N + n] /= sum;
      dz[i * N + n] = (e.out[i * N + n] - (n == in.labels[i] ? 1.0 : 0.0)) / M;  // dL/dz (softmax + CE)
    }
  }
  e.dy.resize(M * N);
  for (int64_t n = 0; n < N; ++n) {
    double sum_dz = 0.0, sum_dz_xhat = 0.0;
    for (int64_t i = 0; i < M; ++i) {
      sum_dz += dz[i * N + n];
      sum_dz_xhat += dz[i * N + n] * xhat[i * N + n];
      e.grad_scale += dz[i * N + n] * (in.gamma[n] * xhat[i * N + n] + in.beta[n]);
    }
    e.grad_beta.push_back(in.scale * sum_dz);
    e.grad_gamma.push_back(in.scale * sum_dz_xhat);
    // BatchNorm's backward through the batch statistics: dy = invstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
    const double a = in.scale * in.gamma[n];  // dxhat = a dz
    for (int64_t i = 0; i < M; ++i)
      e.dy[i * N + n] = invstd[n] * a * (dz[i * N + n] - sum_dz / M - xhat[i * N + n] * sum_dz_xhat / M);
  }
  return e;
}

// Largest |got - want| / (1 + |want|), printed; false above the tolerance.
bool check(const char* what, const Floats& got, const Doubles& want, double tolerance = 1e-5) {
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / (1.0 + std::abs(want[i])));
  const bool ok = worst <= tolerance;
  std::printf("  %-13s max error vs double %.1e  %s\n", what, worst, ok ? "ok" : "MISMATCH");
  return ok;
}

bool succeeded(const fused::Status& status, const char* call) {
  if (!status.ok()) std::fprintf(stderr, "%s failed: %s\n", call, status.message);
  return status.ok();
}

#if defined(FUSED_WITH_CUDA)
// fused::cuda::forward on the path fused::cuda::choose_path picks: the library computes y = x W^T + b
// itself (exact fp32 here: cuBLASLt on the generic path), then the statistics and the softmax.
// Without a GPU it says so and returns true.
bool gpu_forward_matches(const Inputs& in, const Floats& cpu_out) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA GPU: skipping fused::cuda::forward\n");
    return true;
  }
  std::vector<void*> allocations;
  auto device_copy = [&](const Floats& host) {
    void* ptr = nullptr;
    cudaMalloc(&ptr, host.size() * sizeof(float));
    cudaMemcpy(ptr, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice);
    allocations.push_back(ptr);
    return static_cast<float*>(ptr);
  };
  fused::ForwardProblem problem;
  problem.M = M; problem.N = N; problem.K = K;
  fused::ForwardBuffers buffers;
  buffers.x = device_copy(in.x); buffers.ldx = K;
  buffers.weight = device_copy(in.weight); buffers.ldw = K;
  buffers.bias = device_copy(in.bias);
  buffers.y = device_copy(Floats(M * N)); buffers.ldy = N;
  buffers.out = device_copy(Floats(M * N)); buffers.ldo = N;
  buffers.save_mean = device_copy(Floats(N));
  buffers.save_invstd = device_copy(Floats(N));
  fused::BatchNormArgs bn;
  bn.gamma = device_copy(in.gamma); bn.beta = device_copy(in.beta);
  bn.running_mean = device_copy(Floats(N, 0.f)); bn.running_var = device_copy(Floats(N, 1.f));
  bn.momentum = kMomentum; bn.eps = kEps; bn.training = true;
  bn.scale = device_copy(Floats{in.scale});
  int device = 0;
  fused::cuda::DeviceProperties properties;
  fused::cuda::GemmPath path = fused::cuda::GemmPath::kGeneric;
  if (cudaGetDevice(&device) != cudaSuccess ||
      !succeeded(fused::cuda::device_properties(device, &properties), "fused::cuda::device_properties") ||
      !succeeded(fused::cuda::choose_path(problem, buffers, properties, fused::cuda::PathRequest::kAuto, &path),
                 "fused::cuda::choose_path")) {
    for (void* ptr : allocations) cudaFree(ptr);
    return false;
  }
  const size_t workspace_size = fused::cuda::workspace_bytes(problem, path);
  void* workspace = nullptr;
  cudaMalloc(&workspace, workspace_size);  // cudaMalloc's alignment (256 bytes) is what forward() needs
  allocations.push_back(workspace);
  bool ok = succeeded(fused::cuda::forward(problem, buffers, bn, path, workspace, workspace_size, nullptr),
                      "fused::cuda::forward");
  Floats out(M * N);
  const cudaError_t copied = cudaMemcpy(out.data(), buffers.out, out.size() * sizeof(float), cudaMemcpyDeviceToHost);
  for (void* ptr : allocations) cudaFree(ptr);
  if (copied != cudaSuccess) std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(copied));
  if (!ok || copied != cudaSuccess) return false;
  std::printf("forward on the GPU (fused::cuda::forward, %s path):\n",
              path == fused::cuda::GemmPath::kSm90 ? "sm90" : "generic");
  return check("out", out, Doubles(cpu_out.begin(), cpu_out.end()));
}
#endif

}  // namespace

int main() {
  const Inputs in = make_inputs();
  const Expected expected = reference(in);

  // The library takes y = x W^T + b from the caller (the torch extension uses ATen's GEMM here).
  Floats y(M * N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < N; ++n) {
      float acc = in.bias[n];
      for (int64_t k = 0; k < K; ++k) acc += in.x[i * K + k] * in.weight[n * K + k];
      y[i * N + n] = acc;
    }

  // ---- forward: BatchNorm statistics, running-statistics update, softmax ----
  Floats out(M * N), save_mean(N), save_invstd(N), row_lse(M);
  Floats running_mean(N, 0.f), running_var(N, 1.f);  // as a fresh nn.BatchNorm1d
  fused::ForwardProblem problem;                       // fp32 everywhere (the default dtypes)
  problem.M = M; problem.N = N; problem.K = K;
  fused::ForwardBuffers buffers;  // row-major matrices, row strides in elements
  buffers.x = in.x.data(); buffers.ldx = K;
  buffers.weight = in.weight.data(); buffers.ldw = K;
  buffers.bias = in.bias.data();
  buffers.y = y.data(); buffers.ldy = N;
  buffers.out = out.data(); buffers.ldo = N;
  buffers.save_mean = save_mean.data(); buffers.save_invstd = save_invstd.data();
  buffers.row_lse = row_lse.data();  // kept, with y, for the backward
  fused::BatchNormArgs bn;
  bn.gamma = in.gamma.data(); bn.beta = in.beta.data();
  bn.running_mean = running_mean.data(); bn.running_var = running_var.data();
  bn.momentum = kMomentum; bn.eps = kEps; bn.training = true;
  bn.scale = &in.scale; bn.scale_numel = 1;
  if (!succeeded(fused::cpu::forward_from_y(problem, buffers, bn), "fused::cpu::forward_from_y")) return 1;

  std::printf("forward on the CPU (M=%lld, N=%lld, K=%lld):\n  row sums of out:", static_cast<long long>(M),
              static_cast<long long>(N), static_cast<long long>(K));
  for (int64_t i = 0; i < M; ++i) {
    float sum = 0.f;
    for (int64_t n = 0; n < N; ++n) sum += out[i * N + n];
    std::printf(" %.6f", sum);
  }
  std::printf("\n  out[0, :] =");
  for (int64_t n = 0; n < N; ++n) std::printf(" %.6f", out[n]);
  std::printf("\n");
  bool ok = check("out", out, expected.out);
  ok &= check("running_mean", running_mean, expected.running_mean);
  ok &= check("running_var", running_var, expected.running_var);

  // ---- backward of L = -mean_i log out[i, label_i]: dL/dout = -1 / (M out) at the labels ----
  Floats grad_out(M * N, 0.f), dy(M * N), grad_gamma(N), grad_beta(N), grad_scale(1);
  for (int64_t i = 0; i < M; ++i) grad_out[i * N + in.labels[i]] = -1.f / (M * out[i * N + in.labels[i]]);
  fused::BackwardProblem backward_problem;  // fp32 gradients and statistics
  backward_problem.M = M; backward_problem.N = N; backward_problem.batch_stats = true;
  fused::BackwardBuffers grads;
  grads.grad_out = grad_out.data(); grads.ldg = N;
  grads.y = y.data(); grads.ldy = N;
  grads.save_mean = save_mean.data(); grads.save_invstd = save_invstd.data(); grads.row_lse = row_lse.data();
  grads.gamma = in.gamma.data(); grads.beta = in.beta.data();
  grads.scale = &in.scale; grads.scale_numel = 1;
  grads.dy = dy.data(); grads.lddy = N;
  grads.grad_gamma = grad_gamma.data(); grads.grad_beta = grad_beta.data(); grads.grad_scale = grad_scale.data();
  if (!succeeded(fused::cpu::backward(backward_problem, grads), "fused::cpu::backward")) return 1;
  // The Linear layer's gradients are the caller's GEMMs: dx = dy W, dW = dy^T x, d_bias = column sums of dy.
  std::printf("backward on the CPU:\n  grad_gamma[0] = %.6f, grad_scale = %.6f\n", grad_gamma[0], grad_scale[0]);
  ok &= check("dy", dy, expected.dy);
  ok &= check("grad_gamma", grad_gamma, expected.grad_gamma);
  ok &= check("grad_beta", grad_beta, expected.grad_beta);
  ok &= check("grad_scale", grad_scale, {expected.grad_scale});

#if defined(FUSED_WITH_CUDA)
  ok &= gpu_forward_matches(in, out);
#endif
  std::printf("%s\n", ok ? "all results match" : "MISMATCH: see above");
  return ok ? 0 : 1;
}
