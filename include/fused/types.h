// Public, torch-free vocabulary of the fused Linear -> BatchNorm1d -> scale -> softmax library.
#pragma once

#include <cstddef>
#include <cstdint>

// Same typedef as <driver_types.h>; lets CPU-only users include this header without CUDA.
typedef struct CUstream_st* cudaStream_t;

// Small functions shared by host code and the CUDA kernels (FUSED_HD: inline ones).
#if defined(__CUDACC__)
#define FUSED_HOST_DEVICE __host__ __device__
#define FUSED_HD __host__ __device__ __forceinline__
#else
#define FUSED_HOST_DEVICE
#define FUSED_HD inline
#endif

namespace fused {

// Element type of x, W, bias and out. y, the statistics and all BN vectors are fp32.
// kFloat64 exists for the CPU backward only (gradient checks in float64); no CUDA kernel takes it.
enum class ElementType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kFloat64 = 3 };

// How fp32 inputs are multiplied. bf16/fp16 always use their native tensor-core MMA.
enum class MatmulPrecision : int {
  kHighest = 0,  // fp32-accurate (torch.get_float32_matmul_precision() == "highest")
  kTF32 = 1,     // TF32 tensor cores allowed ("high" / "medium")
  // fp32-grade on TF32 tensor cores (precision "3xtf32", asked for explicitly, sm90 only): each
  // operand split into two TF32 parts, three TF32 products per multiply-add, the tensor cores'
  // partial sums added into fp32 registers every 32 K-elements. The workspace holds the small parts
  // of the operand the tensor cores read from shared memory (x's size in the forward).
  k3xTF32 = 2,
};

enum class StatusCode : int { kOk = 0, kInvalidArgument, kNotSupported, kCudaError };

// Errors carry a static message; the torch binding turns them into exceptions.
struct Status {
  StatusCode code = StatusCode::kOk;
  const char* message = "";
  bool ok() const { return code == StatusCode::kOk; }
  static Status Ok() { return {}; }
};

inline std::size_t element_size(ElementType t) {
  return t == ElementType::kFloat64 ? 8 : (t == ElementType::kFloat32 ? 4 : 2);
}

}  // namespace fused
