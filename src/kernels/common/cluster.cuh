// Thread-block clusters (sm90): a CTA's rank and the cluster's size, the cluster-wide barrier, and
// asynchronous stores into another CTA's shared memory (distributed shared memory). Below sm90, where
// no cluster is ever launched, a CTA is its own cluster of one.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/common/bulk_copy.cuh"

namespace fused::cuda::util {

// This CTA's place in its thread-block cluster: the cluster's size in CTAs and the CTA's rank in it.
struct ClusterPlace {
  uint32_t ctas, rank;
};
__device__ __forceinline__ ClusterPlace cluster_place() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t ctas, rank;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(ctas));
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return {ctas, rank};
#else
  return {1, 0};
#endif
}

// Every thread of every CTA of the cluster; shared-memory writes before it are visible to reads after
// it in any CTA of the cluster.
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#else
  __syncthreads();
#endif
}

// The shared::cluster address of `p` (this CTA's shared memory) in the cluster's CTA `rank`.
__device__ __forceinline__ uint32_t cluster_address(const void* p, uint32_t rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(shared_address(p)), "r"(rank));
  return remote;
#else
  (void)rank;
  return shared_address(p);
#endif
}

// Stores v at the cluster address `remote` and completes 4 bytes of the transaction of the mbarrier at
// the cluster address `remote_barrier` (in the same CTA as `remote`).
__device__ __forceinline__ void store_async_to_cta(uint32_t remote, float v, uint32_t remote_barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote),
               "r"(__float_as_uint(v)), "r"(remote_barrier)
               : "memory");
#else
  (void)remote, (void)v, (void)remote_barrier;
#endif
}

}  // namespace fused::cuda::util
