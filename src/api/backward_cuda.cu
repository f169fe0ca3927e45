// The CUDA backward up to dy (fused/backward.h): carves the workspace and runs [B1] row pass,
// [B2] column partials, [B3] column finalize and [B4] dy pass, stream-ordered, no host
// synchronisation. The GEMMs dx = dy W and dW = dy^T x are the caller's.
#include "fused/backward.h"
#include "kernels/backward/backward_kernels.h"
#include "util/cuda_check.h"
#include "util/nvtx.h"

namespace fused::cuda {
namespace {

using backward_steps::DyCoefficients;
using backward_steps::GradPartials;

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// Byte sizes of the workspace regions, in carving order.
struct WorkspaceLayout {
  std::size_t row_parts, row_sums, partials, coefficients, block_sums, counter;
  std::size_t total() const { return row_parts + row_sums + 2 * partials + 2 * coefficients + block_sums + counter; }
};

GradPartials partials_geometry(const BackwardProblem& p) {
  GradPartials g;
  g.row_tile = backward_steps::grad_partials_row_tile(p.M);
  g.num_row_tiles = util::ceil_div(p.M, g.row_tile);
  g.ld = p.N;
  return g;
}

WorkspaceLayout layout(const BackwardProblem& p) {
  const GradPartials g = partials_geometry(p);
  const auto n = static_cast<std::size_t>(p.N);
  const auto strips = static_cast<std::size_t>(backward_steps::row_strips(p.N));
  const std::size_t rows = kRowSumsRows * static_cast<std::size_t>(p.M);
  return {align_up(sizeof(double) * strips * rows), align_up(sizeof(double) * rows),
          align_up(sizeof(double) * static_cast<std::size_t>(g.num_row_tiles) * n), align_up(sizeof(float) * n),
          align_up(sizeof(double) * static_cast<std::size_t>(util::ceil_div(p.N, backward_steps::kFinalizeThreads))),
          align_up(sizeof(unsigned))};
}

bool cuda_dtype(ElementType t) {
  return t == ElementType::kFloat32 || t == ElementType::kBFloat16 || t == ElementType::kFloat16;
}

}  // namespace

std::size_t backward_workspace_bytes(const BackwardProblem& p) { return layout(p).total(); }

namespace {

// The workspace's regions, carved in order.
struct WorkspaceRegions {
  double* row_parts = nullptr;
  double* row_sums = nullptr;
  GradPartials partials;
  DyCoefficients coef;
  double* block_sums = nullptr;
  unsigned* counter = nullptr;
};

Status check_and_carve(const BackwardProblem& p, const BackwardBuffers& b, void* workspace, std::size_t workspace_size,
                       WorkspaceRegions& w) {
  FUSED_RETURN_IF_ERROR(validate(p, b));
  if (p.stats_dtype != ElementType::kFloat32 || !cuda_dtype(p.grad_dtype) ||
      ((b.dy != nullptr || b.dy_t != nullptr) && !cuda_dtype(b.dy_dtype)))
    return {StatusCode::kNotSupported, "CUDA backward: y and the statistics must be float32; grad_out and dy "
                                       "float32, bfloat16 or float16"};
  const WorkspaceLayout ws = layout(p);
  if (workspace_size < ws.total() || (reinterpret_cast<uintptr_t>(workspace) % kAlign) != 0)
    return {StatusCode::kInvalidArgument, "CUDA backward: workspace too small or not 256-byte aligned"};
  auto* cursor = static_cast<char*>(workspace);
  auto take = [&](std::size_t bytes) {
    char* ptr = cursor;
    cursor += bytes;
    return ptr;
  };
  w.row_parts = reinterpret_cast<double*>(take(ws.row_parts));
  w.row_sums = reinterpret_cast<double*>(take(ws.row_sums));
  w.partials = partials_geometry(p);
  w.partials.s1 = reinterpret_cast<double*>(take(ws.partials));
  w.partials.s2 = reinterpret_cast<double*>(take(ws.partials));
  w.coef.b = reinterpret_cast<float*>(take(ws.coefficients));
  w.coef.c = reinterpret_cast<float*>(take(ws.coefficients));
  w.block_sums = reinterpret_cast<double*>(take(ws.block_sums));
  w.counter = reinterpret_cast<unsigned*>(take(ws.counter));
  return Status::Ok();
}

// [B1] + [B2] (the row sums into `row_sums`), or only zeroes the finalize's counter when there are no
// rows. With `given_row_sums` (column parallelism: the row sums over every rank's columns) [B1] is
// replaced by placing them as the only non-zero strip, which [B2] then sums to exactly them (adding
// zeros changes no value).
Status row_pass(const BackwardProblem& p, const BackwardBuffers& b, const WorkspaceRegions& w,
                const double* given_row_sums, double* row_sums, cudaStream_t stream) {
  if (p.M == 0) {  // no row pass to zero the counter (and nothing to sum: every gradient is 0)
    return util::cuda_status(cudaMemsetAsync(w.counter, 0, sizeof(unsigned), stream), "CUDA backward: cudaMemsetAsync");
  }
  util::NvtxRange range("fused::backward_row_pass");
  if (given_row_sums != nullptr) {
    const auto strips = static_cast<std::size_t>(backward_steps::row_strips(p.N));
    const std::size_t row_bytes = sizeof(double) * static_cast<std::size_t>(p.M);
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaMemsetAsync(w.row_parts, 0, kRowSumsRows * strips * row_bytes, stream),
                                            "CUDA backward: cudaMemsetAsync"));
    // row k of the given sums into strip 0 of row_parts' k-th half ((2, strips, M))
    FUSED_RETURN_IF_ERROR(util::cuda_status(
        cudaMemcpy2DAsync(w.row_parts, strips * row_bytes, given_row_sums, row_bytes, row_bytes, kRowSumsRows,
                          cudaMemcpyDeviceToDevice, stream),
        "CUDA backward: cudaMemcpy2DAsync"));
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaMemsetAsync(w.counter, 0, sizeof(unsigned), stream),
                                            "CUDA backward: cudaMemsetAsync"));
  } else {
    FUSED_RETURN_IF_ERROR(backward_steps::row_sums(p, b, w.row_parts, w.counter, stream));
  }
  return backward_steps::grad_partials(p, b, w.row_parts, row_sums, w.partials, stream);
}

}  // namespace

