// Scalar math shared by the CPU implementation and the CUDA kernels, so that both paths
// compute the contract with one definition (host + device inline functions).
#pragma once

#include <cmath>
#include <cstdint>

#include "fused/backward.h"
#include "fused/batchnorm.h"
#include "fused/detail/half_bits.h"

namespace fused::detail {

// Running (count, mean, M2) of one column, merged in double precision.
struct MeanM2 {
  double n = 0.0;
  double mean = 0.0;
  double m2 = 0.0;
};

// Rows in row tile t of an M-row problem.
FUSED_HD int64_t row_tile_count(int64_t M, int64_t row_tile, int64_t t) {
  const int64_t rest = M - t * row_tile;
  return rest < row_tile ? rest : row_tile;
}

// Chan et al.'s parallel update: merges (nb, mean_b, m2_b) into acc. Exact in exact
// arithmetic and stable when |mean| >> std, unlike sum(y^2) - sum(y)^2 / n.
FUSED_HD void chan_merge(MeanM2& acc, double nb, double mean_b, double m2_b) {
  if (nb <= 0.0) return;
  const double n = acc.n + nb;
  const double delta = mean_b - acc.mean;
  acc.mean += delta * (nb / n);
  acc.m2 += m2_b + delta * delta * (acc.n * nb / n);
  acc.n = n;
}

// The merge of a column's partials over its row tiles, in two passes over the tiles in order: the
// mean as the count-weighted sum of the tiles' means over the count (one division), then
//   M2 = sum_t m2_t + n_t (mean_t - mean)^2,
// an exact identity whose terms are all non-negative (no cancellation), in double precision like
// Chan's pairwise update (chan_merge), which costs two divisions a tile (slow in double on a GPU).
// Each pass covers tiles [t_begin, t_end), so that several threads can share one column's tiles and
// add their parts in a fixed order (the one-kernel forward); merge_column_partials runs both over all
// tiles. A pass loads kBatch tiles at a time, then adds them in order: on the GPU a batch's loads are
// in flight together (one load per step made finalize wait on L2 once per row tile: 22 us at M = 4096
// on the H200); the second pass finds the means in L1.
struct PartialsSum {
  double n = 0.0;         // rows
  double weighted = 0.0;  // sum of rows * tile mean
};

FUSED_HD PartialsSum partials_weighted_sum(const ColumnStatsPartials& p, int64_t M, int64_t col, int64_t t_begin,
                                           int64_t t_end) {
  constexpr int kBatch = 8;
  PartialsSum sum;
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kBatch) {
    float mean[kBatch];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kBatch; ++j) mean[j] = t0 + j < t_end ? p.mean[(t0 + j) * p.ld + col] : 0.f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kBatch; ++j) {
      const int64_t nt = t0 + j < t_end ? row_tile_count(M, p.row_tile, t0 + j) : 0;
      if (nt <= 0) continue;  // a caller may pass more tiles than M fills
      sum.n += static_cast<double>(nt);
      sum.weighted += static_cast<double>(nt) * mean[j];
    }
  }
  return sum;
}

FUSED_HD double partials_m2_about(const ColumnStatsPartials& p, int64_t M, int64_t col, double mean, int64_t t_begin,
                                  int64_t t_end) {
  constexpr int kBatch = 8;
  double m2_sum = 0.0;
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kBatch) {
    float tile_mean[kBatch], m2[kBatch];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kBatch; ++j) {
      const bool in = t0 + j < t_end;
      tile_mean[j] = in ? p.mean[(t0 + j) * p.ld + col] : 0.f;
      m2[j] = in ? p.m2[(t0 + j) * p.ld + col] : 0.f;
    }
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < kBatch; ++j) {
      const int64_t nt = t0 + j < t_end ? row_tile_count(M, p.row_tile, t0 + j) : 0;
      if (nt <= 0) continue;
      const double d = static_cast<double>(tile_mean[j]) - mean;
      m2_sum += static_cast<double>(m2[j]) + static_cast<double>(nt) * d * d;
    }
  }
  return m2_sum;
}

