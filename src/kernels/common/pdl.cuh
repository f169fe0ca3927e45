// Programmatic dependent launch (PDL, sm90+): a kernel launched with `launch_dependent` may start
// while the kernel before it in the stream is still finishing, so its launch latency and prologue
// hide behind that kernel's tail instead of leaving a gap on the GPU.
//
// Contract of every kernel launched this way:
//   1. `wait_for_prerequisites()` before its first global-memory access (read or write): it returns
//      once the previous kernel has completed and its writes are visible. Nothing the previous
//      kernel writes is read early.
//   2. `allow_dependents_to_launch()` right after step 1, never before it. So when a kernel starts,
//      everything before its predecessor in the stream has completed. The softmax relies on that:
//      it reads y, which kernels before finalize wrote, before waiting for finalize.
// On older GPUs both are no-ops and the launch attribute is not set: plain stream order.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "util/cuda_check.h"
#include "util/device_info.h"

namespace fused::cuda::util {

__device__ __forceinline__ void wait_for_prerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependents_to_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) as a programmatic dependent of the
// previous kernel in the stream (where the device supports it), in thread-block clusters of
// `cluster_ctas` CTAs along x (0: no cluster attribute).
template <class... KernelArgs, class... Args>
Status launch_dependent_in_clusters(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, unsigned cluster_ctas,
                                    size_t smem, cudaStream_t stream, const char* what, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  unsigned count = 0;
  if (current_device_has_pdl()) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  if (cluster_ctas > 0) {
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count].val.clusterDim.x = cluster_ctas;
    attribute[count].val.clusterDim.y = 1;
    attribute[count].val.clusterDim.z = 1;
    ++count;
  }
  config.attrs = attribute;
  config.numAttrs = count;
  return cuda_status(cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...), what);
}

template <class... KernelArgs, class... Args>
Status launch_dependent(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        const char* what, Args&&... args) {
  return launch_dependent_in_clusters(kernel, grid, block, 0, smem, stream, what, std::forward<Args>(args)...);
}

}  // namespace fused::cuda::util
