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
  std::size_t r_part, r, partials, coefficients, block_sums, counter;
  std::size_t total() const { return r_part + r + 2 * partials + 2 * coefficients + block_sums + counter; }
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
  const auto strips = static_cast<std::size_t>(util::ceil_div(p.N, backward_steps::row_strip_width(p.N)));
  return {align_up(sizeof(float) * strips * static_cast<std::size_t>(p.M)),
          align_up(sizeof(float) * static_cast<std::size_t>(p.M)),
          align_up(sizeof(float) * static_cast<std::size_t>(g.num_row_tiles) * n), align_up(sizeof(float) * n),
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
  float* r_part = nullptr;
  float* r = nullptr;
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
  w.r_part = reinterpret_cast<float*>(take(ws.r_part));
  w.r = reinterpret_cast<float*>(take(ws.r));
  w.partials = partials_geometry(p);
  w.partials.s1 = reinterpret_cast<float*>(take(ws.partials));
  w.partials.s2 = reinterpret_cast<float*>(take(ws.partials));
  w.coef.b = reinterpret_cast<float*>(take(ws.coefficients));
  w.coef.c = reinterpret_cast<float*>(take(ws.coefficients));
  w.block_sums = reinterpret_cast<double*>(take(ws.block_sums));
  w.counter = reinterpret_cast<unsigned*>(take(ws.counter));
  return Status::Ok();
}

// [B1] + [B2] (r into `r`), or only zeroes the finalize's counter when there are no rows. With
// `given_r` (column parallelism: r over every rank's columns) [B1] is replaced by placing it as the
// only non-zero strip, which [B2] then sums to exactly r (adding zeros changes no value).
Status row_pass(const BackwardProblem& p, const BackwardBuffers& b, const WorkspaceRegions& w, const float* given_r,
                float* r, cudaStream_t stream) {
  if (p.M == 0) {  // no row pass to zero the counter (and nothing to sum: every gradient is 0)
    return util::cuda_status(cudaMemsetAsync(w.counter, 0, sizeof(unsigned), stream), "CUDA backward: cudaMemsetAsync");
  }
  util::NvtxRange range("fused::backward_row_pass");
  if (given_r != nullptr) {
    const auto strips = static_cast<std::size_t>(util::ceil_div(p.N, backward_steps::row_strip_width(p.N)));
    const std::size_t row_bytes = sizeof(float) * static_cast<std::size_t>(p.M);
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaMemsetAsync(w.r_part, 0, strips * row_bytes, stream),
                                            "CUDA backward: cudaMemsetAsync"));
    FUSED_RETURN_IF_ERROR(util::cuda_status(
        cudaMemcpyAsync(w.r_part, given_r, row_bytes, cudaMemcpyDeviceToDevice, stream), "CUDA backward: cudaMemcpyAsync"));
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaMemsetAsync(w.counter, 0, sizeof(unsigned), stream),
                                            "CUDA backward: cudaMemsetAsync"));
  } else {
    FUSED_RETURN_IF_ERROR(backward_steps::row_dot(p, b, w.r_part, w.counter, stream));
  }
  return backward_steps::grad_partials(p, b, w.r_part, r, w.partials, stream);
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
  const float* r = w.r;
  if (b.rank_sums != nullptr) {  // data parallel: [B1] and [B2] ran in backward_column_sums
    r = static_cast<const float*>(b.row_dot);
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaMemsetAsync(w.counter, 0, sizeof(unsigned), stream),
                                            "CUDA backward: cudaMemsetAsync"));
  } else {
    FUSED_RETURN_IF_ERROR(row_pass(p, b, w, nullptr, w.r, stream));
  }
  {
    util::NvtxRange range("fused::backward_column_finalize");
    FUSED_RETURN_IF_ERROR(backward_steps::column_finalize(p, b, w.partials, w.coef, w.block_sums, w.counter, stream));
  }
  util::NvtxRange range("fused::backward_dy");
  return backward_steps::dy_pass(p, b, r, w.coef, stream);
}

Status backward_column_sums(const BackwardProblem& p, const BackwardBuffers& b, double* sums, float* row_dot,
                            void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  WorkspaceRegions w;
  FUSED_RETURN_IF_ERROR(check_and_carve(p, b, workspace, workspace_size, w));
  const auto* given_r = static_cast<const float*>(b.row_dot);
  if (sums == nullptr || (p.M > 0 && row_dot == nullptr && given_r == nullptr))
    return {StatusCode::kInvalidArgument, "backward_column_sums: sums and row_dot (or a given b.row_dot) are required"};
  if (p.N > 0) {
    FUSED_RETURN_IF_ERROR(row_pass(p, b, w, given_r, row_dot != nullptr ? row_dot : w.r, stream));
  } else if (p.M > 0 && row_dot != nullptr) {  // no columns: every r_i is 0
    FUSED_RETURN_IF_ERROR(util::cuda_status(cudaMemsetAsync(row_dot, 0, sizeof(float) * p.M, stream),
                                            "backward_column_sums: cudaMemsetAsync"));
  }
  util::NvtxRange range("fused::backward_column_sums");
  return backward_steps::column_sums(p.M, p.N, w.partials, sums, stream);
}

}  // namespace fused::cuda
