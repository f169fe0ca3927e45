// Fused Linear -> BatchNorm1d -> scale -> softmax(dim=1): the torch-free public API.
//
//   y   = x W^T + b                  (M, N) fp32, fp32 accumulation
//   mu, var = batch statistics of y  (training, or no running stats) else running stats
//   out = softmax(scale * (gamma * (y - mu) * rsqrt(var + eps) + beta), dim=1)
//
// Data flow on CUDA:
//   [1] y and per-row-tile column partials: the sm90 GEMM with its statistics epilogue
//       (GemmPath::kSm90), or cuBLASLt's GEMM with its bias epilogue + a column-partials kernel
//       (GemmPath::kGeneric); cuda::choose_path() decides
//   [2] finalize: partials -> mean, invstd, running-stat update, folded per-column affine map
//   [3] row softmax: out = softmax(a * (y - shift) + c), and each row's log-normaliser for the backward
// On the sm90 path, problems whose 64x64 output tiles all fit on the GPU at once (N = 512 at M = 1024)
// run [1], [2] and [3] as one kernel, with a grid-wide barrier after each of [1] and [2]'s column part
// (src/kernels/sm90/one_kernel_forward_sm90.h): y never leaves the SMs but to be kept.
// On request, for small K when y is not kept (GemmPath::kRecompute), y is never written: [1]
// becomes a pass that recomputes y's tiles for their column partials, and [3] two more passes that
// recompute them for the rows' (max, sum) and for out (src/kernels/recompute/recompute.h).
// The CPU implementation (fused::cpu) follows the same steps on host memory, from a y the caller
// computed.
#pragma once

#include <functional>

#include "fused/batchnorm.h"
#include "fused/types.h"