// Column `col`'s (count, mean, M2) over all its row tiles (fixed order: deterministic).
FUSED_HD MeanM2 merge_column_partials(const ColumnStatsPartials& p, int64_t M, int64_t col) {
  const PartialsSum sum = partials_weighted_sum(p, M, col, 0, p.num_row_tiles);
  MeanM2 acc;
  if (sum.n <= 0.0) return acc;
  acc.n = sum.n;
  acc.mean = sum.weighted / sum.n;
  acc.m2 = partials_m2_about(p, M, col, acc.mean, 0, p.num_row_tiles);
  return acc;
}

// Merges column `col` of the ranks' moment records ([count, mean[N], m2[N]] each) in rank order.
FUSED_HD MeanM2 merge_rank_moments(const double* records, int64_t num_ranks, int64_t N, int64_t col) {
  MeanM2 acc;
  for (int64_t r = 0; r < num_ranks; ++r) {
    const double* rec = records + r * rank_record_size(N);
    chan_merge(acc, rec[0], rec[1 + col], rec[1 + N + col]);
  }
  return acc;
}

// The batch statistics of column `col`: every rank's (bn.rank_moments) or this call's row tiles.
FUSED_HD MeanM2 batch_moments(const ColumnStatsPartials& p, int64_t M, int64_t N, const BatchNormArgs& bn,
                              int64_t col) {
  if (bn.rank_moments != nullptr) return merge_rank_moments(bn.rank_moments, bn.num_ranks, N, col);
  return merge_column_partials(p, M, col);
}

// Momentum applied to the running statistics (nn.BatchNorm1d's exponential_average_factor): with
// momentum=None, 1 / the count including this batch (the counter itself moves after every read).
FUSED_HD double running_stat_factor(const BatchNormArgs& bn) {
  return bn.momentum < 0.0 ? 1.0 / (static_cast<double>(*bn.num_batches_tracked) + 1.0) : bn.momentum;
}

// The statistics a column is normalised with, and the folded map z = a (y - shift) + c.
struct ColumnMap {
  float shift = 0.f, a = 0.f, c = 0.f, invstd = 0.f;
  double var = 0.0;  // the variance normalised with
};

// Column `col`'s map, without side effects: batch statistics (batch.n rows: this call's, or all
// ranks' with bn.rank_moments) or the running ones, by nn.BatchNorm1d's rule. Reads the running
// statistics only when it normalises with them (eval), so a caller may compute it concurrently with
// update_running_stats on the same column in training.
FUSED_HD ColumnMap column_map(int64_t col, const MeanM2& batch, const BatchNormArgs& bn) {
  using half_bits::load;
  const ElementType pt = bn.param_dtype;
  double mean, var;
  if (bn.uses_batch_stats()) {
    mean = batch.mean;
    var = batch.n > 0.0 ? batch.m2 / batch.n : 0.0;
  } else {
    mean = load(bn.running_mean, pt, col);
    var = load(bn.running_var, pt, col);
  }
  const double invstd = 1.0 / sqrt(var + bn.eps);
  const double s = load(bn.scale, bn.scale_dtype, bn.scale_numel == 1 ? 0 : col);
  const double g = bn.gamma != nullptr ? static_cast<double>(load(bn.gamma, pt, col)) : 1.0;
  const double b = bn.beta != nullptr ? static_cast<double>(load(bn.beta, pt, col)) : 0.0;
  ColumnMap m;
  m.shift = static_cast<float>(mean);
  m.a = static_cast<float>(s * g * invstd);
  m.c = static_cast<float>(s * b);
  m.invstd = static_cast<float>(invstd);
  m.var = var;
  return m;
}

// Moves column `col`'s running statistics towards the batch's (biased variance for normalisation,
// unbiased M/(M-1) for the running estimate, as PyTorch), where batch statistics are used and running
// statistics exist; an empty batch leaves them alone (as eager). Exactly once per column and call.
FUSED_HD void update_running_stats(int64_t col, const MeanM2& batch, const BatchNormArgs& bn) {
  using half_bits::load;
  if (!bn.updates_running_stats() || batch.n <= 0.0) return;
  const ElementType pt = bn.param_dtype;
  const double n = batch.n;
  const double var = batch.m2 / n;
  const double f = running_stat_factor(bn);
  const double unbiased = n > 1.0 ? var * n / (n - 1.0) : var;
  half_bits::store(bn.running_mean, pt, col, static_cast<float>((1.0 - f) * load(bn.running_mean, pt, col) + f * batch.mean));
  half_bits::store(bn.running_var, pt, col, static_cast<float>((1.0 - f) * load(bn.running_var, pt, col) + f * unbiased));
}

