// The generic path's [1]: y = x W^T + b in fp32 through cuBLASLt, the bias added by its epilogue.
// Torch-free; the handle is cached per thread and device, the workspace is the caller's.
#pragma once

#include <cstddef>

#include "fused/gemm_bn_softmax.h"

namespace fused::cuda::generic {

// cuBLASLt's workspace for this problem: 1 MiB + 8 fp32 copies of y (room for split-K partial
// products), at most 32 MiB (what PyTorch gives cuBLAS on Hopper).
std::size_t cublaslt_workspace_bytes(const ForwardProblem& p);

// The precision the GEMM runs in: exact fp32 for kHighest, and for kTF32 at tiny batches
// (M <= kExactFp32MaxBatch; the reason is at choose_path()).
MatmulPrecision gemm_precision(const ForwardProblem& p);

// y (M, N, row stride ldy) = x W^T + bias, fp32 accumulation and output. `bias_f32` is the bias in
// fp32 (cuBLASLt's bias epilogue reads it in y's type), or null. M, N > 0. `workspace` holds
// cublaslt_workspace_bytes(p) bytes, 256-byte aligned. K = 0 is the caller's (no product to run).
Status gemm_bias(const ForwardProblem& p, const ForwardBuffers& b, const float* bias_f32, void* workspace,
                 std::size_t workspace_size, cudaStream_t stream);

}  // namespace fused::cuda::generic
