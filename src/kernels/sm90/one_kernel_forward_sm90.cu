// The one-kernel forward's rule and its dispatch to the instantiation TUs (no CUTLASS here).
#include "kernels/sm90/one_kernel_forward_sm90.h"

namespace fused::sm90 {

int64_t one_kernel_tiles(int64_t M, int64_t N) {
  return (M + kOneKernelTile - 1) / kOneKernelTile * ((N + kOneKernelTile - 1) / kOneKernelTile);
}

// Measured on the H200 (132 SMs; bench/pipeline_breakdown.py, the op on the GPU alone, one kernel against
// the three: GEMM + statistics (split K where its grid is small), finalize, softmax), bf16, us:
//   1024 x 512 x 4096: 21.6 against 26.9 (F.linear 10.6)   1024 x 512 x 1024: 13.7 against 17.0
//   1024 x 512 x 2048: 16.2 against 21.6    512 x 512 x 4096: 21.0 against 25.5    384 x 512 x 4096: 20.8
//   against 24.7    1024 x 256 x 4096: 20.7 against 26.3    1024 x 512 x 8192: 31.6 against 33.3;
//   level where each SM runs two tiles or a long K loop: 2048 x 512 x 4096 33.3 against 33.1, 1024 x 1024
//   x 4096 32.5 against 33.0, 64 x 8192 x 4096 43.2 against 43.5; tf32 1024 x 512 x 4096 33.1 against
//   33.0, 512 x 512 x 2048 20.9 against 25.3. Slower with twice that K loop per SM (an earlier version,
//   tf32 1024 x 512 x 8192: 61 against 45; 2048 x 512 x 4096 tf32: 62 against 46).
// So: every tile resident at once (at most kOneKernelCtasPerSm per SM), at least a quarter of the SMs
// busy, and at most 128 k-tiles of 128 bytes of K loop per SM (a 64x64 tile's K loop runs at about
// cuBLAS's rate on one SM; beyond that the three kernels' larger tiles win).
bool one_kernel_forward_fits(int64_t M, int64_t N, int64_t K, int element_bytes, int num_sms) {
  if (M <= 0 || N <= 0 || K <= 0 || element_bytes <= 0 || num_sms <= 0) return false;
  const int64_t tiles = one_kernel_tiles(M, N);
  const int64_t k_tiles = (K * element_bytes + 127) / 128;
  return tiles <= int64_t{kOneKernelCtasPerSm} * num_sms && 4 * tiles >= num_sms &&
         tiles * k_tiles <= kOneKernelMaxKTilesPerSm * num_sms;
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
