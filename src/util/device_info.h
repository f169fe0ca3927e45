// Per-device facts the path rule and the launchers need, queried once per device and cached (the queries are cheap
// but not free, and they run on every call of the op).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdlib>

#include "fused/types.h"

namespace fused::cuda::util {

constexpr int kMaxCachedDevices = 64;

namespace detail {
// query(device), cached for devices 0..63 once positive (a result <= 0 is a failure, asked again next
// time). Each Query type has its own cache: pass a lambda, whose type is unique to its expression
// (and to the template instantiation around it).
template <class Query>
inline int cached_per_device(int device, Query query) {
  static std::atomic<int> cache[kMaxCachedDevices] = {};
  const bool cacheable = device >= 0 && device < kMaxCachedDevices;
  if (cacheable) {
    const int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  const int v = query(device);
  if (cacheable && v > 0) cache[device].store(v, std::memory_order_relaxed);
  return v;
}

// attribute of `device`, cached (a driver call, no synchronisation, on first use); 0 when the query
// fails.
template <cudaDeviceAttr kAttribute>
inline int cached_device_attribute(int device) {
  return cached_per_device(device, [](int d) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, kAttribute, d) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return v;
  });
}

inline int current_device() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}
}  // namespace detail

// Number of SMs of `device`; kCudaError if the query fails.
inline Status sm_count(int device, int& count) {
  count = detail::cached_device_attribute<cudaDevAttrMultiProcessorCount>(device);
  if (count <= 0) return {StatusCode::kCudaError, "cudaDeviceGetAttribute(MultiProcessorCount) failed"};
  return Status::Ok();
}

// Compute capability major of `device`; kCudaError if the query fails.
inline Status compute_capability_major(int device, int& major) {
  major = detail::cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device);
  if (major <= 0) return {StatusCode::kCudaError, "cudaDeviceGetAttribute(ComputeCapabilityMajor) failed"};
  return Status::Ok();
}

// Programmatic dependent launch needs compute capability 9.0 or newer. FUSED_DISABLE_PDL=1 in the
// environment (read once) turns it off: plain stream order, for A/B timing and debugging.
inline bool current_device_has_pdl() {
  static const bool disabled = [] {
    const char* v = std::getenv("FUSED_DISABLE_PDL");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  if (disabled) return false;
  const int device = detail::current_device();
  return device >= 0 && detail::cached_device_attribute<cudaDevAttrComputeCapabilityMajor>(device) >= 9;
}

}  // namespace fused::cuda::util
