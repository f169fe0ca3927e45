// The CUDA forward: carves the workspace, runs [1] (sm90 GEMM + statistics epilogue, or cuBLASLt's
// GEMM + the generic column partials), [2] finalize and [3] row softmax, all stream-ordered, no
// host synchronisation, no allocation.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>

#include "api/dispatch.h"
#include "api/forward_steps.h"
#include "fused/gemm_bn_softmax.h"
#include "kernels/generic/cublaslt_gemm.h"
#include "kernels/recompute/recompute.h"
#include "util/cuda_check.h"
#include "util/nvtx.h"
#if defined(FUSED_WITH_SM90)
#include "kernels/sm90/gemm_stats_sm90.h"
#include "kernels/sm90/one_kernel_forward_sm90.h"
#endif

namespace fused::cuda {
namespace {

constexpr std::size_t kAlign = 256;
std::size_t align_up(std::size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

#if defined(FUSED_WITH_SM90)
// The sm90 kernel shape for this problem on the current device (properties cached per device).
Status sm90_tile(const ForwardProblem& p, sm90::Sm90Tile& tile) {
  int device = 0;
  FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "cudaGetDevice failed"));
  DeviceProperties props;
  FUSED_RETURN_IF_ERROR(device_properties(device, &props));
  tile = p.precision == MatmulPrecision::k3xTF32 ? sm90::k3xTf32Tile
                                                 : sm90::choose_tile(p.M, p.N, p.K, int(element_size(p.dtype)),
                                                                     props.multiprocessor_count);
  return Status::Ok();
}
#endif

// How the forward runs on its path: the three steps as kernels of their own, or (sm90, problems whose
// 64x64 tiles all fit on the GPU at once) the whole forward as one kernel. gemm_column_moments always
// runs the three-step form's [1].
enum class Form { kSteps, kOneKernel };

// The one-kernel form where the problem allows it. FUSED_DISABLE_ONE_KERNEL=1 in the environment (read
// once) turns it off, for A/B timing.
Form forward_form(const ForwardProblem& p, GemmPath path) {
#if defined(FUSED_WITH_SM90)
  static const bool disabled = [] {
    const char* v = std::getenv("FUSED_DISABLE_ONE_KERNEL");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  if (disabled || path != GemmPath::kSm90 || p.precision == MatmulPrecision::k3xTF32) return Form::kSteps;
  int device = 0;
  DeviceProperties props;
  if (cudaGetDevice(&device) != cudaSuccess || !device_properties(device, &props).ok()) {
    (void)cudaGetLastError();
    return Form::kSteps;
  }
  return sm90::one_kernel_forward_fits(p.M, p.N, p.K, int(element_size(p.dtype)), props.multiprocessor_count)
             ? Form::kOneKernel
             : Form::kSteps;
#else
  (void)p, (void)path;
  return Form::kSteps;
#endif
}

// Partials geometry of a path and form.
Status partials_geometry(const ForwardProblem& p, GemmPath path, Form form, ColumnStatsPartials& g) {
  g = ColumnStatsPartials{};
#if defined(FUSED_WITH_SM90)
  if (path == GemmPath::kSm90) {
    sm90::Sm90Tile tile = sm90::Sm90Tile::k256x128;
    FUSED_RETURN_IF_ERROR(sm90_tile(p, tile));
    g.row_tile = form == Form::kOneKernel ? sm90::kOneKernelTile : sm90::partials_row_tile(tile);
    g.ld = sm90::partials_ld(p.N);
  }
#else
  (void)form;
#endif
  if (path == GemmPath::kGeneric || path == GemmPath::kRecompute) {
    g.row_tile = 128;  // the generic partials kernel's and the recompute tile's rows
    g.ld = (p.N + 3) / 4 * 4;
  }
  if (g.row_tile > 0) g.num_row_tiles = util::ceil_div(p.M, g.row_tile);
  return Status::Ok();
}

#if defined(FUSED_WITH_SM90)
// The kernel shape comes from sm90_tile, as the partials geometry's does, so that both always agree.
Status gemm_args(const ForwardProblem& p, const ForwardBuffers& b, sm90::GemmStatsArgs& a) {
  a = sm90::GemmStatsArgs{};
  a.M = p.M; a.N = p.N; a.K = p.K;
  a.x = b.x; a.ldx = b.ldx; a.w = b.weight; a.ldw = b.ldw; a.bias = b.bias;
  a.y = b.y; a.ldy = b.ldy;
  return sm90_tile(p, a.tile);
}
#endif

// The path's own GEMM workspace (after the partials and the folded map); the one-kernel form's is its
// rows' (max, sum) per column tile.
std::size_t gemm_bytes(const ForwardProblem& p, GemmPath path, Form form, bool include_cublaslt_workspace) {
#if defined(FUSED_WITH_SM90)
  if (path == GemmPath::kSm90 && form == Form::kOneKernel)
    return align_up(sizeof(float) * static_cast<std::size_t>(sm90::one_kernel_row_parts_floats(p.M, p.N)));
  if (path == GemmPath::kSm90) {
    sm90::GemmStatsArgs a;
    if (!gemm_args(p, ForwardBuffers{}, a).ok()) return 0;
    return align_up(sm90::gemm_workspace_bytes(p.dtype, p.precision, a));
  }
#endif
  if (path == GemmPath::kGeneric)
    return align_up(sizeof(float) * static_cast<std::size_t>(p.N)) +
           (include_cublaslt_workspace ? align_up(generic::cublaslt_workspace_bytes(p)) : 0);
  if (path == GemmPath::kRecompute)
    return align_up(sizeof(float) * static_cast<std::size_t>(recompute::row_parts_floats(p.M, p.N))) +
           align_up(sizeof(float) * static_cast<std::size_t>(recompute::row_stats_floats(p.M)));
  return 0;
}

// [1] of the generic path: y = x W^T + b through cuBLASLt (bias in fp32 from `bias_f32`, a
// workspace row), then the column partials when batch statistics are used.
Status generic_gemm(const ForwardProblem& p, const ForwardBuffers& b, char* gemm_workspace, std::size_t size,
                    cudaStream_t stream) {
  float* bias_f32 = nullptr;
  if (b.bias != nullptr) {
    if (p.dtype == ElementType::kFloat32 && util::aligned16(b.bias)) {
      bias_f32 = static_cast<float*>(const_cast<void*>(b.bias));
    } else {  // cuBLASLt's bias epilogue reads the bias in y's type, and fastest from aligned memory
      bias_f32 = reinterpret_cast<float*>(gemm_workspace);
      FUSED_RETURN_IF_ERROR(bias_rows(b.bias, p.dtype, bias_f32, p.N, 1, p.N, stream));
    }
  }
  const std::size_t bias_bytes = align_up(sizeof(float) * static_cast<std::size_t>(p.N));
  if (p.K == 0) {  // no product: y = b (or 0)
    if (b.bias != nullptr) return bias_rows(b.bias, p.dtype, b.y, b.ldy, p.M, p.N, stream);
    return util::cuda_status(cudaMemset2DAsync(b.y, sizeof(float) * b.ldy, 0, sizeof(float) * p.N, p.M, stream),
                             "cudaMemset2DAsync(y)");
  }
  if (b.cublaslt_workspace != nullptr)
    return generic::gemm_bias(p, b, bias_f32, static_cast<char*>(b.cublaslt_workspace), b.cublaslt_workspace_size,
                              stream);
  return generic::gemm_bias(p, b, bias_f32, gemm_workspace + bias_bytes, size - bias_bytes, stream);
}

}  // namespace

namespace {
std::size_t form_workspace_bytes(const ForwardProblem& p, GemmPath path, Form form, bool include_cublaslt_workspace) {
  ColumnStatsPartials g;
  if (!partials_geometry(p, path, form, g).ok()) return 0;
  return 2 * align_up(sizeof(float) * static_cast<std::size_t>(g.num_row_tiles * g.ld)) +
         2 * align_up(sizeof(float) * static_cast<std::size_t>(p.N)) +
         gemm_bytes(p, path, form, include_cublaslt_workspace);
}
}  // namespace

// Enough for forward() and for gemm_column_moments(), whichever form forward() runs.
std::size_t workspace_bytes(const ForwardProblem& p, GemmPath path, bool include_cublaslt_workspace) {
  const std::size_t steps = form_workspace_bytes(p, path, Form::kSteps, include_cublaslt_workspace);
  if (forward_form(p, path) == Form::kSteps) return steps;
  return std::max(steps, form_workspace_bytes(p, path, Form::kOneKernel, include_cublaslt_workspace));
}

namespace {

// The workspace's regions: [partials.mean | partials.m2 | a | c | the path's GEMM workspace].
struct WorkspaceRegions {
  ColumnStatsPartials partials;
  ColumnAffine affine;
  char* gemm = nullptr;
  std::size_t gemm_size = 0;
};

Status carve(const ForwardProblem& p, GemmPath path, Form form, float* save_mean, void* workspace,
             std::size_t workspace_size, std::size_t needed, WorkspaceRegions& w) {
  if (workspace_size < needed || (reinterpret_cast<uintptr_t>(workspace) % kAlign) != 0)
    return {StatusCode::kInvalidArgument, "workspace too small or not 256-byte aligned (workspace_bytes)"};
  FUSED_RETURN_IF_ERROR(partials_geometry(p, path, form, w.partials));
  auto* cursor = static_cast<char*>(workspace);
  auto take = [&](std::size_t bytes) {
    char* ptr = cursor;
    cursor += align_up(bytes);
    return ptr;
  };
  const std::size_t partial_bytes = sizeof(float) * static_cast<std::size_t>(w.partials.num_row_tiles * w.partials.ld);
  w.partials.mean = reinterpret_cast<float*>(take(partial_bytes));
  w.partials.m2 = reinterpret_cast<float*>(take(partial_bytes));
  w.affine = ColumnAffine{save_mean, reinterpret_cast<float*>(take(sizeof(float) * p.N)),
                          reinterpret_cast<float*>(take(sizeof(float) * p.N))};
  // The recompute path's passes read the exact map (once per tile, not per row).
  w.affine.shift_folded = path != GemmPath::kRecompute && folds_logit_shift(p);
  w.gemm = cursor;
  w.gemm_size = workspace_size - static_cast<std::size_t>(cursor - static_cast<char*>(workspace));
  return Status::Ok();
}

// The path's own preconditions on this device.
Status check_path(const ForwardProblem& p, const ForwardBuffers& b, GemmPath path) {
  if (path != GemmPath::kSm90 && path != GemmPath::kGeneric && path != GemmPath::kRecompute)
    return {StatusCode::kInvalidArgument, "unknown GemmPath"};
  FUSED_RETURN_IF_ERROR(y_given(p, b, path));
  if (path == GemmPath::kGeneric) return generic_can_implement(p);
  int device = 0;
  FUSED_RETURN_IF_ERROR(util::cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  DeviceProperties props;
  FUSED_RETURN_IF_ERROR(device_properties(device, &props));
  if (path == GemmPath::kRecompute) return recompute_can_implement(p, b, props);
  FUSED_RETURN_IF_ERROR(sm90_device_ok(props, p));
  return sm90_can_implement(p, b);
}

// The recompute path's passes ([R1] column partials, [2] finalize, [R2] row partials, [R3] row
// merge, [R4] out), on the workspace's regions: [partials | a | c | row parts | row stats].
Status recompute_forward(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn,
                         const WorkspaceRegions& w, cudaStream_t stream) {
  recompute::PassParams rp;
  rp.M = p.M; rp.N = p.N; rp.K = p.K; rp.dtype = p.dtype;
  rp.x = b.x; rp.ldx = b.ldx; rp.w = b.weight; rp.ldw = b.ldw; rp.bias = b.bias;
  rp.partials = w.partials;
  rp.affine = w.affine;
  rp.row_parts = reinterpret_cast<float*>(w.gemm);
  rp.row_stats = reinterpret_cast<float*>(
      w.gemm + align_up(sizeof(float) * static_cast<std::size_t>(recompute::row_parts_floats(p.M, p.N))));
  rp.out = b.out; rp.ldo = b.ldo; rp.out_dtype = p.out_dtype;
  if (bn.uses_batch_stats() && p.M > 0) {
    util::NvtxRange range("fused::recompute_column_partials");
    FUSED_RETURN_IF_ERROR(recompute::run_pass(recompute::Pass::kColumnPartials, rp, stream));
  }
  {
    util::NvtxRange range("fused::finalize");
    FUSED_RETURN_IF_ERROR(finalize(w.partials, p.M, p.N, bn, b.save_invstd, w.affine, stream));
  }
  util::NvtxRange range("fused::recompute_softmax");
  FUSED_RETURN_IF_ERROR(recompute::run_pass(recompute::Pass::kRowPartials, rp, stream));
  FUSED_RETURN_IF_ERROR(recompute::merge_row_parts(rp, b.row_lse, stream));
  FUSED_RETURN_IF_ERROR(recompute::run_pass(recompute::Pass::kWriteOut, rp, stream));
  return count_batch(bn.batch_counter(), stream);
}

// [1]: y = x W^T + b, and the column partials when `with_partials` (batch statistics).
Status gemm_and_partials(const ForwardProblem& p, const ForwardBuffers& b, GemmPath path, const WorkspaceRegions& w,
                         bool with_partials, cudaStream_t stream) {
  if (p.M == 0) return Status::Ok();
  if (path == GemmPath::kSm90) {
#if defined(FUSED_WITH_SM90)
    util::NvtxRange range("fused::gemm_stats_sm90");
    sm90::GemmStatsArgs args;
    FUSED_RETURN_IF_ERROR(gemm_args(p, b, args));
    if (with_partials) args.partials = w.partials;
    return sm90::run_gemm_stats(p.dtype, p.precision, args, w.gemm, stream);
#else
    return {StatusCode::kNotSupported, "this build has no sm90 kernels"};
#endif
  }
  {
    util::NvtxRange range("fused::gemm_cublaslt");
    FUSED_RETURN_IF_ERROR(generic_gemm(p, b, w.gemm, w.gemm_size, stream));
  }
  if (!with_partials) return Status::Ok();
  util::NvtxRange range("fused::column_partials");
  return column_partials(b.y, b.ldy, p.M, p.N, w.partials, stream);
}

// [1], [2] and [3] as one kernel (sm90, Form::kOneKernel): it also counts the batch.
Status one_kernel_forward(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn,
                          const WorkspaceRegions& w, cudaStream_t stream) {
#if defined(FUSED_WITH_SM90)
  util::NvtxRange range("fused::one_kernel_forward_sm90");
  sm90::OneKernelForwardArgs a;
  FUSED_RETURN_IF_ERROR(gemm_args(p, b, a.gemm));
  if (!p.keep_y) a.gemm.y = nullptr;  // nothing reads it: the one kernel need not write it
  if (bn.uses_batch_stats()) a.gemm.partials = w.partials;
  a.bn = bn;
  a.save_mean = b.save_mean;
  a.save_invstd = b.save_invstd;
  a.out = b.out;
  a.ldo = b.ldo;
  a.out_dtype = p.out_dtype;
  a.row_lse = b.row_lse;
  a.row_parts = reinterpret_cast<float*>(w.gemm);
  return sm90::run_one_kernel_forward(p.dtype, a, stream);
#else
  (void)p, (void)b, (void)bn, (void)w, (void)stream;
  return {StatusCode::kNotSupported, "this build has no sm90 kernels"};
#endif
}

// [2] and [3].
Status finalize_and_softmax(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn,
                            const WorkspaceRegions& w, cudaStream_t stream) {
  {
    util::NvtxRange range("fused::finalize");
    FUSED_RETURN_IF_ERROR(finalize(w.partials, p.M, p.N, bn, b.save_invstd, w.affine, stream));
  }
  util::NvtxRange range("fused::row_softmax");
  return row_softmax(b.y, b.ldy, p.M, p.N, w.affine, b.out, b.ldo, p.out_dtype, b.row_lse, stream,
                     bn.batch_counter());
}

}  // namespace

// FUSED_FOLD_LOGIT_SHIFT=0 builds the exact map everywhere, for A/B runs (bench/cpp/variants.sh).
#ifndef FUSED_FOLD_LOGIT_SHIFT
#define FUSED_FOLD_LOGIT_SHIFT 1
#endif

bool folds_logit_shift(const ForwardProblem& p) {
  return FUSED_FOLD_LOGIT_SHIFT && p.out_dtype != ElementType::kFloat32;
}

Status forward(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn, GemmPath path,
               void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  FUSED_RETURN_IF_ERROR(validate(p, b, bn));
  if (bn.rank_moments != nullptr)
    return {StatusCode::kInvalidArgument, "forward: data-parallel statistics go through gemm_column_moments and "
                                          "forward_from_y"};
  FUSED_RETURN_IF_ERROR(check_path(p, b, path));
  const Form form = p.M > 0 && p.N > 0 ? forward_form(p, path) : Form::kSteps;
  WorkspaceRegions w;
  FUSED_RETURN_IF_ERROR(carve(p, path, form, b.save_mean, workspace, workspace_size,
                              workspace_bytes(p, path, b.cublaslt_workspace == nullptr), w));
  if (p.N == 0) return count_batch(bn.batch_counter(), stream);
  if (path == GemmPath::kRecompute) return recompute_forward(p, b, bn, w, stream);
  if (form == Form::kOneKernel) return one_kernel_forward(p, b, bn, w, stream);
  FUSED_RETURN_IF_ERROR(gemm_and_partials(p, b, path, w, bn.uses_batch_stats(), stream));
  return finalize_and_softmax(p, b, bn, w, stream);
}

Status gemm_column_moments(const ForwardProblem& p, const ForwardBuffers& b, GemmPath path, double* record,
                           void* workspace, std::size_t workspace_size, cudaStream_t stream) {
  FUSED_RETURN_IF_ERROR(validate_linear(p, b));
  if (record == nullptr) return {StatusCode::kInvalidArgument, "gemm_column_moments: record is null"};
  if (path == GemmPath::kRecompute)
    return {StatusCode::kNotSupported, "gemm_column_moments writes y: the recompute path does not apply"};
  FUSED_RETURN_IF_ERROR(check_path(p, b, path));
  WorkspaceRegions w;
  FUSED_RETURN_IF_ERROR(carve(p, path, Form::kSteps, b.save_mean, workspace, workspace_size,
                              form_workspace_bytes(p, path, Form::kSteps, b.cublaslt_workspace == nullptr), w));
  if (p.N > 0) FUSED_RETURN_IF_ERROR(gemm_and_partials(p, b, path, w, /*with_partials=*/true, stream));
  util::NvtxRange range("fused::column_moments");
  return column_moments(w.partials, p.M, p.N, record, stream);
}

bool forward_runs_one_kernel(const ForwardProblem& p, GemmPath path) {
  return p.M > 0 && p.N > 0 && forward_form(p, path) == Form::kOneKernel;
}

bool forward_needs_y_scratch(const ForwardProblem& p, GemmPath path) {
  return !p.keep_y && p.M > 0 && p.N > 0 && path != GemmPath::kRecompute && !forward_runs_one_kernel(p, path);
}

std::size_t forward_from_y_workspace_bytes(const ForwardProblem& p) {
  return workspace_bytes(problem_from_y(p), GemmPath::kGeneric, /*include_cublaslt_workspace=*/false);
}

Status forward_from_y(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn, void* workspace,
                      std::size_t workspace_size, cudaStream_t stream) {
  const ForwardProblem no_gemm = problem_from_y(p);
  FUSED_RETURN_IF_ERROR(validate(no_gemm, b, bn));
  WorkspaceRegions w;
  FUSED_RETURN_IF_ERROR(carve(no_gemm, GemmPath::kGeneric, Form::kSteps, b.save_mean, workspace, workspace_size,
                              forward_from_y_workspace_bytes(p), w));
  if (p.N == 0) return count_batch(bn.batch_counter(), stream);
  if (bn.uses_batch_stats() && bn.rank_moments == nullptr && p.M > 0) {
    util::NvtxRange range("fused::column_partials");
    FUSED_RETURN_IF_ERROR(column_partials(b.y, b.ldy, p.M, p.N, w.partials, stream));
  }
  return finalize_and_softmax(p, b, bn, w, stream);
}

}  // namespace fused::cuda
