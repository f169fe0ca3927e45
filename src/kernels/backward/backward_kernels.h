// The backward's CUDA steps [B1]..[B4] (fused/backward.h), launched by src/api/backward_cuda.cu.
// Torch-free; each function checks its launch and returns a Status.
#pragma once

#include "fused/backward.h"

namespace fused::cuda::backward_steps {

// Column sums of one row tile each: s1[t * ld + n] = sum over the rows of tile t of dz, s2 of dz * xhat.
struct GradPartials {
  double* s1 = nullptr;
  double* s2 = nullptr;
  int64_t num_row_tiles = 0;
  int64_t row_tile = 0;
  int64_t ld = 0;  // >= N
};

// dy = a * dz + b * xhat + c: b and c per column ([B3]); a is the logit map's (ColumnMaps).
struct DyCoefficients {
  float* b = nullptr;
  float* c = nullptr;
};

// Whether grad_out and y allow the kernels' 16-byte accesses: 16-byte aligned rows and whole groups of
// 8 columns (else the element-by-element fallback runs).
bool inputs_vectorizable(const BackwardProblem& p, const BackwardBuffers& b);

// Rows per partials tile: enough tiles to fill the GPU, few enough that the finalize stays cheap.
int64_t grad_partials_row_tile(int64_t M);

// Column strips of the row pass: at most kMaxRowStrips per row, each a multiple of 256 columns.
constexpr int64_t kMaxRowStrips = 32;
int64_t row_strip_width(int64_t N);
int64_t row_strips(int64_t N);  // the row pass's strips per row (0 when N = 0)

// [B1] row_parts (2 x row_strips(N) x M doubles): [s * M + i] = sum over the columns of strip s of
// g[i, n] * out[i, n], [(strips + s) * M + i] = of out[i, n]; also zeroes `counter` for [B3].
Status row_sums(const BackwardProblem& p, const BackwardBuffers& b, double* row_parts, unsigned* counter,
                cudaStream_t stream);
// [B2] row_sums (2 x M, fused/backward.h's kRowSumsRows) = the strips of row_parts summed in order,
// and the per-row-tile column sums of dz and dz * xhat.
Status grad_partials(const BackwardProblem& p, const BackwardBuffers& b, const double* row_parts, double* row_sums,
                     const GradPartials& partials, cudaStream_t stream);
// [B3] merges the tiles in order, writes the parameter gradients and the dy coefficients. A scalar
// scale's gradient is summed over column blocks by the last block to finish (block_sums holds
// ceil(N / 256) doubles; counter must be 0 on entry and is 0 again on exit).
Status column_finalize(const BackwardProblem& p, const BackwardBuffers& b, const GradPartials& partials,
                       const DyCoefficients& coef, double* block_sums, unsigned* counter, cudaStream_t stream);
constexpr int kFinalizeThreads = 256;
// Data-parallel step 1's end: sums = [M, S1[N], S2[N]], the tiles merged in order as [B3] does.
Status column_sums(int64_t M, int64_t N, const GradPartials& partials, double* sums, cudaStream_t stream);
// [B4] dy and/or dy^T.
Status dy_pass(const BackwardProblem& p, const BackwardBuffers& b, const double* row_sums, const DyCoefficients& coef,
               cudaStream_t stream);

}  // namespace fused::cuda::backward_steps
