// How the backward's kernels [B1]..[B4] launch: each as a programmatic dependent of the kernel before it
// in the stream (kernels/common/pdl.cuh), so its launch and its CTAs' start hide behind that kernel's
// tail. Every one of them waits for its prerequisites before its first global-memory access and then
// lets its own dependent launch. FUSED_BWD_PDL=0 launches them in plain stream order, for A/B runs.
#pragma once

#include <algorithm>
#include <utility>

#include "kernels/common/pdl.cuh"
#include "util/cuda_check.h"
#include "util/device_info.h"

#ifndef FUSED_BWD_PDL
#define FUSED_BWD_PDL 1
#endif

namespace fused::cuda::backward_steps {

// Blocks of 256 threads per SM that the row passes' and dy's registers allow (their __launch_bounds__),
// and that their one-wave grids count.
constexpr int kBlocksPerSm = 2;

// Row blocks of a grid of `strips` column strips, for `needed` row blocks (tiles): with `one_wave`, as
// many as one wave of blocks holds (kBlocksPerSm per SM), each block walking several; else `needed`.
inline Status grid_row_blocks(bool one_wave, int64_t needed, int64_t strips, int64_t& row_blocks) {
  row_blocks = needed;
  if (!one_wave) return Status::Ok();
  int sms = 0;
  FUSED_RETURN_IF_ERROR(util::sm_count(util::detail::current_device(), sms));
  // rounded down: a block past the wave would run after the first ones end, a second round
  const int64_t wave = std::max<int64_t>(1, int64_t{kBlocksPerSm} * sms / strips);
  if (row_blocks > wave) row_blocks = wave;
  return Status::Ok();
}

// The start of every backward kernel: the kernel before it has completed and its writes are visible.
__device__ __forceinline__ void begin_step() {
  util::wait_for_prerequisites();
  util::allow_dependents_to_launch();
}

template <class... KernelArgs, class... Args>
Status launch_step(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   const char* what, Args&&... args) {
  if constexpr (FUSED_BWD_PDL != 0) {
    return util::launch_dependent(kernel, grid, block, smem, stream, what, std::forward<Args>(args)...);
  } else {
    kernel<<<grid, block, smem, stream>>>(static_cast<KernelArgs>(args)...);
    return util::launch_status(what);
  }
}

}  // namespace fused::cuda::backward_steps