// A column's map with its shift folded in, z = a' y + c' (ColumnAffine::shift_folded): a' = a and
// c' = c - a * shift from the map's floats, in double (exact but for one rounding in the sum), rounded
// once to float. Against z = a (y - shift) + c it adds at most half an ulp of |c'| to every logit of
// the column: about what rounding y to fp32 already costs a logit (|a y| 2^-24, y ~ shift), and far
// below a 16-bit output's rounding. NaN and inf propagate as through the exact map (a NaN or infinite
// shift, c or y). Columns of zero batch variance stay exact: y - shift is exactly 0 in every row there,
// so the exact map gives z = c, which a' = 0 keeps (the fold would put 2^-24 |a shift| on each logit, a
// being s gamma / sqrt(eps) there). Only a map no float fold can hold gives NaN in the whole column
// (its rows' softmax NaN), where the exact map's logits are infinite or beyond fp32 in part: a = +-inf,
// or |c - a shift| > FLT_MAX with everything finite. Both need |scale * gamma| above about 1e26 (a
// column with variance has |shift| / std at most about 2^24 sqrt(M)).
struct FoldedMap {
  float a = 0.f, c = 0.f;
};
FUSED_HD FoldedMap folded_map(const ColumnMap& m, bool batch_statistics) {
  constexpr float kMax = 3.40282347e38f;
  if (batch_statistics && m.var == 0.0) return {0.f, m.c};  // (a zero running variance says nothing of y)
  if (fabsf(m.a) > kMax) return {NAN, NAN};  // +-inf; a NaN a folds to NaN below as it is
  const double folded = static_cast<double>(m.c) - static_cast<double>(m.a) * static_cast<double>(m.shift);
  const bool overflows = fabs(folded) > kMax && fabsf(m.shift) <= kMax && fabsf(m.c) <= kMax;
  return overflows ? FoldedMap{NAN, NAN} : FoldedMap{m.a, static_cast<float>(folded)};
}

// Finalizes column `col`: the running-statistics update, the saved invstd and the folded affine map
// (with its shift folded in too where out.shift_folded). The count is the batch's (batch.n: this
// call's rows, or all ranks' with bn.rank_moments).
FUSED_HD void finalize_column(int64_t col, const MeanM2& batch, const BatchNormArgs& bn, float* save_invstd,
                              const ColumnAffine& out) {
  const ColumnMap m = column_map(col, batch, bn);  // before the update: eval reads the running statistics
  update_running_stats(col, batch, bn);
  out.shift[col] = m.shift;
  if (out.shift_folded) {
    const FoldedMap f = folded_map(m, bn.uses_batch_stats());
    out.a[col] = f.a;
    out.c[col] = f.c;
  } else {
    out.a[col] = m.a;
    out.c[col] = m.c;
  }
  save_invstd[col] = m.invstd;
}

// The softmax logit of one element: z = a * (y - shift) + c.
FUSED_HD float bn_logit(float y, float shift, float a, float c) { return fmaf(a, y - shift, c); }

// log sum_n exp(z_n) of a row from its max and sum_n exp(z_n - max).
FUSED_HD float log_normaliser(float row_max, float sum_exp) { return row_max + logf(sum_exp); }

// ---- backward (fused/backward.h) ----

// The softmax backward of one element: dz = out * (g - r), r = sum over the row of g * out.
template <class T>
FUSED_HD T softmax_grad(T out, T g, T r) {
  return out * (g - r);
}

// A row's constants for the softmax backward, from its row sums (fused/backward.h, kRowSumsRows):
// what each recomputed out of the row is multiplied by, 1 / sum_n out (or 1 where that sum is 0 or not
// finite: N = 0, or a row whose logits are not finite, whose NaN then comes through the dot), and
// r = sum_n g * out / sum_n out, the normalised row's sum of g * out.
template <class T>
struct RowNorm {
  T normaliser, r;
};
template <class T>
FUSED_HD RowNorm<T> row_norm(T dot, T out_sum) {
  const T normaliser = out_sum > T(0) && out_sum < T(INFINITY) ? T(1) / out_sum : T(1);
  return {normaliser, dot * normaliser};
}

