// The backward (fused/backward.h) on host memory, in double precision: row pass -> column sums ->
// column finalize -> dy. Shares the per-column math with the CUDA kernels; recomputes the softmax
// from y and the row log-normaliser like them, each row divided by its own sum.
#include <algorithm>
#include <cmath>
#include <vector>

#include "fused/backward.h"
#include "fused/detail/bn_math.h"
#include "fused/detail/half_bits.h"

namespace fused::cpu {
namespace {

// Columns [n0, n1) of one row of an (M, N) matrix of any ElementType, widened to double.
void load_row(const void* base, ElementType t, int64_t ld, int64_t row, int64_t n0, int64_t n1, double* dst) {
  for (int64_t n = n0; n < n1; ++n) dst[n - n0] = half_bits::load_double(base, t, row * ld + n);
}

// Per row, what kRowSumsRows (fused/backward.h) holds: sum_n g * out and sum_n out.
struct RowSums {
  std::vector<double> dot, out_sum;
  explicit RowSums(int64_t M) : dot(static_cast<size_t>(M), 0.0), out_sum(static_cast<size_t>(M), 0.0) {}

  // (2, M) as fused/backward.h lays them out, M being this object's size
  void load(const double* given) {
    const size_t M = dot.size();
    dot.assign(given, given + M);
    out_sum.assign(given + M, given + 2 * M);
  }
  void store(double* dst) const {
    std::copy(dot.begin(), dot.end(), dst);
    std::copy(out_sum.begin(), out_sum.end(), dst + dot.size());
  }
};

// Per row: what each recomputed out is multiplied by and the softmax backward's r_i (detail::row_norm).
using RowNorms = std::vector<detail::RowNorm<double>>;
RowNorms row_norms(const RowSums& s) {
  RowNorms norms(s.dot.size());
  for (size_t i = 0; i < norms.size(); ++i) norms[i] = detail::row_norm(s.dot[i], s.out_sum[i]);
  return norms;
}

// The steps' shared view of the problem: per-column constants and a row reader.
class Rows {
 public:
  Rows(const BackwardProblem& p, const BackwardBuffers& b) : p_(p), b_(b), col_(static_cast<size_t>(p.N)) {
    for (int64_t n = 0; n < p.N; ++n) col_[n] = detail::backward_column(n, p, b);
  }
  const BackwardProblem& p() const { return p_; }

  // Calls body(n, g, out, xhat) for columns [n0, n1) of row i, out recomputed and multiplied by
  // `normaliser`.
  template <class Body>
  void for_row_chunk(int64_t i, int64_t n0, int64_t n1, double normaliser, Body&& body) const {
    const int64_t w = n1 - n0;
    std::vector<double> g(static_cast<size_t>(w)), y(static_cast<size_t>(w));
    load_row(b_.grad_out, p_.grad_dtype, b_.ldg, i, n0, n1, g.data());
    load_row(b_.y, p_.stats_dtype, b_.ldy, i, n0, n1, y.data());
    const double lse = half_bits::load_double(b_.row_lse, p_.stats_dtype, i);
    for (int64_t n = n0; n < n1; ++n) {
      const detail::BackwardColumn& k = col_[n];
      const double centered = y[n - n0] - k.shift;
      body(n, g[n - n0], std::exp(k.a * centered + k.c - lse) * normaliser, centered * k.invstd);
    }
  }

  // [B1] sum_n g * out and sum_n out of every row
  RowSums row_sums(const ParallelFor& parallel_for) const {
    RowSums sums(p_.M);
    parallel_for(p_.M, std::max<int64_t>(1, 16384 / p_.N), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        double dot = 0.0, out_sum = 0.0;
        for_row_chunk(i, 0, p_.N, 1.0, [&](int64_t, double g, double out, double) {
          dot += g * out;
          out_sum += out;
        });
        sums.dot[i] = dot;
        sums.out_sum[i] = out_sum;
      }
    });
    return sums;
  }

  // [B2] S1 and S2 of every column over all rows (each column in row order: any column split gives
  // the same bits).
  void column_sums(const RowNorms& norms, std::vector<double>& s1, std::vector<double>& s2,
                   const ParallelFor& parallel_for) const {
    s1.assign(static_cast<size_t>(p_.N), 0.0);
    s2.assign(static_cast<size_t>(p_.N), 0.0);
    parallel_for(p_.N, 256, [&](int64_t n0, int64_t n1) {
      for (int64_t i = 0; i < p_.M; ++i) {
        for_row_chunk(i, n0, n1, norms[i].normaliser, [&](int64_t n, double g, double out, double xhat) {
          const double dz = out * (g - norms[i].r);
          s1[n] += dz;
          s2[n] += dz * xhat;
        });
      }
    });
  }