namespace fused {

struct ForwardProblem {
  int64_t M = 0;  // batch
  int64_t N = 0;  // out_features
  int64_t K = 0;  // in_features
  ElementType dtype = ElementType::kFloat32;      // of x, W, bias: the GEMM's input type
  ElementType out_dtype = ElementType::kFloat32;  // of out (autocast asks for fp32 out of a 16-bit GEMM)
  MatmulPrecision precision = MatmulPrecision::kHighest;  // fp32 only
  // false: the caller does not need y (no backward will read it). Then y may be null where the forward
  // never writes it (cuda::forward_needs_y_scratch): the recompute path (GemmPath::kRecompute), and the
  // sm90 path's one-kernel form; the other forms still need one.
  bool keep_y = true;
};

// Row-major matrices with a row stride (elements); unit column stride.
struct ForwardBuffers {
  const void* x = nullptr;       // (M, K) dtype, row stride ldx
  int64_t ldx = 0;
  const void* weight = nullptr;  // (N, K) dtype (nn.Linear layout), row stride ldw
  int64_t ldw = 0;
  const void* bias = nullptr;    // (N) dtype, or null
  float* y = nullptr;            // (M, N) fp32, row stride ldy; kept for the backward (null: see keep_y)
  int64_t ldy = 0;
  void* out = nullptr;           // (M, N) out_dtype, row stride ldo
  int64_t ldo = 0;
  float* save_mean = nullptr;    // (N) the mean used (batch or running)
  float* save_invstd = nullptr;  // (N) 1 / sqrt(var + eps)
  // (M) log sum_n exp(z[i, n]) per row, or null. Kept for the backward, which recomputes the
  // softmax in fp32 from y (exp(z - row_lse)) instead of reading the rounded out. Not written when
  // N = 0: the log of an empty sum, -inf, is the caller's to fill (the torch op does).
  float* row_lse = nullptr;
  // Generic path only, optional: a cuBLASLt workspace the caller already owns (e.g. PyTorch's, one
  // per stream). When set, forward() uses it instead of carving one out of its workspace; ask
  // workspace_bytes(p, path, /*include_cublaslt_workspace=*/false) then.
  void* cublaslt_workspace = nullptr;
  std::size_t cublaslt_workspace_size = 0;
};

// Checks shapes, strides and arguments common to every path (the contract's preconditions).
Status validate(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn);
// The part of validate() that concerns the GEMM alone (x, weight, y, precision).
Status validate_linear(const ForwardProblem& p, const ForwardBuffers& b);

namespace cpu {

// Runs body(begin, end) over chunks of [0, n) of about `grain` items, possibly in parallel
// (the torch binding passes at::parallel_for). Results never depend on the chunking.
using ParallelFor = std::function<void(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body)>;
void serial_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// The whole forward on host memory. y must already hold x W^T + b (the caller's GEMM).
// Statistics are split over columns, the softmax over rows. With bn.rank_moments, the batch
// statistics are the ranks' (data-parallel step 2).
Status forward_from_y(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn,
                      const ParallelFor& parallel_for = serial_for);

// Data-parallel step 1: this rank's moments record (fused/batchnorm.h, rank_record_size(p.N)
// doubles) of a y the caller computed; the caller exchanges the records, then forward_from_y.
Status column_moments(const ForwardProblem& p, const float* y, int64_t ldy, double* record,
                      const ParallelFor& parallel_for = serial_for);

}  // namespace cpu

namespace cuda {

// Where y and the column partials come from.
enum class GemmPath : int {
  kSm90 = 0,     // CUTLASS sm90 GEMM with the column-statistics epilogue (Hopper, bf16/fp16/tf32)
  kGeneric = 1,  // cuBLASLt GEMM with its bias epilogue, then the generic column-partials kernel (any GPU)
  // Small K, y not kept (keep_y = false): y's tiles recomputed from x and W in each of three passes
  // (column partials; rows' max and sum; out), never written (compute capability >= 8.0). Only
  // when asked for: it saves y's memory but is slower than kSm90 (choose_path, rule 4)
  kRecompute = 2,
};

// True when this build holds the sm90 kernels.
bool sm90_compiled();

// What the path rule reads of a GPU.
struct DeviceProperties {
  int compute_capability_major = 0;
  int multiprocessor_count = 0;
};
// The properties of `device`, queried once per device and cached (no synchronisation, no allocation).
Status device_properties(int device, DeviceProperties* out);

// The path a caller asks for. kAuto reads the environment variable GEMM_BN_SOFTMAX_PATH
// ("auto", "sm90", "generic" or "recompute"; unset or empty = "auto"), then applies the rule.
enum class PathRequest : int { kAuto = 0, kSm90 = 1, kGeneric = 2, kRecompute = 3 };

// The one place that decides the path. A forced path (request or environment) is taken or refused
// with kNotSupported and the reason, never replaced by another. Precision k3xTF32 has one path,
// sm90 (only its kernels implement 3xTF32): where sm90 cannot run, or generic is forced, the call
// is refused with the reason, never run less accurately. Otherwise the automatic rule:
//   1. sm90 needs a build with the sm90 kernels, a GPU of compute capability 9.x, bf16/fp16,
//      tf32 or 3xtf32 (exact fp32, precision "highest", is cuBLASLt's job), and TMA's operand rules: 16-byte
//      aligned x, W and y, K and the row strides of x and W multiples of 16 bytes, N and y's row
//      stride multiples of 4, M, N and K below 2^31;
//   2. tf32 with a tiny batch (M <= kExactFp32MaxBatch) runs the generic path in exact fp32: at
//      such M the GEMM is bound by reading W, so TF32 buys no time, while its rounding, which
//      BatchNorm amplifies at tiny batches, costs accuracy (measured against float64 at M = 2..10:
//      3e-4..3e-2 in TF32, 3e-7..2e-5 in exact fp32);
//   3. grids that 256x128 tiles leave under one wave run the sm90 path's 128x128 ping-pong kernel
//      (2x faster there, level with cuBLAS's GEMM alone), and 128x128 grids that fill at most half
//      the SMs its 128x128 kernel with K split over 2-8 CTAs (sm90::split_k_count), so sm90 wins
//      almost everywhere; the exception is such a half-wave grid with K >= 8192, where cuBLASLt's
//      GEMM plus the statistics pass stayed faster on the GPU at three of the four points measured
//      (H200, CUDA graphs, per call, generic against sm90 with split K: 128 x 8192 x 8192 bf16 53
//      against 59 us, tf32 87 against 93; 2048 x 512 x 8192 bf16 45 against 47, but tf32 78 against
//      68). There the generic path runs; otherwise sm90.
//      At K = 4096 the generic path is faster on the GPU alone in bf16 (1024 x 512 x 4096: 24 against
//      31 us), but its extra launches and cuBLASLt's host work cost more than that in a loop bound by
//      the host, so sm90 stays.
//   4. the recompute path runs only when asked for (request or environment): it never writes y, so
//      it needs no (M, N) fp32 buffer (inference peak memory: out alone), but its three mma.sync
//      tile passes are slower than the sm90 GEMM + softmax (H200, 4096 x 8192, bf16: 0.176 vs
//      0.136 ms at K = 64), so the automatic rule never picks it. It takes y not kept (keep_y =
//      false), K small enough for a 128-row tile's whole K in shared memory (K <= 128 for
//      bf16/fp16, K <= 64 for tf32), compute capability >= 8.0, bf16/fp16 or tf32, 16-byte aligned
//      x and W, and K and the row strides of x and W multiples of 16 bytes; else it is refused with
//      the reason.
// Buffers not allocated yet may be null (x, weight or y, with a row stride of 0): they are taken
// as fresh allocations, 256-byte aligned with dense rows, as any CUDA allocator returns; so a caller
// can ask before allocating anything. Reads no device memory.
constexpr int64_t kExactFp32MaxBatch = 16;
Status choose_path(const ForwardProblem& p, const ForwardBuffers& b, const DeviceProperties& device,
                   PathRequest request, GemmPath* path);

// Whether the forward's softmax takes the BatchNorm map with its shift folded in (ColumnAffine::shift_folded:
// z = a y + c, one coefficient fewer to load per column and row) rather than z = a (y - shift) + c: for
// 16-bit outputs (bf16, fp16), on the paths whose softmax reads the map per row (not the recompute path's
// passes, nor the one-kernel form, which keep the exact map). There the fold's error, at most half an ulp
// of |c - a shift| per logit (detail::folded_map), is about what rounding y to fp32 already costs, and
// far below the output's own rounding. Measured on the H200 (softmax alone, bf16 out): 1024x8192 19.8 ->
// 19.0 us, 4096x8192 61.8 -> 60.5; the op 893.4 -> 885.0 us at 4096x8192x8192 bf16. fp32 outputs (tf32,
// fp32, 3xtf32, autocast) keep the exact map: with it the tf32 headline op was 1 % slower in every round
// and the fp32-out kernel 2 % slower from 4096 rows.
bool folds_logit_shift(const ForwardProblem& p);

// Whether forward() on `path` needs a y buffer although y is not kept (keep_y = false): its steps write y
// and read it back. The recompute path and the sm90 path's one-kernel form (every 64x64 output tile
// resident at once) never write y when it is not kept: they take a null y.
bool forward_needs_y_scratch(const ForwardProblem& p, GemmPath path);

// Device workspace for forward(); 256-byte aligned pointer expected. Each region 256-byte aligned:
//   partials mean + M2   2 * ceil(M / row_tile) * ld floats  (sm90: row_tile 256, or 128 for grids
//                                                            under one wave; ld = round_up(N, 128);
//                                                            generic: row_tile 128, ld = round_up(N, 4))
//   folded a, c          2 * N floats
//   sm90: the GEMM's own (CUTLASS tile-scheduler workspace; 0 for the data-parallel persistent schedule;
//         with split K one fp32 128x128 tile of partial sums per output tile and its counters: about 2 MiB at
//         1024 x 512 x 4096); 3xTF32 always runs the 128x128 tile (row_tile 128). Where forward() runs
//         the one-kernel form, its partials have row_tile 64, and its own region holds each row's (max,
//         sum) per 64-column tile (2 * ceil(N / 64) * M floats); the size is the larger of the two forms',
//         so the same workspace also serves gemm_column_moments
//   generic: the bias in fp32 (N floats) and cuBLASLt's workspace: 1 MiB + room for 8 fp32 copies
//            of y (split-K partial products), at most 32 MiB (what PyTorch gives cuBLAS on Hopper)
// Headline problem (M = 1024, N = 8192): 320 KiB on the sm90 path, 32.6 MiB on the generic path.
// The outputs (out, y, save_mean, save_invstd, row_lse) are the caller's, not part of the workspace.
std::size_t workspace_bytes(const ForwardProblem& p, GemmPath path, bool include_cublaslt_workspace = true);

// The whole forward on the current device, stream-ordered on `stream`, no host synchronisation and
// no allocation: [1] y = x W^T + b and its column partials (sm90: one kernel; generic: cuBLASLt on a
// per-thread, per-device handle, then the partials kernel), [2] finalize, [3] row softmax, which
// also counts the batch in bn.num_batches_tracked (BatchNormArgs::counts_batch).
// `path` usually comes from choose_path(); a path the problem or the GPU cannot take is refused.
// The generic GEMM runs exact fp32 for precision kHighest, and for kTF32 at M <= kExactFp32MaxBatch.
Status forward(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn, GemmPath path,
               void* workspace, std::size_t workspace_size, cudaStream_t stream);

// Data parallelism (nn.SyncBatchNorm's semantics) splits forward() at the statistics exchange:
//   1. gemm_column_moments: [1] on `path`, then this rank's moments record (fused/batchnorm.h,
//      rank_record_size(N) doubles, count = M) in `record`; reads x, weight, bias, writes y;
//   2. the caller gathers every rank's record (one collective) in rank order;
//   3. forward_from_y with bn.rank_moments = the gathered records: [2] and [3] on the y of step 1.
// gemm_column_moments takes workspace_bytes(p, path) bytes, forward_from_y
// forward_from_y_workspace_bytes(p). forward_from_y without rank moments computes the batch
// statistics from y itself (the generic partials kernel).
Status gemm_column_moments(const ForwardProblem& p, const ForwardBuffers& b, GemmPath path, double* record,
                           void* workspace, std::size_t workspace_size, cudaStream_t stream);
std::size_t forward_from_y_workspace_bytes(const ForwardProblem& p);
Status forward_from_y(const ForwardProblem& p, const ForwardBuffers& b, const BatchNormArgs& bn, void* workspace,
                      std::size_t workspace_size, cudaStream_t stream);

}  // namespace cuda
}  // namespace fused