// The normalised value the forward computed: xhat = (y - mean) * invstd.
FUSED_HD float bn_xhat(float y, float mean, float invstd) { return (y - mean) * invstd; }

// The forward's softmax output, recomputed from its logit and the row's log-normaliser.
FUSED_HD float softmax_from_logit(float z, float row_lse) { return expf(z - row_lse); }

// One column's parameters as the backward sees them: the saved statistics, scale, gamma, beta, and
// the softmax logit's map z = a (y - shift) + c (the forward's, up to the rounding of the saved invstd).
struct BackwardColumn {
  double shift = 0.0, invstd = 0.0, s = 1.0, gamma = 1.0, beta = 0.0, a = 0.0, c = 0.0;
};

FUSED_HD BackwardColumn backward_column(int64_t col, const BackwardProblem& p, const BackwardBuffers& b) {
  using half_bits::load_double;
  BackwardColumn k;
  k.shift = load_double(b.save_mean, p.stats_dtype, col);
  k.invstd = load_double(b.save_invstd, p.stats_dtype, col);
  k.s = load_double(b.scale, b.scale_dtype, b.scale_numel == 1 ? 0 : col);
  if (b.gamma != nullptr) {
    k.gamma = load_double(b.gamma, b.param_dtype, col);
    k.beta = load_double(b.beta, b.param_dtype, col);
  }
  k.a = k.s * k.gamma * k.invstd;  // as finalize_column folds them in the forward
  k.c = k.s * k.beta;
  return k;
}

// One column's share of the backward: dy = a * dz + b * xhat + c, and the column's term of a
// scalar scale's gradient (sum over columns of gamma S2 + beta S1).
struct ColumnGrad {
  double a = 0.0, b = 0.0, c = 0.0;
  double d_scale_term = 0.0;
};

// One column's sums over rows: S1 = sum_i dz, S2 = sum_i dz * xhat, over `count` rows.
struct ColumnSums {
  double count = 0.0, s1 = 0.0, s2 = 0.0;
};

// Column `col` of the ranks' column-sums records ([count, S1[N], S2[N]] each), added in rank order.
FUSED_HD ColumnSums sum_rank_records(const double* records, int64_t num_ranks, int64_t N, int64_t col) {
  ColumnSums acc;
  for (int64_t r = 0; r < num_ranks; ++r) {
    const double* rec = records + r * rank_record_size(N);
    acc.count += rec[0];
    acc.s1 += rec[1 + col];
    acc.s2 += rec[1 + N + col];
  }
  return acc;
}

// Finalizes column `col`: stores d_gamma, d_beta, d_bias and (per-column scale) d_scale from this
// call's sums `local`, where the buffers ask for them, and returns the dy coefficients, which
// normalise over the whole batch (`global`: the same as `local` on one device; every rank's under
// data parallelism).
FUSED_HD ColumnGrad finalize_column_grad(int64_t col, const ColumnSums& local, const ColumnSums& global,
                                         const BackwardProblem& p, const BackwardBuffers& b) {
  using half_bits::store_double;
  const BackwardColumn k = backward_column(col, p, b);
  const double s1 = local.s1, s2 = local.s2;
  ColumnGrad g;
  g.d_scale_term = k.gamma * s2 + k.beta * s1;
  g.a = k.a;
  if (p.batch_stats && global.count > 0.0) {
    g.b = -g.a * global.s2 / global.count;
    g.c = -g.a * global.s1 / global.count;
  }
  if (b.grad_gamma != nullptr) store_double(b.grad_gamma, b.param_dtype, col, k.s * s2);
  if (b.grad_beta != nullptr) store_double(b.grad_beta, b.param_dtype, col, k.s * s1);
  // sum_i dy = a S1 + b sum_i xhat + M c, and sum_i xhat = 0 for batch statistics: exactly 0.
  if (b.grad_bias != nullptr) store_double(b.grad_bias, b.bias_dtype, col, p.batch_stats ? 0.0 : g.a * s1);
  if (b.grad_scale != nullptr && b.scale_numel != 1) store_double(b.grad_scale, b.scale_dtype, col, g.d_scale_term);
  return g;
}

}  // namespace fused::detail
