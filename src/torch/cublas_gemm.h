// Row-major GEMMs through cuBLAS on torch's handle for the current thread and stream: the backward's
// dx = dy W and dW = dy^T x (the forward's GEMMs are the library's).
#pragma once

#include <ATen/ATen.h>

#include "fused/types.h"

namespace fused::torch_op {

// A row-major matrix operand: `data` holds the operand itself (transposed = false) or its
// transpose (transposed = true), with row stride `ld` elements.
struct GemmOperand {
  const void* data = nullptr;
  int64_t ld = 0;
  bool transposed = false;
};

// C (m x n, row-major, row stride ldc, dtype c_type) = A (m x k) * B (k x n), fp32
// accumulation. a_type is A's and B's dtype. fp32 operands use TF32 tensor cores only when
// `precision` is kTF32 (set per call, torch's process-wide flag untouched); 16-bit operands never
// reduce in reduced precision.
void gemm_row_major(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b, at::ScalarType ab_type,
                    void* c, int64_t ldc, at::ScalarType c_type, MatmulPrecision precision);

}  // namespace fused::torch_op
