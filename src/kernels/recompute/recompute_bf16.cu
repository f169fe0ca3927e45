// The recompute path's passes for bf16 inputs (mma m16n8k16): one translation unit per input type.
#include "kernels/recompute/recompute_passes.cuh"

namespace fused::cuda::recompute {

Status run_pass_bf16(Pass pass, const PassParams& p, cudaStream_t stream) {
  return tile::run_pass_typed<__nv_bfloat16>(pass, p, stream);
}

}  // namespace fused::cuda::recompute
