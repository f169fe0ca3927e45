// The backward (fused/backward.h) on host memory, in double precision: row pass -> column sums ->
// column finalize -> dy. Shares the per-column math with the CUDA kernels; recomputes the softmax
// from y and the row log-normaliser like them.
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

}  // namespace

Status backward(const BackwardProblem& p, const BackwardBuffers& b, const ParallelFor& parallel_for) {
  if (Status s = validate(p, b); !s.ok()) return s;
  const int64_t M = p.M, N = p.N;
  if (N == 0) return Status::Ok();
  std::vector<detail::BackwardColumn> col(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) col[n] = detail::backward_column(n, p, b);

  // Calls body(n, g, out, xhat) for columns [n0, n1) of row i.
  auto for_row_chunk = [&](int64_t i, int64_t n0, int64_t n1, auto&& body) {
    const int64_t w = n1 - n0;
    std::vector<double> g(static_cast<size_t>(w)), y(static_cast<size_t>(w));
    load_row(b.grad_out, p.grad_dtype, b.ldg, i, n0, n1, g.data());
    load_row(b.y, p.stats_dtype, b.ldy, i, n0, n1, y.data());
    const double lse = half_bits::load_double(b.row_lse, p.stats_dtype, i);
    for (int64_t n = n0; n < n1; ++n) {
      const detail::BackwardColumn& k = col[n];
      const double centered = y[n - n0] - k.shift;
      body(n, g[n - n0], std::exp(k.a * centered + k.c - lse), centered * k.invstd);
    }
  };

  // [B1] r_i = sum_n g * out
  std::vector<double> r(static_cast<size_t>(M));
  parallel_for(M, std::max<int64_t>(1, 16384 / N), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      double acc = 0.0;
      for_row_chunk(i, 0, N, [&](int64_t, double g, double out, double) { acc += g * out; });
      r[i] = acc;
    }
  });

  // [B2] + [B3] column sums over all rows (each column in row order: any column split gives the
  // same bits), then the per-column finalize.
  std::vector<detail::ColumnGrad> coef(static_cast<size_t>(N));
  parallel_for(N, 256, [&](int64_t n0, int64_t n1) {
    std::vector<double> s1(static_cast<size_t>(n1 - n0)), s2(static_cast<size_t>(n1 - n0));
    for (int64_t i = 0; i < M; ++i) {
      for_row_chunk(i, n0, n1, [&](int64_t n, double g, double out, double xhat) {
        const double dz = out * (g - r[i]);
        s1[n - n0] += dz;
        s2[n - n0] += dz * xhat;
      });
    }
    for (int64_t n = n0; n < n1; ++n) coef[n] = detail::finalize_column_grad(n, s1[n - n0], s2[n - n0], p, b);
  });
  if (b.grad_scale != nullptr && b.scale_numel == 1) {
    double sum = 0.0;
    for (int64_t n = 0; n < N; ++n) sum += coef[n].d_scale_term;
    half_bits::store_double(b.grad_scale, b.scale_dtype, 0, sum);
  }

  // [B4] dy = a dz + b xhat + c, and/or its transpose
  if (b.dy == nullptr && b.dy_t == nullptr) return Status::Ok();
  parallel_for(M, std::max<int64_t>(1, 16384 / N), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      for_row_chunk(i, 0, N, [&](int64_t n, double g, double out, double xhat) {
        const double dy = coef[n].a * (out * (g - r[i])) + coef[n].b * xhat + coef[n].c;
        if (b.dy != nullptr) half_bits::store_double(b.dy, b.dy_dtype, i * b.lddy + n, dy);
        if (b.dy_t != nullptr) half_bits::store_double(b.dy_t, b.dy_dtype, n * b.lddy_t + i, dy);
      });
    }
  });
  return Status::Ok();
}

}  // namespace fused::cpu
