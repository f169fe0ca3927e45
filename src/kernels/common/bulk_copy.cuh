// sm90 bulk copies (global -> shared, the copy engine's 1-D form of TMA) completed on an mbarrier:
// one instruction moves a whole row, with no registers or threads tied up while it is in flight.
// Every function is a no-op below sm90; callers only launch kernels that use them on sm90+.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace fused::cuda::util {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An mbarrier that completes a phase after `arrivals` arrivals and the bytes they announced.
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, uint32_t arrivals) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

// This thread's arrival on a local mbarrier, announcing `bytes` of transactions (bulk copies, remote
// st.async) that its current phase also waits for.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* barrier, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
#endif
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory;
// the barrier's current phase completes when they have landed. One thread calls it per phase.
__device__ __forceinline__ void bulk_load(void* shared_dst, const void* global_src, uint32_t bytes, uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The buffer may have just been read through the generic proxy: order those reads first.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  mbarrier_arrive_expect_tx(barrier, bytes);
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(shared_dst)),
               "l"(global_src), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
#endif
}

// Waits until the barrier's phase of parity `parity` (0, 1, 0, ... for successive phases) completes.
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n\t.reg .pred done;\n\t"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t"
      "@!done bra WAIT;\n\t"
      "}" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace fused::cuda::util
