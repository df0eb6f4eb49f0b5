// Fitting integers seen at several sizes as polynomials of the symbols
// (size_fit.h).
#include "graph/size_fit.h"

#include <torchcap/error.h>

#include <algorithm>
#include <cmath>

namespace torchcap::detail {
namespace {


// Monomials of degree 0 to 2 in `k` symbols: 1, s_i, s_i*s_j (i <= j).
std::vector<Monomial> monomials(size_t k) {
  std::vector<Monomial> out = {Monomial{}};
  for (size_t i = 0; i < k; ++i) out.push_back(Monomial{static_cast<uint8_t>(i)});
  for (size_t i = 0; i < k; ++i) {
    for (size_t j = i; j < k; ++j) out.push_back(Monomial{static_cast<uint8_t>(i), static_cast<uint8_t>(j)});
  }
  return out;
}

long double monomial_at(const Monomial& m, const SizePoint& p) {
  long double v = 1;
  for (uint8_t s : m) v *= static_cast<long double>(p[s]);
  return v;
}

// Rank of the rows (design rows of the points) by Gaussian elimination.
size_t rank_of(std::vector<std::vector<long double>> rows) {
  size_t rank = 0;
  const size_t cols = rows.empty() ? 0 : rows[0].size();
  for (size_t c = 0; c < cols && rank < rows.size(); ++c) {
    size_t pivot = rank;
    for (size_t r = rank; r < rows.size(); ++r) {
      if (std::fabs(rows[r][c]) > std::fabs(rows[pivot][c])) pivot = r;
    }
    if (std::fabs(rows[pivot][c]) < 1e-9L) continue;
    std::swap(rows[pivot], rows[rank]);
    for (size_t r = 0; r < rows.size(); ++r) {
      if (r == rank) continue;
      long double f = rows[r][c] / rows[rank][c];
      for (size_t k = c; k < cols; ++k) rows[r][k] -= f * rows[rank][k];
    }
    ++rank;
  }
  return rank;
}

}  // namespace

SizeDesign design_sizes(const std::vector<std::vector<int64_t>>& values) {
  SizeDesign d;
  d.terms = monomials(values.size());
  const size_t needed = d.terms.size();
  // Candidate points in order of the sum of their value indices, so the
  // traces stay near the first one's sizes.
  std::vector<std::vector<size_t>> candidates;
  std::vector<size_t> index(values.size(), 0);
  for (;;) {
    candidates.push_back(index);
    size_t s = 0;
    while (s < index.size() && ++index[s] == values[s].size()) index[s++] = 0;
    if (s == index.size()) break;
  }
  auto weight = [](const std::vector<size_t>& c) {
    size_t w = 0;
    for (size_t i : c) w += i;
    return w;
  };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const auto& a, const auto& b) { return weight(a) < weight(b); });
  std::vector<std::vector<long double>> rows;
  for (const std::vector<size_t>& c : candidates) {
    SizePoint p(values.size());
    for (size_t s = 0; s < values.size(); ++s) p[s] = values[s][c[s]];
    std::vector<long double> row;
    for (const Monomial& m : d.terms) row.push_back(monomial_at(m, p));
    rows.push_back(row);
    if (rows.size() == 1 || rank_of(rows) == d.basis.size() + 1) {
      d.basis.push_back(d.points.size());
      d.points.push_back(std::move(p));
    } else {
      rows.pop_back();
      d.points.push_back(std::move(p));
    }
    if (d.basis.size() == needed) break;
  }
  // Keep the basis and two checks beyond it.
  std::vector<SizePoint> kept;
  std::vector<size_t> basis;
  for (size_t i : d.basis) {
    basis.push_back(kept.size());
    kept.push_back(d.points[i]);
  }
  size_t checks = 0;
  for (size_t i = 0; i < d.points.size() && checks < 2; ++i) {
    if (std::find(d.basis.begin(), d.basis.end(), i) == d.basis.end()) {
      kept.push_back(d.points[i]);
      ++checks;
    }
  }
  for (size_t c = d.points.size(); c < candidates.size() && checks < 2; ++c) {
    SizePoint p(values.size());
    for (size_t s = 0; s < values.size(); ++s) p[s] = values[s][candidates[c][s]];
    kept.push_back(std::move(p));
    ++checks;
  }
  d.points = std::move(kept);
  d.basis = std::move(basis);
  if (d.basis.size() < needed || checks < 1) {
    throw TraceError("dynamic shapes: the dimensions' ranges leave too few sizes to trace at; give "
                     "each dynamic dimension a range of at least 4 sizes of 2 or more");
  }
  return d;
}

std::optional<SizeExpr> fit_sizes(const SizeDesign& d, const std::vector<int64_t>& v) {
  const size_t n = d.terms.size();
  std::vector<std::vector<long double>> a(n, std::vector<long double>(n + 1));
  for (size_t r = 0; r < n; ++r) {
    const SizePoint& p = d.points[d.basis[r]];
    for (size_t c = 0; c < n; ++c) a[r][c] = monomial_at(d.terms[c], p);
    a[r][n] = static_cast<long double>(v[d.basis[r]]);
  }
  for (size_t c = 0; c < n; ++c) {
    size_t pivot = c;
    for (size_t r = c; r < n; ++r) {
      if (std::fabs(a[r][c]) > std::fabs(a[pivot][c])) pivot = r;
    }
    if (std::fabs(a[pivot][c]) < 1e-12L) return std::nullopt;
    std::swap(a[pivot], a[c]);
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      long double f = a[r][c] / a[c][c];
      for (size_t k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  std::vector<SizeExpr::Term> terms;
  for (size_t c = 0; c < n; ++c) {
    long double coefficient = std::round(a[c][n] / a[c][c]);
    if (std::fabs(coefficient) > 9.0e18L) return std::nullopt;
    terms.push_back(SizeExpr::Term{static_cast<int64_t>(coefficient), d.terms[c]});
  }
  SizeExpr e = SizeExpr::of_terms(std::move(terms));
  try {
    for (size_t j = 0; j < d.points.size(); ++j) {
      if (e.evaluate(d.points[j]) != v[j]) return std::nullopt;
    }
  } catch (const Error&) {
    return std::nullopt;
  }
  return e;
}

std::vector<std::vector<int64_t>> candidate_sizes(const std::vector<Symbol>& symbols,
                                                  const std::vector<int64_t>& first) {
  std::vector<std::vector<int64_t>> values;
  for (size_t s = 0; s < symbols.size(); ++s) {
    const Symbol& sym = symbols[s];
    const int64_t lo = std::max<int64_t>(sym.min, 2);
    std::vector<int64_t> v;
    if (s < first.size() && first[s] >= lo && first[s] <= sym.max) v.push_back(first[s]);
    for (int64_t x = lo; v.size() < 5 && x <= sym.max; ++x) {
      if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
    }
    if (v.size() < 4) {
      throw TraceError("dynamic shapes: " + sym.label + "'s range [" + std::to_string(sym.min) + ", " +
                       std::to_string(sym.max) + "] has fewer than 4 sizes of 2 or more to trace at; "
                       "widen it, or trace each size as a graph of its own");
    }
    values.push_back(std::move(v));
  }
  return values;
}

}  // namespace torchcap::detail
