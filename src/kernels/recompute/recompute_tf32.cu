// The recompute path's passes for fp32 inputs (rounded to TF32, mma m16n8k8): one translation unit per input type.
#include "kernels/recompute/recompute_passes.cuh"

namespace fused::cuda::recompute {

Status run_pass_tf32(Pass pass, const PassParams& p, cudaStream_t stream) {
  return tile::run_pass_typed<float>(pass, p, stream);
}

}  // namespace fused::cuda::recompute
