// CUDA error handling for the torch-free library: every call is checked and turned into a Status,
// whose message names the call and the runtime's error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>

#include "fused/types.h"

namespace fused::cuda::util {

// A Status whose message is "<what>: <detail>". Status carries a plain pointer, so the text lives
// in a per-thread buffer: valid until this thread's next error, enough to report or rethrow it.
inline Status error_status(StatusCode code, const char* what, const char* detail) {
  thread_local char message[256];
  std::snprintf(message, sizeof(message), "%s: %s", what, detail);
  return {code, message};
}

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed
  return error_status(StatusCode::kCudaError, what, cudaGetErrorString(err));
}

// After a kernel launch: launch-configuration errors surface here.
inline Status launch_status(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The 16-byte rule of TMA and of the kernels' vector accesses.
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace fused::cuda::util

#define FUSED_RETURN_IF_ERROR(expr)  \
  do {                               \
    ::fused::Status _s = (expr);     \
    if (!_s.ok()) return _s;         \
  } while (0)