 private:
  const BackwardProblem& p_;
  const BackwardBuffers& b_;
  std::vector<detail::BackwardColumn> col_;
};

}  // namespace

Status backward_column_sums(const BackwardProblem& p, const BackwardBuffers& b, double* sums, double* row_sums,
                            const ParallelFor& parallel_for) {
  if (Status s = validate(p, b); !s.ok()) return s;
  const bool given = b.row_sums != nullptr;
  if (sums == nullptr || (p.M > 0 && row_sums == nullptr && !given))
    return {StatusCode::kInvalidArgument, "backward_column_sums: sums and row_sums (or a given b.row_sums) are required"};
  const int64_t M = p.M, N = p.N;
  sums[0] = static_cast<double>(M);
  RowSums row(M);
  std::vector<double> s1(static_cast<size_t>(N), 0.0), s2(static_cast<size_t>(N), 0.0);
  if (given) row.load(b.row_sums);
  if (N > 0) {
    const Rows rows(p, b);
    if (!given) row = rows.row_sums(parallel_for);
    rows.column_sums(row_norms(row), s1, s2, parallel_for);
  }
  for (int64_t n = 0; n < N; ++n) {
    sums[1 + n] = s1[n];
    sums[1 + N + n] = s2[n];
  }
  if (row_sums != nullptr) row.store(row_sums);
  return Status::Ok();
}

Status backward(const BackwardProblem& p, const BackwardBuffers& b, const ParallelFor& parallel_for) {
  if (Status s = validate(p, b); !s.ok()) return s;
  const int64_t M = p.M, N = p.N;
  if (N == 0) {  // no columns: a scalar scale's gradient is a sum over none
    if (b.grad_scale != nullptr && b.scale_numel == 1) half_bits::store_double(b.grad_scale, b.scale_dtype, 0, 0.0);
    return Status::Ok();
  }
  const Rows rows(p, b);

  // [B1], [B2]: computed here, or (data parallel) given by backward_column_sums and the exchange.
  RowSums row(M);
  std::vector<double> s1, s2;
  const bool data_parallel = b.rank_sums != nullptr;
  if (data_parallel) {
    row.load(b.row_sums);
  } else {
    row = rows.row_sums(parallel_for);
  }
  const RowNorms norms = row_norms(row);
  if (!data_parallel) rows.column_sums(norms, s1, s2, parallel_for);

  // [B3] the per-column finalize
  std::vector<detail::ColumnGrad> coef(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    if (data_parallel) {
      const detail::ColumnSums local{b.local_sums[0], b.local_sums[1 + n], b.local_sums[1 + N + n]};
      coef[n] = detail::finalize_column_grad(n, local, detail::sum_rank_records(b.rank_sums, b.num_ranks, N, n), p, b);
    } else {
      const detail::ColumnSums sums{static_cast<double>(M), s1[n], s2[n]};
      coef[n] = detail::finalize_column_grad(n, sums, sums, p, b);
    }
  }
  if (b.grad_scale != nullptr && b.scale_numel == 1) {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += coef[n].d_scale_term;
    half_bits::store_double(b.grad_scale, b.scale_dtype, 0, sum);
  }

  // [B4] dy = a dz + b xhat + c, and/or its transpose
  if (b.dy == nullptr && b.dy_t == nullptr) return Status::Ok();
  parallel_for(M, std::max<int64_t>(1, 16384 / N), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      rows.for_row_chunk(i, 0, N, norms[i].normaliser, [&](int64_t n, double g, double out, double xhat) {
        const double dy = coef[n].a * (out * (g - norms[i].r)) + coef[n].b * xhat + coef[n].c;
        if (b.dy != nullptr) half_bits::store_double(b.dy, b.dy_dtype, i * b.lddy + n, dy);
        if (b.dy_t != nullptr) half_bits::store_double(b.dy_t, b.dy_dtype, n * b.lddy_t + i, dy);
      });
    }
  });
  return Status::Ok();
}

}  // namespace fused::cpu
