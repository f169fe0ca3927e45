// The one-kernel forward's rule and its dispatch to the instantiation TUs (no CUTLASS here).
#include "kernels/sm90/one_kernel_forward_sm90.h"

namespace fused::sm90 {

int64_t one_kernel_tiles(int64_t M, int64_t N) {
  return (M + kOneKernelTile - 1) / kOneKernelTile * ((N + kOneKernelTile - 1) / kOneKernelTile);
}

bool one_kernel_forward_fits(int64_t M, int64_t N, int64_t K, int element_bytes, int num_sms) {
  (void)K;
  (void)element_bytes;
  const int64_t tiles = one_kernel_tiles(M, N);
  return M > 0 && N > 0 && 4 * tiles >= num_sms && tiles <= int64_t{kOneKernelCtasPerSm} * num_sms;
}

int64_t one_kernel_row_parts_floats(int64_t M, int64_t N) {
  return 2 * ((N + kOneKernelTile - 1) / kOneKernelTile) * M;
}

Status run_one_kernel_forward(ElementType dtype, const OneKernelForwardArgs& args, cudaStream_t stream) {
  switch (dtype) {
    case ElementType::kBFloat16: return instances::run_one_kernel_bf16(args, stream);
    case ElementType::kFloat16: return instances::run_one_kernel_fp16(args, stream);
    case ElementType::kFloat32: return instances::run_one_kernel_tf32(args, stream);
    default: return {StatusCode::kNotSupported, "one-kernel forward: bf16, fp16 or fp32 (TF32) inputs"};
  }
}

}  // namespace fused::sm90
