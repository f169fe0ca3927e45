// The BatchNorm part of the contract (nn.BatchNorm1d's semantics), shared by every path: the partial
// statistics format, the BN arguments, and the folded per-column affine map.
#pragma once

#include "fused/types.h"

namespace fused {

// Per-row-tile column statistics of y, written with plain stores, one slot per
// (row tile, column): deterministic and atomic-free.
//   row tile t covers rows [t*row_tile, min(M, (t+1)*row_tile)); its count follows from M.
//   mean[t*ld + n] = mean of y[rows of t, n]
//   m2  [t*ld + n] = sum over rows of t of (y[i, n] - mean)^2
// Columns n in [N, ld) may hold anything (the sm90 epilogue writes whole column tiles).
struct ColumnStatsPartials {
  float* mean = nullptr;  // (num_row_tiles, ld)
  float* m2 = nullptr;    // (num_row_tiles, ld)
  int64_t num_row_tiles = 0;
  int64_t row_tile = 0;
  int64_t ld = 0;  // >= N
};

// nn.BatchNorm1d's rule, the one definition for the library and the torch binding: batch
// statistics in training, and in eval when there are no running statistics.
FUSED_HOST_DEVICE constexpr bool batch_norm_uses_batch_stats(bool training, bool has_running_stats) {
  return training || !has_running_stats;
}

// nn.BatchNorm1d's other rule: batch statistics over a single row are refused (it has no variance).
FUSED_HOST_DEVICE constexpr bool batch_norm_batch_too_small(int64_t M, bool uses_batch_stats) {
  return uses_batch_stats && M == 1;
}
#define FUSED_BATCH_TOO_SMALL_MESSAGE "Expected more than 1 value per channel when training"

// And torch's batch_norm refuses eps = 0 with batch statistics: a column of zero batch variance would
// get an infinite invstd, on which the exact and the folded BatchNorm maps disagree (NaN against c).
FUSED_HOST_DEVICE constexpr bool batch_norm_eps_zero_refused(double eps, bool uses_batch_stats) {
  return uses_batch_stats && eps == 0.0;
}
#define FUSED_EPS_ZERO_MESSAGE "batch_norm eps must be positive during training (with batch statistics)"

// Data-parallel BatchNorm (nn.SyncBatchNorm's semantics): the statistics of the global batch, spread
// over ranks. Each rank summarises its own rows as one record of rank_record_size(N) doubles,
//   [count, mean[0..N), m2[0..N)]   (m2: sum of squared deviations from the rank's mean),
// the ranks exchange them (the caller's collective, e.g. one all_gather), and every rank merges the
// gathered records in rank order (Chan's formula): the same bits on every rank, whatever the batch
// split, ranks with no rows included. The backward's column sums use the same record layout,
// [count, S1[0..N), S2[0..N)].
FUSED_HOST_DEVICE constexpr int64_t rank_record_size(int64_t N) { return 2 * N + 1; }

// BatchNorm1d arguments. All pointers live in the memory space of the entry point they are
// passed to (device memory for fused::cuda, host memory for fused::cpu). The BN vectors are read
// (and the running statistics written) in their own dtype, `param_dtype` (fp32, or x's dtype for
// a module converted with .to(bf16)); all math is fp32/fp64.
struct BatchNormArgs {
  const void* gamma = nullptr;  // (N) or null: affine=False (gamma = 1)
  const void* beta = nullptr;   // (N) or null: affine=False (beta = 0)
  // Running statistics, (N) each, both or neither. Updated in place when batch statistics are
  // used; read instead of batch statistics in eval mode.
  void* running_mean = nullptr;
  void* running_var = nullptr;
  ElementType param_dtype = ElementType::kFloat32;  // of gamma, beta, running_mean, running_var
  // nn.BatchNorm1d's num_batches_tracked (one int64), or null. When set in training, the forward
  // counts this batch as nn.BatchNorm1d does: it adds 1 to it (on the device: its last kernel does,
  // after every read), and momentum=None averages with the factor 1 / (the count after the increment).
  int64_t* num_batches_tracked = nullptr;
  double momentum = 0.1;  // < 0 means momentum=None: cumulative average, factor 1/num_batches_tracked
  double eps = 1e-5;
  bool training = true;
  const void* scale = nullptr;  // (scale_numel): 1 (scalar) or N (per column)
  int64_t scale_numel = 1;
  ElementType scale_dtype = ElementType::kFloat32;
  // Data-parallel statistics, or null: num_ranks records of rank_record_size(N) doubles, in rank
  // order. When set (and batch statistics are used), the batch statistics are those of all ranks'
  // rows, merged from these records, instead of this call's own rows; the running statistics move
  // with the global count, as nn.SyncBatchNorm's.
  const double* rank_moments = nullptr;
  int64_t num_ranks = 0;

  FUSED_HOST_DEVICE constexpr bool uses_batch_stats() const {
    return batch_norm_uses_batch_stats(training, running_mean != nullptr);
  }
  FUSED_HOST_DEVICE constexpr bool updates_running_stats() const { return uses_batch_stats() && running_mean != nullptr; }
  // Whether the forward adds this batch to *num_batches_tracked; the counter it adds to, or null.
  FUSED_HOST_DEVICE constexpr bool counts_batch() const { return training && num_batches_tracked != nullptr; }
  FUSED_HOST_DEVICE constexpr int64_t* batch_counter() const { return counts_batch() ? num_batches_tracked : nullptr; }
};

// The per-column map that BatchNorm + scale fold into:  z[i, n] = a[n] * (y[i, n] - shift[n]) + c[n]
//   shift = mean (batch or running),  a = scale * gamma * invstd,  c = scale * beta.
// Subtracting the mean before scaling keeps z exact when |mean| >> std.
// With shift_folded, finalize writes the map with its shift folded in, z = a[n] * y[i, n] + c[n]
// (detail::folded_map), and the softmax loads two coefficients a column instead of three; shift
// still receives the saved mean, which the softmax then does not read. The forward folds for 16-bit
// outputs (cuda::folds_logit_shift).
struct ColumnAffine {
  float* shift = nullptr;  // (N); the saved mean
  float* a = nullptr;      // (N)
  float* c = nullptr;      // (N)
  bool shift_folded = false;
};

}  // namespace fused
