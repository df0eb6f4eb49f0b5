// Fitting integers seen at several sizes as polynomials of the symbols: the
// sizes to sample at and the exact fit (Note [Dynamic shapes by aligned
// traces] in src/trace/dynamic.cpp; symbolic shape propagation in
// src/passes/shape_propagation.cpp). Internal.
#pragma once

#include <torchcap/graph_module.h>
#include <torchcap/symbolic.h>

#include <optional>
#include <vector>

namespace torchcap::detail {

using Monomial = c10::SmallVector<uint8_t, 2>;
using SizePoint = std::vector<int64_t>;  // one value per symbol

// The sizes to sample at: every polynomial of degree 2 or less in the
// symbols is fixed by the `basis` points, and up to two more check a fit.
struct SizeDesign {
  std::vector<SizePoint> points;  // points[0]: each symbol's first value
  std::vector<size_t> basis;
  std::vector<Monomial> terms;  // 1, s_i, s_i*s_j (i <= j)
};

// `values[s]`: symbol s's candidate values (distinct), its first the first
// point's. Throws TraceError if they cannot fix every polynomial.
SizeDesign design_sizes(const std::vector<std::vector<int64_t>>& values);

// Candidate values for each symbol: `first[s]` when it is in the symbol's
// range and 2 or more, then the smallest values of 2 or more in range, five
// in all. Throws TraceError naming a range with fewer than four.
std::vector<std::vector<int64_t>> candidate_sizes(const std::vector<Symbol>& symbols,
                                                  const std::vector<int64_t>& first);

// `v` (one value per point of `d`) as an integer polynomial in the terms,
// or nullopt if none fits every point exactly.
std::optional<SizeExpr> fit_sizes(const SizeDesign& d, const std::vector<int64_t>& v);

}  // namespace torchcap::detail
