// NVTX ranges named after the op's stages, so Nsight Systems / Compute show where the time goes.
// Header-only NVTX v3 from the CUDA toolkit; a no-op where it is absent. Cost without a profiler
// attached: a few nanoseconds of host time per range.
#pragma once

#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define FUSED_HAVE_NVTX 1
#endif

namespace fused::cuda::util {

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) {
#if defined(FUSED_HAVE_NVTX)
    nvtxRangePushA(name);
#else
    (void)name;
#endif
  }
  ~NvtxRange() {
#if defined(FUSED_HAVE_NVTX)
    nvtxRangePop();
#endif
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace fused::cuda::util
