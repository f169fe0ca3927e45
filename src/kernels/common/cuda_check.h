// CUDA error handling for the torch-free library: every call is checked and turned into a Status.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fused/types.h"

namespace fused::cuda::util {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();  // clear the sticky-free error so later calls are not blamed
  return {StatusCode::kCudaError, what};
}

// After a kernel launch: launch-configuration errors surface here.
inline Status launch_status(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace fused::cuda::util

#define FUSED_RETURN_IF_ERROR(expr)  \
  do {                               \
    ::fused::Status _s = (expr);     \
    if (!_s.ok()) return _s;         \
  } while (0)