Status backward(const BackwardProblem& p, const BackwardBuffers& b, void* workspace, std::size_t workspace_size,
                cudaStream_t stream) {
  WorkspaceRegions w;
  FUSED_RETURN_IF_ERROR(check_and_carve(p, b, workspace, workspace_size, w));
  if (p.N == 0) {  // no columns: a scalar scale's gradient is a sum over none (zero bits in every dtype)
    if (b.grad_scale != nullptr && b.scale_numel == 1)
      return util::cuda_status(cudaMemsetAsync(b.grad_scale, 0, element_size(b.scale_dtype), stream),
                               "CUDA backward: cudaMemsetAsync");
    return Status::Ok();
  }
  const double* row_sums = w.row_sums;
  if (b.rank_sums != nullptr) {  // data parallel: [B1] and [B2] ran in backward_column_sums
    row_sums = static_cast<const double*>(b.row_sums);
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaMemsetAsync(w.counter, 0, sizeof(unsigned), stream),
                                            "CUDA backward: cudaMemsetAsync"));
  } else {
    FUSED_RETURN_IF_ERROR(row_pass(p, b, w, nullptr, w.row_sums, stream));
  }
  {
    util::NvtxRange range("fused::backward_column_finalize");
    FUSED_RETURN_IF_ERROR(backward_steps::column_finalize(p, b, w.partials, w.coef, w.block_sums, w.counter, stream));
  }
  util::NvtxRange range("fused::backward_dy");
  return backward_steps::dy_pass(p, b, row_sums, w.coef, stream);
}

Status backward_column_sums(const BackwardProblem& p, const BackwardBuffers& b, double* sums, double* row_sums,
                            void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  WorkspaceRegions w;
  FUSED_RETURN_IF_ERROR(check_and_carve(p, b, workspace, workspace_size, w));
  const auto* given_row_sums = static_cast<const double*>(b.row_sums);
  if (sums == nullptr || (p.M > 0 && row_sums == nullptr && given_row_sums == nullptr))
    return {StatusCode::kInvalidArgument, "backward_column_sums: sums and row_sums (or a given b.row_sums) are required"};
  if (p.N > 0) {
    FUSED_RETURN_IF_ERROR(row_pass(p, b, w, given_row_sums, row_sums != nullptr ? row_sums : w.row_sums, stream));
  } else if (p.M > 0 && row_sums != nullptr) {  // no columns: every row sum is 0
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaMemsetAsync(row_sums, 0, sizeof(double) * kRowSumsRows * p.M, stream),
                                            "backward_column_sums: cudaMemsetAsync"));
  }
  util::NvtxRange range("fused::backward_column_sums");
  return backward_steps::column_sums(p.M, p.N, w.partials, sums, stream);
}

}  // namespace fused::cuda
